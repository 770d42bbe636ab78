"""Where a local model runs: the device, the torch threads and the weights' dtype, chosen one way for
every loader (a registered model, a base model under an adapter, a value model)."""

from __future__ import annotations

from typing import Any


def default_device() -> str:
    """`cuda` when a GPU is visible, else `cpu`: local models run where the machine is fastest."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def set_num_threads(num_threads: int | None) -> None:
    """Process-wide torch threads; 1 per worker avoids OpenMP spin-wait collapse on a busy CPU."""
    if num_threads:
        import torch

        torch.set_num_threads(num_threads)


def torch_dtype(dtype: Any, device: str) -> Any:
    """The dtype to load weights in: `auto` (or None) is bfloat16 on a GPU that supports it, else float32;
    a name is looked up in torch."""
    import torch

    if dtype in (None, "auto"):
        return torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype
