"""LoRA SFT training throughput (tokens/s) and, on a known GPU, model FLOPs utilisation (MFU).

The model is built from a config with random weights (Qwen2.5-0.5B / 1.5B dimensions, or a tiny
shape for CPUs) and fed random token ids, so nothing is downloaded and no tokenizer is needed.
Each step is one forward + backward + AdamW update of the LoRA weights, like a training step of
`train/sft.py` (LoRA on q/k/v/o and the MLP projections, loss on every position).

    python bench/train_throughput.py --shape tiny --steps 5 --seq-len 256 --batch-size 2 --device cpu
    python bench/train_throughput.py --shape 0.5b --steps 20 --seq-len 2048 --batch-size 8 --device cuda
    python bench/train_throughput.py --shape 1.5b --steps 20 --seq-len 2048 --batch-size 4 --gradient-checkpointing

FLOPs formula (documented so the numbers can be compared with other reports):
    model_flops_per_step = 6 * N * tokens_per_step
with N = every parameter the forward pass multiplies by: all frozen + trainable (LoRA) weights;
a tied input embedding / LM head counts once (the lookup is free, the LM head matmul is not).
6 = 2 (forward) + 4 (backward). This is the usual "model FLOPs" convention (Kaplan et al.; PaLM
appendix B) and ignores attention-score FLOPs; `mfu_with_attention` adds PaLM's
12 * n_layers * hidden * seq_len per token. With LoRA the frozen weights need no weight gradients,
so the hardware does only about 4N per token (6N with gradient checkpointing's recompute): MFU
by the 6N convention is therefore an upper-bound-style figure, comparable across reports but
not "hardware FLOPs utilisation".
MFU = model_flops_per_step / step_time / peak, with peak the device's dense bf16 tensor-core
FLOP/s from its name (H200/H100 SXM 989e12, H100 PCIe 756e12, A100 312e12); unknown devices and
CPUs report tokens/s only.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

# name: (hidden, intermediate, layers, heads, kv_heads, vocab, tied embeddings) -- the real Qwen2.5 dims
SHAPES: dict[str, tuple[int, int, int, int, int, int, bool]] = {
    "tiny": (64, 128, 2, 4, 2, 1024, True),
    "0.5b": (896, 4864, 24, 14, 2, 151936, True),
    "1.5b": (1536, 8960, 28, 12, 2, 151936, True),
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PEAK_BF16 = (("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12))


def peak_flops(device: torch.device) -> tuple[str, float | None]:
    """(device name, dense bf16 peak FLOP/s or None when unknown)."""
    if device.type != "cuda":
        return "cpu", None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BF16:
        if all(part in name for part in key.split()):
            return name, peak
    return name, None


def qwen_config(shape: str, min_vocab: int = 0) -> Any:
    """Qwen2Config of a named shape; the vocabulary grows to `min_vocab` (a tokenizer's) if larger."""
    from transformers import Qwen2Config

    hidden, inter, layers, heads, kv, vocab, tied = SHAPES[shape]
    return Qwen2Config(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=max(vocab, min_vocab),
        tie_word_embeddings=tied,
        max_position_embeddings=32768,
        rope_theta=1e6,
        attn_implementation="sdpa",
    )


def build_model(shape: str, device: torch.device, dtype: torch.dtype, lora_r: int, checkpointing: bool) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM

    config = qwen_config(shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    lora = LoraConfig(
        r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"
    )
    return get_peft_model(model, lora)


def count_params(model: Any) -> tuple[int, int]:
    """(all parameters, tied ones counted once; trainable parameters)."""
    seen, total, trainable = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return total, trainable


def timed_steps(step: Callable[[], float], device: torch.device, warmup: int, steps: int) -> list[float]:
    """Seconds of each of `steps` training steps after `warmup` untimed ones (a GPU synchronised after
    each, its peak memory counted from the first timed step)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(args.shape, device, dtype, args.lora_r, args.gradient_checkpointing)
    model.train()
    n_params, n_trainable = count_params(model)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    vocab = SHAPES[args.shape][5]
    gen = torch.Generator().manual_seed(0)
    tokens_per_step = args.batch_size * args.seq_len

    def step() -> float:
        ids = torch.randint(0, vocab, (args.batch_size, args.seq_len), generator=gen).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        return float(loss.detach())

    times = timed_steps(step, device, args.warmup, args.steps)
    step_s = sum(times) / len(times)
    name, peak = peak_flops(device)
    hidden, _, layers = SHAPES[args.shape][:3]
    flops = 6 * n_params * tokens_per_step
    attn = 12 * layers * hidden * args.seq_len * tokens_per_step
    result = {
        "shape": args.shape,
        "device": name,
        "dtype": str(dtype).removeprefix("torch."),
        "params": n_params,
        "trainable_params": n_trainable,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "gradient_checkpointing": args.gradient_checkpointing,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "step_s": round(step_s, 4),
        "step_s_min": round(min(times), 4),
        "tokens_per_s": round(tokens_per_step / step_s, 1),
        "model_tflops_per_s": round(flops / step_s / 1e12, 3),
    }
    if peak:
        result["peak_bf16_tflops"] = peak / 1e12
        result["mfu"] = round(flops / step_s / peak, 4)
        result["mfu_with_attention"] = round((flops + attn) / step_s / peak, 4)
    if device.type == "cuda":
        result["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=list(SHAPES), default="tiny", help="model dimensions (default: tiny)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (default: 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (default: 1)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default: 256)")
    p.add_argument("--batch-size", type=int, default=2, help="sequences per step (default: 2)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda[:i]")
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank (default: 16)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in backward")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's choice)")
    print(json.dumps(run(p.parse_args(argv))))


if __name__ == "__main__":
    main()
