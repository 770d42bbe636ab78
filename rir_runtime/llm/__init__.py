"""Models: the registry (names -> weights) and the generation/scoring backends."""

from rir_runtime.llm.backends import (
    Backend,
    Completion,
    OpenAIBackend,
    TransformersBackend,
    make_backend,
    truncate_at_stop,
)
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

__all__ = [
    "MODELS",
    "Backend",
    "Completion",
    "ModelInfo",
    "ModelSpec",
    "OpenAIBackend",
    "TransformersBackend",
    "cache_root",
    "list_models",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "local_path",
    "make_backend",
    "prepare_model",
    "resolve_model",
    "truncate_at_stop",
]
