"""Sharing: plain PEFT adapter folders load as policy and controller, adapter and dataset cards carry
Hub metadata (never a local cache path as the base model), and the push path sends the right files.

Nothing reaches the network: the push tests replace only `HfApi.create_repo` and `HfApi.create_commit`
and inspect what would have been sent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")
pytest.importorskip("huggingface_hub")

from rir_runtime.errors import UserInputError  # noqa: E402
from rir_runtime.llm.card import PlainAdapterWarning, describe_base  # noqa: E402

MESSAGES = [{"role": "user", "content": "Decision: review. Is the agent stuck?"}]


def front_matter(text: str) -> dict[str, Any]:
    """The README's YAML metadata, parsed the way huggingface_hub parses it before a push."""
    from huggingface_hub import RepoCard

    return RepoCard(text).data.to_dict()


# --- plain PEFT adapters ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter saved by PEFT alone (no rir card), with nonzero weights so it changes outputs."""
    import torch
    from peft import LoraConfig, get_peft_model

    from rir_runtime.llm.registry import load_model_and_tokenizer

    torch.manual_seed(0)
    base, _ = load_model_and_tokenizer("tiny-random-llama")
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    out = tmp_path_factory.mktemp("plain") / "adapter"
    model.save_pretrained(str(out))
    return out


def test_plain_peft_adapter_loads_as_policy_and_controller(plain_adapter: Path) -> None:
    from rir_runtime.controllers import check_controller_name
    from rir_runtime.llm.card import CARD
    from rir_runtime.llm.factory import make_backend
    from rir_runtime.llm.tuned import TunedBackend

    recorded = json.loads((plain_adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert not (plain_adapter / CARD).exists() and Path(recorded).name == "tiny-random-llama"
    with pytest.warns(PlainAdapterWarning, match="plain PEFT adapter.*prompt format is unknown"):
        policy = make_backend(str(plain_adapter), device="cpu")  # --policy llm:<folder>
    with pytest.warns(PlainAdapterWarning, match="as a controller"):
        check_controller_name(f"tuned:{plain_adapter}")  # rir eval validates before any episode
    with pytest.warns(PlainAdapterWarning):
        controller = make_backend(f"tuned:{plain_adapter}", device="cpu")  # --controller tuned:<folder>
    assert isinstance(controller, TunedBackend)
    assert controller.card["base_model"] == "tiny-random-llama" and controller.card["plain_peft"]
    base = make_backend("tiny-random-llama", device="cpu")
    answer = ['{"decision": "continue"}']
    with_adapter = policy.score(MESSAGES, answer)[0]
    assert controller.score(MESSAGES, answer)[0] == pytest.approx(with_adapter, rel=1e-5)  # merged: float rounding
    assert abs(with_adapter - base.score(MESSAGES, answer)[0]) > 1e-3  # the adapter is applied


def test_plain_adapter_without_base_model_is_a_clear_error(plain_adapter: Path, tmp_path: Path) -> None:
    from rir_runtime.llm.card import read_card

    folder = tmp_path / "adapter"
    folder.mkdir()
    config = json.loads((plain_adapter / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": None}))
    with pytest.raises(UserInputError, match="names no base_model_name_or_path"):
        read_card(folder)


def test_base_model_names_are_shareable(tmp_path: Path) -> None:
    own = tmp_path / "models" / "gemma3-270m"  # a user's folder that happens to share a registry name
    own.mkdir(parents=True)
    cases = {
        "smollm2-135m-instruct": ("smollm2-135m-instruct", "registry"),
        "/home/someone/.cache/rir/models/smollm2-135m-instruct": ("smollm2-135m-instruct", "registry"),
        "/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B/snapshots/abc123": ("Qwen/Qwen2.5-0.5B", "hub"),
        "Qwen/Qwen2.5-0.5B-Instruct": ("Qwen/Qwen2.5-0.5B-Instruct", "hub"),
        str(own): (str(own.resolve()), "local"),
    }
    for given, (name, source) in cases.items():
        ref = describe_base(given)
        assert (ref.name, ref.source) == (name, source), given


# --- adapter card --------------------------------------------------------------------------------------------
def _card(folder: Path, base_model: str, base_model_path: str = "") -> dict[str, Any]:
    from train.common.adapter_files import write_cards

    folder.mkdir(parents=True, exist_ok=True)
    fingerprints = {"review_sft/train": "f1", "review_sft/validation": "f2"}
    write_cards(
        str(folder),
        base_model=base_model,
        base_model_path=base_model_path or base_model,
        decision_types=["review"],
        fingerprints=fingerprints,
        stage="sft",
    )
    return json.loads((folder / "rir_controller.json").read_text())


def test_adapter_card_names_the_base_model_without_a_local_path(tmp_path: Path) -> None:
    from rir_runtime.llm.registry import cache_root

    cached = str(cache_root() / "tiny-random-llama")  # --model given as the cache path (a resolved config rerun)
    card = _card(tmp_path / "a", cached)
    assert (card["base_model"], card["base_model_source"]) == ("tiny-random-llama", "registry")
    meta = front_matter((tmp_path / "a" / "README.md").read_text())
    assert meta["library_name"] == "peft" and meta["base_model"] == "tiny-random-llama"
    assert {"rir", "sft", "recovery-controller", "review"} <= set(meta["tags"])

    _card(tmp_path / "b", "smollm2-135m-instruct", "/some/cache/models/smollm2-135m-instruct")
    meta = front_matter((tmp_path / "b" / "README.md").read_text())
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"  # the Hub id, not the registry copy

    local = tmp_path / "my-base"
    local.mkdir()
    card = _card(tmp_path / "c", str(local))
    assert (card["base_model"], card["base_model_source"]) == (str(local.resolve()), "local")
    readme = (tmp_path / "c" / "README.md").read_text()
    assert "base_model" not in front_matter(readme) and str(local) not in readme.split("---")[1]


# --- pushing -------------------------------------------------------------------------------------------------
class FakeHub:
    """Records what `HfApi` would send; every other part of the push runs for real."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from huggingface_hub import HfApi

        self.repos: list[dict[str, Any]] = []
        self.files: dict[str, bytes] = {}
        self.repo_type = ""
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # anything left unmocked fails instead of going online
        monkeypatch.setattr(HfApi, "create_repo", self.create_repo)
        monkeypatch.setattr(HfApi, "create_commit", self.create_commit)

    def create_repo(self, repo_id: str, **kwargs: Any) -> str:
        self.repos.append({"repo_id": repo_id, **kwargs})
        return f"https://huggingface.co/{repo_id}"

    def create_commit(self, repo_id: str, operations: list, **kwargs: Any) -> str:
        self.repo_type = kwargs["repo_type"]
        for op in operations:
            data = op.path_or_fileobj
            self.files[op.path_in_repo] = data if isinstance(data, bytes) else Path(data).read_bytes()
        return f"https://huggingface.co/{repo_id}/commit/0"


def test_push_adapter_sends_the_adapter_and_a_hub_ready_card(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from train.hub import push_adapter

    folder = tmp_path / "sft-smollm2"
    cache_path = "/home/someone/.cache/rir/models/smollm2-135m-instruct"
    _card(folder, "smollm2-135m-instruct", cache_path)
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": cache_path, "r": 8}))
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "checkpoint-2").mkdir()
    (folder / "checkpoint-2" / "optimizer.pt").write_bytes(b"state")
    (folder / ".lock").write_text("")
    hub = FakeHub(monkeypatch)

    push_adapter(folder, "me/rir-controller", private=True, datasets=["me/rir-review-sft"])

    assert hub.repos == [{"repo_id": "me/rir-controller", "private": True, "repo_type": "model", "exist_ok": True}]
    assert hub.repo_type == "model"
    expected = {"README.md", "adapter_config.json", "adapter_model.safetensors", "rir_controller.json"}
    assert set(hub.files) == expected | {"tokenizer_config.json"}
    meta = front_matter(hub.files["README.md"].decode())
    assert meta["library_name"] == "peft" and meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert meta["datasets"] == ["me/rir-review-sft"]
    sent_config = json.loads(hub.files["adapter_config.json"])
    assert sent_config == {"base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct", "r": 8}
    assert json.loads(hub.files["rir_controller.json"])["base_model"] == "smollm2-135m-instruct"


def test_push_adapter_refuses_folders_it_cannot_describe(plain_adapter: Path, tmp_path: Path) -> None:
    from train.hub import push_adapter

    with pytest.raises(UserInputError, match="has no rir_controller.json.*PeftModel.push_to_hub"):
        push_adapter(plain_adapter, "me/x")
    with pytest.raises(UserInputError, match="is not an adapter folder"):
        push_adapter(tmp_path, "me/x")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`rir build-data` output over a small builtin rollout."""
    from data_gen.build import build
    from data_gen.build_config import BuildConfig
    from data_gen.rollout import RolloutConfig, rollout

    runs, data = tmp_path_factory.mktemp("rollout"), tmp_path_factory.mktemp("data")
    rollout(RolloutConfig(env="builtin", tasks=["workshop-3"], variations="0-11", out=str(runs)))
    build(BuildConfig(rollouts=[str(runs)], out=str(data)))
    return data


@pytest.mark.parametrize("name", ["review_sft", "locate_pref"])
def test_built_dataset_card_has_hub_metadata_that_loads_the_data(built: Path, name: str, tmp_path: Path) -> None:
    from datasets import load_dataset, load_from_disk

    folder = built / name
    readme = (folder / "README.md").read_text()
    meta = front_matter(readme)
    saved = load_from_disk(str(folder))
    assert meta["license"] == "apache-2.0" and meta["task_categories"] == ["text-generation"]
    assert {"rir", "builtin", "sft" if name.endswith("_sft") else "dpo"} <= set(meta["tags"])
    assert [f["split"] for f in meta["configs"][0]["data_files"]] == list(saved)
    assert f"# {name}" in readme and "| split | rows |" in readme  # the card's table is still there
    loaded = load_dataset(str(folder), cache_dir=str(tmp_path / "hf"))  # reads the front matter's files
    assert {s: d.num_rows for s, d in loaded.items()} == {s: d.num_rows for s, d in saved.items()}
    assert loaded["train"][0] == saved["train"][0]


def test_agent_data_card_has_hub_metadata(tmp_path: Path) -> None:
    from datasets import load_dataset

    from data_gen.agent_data import AgentDataConfig, AgentDataSource, build_agent_data

    source = AgentDataSource("builtin", ["workshop-2"], "train", "0-3")
    counts = build_agent_data(AgentDataConfig(sources=[source], out=str(tmp_path), detour_share=0.0))
    meta = front_matter((tmp_path / "agent_sft" / "README.md").read_text())
    assert {"agent", "builtin", "sft"} <= set(meta["tags"]) and meta["license"] == "apache-2.0"
    loaded = load_dataset(str(tmp_path / "agent_sft"), cache_dir=str(tmp_path / "hf"))
    assert {s: d.num_rows for s, d in loaded.items()} == {s: n for s, n in counts.items() if n}


def test_push_dataset_sends_one_dataset_folder(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from train.hub import push_dataset

    hub = FakeHub(monkeypatch)
    push_dataset(built / "review_sft", "me/rir-review-sft", private=False)
    assert hub.repos == [{"repo_id": "me/rir-review-sft", "private": False, "repo_type": "dataset", "exist_ok": True}]
    assert hub.repo_type == "dataset"
    folder = built / "review_sft"
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert set(hub.files) == on_disk
    assert {"README.md", "dataset_dict.json", "train/data-00000-of-00001.arrow"} <= on_disk
    assert front_matter(hub.files["README.md"].decode())["configs"][0]["config_name"] == "default"


def test_push_dataset_refuses_a_build_folder_and_a_card_without_metadata(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from train.hub import push_dataset

    hub = FakeHub(monkeypatch)
    with pytest.raises(UserInputError, match="not a saved dataset.*locate_pref.*review_sft"):
        push_dataset(built, "me/x")
    old = tmp_path / "review_sft"
    shutil.copytree(built / "review_sft", old)
    (old / "README.md").write_text("# review_sft\n\nA card written before front matter.\n")
    with pytest.raises(UserInputError, match="no dataset-card front matter"):
        push_dataset(old, "me/x")
    assert hub.repos == [] and hub.files == {}
