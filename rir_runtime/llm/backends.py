"""The model backends: a local transformers model (batched) here, OpenAI-compatible servers in `remote.py`.

Policies and prompted controllers see only the `Backend` protocol (`base.py`), so a run can switch
between a CPU model in-process and a vLLM / SGLang / `transformers serve` server by changing one spec
string (`factory.make_backend`).
"""

from __future__ import annotations

import copy
import inspect
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from rir_runtime.errors import RIRError
from rir_runtime.llm.base import Choice, Completion, Prompt, truncate_at_stop
from rir_runtime.llm.device import default_device, set_num_threads
from rir_runtime.llm.kv_pool import DEFAULT_POOL_TOKENS, PrefixPool
from rir_runtime.llm.pooled import EMPTY, TokenTree, generate_rows, score_trees

MEMO_SCORES = 4096  # scored prompts and greedy replies remembered beside the pool (keyed by token ids)


class TransformersBackend:
    """A loaded causal LM: many prompts per `generate` call, left padding, greedy at temperature 0.

    It takes a model that is already loaded, so every way of loading one (a registered name,
    `load_transformers_backend`; a base model plus adapter, `tuned.load_tuned_backend`) shares
    the same generation, scoring and constrained decoding.
    """

    supports_scoring = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        name: str,
        device: str = "cpu",
        max_batch_size: int = 16,
        kv_pool_tokens: int = DEFAULT_POOL_TOKENS,
    ) -> None:
        self.model, self.tokenizer, self.name = model, tokenizer, name
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        self.device, self.max_batch_size = device, max(1, max_batch_size)
        self._stop_strings_ok = True  # cleared when a tokenizer cannot build stop-string tables
        self._prefix_cache_ok = True  # cleared when a cache class cannot be repeated over a batch
        # Prompt caches kept for later calls that begin alike (`kv_pool.py`); max_tokens 0 turns it off.
        self.pool = PrefixPool(kv_pool_tokens)
        # Scoring and generation over pooled prompts (`pooled.py`): checked against the plain path on the
        # first call, and cleared where the two disagree (a sliding window, a capped output head).
        self.pooled = True
        self._checked = False
        self._scores: OrderedDict[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]], list[float]] = OrderedDict()
        self._replies: OrderedDict[tuple[tuple[int, ...], int, tuple[str, ...]], Completion] = OrderedDict()

    @property
    def reused_tokens(self) -> int:
        """Prompt tokens served from kept KV caches instead of computed, for benchmarks."""
        return self.pool.reused_tokens

    def forget_prefixes(self) -> None:
        """Drop the kept prompt caches and scores. A reused prefix agrees with a recomputed one up to
        float rounding, so an episode that starts with an empty pool depends on its own calls alone."""
        self.pool.clear()
        self._scores.clear()
        self._replies.clear()

    def _cache_kw(self) -> str:
        return cache_keyword(self.model)

    def _encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def _left_pad(self, rows: list[list[int]]) -> tuple[Any, Any, Any]:
        return left_pad(rows, self.tokenizer.pad_token_id, self.device)

    def _pooled_ok(self, head: list[int]) -> bool:
        """Whether this model takes the pooled path: on the first call, two continuations of `head`'s own
        last tokens are scored both ways; where the scores disagree the plain path serves from then on."""
        if self.pooled and not self._checked:  # `pooled = False` beforehand keeps the plain path
            self._checked = True
            tails = [head[-1:], head[-2:]]
            plain = self._score_alone(head[:-2], tails)
            try:
                with _inference():
                    pooled = score_trees(
                        self.model, PrefixPool(0), [head[:-2]], [TokenTree.of(tails)], self.tokenizer.pad_token_id
                    )[0]
            except Exception:  # noqa: BLE001 - an architecture the custom mask or cache layout does not fit
                pooled = []
            self.pooled = len(pooled) == 2 and all(
                abs(a - b) <= 1e-3 + 1e-4 * abs(b) for a, b in zip(pooled, plain, strict=True)
            )
        return self.pooled

    def generate(
        self,
        prompts: Sequence[Prompt],
        *,
        max_new_tokens: int,
        stop: list[str] | None = None,
        temperature: float = 0.0,
        hints: Sequence[Sequence[str]] | None = None,
    ) -> list[Completion]:
        """Greedy at temperature 0. Over pooled prompts (`pooled.generate_rows`) where the model allows:
        prompts that begin like earlier ones compute only the rest, the batch decodes together, and a
        greedy reply follows its `hints` in one pass while it stays among them. With the pool on, a greedy
        reply to a prompt asked again comes from memory (the same tokens give the same reply)."""
        encoded = [self._encode(p) for p in prompts]
        if encoded and len(encoded[0]) > 2 and self._pooled_ok(encoded[0]):
            remember = temperature <= 0 and self.pool.max_tokens > 0
            keys = [(tuple(ids), max_new_tokens, tuple(stop or ())) for ids in encoded]
            todo = [i for i, key in enumerate(keys) if not (remember and key in self._replies)]
            if todo:
                trees = [self._tree(hints[i]) for i in todo] if hints else None
                new = self._generate_pooled([encoded[i] for i in todo], max_new_tokens, stop, temperature, trees)
                if not remember:
                    return new
                self._replies.update(zip([keys[i] for i in todo], new, strict=True))
                while len(self._replies) > MEMO_SCORES:
                    self._replies.popitem(last=False)
            for key in keys:
                self._replies.move_to_end(key)
            return [self._replies[key] for key in keys]
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # similar lengths pad less
        results: dict[int, Completion] = {}
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            for i, completion in zip(
                chunk, self._generate_batch([encoded[i] for i in chunk], max_new_tokens, stop, temperature), strict=True
            ):
                results[i] = completion
        return [results[i] for i in range(len(prompts))]

    def _tree(self, texts: Sequence[str]) -> TokenTree:
        return TokenTree.of(continuation_tokens(self.tokenizer, list(texts))) if texts else EMPTY

    def _generate_pooled(
        self,
        rows: list[list[int]],
        max_new_tokens: int,
        stop: list[str] | None,
        temperature: float,
        hints: list[TokenTree] | None,
    ) -> list[Completion]:
        eos, stops = self._eos_ids(), [s for s in stop or [] if s]

        def stopped(tokens: list[int]) -> bool:
            if tokens[-1] in eos:
                return True
            return bool(stops) and any(s in self.tokenizer.decode(tokens, skip_special_tokens=True) for s in stops)

        with _inference():
            new = generate_rows(
                self.model, self.pool, rows, self.tokenizer.pad_token_id, stopped, max_new_tokens, temperature,
                self.max_batch_size, hints,
            )  # fmt: skip
        return [
            Completion(
                truncate_at_stop(self.tokenizer.decode(tokens, skip_special_tokens=True), stop), len(row), len(tokens)
            )
            for row, tokens in zip(rows, new, strict=True)
        ]

    def _eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        return set([eos] if isinstance(eos, int) else (eos or [])) | {self.tokenizer.eos_token_id}

    def _generate_batch(
        self, rows: list[list[int]], max_new_tokens: int, stop: list[str] | None, temperature: float
    ) -> list[Completion]:
        """transformers' `generate` over left-padded rows: the path of models the pooled one does not fit."""
        import torch

        ids, mask, _ = self._left_pad(rows)
        kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "pad_token_id": self.tokenizer.pad_token_id}
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.inference_mode():
            out = None
            if stop and self._stop_strings_ok:
                try:
                    out = self.model.generate(
                        input_ids=ids, attention_mask=mask, stop_strings=stop, tokenizer=self.tokenizer, **kwargs
                    )
                except Exception:  # noqa: BLE001 - some tokenizers cannot build stop-string tables
                    self._stop_strings_ok = False
            if out is None:
                out = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        stopped_on = stop if stop and self._stop_strings_ok else None
        completions = []
        for row, new in zip(rows, out[:, ids.shape[1] :].tolist(), strict=True):
            n = self._generated_length(new, stopped_on)
            text = self.tokenizer.decode(new[:n], skip_special_tokens=True)
            completions.append(Completion(truncate_at_stop(text, stop), len(row), n))
        return completions

    def _generated_length(self, new: list[int], stopped_on: list[str] | None) -> int:
        """How many of a row's new tokens the model generated: the rest is padding, added while the
        batch went on. When the pad token is the EOS token (SmolLM2's is), the padding after a row
        that a stop string ended reads as an EOS the model never generated; counting it would make
        `completion_tokens` depend on which other prompts shared the batch."""
        eos_ids = self._eos_ids()
        k = next((k for k, t in enumerate(new) if t in eos_ids), None)
        if k is not None:
            text = self.tokenizer.decode(new[:k], skip_special_tokens=True)
            return k if stopped_on and any(s and s in text for s in stopped_on) else k + 1
        n = len(new)  # stopped by a stop string (then padded while the batch went on) or by length
        while n and new[n - 1] == self.tokenizer.pad_token_id:
            n -= 1
        return n

    def choose(
        self, prompt: Prompt, choices: list[str], penalties: Sequence[float] | None = None
    ) -> tuple[int, Completion]:
        """Greedy decoding that can only spell one of `choices`: at each step the vocabulary is cut
        to the tokens that continue some choice (a token trie, closed by EOS). Unlike free text the
        reply cannot name an object that is not there; unlike ranking, the cost does not grow with
        the number of choices (greedy commits to the likeliest first token, where ranking compares
        whole actions).

        `penalties[i]` is taken off choice i's log-probability (memory guidance): at the token where
        the path leaves every choice with a smaller penalty, the difference is subtracted, so a
        spelled choice pays exactly its own penalty."""
        import torch
        from transformers import LogitsProcessorList

        head = self._encode(prompt)
        eos = self.tokenizer.eos_token_id
        spellings = self.tokenizer(choices, add_special_tokens=False)["input_ids"]
        trie, index, least = choice_trie(spellings, eos, penalties)

        def allowed(_batch: int, ids: Any) -> list[int]:
            node = trie
            for token in ids[len(head) :].tolist():
                node = node.get(token, {})
            return list(node) or [eos]

        def penalise(ids: Any, scores: Any) -> Any:
            path = tuple(ids[0, len(head) :].tolist())
            here = least.get(path, min(least.values()) if not path else 0.0)
            for token in allowed(0, ids[0]):
                extra = least.get((*path, token), here) - here
                if extra:
                    scores[0, token] -= extra
            return scores

        ids = torch.tensor([head], device=self.device)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                prefix_allowed_tokens_fn=allowed,
                logits_processor=LogitsProcessorList([penalise]) if penalties and any(penalties) else None,
                max_new_tokens=max(map(len, index)) + 1,
                eos_token_id=eos,
                pad_token_id=self.tokenizer.pad_token_id,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
            )
        new = out[0, len(head) :].tolist()
        spelled = tuple(new[: new.index(eos)] if eos in new else new)
        if spelled not in index:  # cannot happen with a well-formed trie; say so rather than guess
            raise RIRError(f"constrained decoding spelled {self.tokenizer.decode(spelled)!r}, which is not a choice")
        return index[spelled], Completion(choices[index[spelled]], len(head), len(new))

    def choose_many(self, requests: Sequence[Choice]) -> list[tuple[int, Completion]]:
        return [self.choose(*request) for request in requests]

    def score(self, prompt: Prompt, continuations: list[str]) -> list[float]:
        return self.score_many([(prompt, continuations)])[0]

    def score_many(self, requests: Sequence[tuple[Prompt, list[str]]]) -> list[list[float]]:
        """Every request's continuations scored, the prompts in batches of one forward pass each, their
        continuations as token trees over pooled prompt prefixes (`pooled.score_trees`). A model the
        pooled path does not fit scores each prompt alone: its KV cache repeated over a batch of
        continuations (ranking 100 actions must not recompute a 1k-token prompt 100 times). With the pool
        on, a prompt asked again (a continuation replayed under a smaller cap, one step reached from two
        reviews) is answered from memory: the same tokens give the same scores."""
        out: list[list[float]] = [[] for _ in requests]
        todo = [i for i, (_, continuations) in enumerate(requests) if continuations]
        heads = {i: self._encode(requests[i][0]) for i in todo}
        tails = {i: continuation_tokens(self.tokenizer, requests[i][1]) for i in todo}
        keys = {i: (tuple(heads[i]), tuple(map(tuple, tails[i]))) for i in todo}
        remember = self.pool.max_tokens > 0
        if remember:
            for i in [i for i in todo if keys[i] in self._scores]:
                out[i] = list(self._scores[keys[i]])
                self._scores.move_to_end(keys[i])
            todo = [i for i in todo if keys[i] not in self._scores]
        if todo and len(heads[todo[0]]) > 2 and self._pooled_ok(heads[todo[0]]):
            with _inference():
                got = score_trees(
                    self.model,
                    self.pool,
                    [heads[i] for i in todo],
                    [TokenTree.of(tails[i]) for i in todo],
                    self.tokenizer.pad_token_id,
                    self.max_batch_size,
                )
            for i, scores in zip(todo, got, strict=True):
                out[i] = scores
        else:
            for i in todo:
                out[i] = self._score_alone(heads[i], tails[i])
        if remember:
            for i in keys:
                self._scores[keys[i]] = list(out[i])
            while len(self._scores) > MEMO_SCORES:
                self._scores.popitem(last=False)
        return out

    def _score_alone(self, head: list[int], tails: list[list[int]]) -> list[float]:
        if self._prefix_cache_ok:
            try:
                return self._score_cached(head, tails)
            except Exception:  # noqa: BLE001 - a cache class without batch repeat: use the plain path
                self._prefix_cache_ok = False
        return self._score_plain(head, tails)

    def _score_cached(self, head: list[int], tails: list[list[int]]) -> list[float]:
        import torch

        cache_kw = self._cache_kw()
        with torch.inference_mode():
            first_lp, prefix = prompt_log_probs_and_cache(self.model, head, cache_kw)
            scores: list[float] = []
            for start in range(0, len(tails), self.max_batch_size):
                chunk = tails[start : start + self.max_batch_size]
                cache = copy.deepcopy(prefix)  # extended below; the next chunk needs the prompt's alone
                scores += tail_log_probs(
                    self.model, cache, cache_kw, first_lp, len(head), chunk, self.tokenizer.pad_token_id
                ).tolist()
        return scores

    def _score_plain(self, head: list[int], tails: list[list[int]]) -> list[float]:
        """Left-padded prompt+continuation rows in one forward pass; only the last positions get logits
        (a 262k vocabulary times the whole prompt would not fit in memory)."""
        import torch

        scores: list[float] = []
        for start in range(0, len(tails), self.max_batch_size):
            chunk = tails[start : start + self.max_batch_size]
            with torch.inference_mode():
                scores += continuation_log_probs(self.model, head, chunk, self.tokenizer.pad_token_id).tolist()
        return scores


def _inference() -> Any:
    import torch

    return torch.inference_mode()


def cache_keyword(model: Any) -> str:
    """transformers 5.x renamed `past_key_values` to `cache` (the old name is deprecated until 5.40)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """A prompt's token ids. Chat messages go through the chat template (which adds BOS itself); raw
    text gets the specials. A chat that ends in an assistant message is a reply begun by the caller:
    it is continued."""
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=True)["input_ids"]
    if prompt and prompt[-1]["role"] == "assistant":
        text = tokenizer.apply_chat_template(prompt, tokenize=False, continue_final_message=True)
    else:
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def continuation_tokens(tokenizer: Any, continuations: Sequence[str]) -> list[list[int]]:
    """Each continuation's token ids as scored after a prompt (an empty one scores end-of-text)."""
    return [tokenizer(c, add_special_tokens=False)["input_ids"] or [tokenizer.eos_token_id] for c in continuations]


def left_pad(rows: list[list[int]], pad: int, device: Any) -> tuple[Any, Any, Any]:
    """(ids, attention mask, positions) of token rows left-padded to one width."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def continuation_log_probs(model: Any, head: list[int], tails: list[list[int]], pad: int) -> Any:
    """A tensor of each tail's log-probability after `head` (summed over its tokens): the rows
    head + tail left-padded in one forward pass, logits only for the last positions (a 262k
    vocabulary times the whole prompt would not fit in memory): the path for a model whose cache
    cannot be repeated over a batch."""
    import torch

    ids, mask, positions = left_pad([head + t for t in tails], pad, model.device)
    keep = max(len(t) for t in tails) + 1
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep).logits.float()
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1)  # position j predicts token j+1
    token_lp = logprobs.gather(-1, ids[:, -keep + 1 :].unsqueeze(-1)).squeeze(-1)
    return torch.stack([token_lp[r, -len(t) :].sum() for r, t in enumerate(tails)])


def prompt_log_probs_and_cache(
    model: Any, head: list[int], cache_kw: str, kept: Any = None, n: int = 0
) -> tuple[Any, Any]:
    """(log-probabilities of the token after `head`, the KV cache of `head`): one pass over the prompt
    (over its tokens after the first `n` where `kept` caches those) that every continuation scored by
    `tail_log_probs` extends. Differentiable outside inference mode."""
    import torch

    rest = torch.tensor([head[n:]], device=model.device)
    reused = {cache_kw: kept, "position_ids": torch.arange(n, len(head), device=model.device)[None]} if n else {}
    out = model(input_ids=rest, use_cache=True, logits_to_keep=1, **reused)
    cache = getattr(out, "cache", None)
    return torch.log_softmax(out.logits[0, -1].float(), dim=-1), out.past_key_values if cache is None else cache


def tail_log_probs(
    model: Any, cache: Any, cache_kw: str, first_lp: Any, head_len: int, tails: list[list[int]], pad: int
) -> Any:
    """A tensor of each tail's log-probability (summed over its tokens) after a prompt of `head_len`
    tokens whose KV `cache` and next-token log-probabilities `first_lp` are given: the tails right-padded
    in one batched pass over the cache, which this extends (pass a copy to reuse it). Differentiable
    outside inference mode, so a policy over scored texts trains on the scores it is served with
    (`train/value_grpo.py`)."""
    import torch

    device, width = model.device, max(len(t) for t in tails)
    ids = torch.tensor([t + [pad] * (width - len(t)) for t in tails], device=device)
    mask = torch.tensor([[1] * (head_len + len(t)) + [0] * (width - len(t)) for t in tails], device=device)
    positions = torch.arange(head_len, head_len + width, device=device).expand(len(tails), -1)
    cache.batch_repeat_interleave(len(tails))
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, **{cache_kw: cache}, use_cache=True)
    token_lp = torch.log_softmax(logits.logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.stack([first_lp[t[0]] + token_lp[r, : len(t) - 1].sum() for r, t in enumerate(tails)])


def choice_trie(
    spellings: list[list[int]], eos: int, penalties: Sequence[float] | None = None
) -> tuple[dict[int, dict], dict[tuple[int, ...], int], dict[tuple[int, ...], float]]:
    """The token trie of constrained decoding over the choices' token ids, each path closed by `eos`:
    (the trie, {token ids: the first choice spelled so}, {token path: the smallest penalty of the
    choices through it}). An empty spelling, or one an earlier choice has, adds nothing."""
    trie: dict[int, dict] = {}
    index: dict[tuple[int, ...], int] = {}
    least: dict[tuple[int, ...], float] = {}
    for i, ids in enumerate(spellings):
        if tuple(ids) in index or not ids:
            continue
        index[tuple(ids)] = i
        node = trie
        path = [*ids, eos]
        for k, token in enumerate(path):
            node = node.setdefault(token, {})
            key = tuple(path[: k + 1])
            least[key] = min(least.get(key, math.inf), float(penalties[i]) if penalties else 0.0)
    if not index:
        raise RIRError("constrained decoding needs at least one non-empty choice")
    return trie, index, least


def load_transformers_backend(
    model_name_or_path: str,
    dtype: Any = "auto",
    device: str | None = None,
    max_batch_size: int = 16,
    num_threads: int | None = None,
) -> TransformersBackend:
    """A `TransformersBackend` over a registered model, a local folder or a hub id (see `registry.py`)."""
    from rir_runtime.llm.registry import check_name, load_model_and_tokenizer

    check_name(model_name_or_path)  # a typo fails before torch is imported
    set_num_threads(num_threads)
    device = device or default_device()
    model, tokenizer = load_model_and_tokenizer(model_name_or_path, dtype=dtype, device=device)
    return TransformersBackend(model, tokenizer, f"transformers:{model_name_or_path}", device, max_batch_size)
