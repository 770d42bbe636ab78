"""Mistakes a user can make fail at once, with the fix: a model name that is nothing known (no wait on
an unreachable Hub), and training data that is not there (before the base model is converted)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rir_runtime.errors import ModelLoadError, UserInputError
from rir_runtime.llm import registry


def no_network(*_args: object, **_kwargs: object) -> None:
    raise AssertionError("the network was asked")


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any request to the Hub fails the test; the Hub counts as online (HF_HUB_OFFLINE unset)."""
    import huggingface_hub.constants

    monkeypatch.setattr(registry.urllib.request, "urlopen", no_network)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def test_a_name_that_is_no_hub_id_is_refused_at_once_with_the_valid_names(offline_hub: None) -> None:
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as err:
        registry.load_model_and_tokenizer("no-such-model")
    assert time.perf_counter() - start < 2.0
    message = str(err.value)
    assert "neither a registered name" in message and "not a hub id either (those read owner/name)" in message
    assert all(name in message for name in registry.MODELS)
    with pytest.raises(ModelLoadError, match="Did you mean 'gemma3-270m'"):
        registry.load_tokenizer("gemma3-270")


def test_a_hub_id_fails_fast_where_the_hub_cannot_be_reached(
    offline_hub: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "hub_reachable", lambda timeout=2.0: False)
    with pytest.raises(ModelLoadError, match="cannot be reached and the Hugging Face cache does not hold it"):
        registry.load_model_and_tokenizer("someone/no-such-model")


def test_hf_hub_offline_is_honoured_without_asking_the_hub(offline_hub: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(registry, "hub_reachable", no_network)
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE is set and the Hugging Face cache does not hold it"):
        registry.load_model_and_tokenizer("someone/no-such-model")


def test_a_reachable_hub_is_left_to_transformers(offline_hub: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "hub_reachable", lambda timeout=2.0: True)
    assert registry.hub_local_only("someone/model") is False
    monkeypatch.setattr(registry, "_hub_cached", lambda name: True)
    monkeypatch.setattr(registry, "hub_reachable", lambda timeout=2.0: False)
    assert registry.hub_local_only("someone/model") is True  # cached: read from the cache without retries
    assert registry.hub_local_only("gpt2") is True  # a bare name the cache holds is a hub id after all


def test_sft_checks_the_data_folder_before_the_base_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing --data is reported before the base model is resolved (a packaged model is converted
    on first use, minutes on a CPU)."""
    pytest.importorskip("trl")
    import train.common.models
    from train import sft
    from train.common.args import parse_train_args

    def converted(*_args: object) -> None:
        raise AssertionError("the base model was resolved before the data was checked")

    monkeypatch.setattr(train.common.models, "resolve_base", converted)
    argv = ["--model", "smollm2-135m-instruct", "--use_cpu", "true", "--bf16", "false", "--report_to", "none"]
    argv += ["--data", str(tmp_path / "missing"), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(UserInputError, match=r"--data .*missing is not a folder: pass the --out folder"):
        sft.build_trainer(*parse_train_args(sft.make_parser(), argv))
