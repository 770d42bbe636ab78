"""Model registry and backends, on tiny-random-llama (seconds) plus one packaged-model integration test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rir_runtime.errors import ModelLoadError, UserInputError
from rir_runtime.llm import (
    Completion,
    OpenAIBackend,
    TransformersBackend,
    list_models,
    load_model_and_tokenizer,
    load_transformers_backend,
    make_backend,
    prepare_model,
    resolve_model,
    truncate_at_stop,
)
from tests.factories import ChatHandler, chat_server

TINY = "tiny-random-llama"
PROMPTS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Go north, then open the door."}],
    "a raw string prompt of middling length",
]


@pytest.fixture(scope="module")
def tiny() -> TransformersBackend:
    return load_transformers_backend(TINY, max_batch_size=8)


def test_tiny_builds_saves_and_reloads(tmp_path: Path) -> None:
    folder = prepare_model(TINY)
    marker = json.loads((folder / "rir_prepared.json").read_text())
    assert "model.safetensors" in marker["files"]
    model, tok = load_model_and_tokenizer(TINY)
    text = tok.apply_chat_template(PROMPTS[1], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert tok.decode(tok("héllo wörld ✓")["input_ids"]) == "héllo wörld ✓"
    model.save_pretrained(tmp_path / "copy")
    tok.save_pretrained(tmp_path / "copy")
    again, tok2 = load_model_and_tokenizer(str(tmp_path / "copy"))
    assert resolve_model(str(tmp_path / "copy")).kind == "folder"
    assert all((a == b).all() for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
    assert tok2.chat_template == tok.chat_template
    assert (TINY, "tiny") in [(m.name, m.kind) for m in list_models()]


def test_batched_generation_equals_single(tiny: TransformersBackend) -> None:
    batched = tiny.generate(PROMPTS, max_new_tokens=12)
    single = [tiny.generate([p], max_new_tokens=12)[0] for p in PROMPTS]
    assert batched == single
    assert len({c.prompt_tokens for c in batched}) == 3  # different lengths really were padded
    assert all(c.prompt_tokens > 0 and c.completion_tokens > 0 for c in batched)


def test_stop_strings_truncate(tiny: TransformersBackend) -> None:
    full = tiny.generate(PROMPTS, max_new_tokens=16)
    # a random model's text is junk, mostly non-ASCII bytes: take a stop character from any row that has one
    row, stop = next((i, ch) for i, f in enumerate(full) for ch in f.text[1:-2] if ch.isascii() and ch.isalnum())
    cut = tiny.generate(PROMPTS, max_new_tokens=16, stop=[stop, "never"])  # batched: early rows get padded
    for c, f in zip(cut, full, strict=True):
        assert c.text == truncate_at_stop(f.text, [stop])
    assert cut[row].completion_tokens < full[row].completion_tokens  # generation itself stopped, pads not counted
    assert truncate_at_stop("a\nb. c", ["x", ".", "\n"]) == "a"


def test_batched_stop_counts_the_tokens_it_counts_alone_when_pad_is_eos() -> None:
    """SmolLM2's pad token is its EOS: the padding after a row that a stop string ended is no EOS."""
    model, tok = load_model_and_tokenizer(TINY)
    tok.pad_token = tok.eos_token
    backend = TransformersBackend(model, tok, "transformers:tiny-pad-is-eos", max_batch_size=8)
    full = backend.generate(PROMPTS, max_new_tokens=16)
    # the first character of a row's reply that is not in the longest row's reply: that row stops on it early
    longest = max(full, key=lambda c: c.completion_tokens).text
    stop = next(ch for c in full for ch in c.text[1:-1] if ch.isascii() and ch.isprintable() and ch not in longest)
    batched = backend.generate(PROMPTS, max_new_tokens=16, stop=[stop])
    alone = [backend.generate([p], max_new_tokens=16, stop=[stop])[0] for p in PROMPTS]
    assert min(c.completion_tokens for c in batched) < max(c.completion_tokens for c in batched)  # padding happened
    assert batched == alone


def test_score_ranks_and_matches_single(tiny: TransformersBackend) -> None:
    prompt = PROMPTS[1]
    conts = ["Action: go north", "Action: open door now please", "x"]
    batched = tiny.score(prompt, conts)
    single = [tiny.score(prompt, [c])[0] for c in conts]
    assert batched == pytest.approx(single, abs=1e-3)
    assert tiny.pooled  # the pooled path passed its check against the plain one
    tails = [tiny.tokenizer(c, add_special_tokens=False)["input_ids"] for c in conts]
    assert batched == pytest.approx(tiny._score_plain(tiny._encode(prompt), tails), abs=1e-3)
    assert all(s < 0 for s in batched)
    assert batched[1] < batched[0]  # more tokens of a random model: lower likelihood
    # reference: one unpadded full-logits forward pass per continuation
    import torch

    head = tiny._encode(prompt)
    for cont, got in zip(conts, batched, strict=True):
        tail = tiny.tokenizer(cont, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(tiny.model(torch.tensor([head + tail])).logits[0].float(), -1)
        ref = sum(float(logp[len(head) + k - 1, t]) for k, t in enumerate(tail))
        assert got == pytest.approx(ref, abs=1e-3)


def test_choose_spells_only_a_choice_and_follows_the_greedy_path(tiny: TransformersBackend) -> None:
    import torch

    prompt = PROMPTS[1]
    # a shared prefix, a choice that is a prefix of another, and junk the random model might prefer
    choices = ["go north", "go north east", "open door", "take key", "go north"]
    best, completion = tiny.choose(prompt, choices)
    assert completion.text == choices[best] and best != 4  # a duplicate keeps its first index
    tokens = tiny.tokenizer(choices[best], add_special_tokens=False)["input_ids"]
    assert completion.completion_tokens == len(tokens) + 1  # the choice, then EOS
    # the trie's greedy path: at every step the best-scoring token among those that continue a choice
    head, path = tiny._encode(prompt), []
    eos = tiny.tokenizer.eos_token_id
    spelled = [tiny.tokenizer(c, add_special_tokens=False)["input_ids"] + [eos] for c in choices]
    while not path or path[-1] != eos:
        allowed = {s[len(path)] for s in spelled if s[: len(path)] == path and len(s) > len(path)}
        with torch.no_grad():
            logits = tiny.model(torch.tensor([head + path])).logits[0, -1]
        path.append(max(allowed, key=lambda t: float(logits[t])))
    assert path[:-1] == tokens
    only, _ = tiny.choose(prompt, ["a phrase the random model would never write"])
    assert only == 0


def test_a_begun_assistant_reply_is_continued_and_a_structured_reflection_parses(tiny: TransformersBackend) -> None:
    from rir_runtime.decisions import parse
    from rir_runtime.envs.checkpoints import Step
    from rir_runtime.prompts import DecisionContext
    from rir_runtime.structured import fill_reflection

    begun = [*PROMPTS[0], {"role": "assistant", "content": '{"failure": {"condition": "'}]
    assert tiny.tokenizer.decode(tiny._encode(begun)).endswith('<|im_start|>assistant\n{"failure": {"condition": "')
    steps = (Step(0, "take key", "Taken.", 0.0), Step(1, "eat key", "You can't.", 0.0))
    ctx = DecisionContext(
        task="t", objective="Open the door.", memory="", history=steps, observation="x", score=0.0, restore_point=1
    )
    decision = fill_reflection(tiny, PROMPTS[1], ctx)  # a random model's junk, inside a skeleton
    assert parse("reflect", decision.raw) == decision.value and decision.value.failure.action == "eat key"


def test_many_prompts_scored_over_pooled_prefixes_match_each_scored_alone(tiny: TransformersBackend) -> None:
    """Prompts that extend earlier ones (an agent's steps along a branch, siblings from one checkpoint) start
    from the pool's prefix of different lengths in one padded batch; each scores what it scores alone."""
    plain = TransformersBackend(tiny.model, tiny.tokenizer, "plain", kv_pool_tokens=0)
    plain.pooled = False  # the prompt computed whole, its cache repeated over the continuations
    room = [{"role": "user", "content": "You are in the kitchen. " * 4}]
    actions = ["Action: take apple", "Action: take pear", "Action: look", "Action: look around", "x"]
    first = [(room, actions), ([{"role": "user", "content": "Elsewhere."}], ["a", "ab"])]
    later = [([{**room[0], "content": room[0]["content"] + f"Step {i}."}], actions[: 2 + i]) for i in range(3)]
    tiny.forget_prefixes()
    got = tiny.score_many(first) + tiny.score_many([*later, first[1]])
    want = [plain.score(p, c) for p, c in [*first, *later, first[1]]]
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=1e-3)
    assert tiny.pooled and tiny.reused_tokens > 0
    computed = tiny.pool.computed_tokens
    assert tiny.score_many(later) == got[2:5] and tiny.pool.computed_tokens == computed  # asked again: remembered


@pytest.mark.parametrize("stop", [None, ["\n"], ["e"]])
def test_pooled_generation_decodes_what_transformers_generate_does(tiny: TransformersBackend, stop) -> None:
    """Rows of different lengths decode together over pooled prompts; each gets what `generate` gives it."""
    plain = TransformersBackend(tiny.model, tiny.tokenizer, "plain", kv_pool_tokens=0)
    plain.pooled = False  # transformers' own generate
    prompts = [PROMPTS[0], PROMPTS[1], "raw text", [{"role": "user", "content": "The kitchen. " * 6}]]
    tiny.forget_prefixes()
    first = tiny.generate(prompts, max_new_tokens=12, stop=stop)
    again = tiny.generate(prompts[::-1], max_new_tokens=12, stop=stop)[::-1]  # now from the pool
    want = plain.generate(prompts, max_new_tokens=12, stop=stop)
    assert first == want and again == want
    assert tiny.pooled and tiny.reused_tokens > 0


def test_a_reply_decoded_along_its_hints_is_greedy_decodings_own(
    tiny: TransformersBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hints that hold the greedy reply decode it in the first pass; hints it leaves decode the rest token
    by token; either way the tokens are greedy decoding's."""
    from rir_runtime.llm import pooled

    head = tiny._encode(PROMPTS[1])
    eos = tiny._eos_ids()

    def run(hints: list[list[list[int]]] | None) -> list[list[int]]:
        trees = [pooled.TokenTree.of(h) for h in hints] if hints else None
        stopped = lambda tokens: tokens[-1] in eos  # noqa: E731
        with torch.inference_mode():
            return pooled.generate_rows(
                tiny.model, pooled.PrefixPool(0), [head, head[:-3]], 0, stopped, 10, 0.0, 4, trees
            )

    want = run(None)
    decoded: list[int] = []
    step = pooled._decode
    monkeypatch.setattr(pooled, "_decode", lambda *a: decoded.append(len(a[5])) or step(*a))
    assert run([[want[0], want[0][:3] + [7]], [[5, 6]]]) == want  # row 0: in the tree; row 1: off it at once
    assert decoded == [1]  # only row 1 decoded token by token
    decoded.clear()
    assert run([[want[0][:4] + [9]], [want[1]]]) == want and decoded == [1]  # row 0 leaves after 4 tokens


def test_a_model_the_token_tree_does_not_fit_is_scored_the_plain_way(monkeypatch: pytest.MonkeyPatch) -> None:
    from rir_runtime.llm import backends

    backend = make_backend("tiny-random-llama")
    assert isinstance(backend, TransformersBackend)
    monkeypatch.setattr(backends, "score_trees", lambda *args: [[0.0, 0.0]])  # disagrees with the plain path
    got = backend.score(PROMPTS[0], ["yes", "no"])
    assert not backend.pooled and len(backend.pool) == 0
    plain = TransformersBackend(backend.model, backend.tokenizer, "plain", kv_pool_tokens=0)
    plain.pooled = False
    assert got == pytest.approx(plain.score(PROMPTS[0], ["yes", "no"]), abs=1e-4)
    assert backend.score(PROMPTS[0], ["yes", "no"]) == got


def test_a_structured_reflection_reuses_its_prompt_cache_and_writes_the_same_reply(tiny: TransformersBackend) -> None:
    """Its passes re-read one prompt: the shared tokens come from the kept KV caches (the pool), and every
    pass (generated and ranked) gives what recomputing the prompt gives."""
    from rir_runtime.envs.checkpoints import Step
    from rir_runtime.prompts import DecisionContext
    from rir_runtime.structured import fill_reflection

    steps = tuple(Step(i, f"go to room {i}", f"You are in room {i}.", 0.0) for i in range(6))
    ctx = DecisionContext(
        task="t", objective="Find the key.", memory="", history=steps, observation="x", score=0.0, restore_point=2
    )
    plain = TransformersBackend(tiny.model, tiny.tokenizer, "plain", kv_pool_tokens=0)  # every pass from scratch
    recomputed = fill_reflection(plain, PROMPTS[1], ctx)
    tiny.forget_prefixes()
    before = tiny.reused_tokens
    reused = fill_reflection(tiny, PROMPTS[1], ctx)
    assert reused.raw == recomputed.raw and reused.meta["passes"] == recomputed.meta["passes"] == 4
    prompt = len(tiny._encode(PROMPTS[1]))
    assert tiny.reused_tokens - before >= 3 * prompt  # passes 2-4 each skipped at least the prompt
    assert plain.reused_tokens == 0 and len(plain.pool) == 0
    other = tiny.generate([PROMPTS[0]], max_new_tokens=8)[0]  # shares little with the kept reflection
    assert other == plain.generate([PROMPTS[0]], max_new_tokens=8)[0]


class _Canned(ChatHandler):
    content = "Action: go north\nThought"
    seen: list[dict] = []

    def received(self, body: dict) -> None:
        _Canned.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})


def test_openai_backend_against_local_server(monkeypatch: pytest.MonkeyPatch) -> None:
    with chat_server(_Canned, monkeypatch) as url:
        backend = make_backend(f"openai:my/model@{url}")
        assert isinstance(backend, OpenAIBackend) and backend.base_url.endswith("/v1")
        out = backend.generate(PROMPTS[:2] * 2, max_new_tokens=8, stop=["\n"])
        assert out == [Completion("Action: go north", 17, 5)] * 4
        assert {s["path"] for s in _Canned.seen} == {"/v1/chat/completions"}
        assert _Canned.seen[0]["model"] == "my/model" and _Canned.seen[0]["auth"] == "Bearer sk-test"
        assert _Canned.seen[0]["stop"] == ["\n"] and _Canned.seen[0]["max_tokens"] == 8
        assert not backend.supports_scoring
        with pytest.raises(UserInputError, match="cannot score continuations.*generate mode"):
            backend.score(PROMPTS[0], ["a"])
        with pytest.raises(UserInputError, match="cannot constrain decoding.*generate mode"):
            backend.choose(PROMPTS[0], ["a"])


def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub reads HF_HUB_OFFLINE once at import, so patch the constant as well."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_unknown_model_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _offline(monkeypatch)
    with pytest.raises(ModelLoadError) as err:
        load_model_and_tokenizer("smollm2-135m-instruc")
    msg = str(err.value)
    assert "\n" not in msg and "neither a registered name" in msg and "smollm2-135m-instruct" in msg


def test_corrupt_cache_entry_is_reported_then_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIR_CACHE_DIR", str(tmp_path))
    folder = prepare_model(TINY)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a truncated download / full disk
    with pytest.raises(ModelLoadError, match="is corrupt .*rir models prepare tiny-random-llama"):
        load_model_and_tokenizer(TINY)
    assert prepare_model(TINY) == folder
    load_model_and_tokenizer(TINY)
    assert not list(tmp_path.glob("models/*.tmp-*"))


@pytest.mark.integration
def test_smollm2_prepares_unquantized_and_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    monkeypatch.setenv("RIR_CACHE_DIR", str(tmp_path))
    _offline(monkeypatch)
    prepare_model("smollm2-135m-instruct")
    model, tok = load_model_and_tokenizer("smollm2-135m-instruct")
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model, "is_quantized", False)
    assert not hasattr(model.config, "quantization_config") and tok.chat_template
    backend = load_transformers_backend("smollm2-135m-instruct")
    out = backend.generate([[{"role": "user", "content": "What is the capital of France?"}]], max_new_tokens=12)[0]
    assert "Paris" in out.text and out.completion_tokens > 0


def test_a_given_gguf_file_must_be_the_one_the_packages_ship(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rir models prepare NAME --gguf FILE` (an offline GPU node): the file stands in for the PyPI
    packages, is hashed as they would be, and a file of another name or a built model is refused."""
    from rir_runtime.llm.registry import MODELS, _gguf_source

    monkeypatch.setenv("RIR_CACHE_DIR", str(tmp_path))
    spec = MODELS["smollm2-135m-instruct"]
    wrong = tmp_path / "other.gguf"
    wrong.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match=f"prepared from a file named {spec.source}"):
        prepare_model("smollm2-135m-instruct", gguf=wrong)
    with pytest.raises(ModelLoadError, match="is built, not converted"):
        prepare_model(TINY, gguf=wrong)
    given = tmp_path / spec.source
    given.write_bytes(b"GGUF not really")
    path, facts = _gguf_source(spec, tmp_path, given)
    assert path == given and facts["source_size"] == 15 and facts["packages"] == {"given file": str(given)}
    assert len(facts["source_sha256"]) == 64


def test_the_pool_finds_the_longest_shared_prefix_drops_what_a_newer_prompt_covers_and_stays_in_bounds() -> None:
    from rir_runtime.llm.kv_pool import PrefixPool

    def layers(n: int) -> list:
        return [(torch.arange(n, dtype=torch.float32).reshape(1, 1, n, 1),) * 2]

    pool = PrefixPool(max_tokens=12)
    pool.keep([1, 2, 3], layers(3))
    pool.keep([1, 2, 3, 4, 5], layers(5))  # covers [1, 2, 3]: that one goes
    assert len(pool) == 1
    kept, n = pool.longest([1, 2, 3, 9])
    assert n == 3 and kept is not None and kept[0][0].shape[2] == 3  # cut to the shared length
    assert pool.longest([7, 8]) == (None, 0)
    pool.keep([6, 6, 6, 6, 6], layers(5))
    pool.keep([7, 7, 7, 7], layers(4))  # 14 tokens > 12: the least recently used goes
    assert pool.longest([1, 2])[1] == 0 and pool.longest([6, 6])[1] == 2 and len(pool) == 2
    assert PrefixPool(max_tokens=0).longest([1, 2]) == (None, 0)


def test_continuations_become_a_token_tree_that_shares_their_first_tokens() -> None:
    from rir_runtime.llm.pooled import TokenTree

    tree = TokenTree.of([[5, 6, 7], [5, 6, 8], [5, 9], [4]])
    assert tree.tokens == (5, 6, 7, 8, 9, 4) and tree.parents == (-1, 0, 1, 1, 0, -1)
    assert tree.depths == (1, 2, 3, 3, 2, 1) and tree.paths == ((0, 1, 2), (0, 1, 3), (0, 4), (5,))
    assert tree.inner == [0, 1] and tree.sees()[3] == [3, 1, 0]
    first = torch.zeros(10)
    first[5], first[4] = -1.0, -2.0
    after = {0: torch.full((10,), -0.5), 1: torch.full((10,), -0.25)}
    assert tree.scores(first, after) == [-1.75, -1.75, -1.5, -2.0]
