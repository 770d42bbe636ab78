"""Forward passes over prompt prefixes kept in a pool: many prompts scored or continued in one batch.

An agent's prompts along a branch, and its siblings' restored from one checkpoint, begin alike; the
pool (`kv_pool.py`) keeps each prompt's KV cache, and a row of a batch computes only the tokens the pool
does not hold. The rows' pooled prefixes differ in length, so their caches are left-padded to the
longest and a 4-D attention mask hides the padding (a padding query sees only itself). Afterwards each
row's prompt cache goes back to the pool, for the next step of the same branch or a sibling.

- Scoring (`score_trees`): ranking an agent's admissible actions asks the log-likelihood of each after
  one prompt. The actions share their first tokens ("Action: take the ..."), so they are laid out as a
  token tree after the prompt, one node per distinct (parent, token): 46 nodes for the 98 tokens of 19
  TextWorld actions. The mask lets a node see the prompt and its own ancestors only, and its position is
  the prompt's length plus its depth, so each node computes exactly what it would at the end of its own
  sequence (0.16 s against 0.59 s for those 19 actions after a 600-token prompt, SmolLM2-135M, 2-core
  CPU, against a batch of whole continuations over copies of the prompt's cache).
- Generation (`generate_rows`): the prompts' first pass is the same; then one token a step for every row
  still going, greedy or sampled, until an end-of-text token, a stop string or the token limit. On a CPU
  a decoding step costs about the same for eight rows as for one, so branches that decode together
  decode nearly for the price of one.

Only the hidden states of positions that predict a token (a prompt's last token, a node with children)
go through the output head: it is a fifth of the 135M model's weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rir_runtime.llm.kv_pool import Layers, PrefixPool


@dataclass(frozen=True)
class TokenTree:
    """Continuations as a trie of tokens: node i is `tokens[i]` after its parent node (-1: the prompt)."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]  # 1 for a continuation's first token
    paths: tuple[tuple[int, ...], ...]  # continuation c's nodes, first to last

    @classmethod
    def of(cls, tails: list[list[int]]) -> TokenTree:
        tokens: list[int] = []
        parents: list[int] = []
        depths: list[int] = []
        index: dict[tuple[int, int], int] = {}
        paths = []
        for tail in tails:
            node, path = -1, []
            for token in tail:
                key = (node, token)
                if key not in index:
                    index[key] = len(tokens)
                    tokens.append(token)
                    parents.append(node)
                    depths.append(depths[node] + 1 if node >= 0 else 1)
                node = index[key]
                path.append(node)
            paths.append(tuple(path))
        return cls(tuple(tokens), tuple(parents), tuple(depths), tuple(paths))

    @property
    def inner(self) -> list[int]:
        """Nodes with children: their logits score the next token."""
        return sorted({p for p in self.parents if p >= 0})

    def sees(self) -> list[list[int]]:
        """For each node, the nodes it attends to: its ancestors and itself."""
        out = []
        for node in range(len(self.tokens)):
            chain = []
            while node >= 0:
                chain.append(node)
                node = self.parents[node]
            out.append(chain)
        return out

    def scores(self, first: Any, inner: dict[int, Any]) -> list[float]:
        """Each continuation's summed log-probability, from the prompt's next-token log-probabilities
        `first` and those after each inner node."""
        out = []
        for path in self.paths:
            total = first[self.tokens[path[0]]]
            for before, node in zip(path, path[1:], strict=False):
                total = total + inner[before][self.tokens[node]]
            out.append(float(total))
        return out


@dataclass
class _Row:
    head: list[int]
    tree: TokenTree
    kept: Layers | None
    n: int  # prompt tokens taken from the pool
    every_node: bool = False  # the logits after every tree node (a decoding hint), not only inner ones

    @property
    def rest(self) -> list[int]:
        return self.head[self.n :]

    @property
    def width(self) -> int:
        return len(self.rest) + len(self.tree.tokens)


@dataclass
class _Pass:
    """A first forward pass over rows: the batch's cache, its prompt-cache width, and the logits after each
    row's prompt and after its tree's nodes (inner ones; every one for a decoding hint)."""

    cache: Any
    cached: int  # the pooled prefixes' padded length: a row's keys start at cached - n
    first: Any  # [rows, vocab]
    inner: list[dict[int, Any]]


EMPTY = TokenTree((), (), (), ())


def score_trees(
    model: Any, pool: PrefixPool, heads: list[list[int]], trees: list[TokenTree], pad: int, max_rows: int = 16
) -> list[list[float]]:
    """Each tree's continuation scores after its prompt, in forward passes of up to `max_rows` rows of
    similar width (sorted, so that short rows do not pad to long ones); the prompts' caches are kept in
    `pool`. Every head needs at least one token."""
    rows = _rows(pool, heads, trees)
    out: list[list[float]] = [[] for _ in rows]
    for chunk in _chunks(rows, max_rows):
        done = _first_pass([rows[i] for i in chunk], model, pool, pad)
        for b, i in enumerate(chunk):
            inner = {node: _log_probs(logits) for node, logits in done.inner[b].items()}
            out[i] = rows[i].tree.scores(_log_probs(done.first[b]), inner)
    return out


def generate_rows(
    model: Any,
    pool: PrefixPool,
    heads: list[list[int]],
    pad: int,
    stopped: Callable[[list[int]], bool],
    max_new_tokens: int,
    temperature: float = 0.0,
    max_rows: int = 16,
    hints: list[TokenTree] | None = None,
) -> list[list[int]]:
    """Each prompt's new tokens: greedy (or sampled at `temperature`), until `stopped(tokens)` says the row
    is done (an end-of-text token, a stop string) or `max_new_tokens`; a done row leaves the batch.

    A greedy row's `hints` (the replies it is likely to give, as a token tree: an agent's admissible
    actions) go into the first pass: decoding follows the tree while the model's greedy choice stays in
    it, every node's next token read off that one pass, and goes on token by token where it leaves. Each
    node computes what it would at the end of its own sequence, so the reply is greedy decoding's exactly;
    an agent that answers with an admissible action needs one pass instead of one a token."""
    greedy = temperature <= 0
    trees = [h if greedy else EMPTY for h in hints] if hints else [EMPTY] * len(heads)
    rows = _rows(pool, heads, trees)
    for row in rows:
        row.every_node = True
    out: list[list[int]] = [[] for _ in rows]
    for chunk in _chunks(rows, max_rows):
        first = _first_pass([rows[i] for i in chunk], model, pool, pad)
        paths: dict[int, list[int]] = {}  # batch row -> the tree nodes its reply took
        pending: dict[int, int] = {}  # batch row -> its reply's last token, not yet through the model
        for b, i in enumerate(chunk):
            path, token = _follow(
                rows[i].tree, first.first[b], first.inner[b], temperature, out[i], stopped, max_new_tokens
            )
            if token is not None:
                paths[b], pending[b] = path, token
        if pending:
            _decode(
                model, first, [rows[i] for i in chunk], chunk, paths, pending, out, stopped, max_new_tokens, temperature
            )
    return out


def _follow(
    tree: TokenTree,
    first: Any,
    after: dict[int, Any],
    temperature: float,
    tokens: list[int],
    stopped: Callable[[list[int]], bool],
    limit: int,
) -> tuple[list[int], int | None]:
    """Append a row's reply as far as its first pass tells: the first token, then down the tree while the
    greedy choice is a child. (the nodes taken, the last token appended that the model has not read);
    that token is None when the reply stopped or reached `limit` tokens."""
    children = {(p, t): node for node, (p, t) in enumerate(zip(tree.parents, tree.tokens, strict=True))}
    path: list[int] = []
    token = int(_pick(first[None], temperature)[0])
    while True:
        tokens.append(token)
        if stopped(tokens) or len(tokens) >= limit:
            return path, None
        node = children.get((path[-1] if path else -1, token))
        if node is None or node not in after:
            return path, token
        path.append(node)
        token = int(after[node].argmax())


def _decode(
    model: Any,
    first: _Pass,
    rows: list[_Row],
    chunk: list[int],
    paths: dict[int, list[int]],
    pending: dict[int, int],
    out: list[list[int]],
    stopped: Callable[[list[int]], bool],
    max_new_tokens: int,
    temperature: float,
) -> None:
    """Token-by-token decoding of the rows still going, from their prompts and the tree nodes they took."""
    import torch

    live = sorted(pending)
    cache, real = _continuing_cache(first, rows, live, paths)
    position = torch.tensor([rows[b].n + len(rows[b].rest) + len(paths[b]) for b in live])
    tokens = torch.tensor([pending[b] for b in live])
    while True:
        real = torch.cat([real, torch.ones(len(live), 1, dtype=torch.bool)], dim=1)
        step = model(
            input_ids=tokens[:, None].to(model.device),
            attention_mask=_model_mask(real[:, None, None, :], model).to(model.device),
            position_ids=position[:, None].to(model.device),
            use_cache=True,
            logits_to_keep=1,
            **{_cache_kw(model): cache},
        )
        tokens = _pick(step.logits[:, -1].float(), temperature)
        going = []
        for k, (b, token) in enumerate(zip(live, tokens.tolist(), strict=True)):
            out[chunk[b]].append(token)
            if not stopped(out[chunk[b]]) and len(out[chunk[b]]) < max_new_tokens:
                going.append(k)
        if not going:
            return
        if len(going) < len(live):
            keep = torch.tensor(going)
            cache.batch_select_indices(keep)
            real, position, tokens = real[keep], position[keep], tokens[keep]
            live = [live[k] for k in going]
        position = position + 1


def _continuing_cache(first: _Pass, rows: list[_Row], live: list[int], paths: dict[int, list[int]]) -> tuple[Any, Any]:
    """The live rows' keys (the prompt, then the tree nodes the reply took) gathered out of the first pass's
    cache and left-padded to one length: (the cache, which key positions are real)."""
    import torch

    spans = []
    for b in live:
        row, start = rows[b], first.cached - rows[b].n
        prompt = list(range(start, first.cached + len(row.rest)))
        spans.append(prompt + [first.cached + len(row.rest) + node for node in paths[b]])
    width = max(map(len, spans))
    real = torch.zeros(len(live), width, dtype=torch.bool)
    for k, span in enumerate(spans):
        real[k, width - len(span) :] = True
    index = [torch.tensor(span, device=first.first.device) for span in spans]

    def rows_of(layer: Any) -> list[tuple[Any, Any]]:
        return [(layer.keys[b : b + 1].index_select(2, i), layer.values[b : b + 1].index_select(2, i))
                for b, i in zip(live, index, strict=True)]  # fmt: skip

    return _left_padded([rows_of(layer) for layer in first.cache.layers], width), real


def _pick(logits: Any, temperature: float) -> Any:
    """The next token of each row: the likeliest, or drawn at `temperature`."""
    import torch

    if temperature <= 0:
        return logits.argmax(dim=-1)
    return torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1)[:, 0]


def _log_probs(logits: Any) -> Any:
    import torch

    return torch.log_softmax(logits, dim=-1)


def _rows(pool: PrefixPool, heads: list[list[int]], trees: list[TokenTree]) -> list[_Row]:
    rows = []
    for head, tree in zip(heads, trees, strict=True):
        kept, n = pool.longest(head[:-1])  # the last prompt token is always computed: it scores first tokens
        rows.append(_Row(head, tree, kept, n))
    return rows


def _chunks(rows: list[_Row], max_rows: int) -> list[list[int]]:
    """Row indices in batches of up to `max_rows`, sorted by width so that short rows pad little."""
    order = sorted(range(len(rows)), key=lambda i: rows[i].width)
    step = max(1, max_rows)
    return [order[start : start + step] for start in range(0, len(order), step)]


def _first_pass(rows: list[_Row], model: Any, pool: PrefixPool, pad: int) -> _Pass:
    """One padded forward pass over the rows' uncached prompt tokens and trees; their prompts' caches go
    back to the pool."""
    import torch

    width = max(row.width for row in rows)
    cached = max(r.n for r in rows)
    device = model.device
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    allow = torch.zeros((len(rows), 1, width, cached + width), dtype=torch.bool)
    for b, row in enumerate(rows):
        r, m = len(row.rest), len(row.tree.tokens)
        ids[b, :r] = torch.tensor(row.rest)
        ids[b, r : r + m] = torch.tensor(row.tree.tokens, dtype=torch.long)
        positions[b, :r] = torch.arange(row.n, row.n + r)
        positions[b, r : r + m] = row.n + r - 1 + torch.tensor(row.tree.depths, dtype=torch.long)
        positions[b, r + m :] = row.n + r
        allow[b, 0, : r + m, cached - row.n : cached] = True  # the pooled prefix
        allow[b, 0, :r, cached : cached + r] = torch.ones(r, r, dtype=torch.bool).tril()
        allow[b, 0, r : r + m, cached : cached + r] = True  # every node sees the whole prompt
        for node, seen in enumerate(row.tree.sees()):
            allow[b, 0, r + node, [cached + r + s for s in seen]] = True
        for q in range(r + m, width):  # padding sees itself, so no query row is empty
            allow[b, 0, q, cached + q] = True
    cache = _batched_cache(rows, cached, model)
    decoder = model.get_decoder()
    hidden = decoder(
        input_ids=ids.to(device),
        attention_mask=_model_mask(allow, model).to(device),
        position_ids=positions.to(device),
        use_cache=True,
        **{_cache_kw(decoder): cache},
    ).last_hidden_state
    picks = []  # (row, position) of each prompt's last token and each tree's inner nodes (or every node)
    for b, row in enumerate(rows):
        r = len(row.rest)
        picks += [(b, r - 1)] + [(b, r + node) for node in _picked(row)]
    index_b = torch.tensor([b for b, _ in picks], device=device)
    index_q = torch.tensor([q for _, q in picks], device=device)
    logits = model.get_output_embeddings()(hidden[index_b, index_q]).float()
    firsts, inner, k = [], [], 0
    for b, row in enumerate(rows):
        nodes = _picked(row)
        firsts.append(logits[k])
        inner.append(dict(zip(nodes, logits[k + 1 : k + 1 + len(nodes)], strict=True)))
        k += 1 + len(nodes)
        span = slice(cached - row.n, cached + len(row.rest))  # the prompt's own entries, adjacent in the cache
        pool.keep(row.head, [(layer.keys[b : b + 1, :, span].clone(), layer.values[b : b + 1, :, span].clone())
                             for layer in cache.layers])  # fmt: skip
        pool.count(row.n, len(row.rest))
    return _Pass(cache, cached, torch.stack(firsts), inner)


def _picked(row: _Row) -> list[int]:
    return list(range(len(row.tree.tokens))) if row.every_node else row.tree.inner


def _batched_cache(rows: list[_Row], cached: int, model: Any) -> Any:
    """The rows' pooled prefixes as one cache, each left-padded with zeros to `cached` tokens."""
    from transformers.cache_utils import DynamicCache

    if cached == 0:
        return DynamicCache(config=model.config)
    if len(rows) == 1 and rows[0].kept is not None:  # one row: its kept views as they are (never written to)
        return DynamicCache(ddp_cache_data=rows[0].kept)
    sample = next(r.kept for r in rows if r.kept)
    empty = [(k[:, :, :0], v[:, :, :0]) for k, v in sample]  # a row with nothing pooled: all padding
    per_layer = [[(row.kept or empty)[i] for row in rows] for i in range(len(sample))]
    return _left_padded(per_layer, cached)


def _left_padded(layers: list[list[tuple[Any, Any]]], width: int) -> Any:
    """A cache from each layer's per-row (keys, values) of up to `width` tokens, each row left-padded with
    zeros to `width` (the mask hides the padding)."""
    import torch
    from transformers.cache_utils import DynamicCache

    def pad(t: Any) -> Any:
        return torch.cat([t.new_zeros(1, t.shape[1], width - t.shape[2], t.shape[3]), t], dim=2)

    return DynamicCache(
        ddp_cache_data=[(torch.cat([pad(k) for k, _ in rows]), torch.cat([pad(v) for _, v in rows])) for rows in layers]
    )


def _model_mask(allow: Any, model: Any) -> Any:
    """The 4-D mask as the model's attention takes it: booleans for SDPA, an additive float mask else."""
    import torch

    if getattr(model.config, "_attn_implementation", "sdpa") == "sdpa":
        return allow
    dtype = model.dtype
    return torch.zeros(allow.shape, dtype=dtype).masked_fill(~allow, torch.finfo(dtype).min)


def _cache_kw(module: Any) -> str:
    """transformers 5.x renamed `past_key_values` to `cache`."""
    import inspect

    inner = module.get_base_model() if hasattr(module, "get_base_model") else module  # PEFT
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"
