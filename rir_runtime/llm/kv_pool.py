"""Kept KV caches of past prompts, found again by the longest token prefix a new prompt shares with one.

An agent's prompt only grows along a branch (the history gains a line, then the new observation and
the valid actions follow), and branches restored from one checkpoint share the history up to it. So
most of a prompt was computed before: for the shipped agent's continuations on TextWorld, 68% of the
prompt tokens of a valued decision had been read by an earlier call. The pool keeps each prompt's
cache and hands the next call the longest shared prefix, which that call extends instead of
recomputing. A kept prompt that is a prefix of a newer one is dropped: the newer one serves it.

A layer's cache is a (keys, values) pair of tensors shaped [1, heads, tokens, dim]. The pool hands out
views cut to the shared length; the model's cache update concatenates into new tensors, so a kept
entry is never written to.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

Layers = list[tuple[Any, Any]]  # per layer: (keys, values), each [1, heads, tokens, dim]

DEFAULT_POOL_TOKENS = 16384  # ~0.75 GB for SmolLM2-135M in float32 (46 kB a token)


def shared_length(a: Any, b: Any) -> int:
    """How many leading tokens two 1-D id tensors share."""
    m = min(len(a), len(b))
    differ = (a[:m] != b[:m]).nonzero()
    return int(differ[0]) if len(differ) else m


class PrefixPool:
    """Least-recently-used kept caches, bounded by their total token count; safe across threads."""

    def __init__(self, max_tokens: int = DEFAULT_POOL_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], tuple[Any, Layers]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self.reused_tokens = 0  # prompt tokens served from the pool instead of computed, for benchmarks
        self.computed_tokens = 0  # prompt tokens computed by calls that consulted the pool

    def longest(self, ids: list[int]) -> tuple[Layers | None, int]:
        """(the kept cache cut to the longest prefix `ids` shares with a kept prompt, that length);
        (None, 0) when nothing is shared or the pool is off."""
        import torch

        if self.max_tokens <= 0 or not ids:
            return None, 0
        query = torch.tensor(ids)
        with self._lock:
            best, best_n = None, 0
            for key, (kept_ids, _) in self._entries.items():
                n = shared_length(kept_ids, query)
                if n > best_n:
                    best, best_n = key, n
            if best is None:
                return None, 0
            self._entries.move_to_end(best)
            layers = self._entries[best][1]
        return [(k[:, :, :best_n], v[:, :, :best_n]) for k, v in layers], best_n

    def keep(self, ids: list[int], layers: Layers) -> None:
        """Keep the cache of prompt `ids` (its layers cover exactly those tokens)."""
        import torch

        if self.max_tokens <= 0 or not ids or len(ids) > self.max_tokens:
            return
        key, tensor = tuple(ids), torch.tensor(ids)
        with self._lock:
            for old in [k for k in self._entries if len(k) <= len(key) and key[: len(k)] == k]:
                self._tokens -= len(old)
                del self._entries[old]
            self._entries[key] = (tensor, layers)
            self._tokens += len(key)
            while self._tokens > self.max_tokens:
                old, _ = self._entries.popitem(last=False)
                self._tokens -= len(old)

    def count(self, reused: int, computed: int) -> None:
        with self._lock:
            self.reused_tokens += reused
            self.computed_tokens += computed

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)
