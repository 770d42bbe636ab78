"""A value model: a base model with a LoRA adapter (`rir train value`), scoring the options of a
decision that share one trajectory prompt. Its head is a scalar one trained on option pairs
(`value_head: scalar`), or the language model's own: an option's score is then the log-probability
of its text after the prompt, trained to name each point's best option (`value_head: lm`,
`LikelihoodScorer`). The card's `value_head` says which.

The prompt is run once and its key/value cache is reused by every option: the options then run in one
batched pass over their own few tokens, so valuing thirty restore points costs about one prompt's
prefill instead of thirty. The score of a text is the head's output at the option's last token, where
TRL's `RewardTrainer` pools it (the rightmost token that is not padding); `encode` is the one
tokenisation of (prompt, option), shared by training and serving, so the two see the same tokens.
Options end with their own text, not an end-of-text token: small chat models pad with that token
(SmolLM2: both `<|im_end|>`), so training would pool the token before it while serving read it.

    scorer = load_value_scorer("runs/value")
    scorer.score(value_prompt(ctx), [o.text for o in recovery_options(ctx, True)])
"""

from __future__ import annotations

import threading
from functools import cache
from pathlib import Path
from typing import Any

from rir_runtime.llm.card import LM, value_head
from rir_runtime.llm.device import default_device, set_num_threads

OPTION_BATCH = 16  # options scored per batched pass over the shared prompt's cache


def encode(tokenizer: Any, prompt: str, option: str) -> tuple[list[int], list[int]]:
    """(prompt tokens, option tokens): each text tokenised on its own, so the prompt's tokens are the
    same whatever option follows (its cache can be shared). The option's last token is scored."""
    prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    option_ids = tokenizer(option, add_special_tokens=False)["input_ids"]
    if not option_ids:
        raise ValueError("an empty option has no token to score")
    return list(prompt_ids), list(option_ids)


def split_head(model: Any) -> tuple[Any, Any]:
    """(transformer body, scalar head) of a sequence-classification model, under PEFT or not (LoRA
    layers and the trained head copy live inside these modules, so calling them applies the adapter)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix), base.score


def prompt_cache(body: Any, prompt_ids: list[int]) -> Any:
    """The key/value cache of the prompt, which every option of the decision extends."""
    import torch

    return body(input_ids=torch.tensor([prompt_ids], device=body.device), use_cache=True).cache


def option_scores(body: Any, head: Any, cache: Any, prefix_len: int, options: list[list[int]], pad_id: int) -> Any:
    """A tensor of the head's score at each option's last token, the options right-padded in one batch
    over the prompt's `cache` (which this extends: pass a copy to reuse it). Differentiable, so online
    training of the option policy (`train/value_grpo.py`) scores options as the controller serves them."""
    import torch

    device = body.device
    n, width = len(options), max(len(ids) for ids in options)
    ids = torch.full((n, width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((n, prefix_len + width), dtype=torch.long, device=device)
    mask[:, :prefix_len] = 1
    for row, option in enumerate(options):
        ids[row, : len(option)] = torch.tensor(option, device=device)
        mask[row, prefix_len : prefix_len + len(option)] = 1
    cache.batch_repeat_interleave(n)
    positions = torch.arange(prefix_len, prefix_len + width, device=device).expand(n, -1)
    hidden = body(input_ids=ids, attention_mask=mask, cache=cache, position_ids=positions, use_cache=True)
    last = torch.tensor([len(option) - 1 for option in options], device=device)
    return head(hidden.last_hidden_state[torch.arange(n), last]).squeeze(-1).float()


class ValueScorer:
    """Scores options after a shared prompt with a scalar-head model."""

    def __init__(self, model: Any, tokenizer: Any, device: str = "cpu", card: dict[str, Any] | None = None) -> None:
        self.model, self.tokenizer, self.device, self.card = model.eval(), tokenizer, device, card or {}
        self.body, self.head = split_head(model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._lock = threading.Lock()  # branches played in threads share the model

    def score(self, prompt: str, options: list[str]) -> list[float]:
        """One score per option: the prompt's cache computed once, the options in batches over it."""
        with self._lock:
            return self._score(prompt, options)

    def _score(self, prompt: str, options: list[str]) -> list[float]:
        import copy

        import torch

        if not options:
            return []
        encoded = [encode(self.tokenizer, prompt, o) for o in options]
        prompt_ids = encoded[0][0]
        scores: list[float] = []
        with torch.no_grad():
            cache = prompt_cache(self.body, prompt_ids)
            for start in range(0, len(options), OPTION_BATCH):
                batch = [ids for _, ids in encoded[start : start + OPTION_BATCH]]
                shared = copy.deepcopy(cache)  # the batch extends it; the next batch needs the prompt's alone
                scores += option_scores(self.body, self.head, shared, len(prompt_ids), batch, self.pad_id).tolist()
        return scores

    def score_uncached(self, prompt: str, options: list[str]) -> list[float]:
        """The same scores from whole sequences, one at a time (the reference the cached path must match)."""
        import torch

        out = []
        with torch.no_grad():
            for option in options:
                prompt_ids, option_ids = encode(self.tokenizer, prompt, option)
                ids = torch.tensor([prompt_ids + option_ids], device=self.device)
                hidden = self.body(input_ids=ids).last_hidden_state
                out.append(float(self.head(hidden[0, -1]).squeeze(-1)))
        return out


def as_chat(prompt: str) -> list[dict[str, str]]:
    """The value prompt as the language-model head reads it: one user turn, the option its reply (so
    TRL's SFTTrainer trains on exactly the served tokens, through the tokenizer's chat template)."""
    return [{"role": "user", "content": prompt}]


class LikelihoodScorer:
    """Scores options by the language model's log-probability of each option's text as its reply to
    the prompt: a model fine-tuned to name the best option (`value_head: lm`) ranks options by how
    likely it is to name them. The prompt runs once and its cache serves every option
    (`TransformersBackend.score`). Log-probabilities sum over an option's tokens, so a longer action
    name costs a little; the calibrated margin over going on absorbs the offset of the review."""

    def __init__(self, backend: Any, card: dict[str, Any] | None = None) -> None:
        from rir_runtime.llm.batching import BatchingBackend

        self.tokenizer, self.card = backend.tokenizer, card or {}
        self.backend = BatchingBackend(backend)  # branches played together score in one batch, one thread at a time

    def score(self, prompt: str, options: list[str]) -> list[float]:
        return list(self.backend.score(as_chat(prompt), options)) if options else []


def load_value_scorer(
    adapter_dir: str | Path, device: str | None = None, num_threads: int | None = None, merge: bool = True
) -> ValueScorer | LikelihoodScorer:
    """The value model of an adapter folder, after its card is checked (kind `value`, prompt version).
    The LoRA weights are merged in: serving never trains them, and a merged layer is one matmul, not
    three (11% less time a decision alone on one CPU thread, `bench/value_latency.py`; same scores to 1e-5).
    `merge=False` applies them on the fly (the reference the merged model is checked against)."""
    from rir_runtime.llm.tuned import TunedBackend, load_tuned_model

    set_num_threads(num_threads)
    device = device or default_device()
    folder = str(adapter_dir).removeprefix("value:")
    model, tokenizer, card = load_tuned_model(folder, merge=merge, device=device, expect="value")
    if value_head(card) == LM:  # no kept prompt caches: a decision's scores depend on its own prompt alone
        backend = TunedBackend(model, tokenizer, f"value:{folder}", card, device, OPTION_BATCH, kv_pool_tokens=0)
        return LikelihoodScorer(backend, card)
    return ValueScorer(model, tokenizer, device, card)


@cache
def cached_value_scorer(adapter_dir: str) -> ValueScorer | LikelihoodScorer:
    """One value model per adapter and process: the episodes of a run share it."""
    return load_value_scorer(adapter_dir)
