"""`make_backend`: one spec string to a backend, so a run switches models by changing one flag."""

from __future__ import annotations

import os
from typing import Any

from rir_runtime.errors import ModelLoadError
from rir_runtime.llm.backends import load_transformers_backend
from rir_runtime.llm.base import Backend
from rir_runtime.llm.card import has_card, is_adapter_folder
from rir_runtime.llm.remote import OpenAIBackend
from rir_runtime.llm.tuned import load_tuned_backend


def make_backend(spec: str, **kwargs: Any) -> Backend:
    """Build a backend from one string.

    - `openai:<model>@<base_url>`, e.g. `openai:Qwen/Qwen2.5-7B-Instruct@http://localhost:8000/v1`
      (`/v1` is appended when missing; the API key, if any, is read from $OPENAI_API_KEY);
      `openai:<model>` alone uses $OPENAI_BASE_URL, else https://api.openai.com/v1 (kwargs: timeout,
      max_retries, max_workers, extra_body, guided; see `remote.OpenAIBackend`).
    - `tuned:<adapter-folder>`: a controller adapter from `rir train sft|dpo` over its base model.
    - `transformers:<name>` or just `<name>`: a registered model, a local folder or a hub id, run
      in-process (kwargs: dtype, device, max_batch_size, num_threads); a folder that holds an adapter
      (an agent from `rir train agent-sft`, or a plain PEFT one) loads over its base model (`tuned.py`).
    """
    if spec.startswith("openai:"):
        rest = spec[len("openai:") :]
        cut = max(rest.rfind("@http://"), rest.rfind("@https://"))
        model, base = (rest[:cut], rest[cut + 1 :]) if cut >= 0 else (rest, "")
        base = base or os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
        if not model:
            raise ModelLoadError(f"backend spec '{spec}' names no model: use openai:<model>@<base_url>")
        return OpenAIBackend(base, model, **kwargs)
    if spec.startswith("tuned:"):  # a controller adapter (base model + LoRA), checked by its card
        return load_tuned_backend(spec, **kwargs)
    spec = spec.removeprefix("transformers:")
    if is_adapter_folder(spec):  # an agent adapter as the policy, over the base model its card names
        # a plain PEFT adapter (no card) is served unmerged, as it always was
        return load_tuned_backend(spec, expect="agent", merge=has_card(spec), **kwargs)
    return load_transformers_backend(spec, **kwargs)


def check_backend_spec(spec: str) -> None:
    """What can be known of a backend spec before any work starts, in seconds: a hub id that is neither
    in the Hugging Face cache nor reachable (offline, or `HF_HUB_OFFLINE`) is refused at once, rather
    than after the run has started and transformers has waited on the Hub."""
    from rir_runtime.llm.registry import hub_local_only, resolve_model

    if spec.startswith(("openai:", "tuned:")):
        return
    name = spec.removeprefix("transformers:")
    if resolve_model(name).kind == "hub":
        hub_local_only(name)
