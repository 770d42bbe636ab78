"""Models: the registry (names -> weights) and the generation/scoring backends."""

from rir_runtime.llm.registry import (
    MODELS,
    ModelInfo,
    ModelSpec,
    list_models,
    load_model_and_tokenizer,
    prepare_model,
    resolve_model,
)

__all__ = [
    "MODELS", "ModelInfo", "ModelSpec", "list_models", "load_model_and_tokenizer", "prepare_model", "resolve_model",
]
