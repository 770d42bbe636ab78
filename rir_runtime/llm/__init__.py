"""Models: the registry (names -> weights), the `Backend` protocol and its implementations."""

from rir_runtime.llm.backends import TransformersBackend, load_transformers_backend
from rir_runtime.llm.base import Backend, Completion, Messages, Prompt, truncate_at_stop
from rir_runtime.llm.batching import BatchingBackend
from rir_runtime.llm.factory import make_backend
from rir_runtime.llm.registry import (
    MODELS,
    ModelInfo,
    ModelSpec,
    cache_root,
    list_models,
    load_model_and_tokenizer,
    load_tokenizer,
    local_path,
    prepare_model,
    resolve_model,
)
from rir_runtime.llm.remote import OpenAIBackend
from rir_runtime.llm.tuned import TunedBackend, load_tuned_backend

__all__ = [
    "MODELS",
    "Backend",
    "BatchingBackend",
    "Completion",
    "Messages",
    "ModelInfo",
    "ModelSpec",
    "OpenAIBackend",
    "Prompt",
    "TransformersBackend",
    "TunedBackend",
    "cache_root",
    "list_models",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "load_transformers_backend",
    "load_tuned_backend",
    "local_path",
    "make_backend",
    "prepare_model",
    "resolve_model",
    "truncate_at_stop",
]
