"""Seconds per valued decision behind the shipped LLM agent: what `oracle-agent` pays to ask the agent
"what happens if I restore here", before and after the branches were played together.

    python bench/branch_values.py                                   # TextWorld recipe1 dev 0-9, every setting
    python bench/branch_values.py --variations 0-3 --settings before,all

Runs the same `rir/oracle-agent` episodes of the shipped agent (`agents/smollm2-135m-small`, rank mode,
which generates where a state has more than 40 actions) once per setting:

- before: the code of `--before` (default 4f865a8, main before this bench existed), in a git worktree,
  as a subprocess: every option valued, one continuation at a time, every prompt computed whole, each
  continuation played to its cap;
- plain: this code with the pooled path off (every prompt computed whole, replies decoded token by
  token), no loop ends, one branch at a time: what the oracle's own search saves (it values continuing
  first, and restores latest first, stopping where one always wins);
- pooled: and prompts start from the longest kept prefix, actions are scored as one token tree, and a
  reply is decoded along the admissible actions in one pass (`llm/kv_pool.py`, `llm/pooled.py`);
- all: and a continuation that loops ends there (`values.looping`);
- lockstep: and `--width` continuations played together, their agent calls one batched forward.

The figures come from the episode records: a review is one When decision of the oracle (each values
continuing and, unless it always wins, the restores its Where needs), and the oracle's seconds are its
controller seconds, all of them valuation. Per setting: reviews, seconds per review, agent calls and
prompt tokens per review (continuations included; the episodes' own steps too, a small share), the agent's
prompt tokens read per second of valuation, the share of them taken from the pool, the batch sizes, and
how many episodes made every review, restore point and restore as under `before`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SETTINGS = ("before", "plain", "pooled", "all", "lockstep")
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Row:
    setting: str
    reviews: int = 0
    seconds: float = 0.0  # the oracle's valuation, all episodes
    successes: int = 0
    episodes: int = 0
    calls: int | None = None  # the agent's model calls, continuations included (in-process settings)
    tokens: int | None = None  # prompt tokens those calls read
    pooled: float | None = None  # share of prompt tokens served from the pool
    batches: list[int] = field(default_factory=list)
    decisions: dict[str, list[tuple]] = field(default_factory=dict)  # episode -> its reviews and restores


def eval_args(args: argparse.Namespace, out: Path) -> list[str]:
    return ["eval", "--env", args.env, "--tasks", args.tasks, "--split", args.split, "--variations", args.variations,
            "--policy", args.policy, "--policy_mode", "rank", "--methods", "rir", "--controller", "oracle-agent",
            "--budget_agent", args.budget_agent, "--budget_rollback", str(args.budget_rollback), "--workers", "1",
            "--out", str(out)]  # fmt: skip


def read_run(row: Row, out: Path) -> Row:
    for line in (out / "episodes.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "episode_id" not in record:
            continue
        events = [e for e in record["events"] if e["type"] in ("review", "locate", "restore")]
        kinds = [(e["type"], e.get("decision"), e.get("step"), e.get("to")) for e in events]
        row.decisions[record["episode_id"]] = kinds
        row.reviews += sum(e["type"] == "review" for e in events)
        row.seconds += record["controller_seconds"]
        row.successes += bool(record["success"])
        row.episodes += 1
    return row


# The editable install's import hook would find this checkout's packages first: drop it, then put the
# worktree's on the path; its agent's calls and prompt tokens are counted as `run_here` counts them.
OLD_CODE = """import json, sys
sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]
sys.path.insert(0, sys.argv[1])
import rir_runtime
assert rir_runtime.__file__.startswith(sys.argv[1]), rir_runtime.__file__
from rir_runtime.llm.backends import TransformersBackend as B
counts = {'calls': 0, 'tokens': 0}
def counted(method, prompts_of):
    def call(self, *args, **kwargs):
        prompts = prompts_of(*args)
        counts['calls'] += len(prompts)
        counts['tokens'] += sum(len(self._encode(p)) for p in prompts)
        return method(self, *args, **kwargs)
    return call
B.generate = counted(B.generate, lambda prompts: list(prompts))
B.score = counted(B.score, lambda prompt, continuations: [prompt])
from rir_runtime.cli import main
code = main(sys.argv[3:])
open(sys.argv[2], 'w').write(json.dumps(counts))
sys.exit(code)
"""


def run_before(args: argparse.Namespace, tmp: Path) -> Row:
    """The old code in a worktree, with this checkout's agents/ and caches."""
    tree = tmp / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.before], check=True)
    try:
        out, counts = tmp / "before-run", tmp / "before-counts.json"
        argv = [sys.executable, "-c", OLD_CODE, str(tree), str(counts), *eval_args(args, out)]
        subprocess.run(argv, cwd=ROOT, env=dict(os.environ), check=True)
        counted = json.loads(counts.read_text())
        return read_run(Row("before", calls=counted["calls"], tokens=counted["tokens"]), out)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


def run_here(setting: str, args: argparse.Namespace, tmp: Path) -> Row:
    """One setting of this code, in this process, its agent's calls and tokens counted."""
    from rir_runtime.cli import main as rir
    from rir_runtime.llm import backends
    from rir_runtime.llm.shared import forget_shared_backends, shared_backend

    forget_shared_backends()
    wrapped = shared_backend(args.policy.removeprefix("llm:"))
    model = wrapped.backend  # type: ignore[attr-defined]
    model.pooled = setting != "plain"
    model.pool.max_tokens = 0 if setting == "plain" else model.pool.max_tokens
    counts = {"calls": 0, "tokens": 0}
    score_many, generate = backends.TransformersBackend.score_many, backends.TransformersBackend.generate

    def count(self, prompts) -> None:  # type: ignore[no-untyped-def]
        counts["calls"] += len(prompts)
        counts["tokens"] += sum(len(self._encode(p)) for p in prompts)

    def counting_score_many(self, requests):  # type: ignore[no-untyped-def]
        count(self, [p for p, _ in requests])
        return score_many(self, requests)

    def counting_generate(self, prompts, **kwargs):  # type: ignore[no-untyped-def]
        count(self, prompts)
        return generate(self, prompts, **kwargs)

    backends.TransformersBackend.score_many = counting_score_many  # type: ignore[method-assign]
    backends.TransformersBackend.generate = counting_generate  # type: ignore[method-assign]
    out = tmp / setting
    width = args.width if setting == "lockstep" else 1
    loops = "3" if setting in ("all", "lockstep") else "0"
    try:
        rir([*eval_args(args, out), "--branch_width", str(width), "--loop_repeats", loops])
    finally:
        backends.TransformersBackend.score_many = score_many  # type: ignore[method-assign]
        backends.TransformersBackend.generate = generate  # type: ignore[method-assign]
    pool = model.pool
    served = pool.reused_tokens + pool.computed_tokens
    share = pool.reused_tokens / served if served else 0.0
    batches = list(wrapped.batches)  # type: ignore[attr-defined]
    return read_run(Row(setting, calls=counts["calls"], tokens=counts["tokens"], pooled=share, batches=batches), out)


def same_decisions(row: Row, reference: Row) -> str:
    same = sum(row.decisions.get(episode) == decisions for episode, decisions in reference.decisions.items())
    return f"{same} of {len(reference.decisions)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="llm:agents/smollm2-135m-small")
    parser.add_argument("--env", default="textworld-cooking")
    parser.add_argument("--tasks", default="recipe1")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--variations", default="0-9")
    parser.add_argument("--budget-agent", default="12")
    parser.add_argument("--budget-rollback", type=int, default=3)
    parser.add_argument("--width", type=int, default=8, help="continuations played together in `lockstep`")
    parser.add_argument("--before", default="4f865a8", help="the git revision `before` runs")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list of {', '.join(SETTINGS)}")
    args = parser.parse_args()
    unknown = [s for s in args.settings.split(",") if s not in SETTINGS]
    if unknown:
        raise SystemExit(f"unknown setting(s) {', '.join(unknown)}: choose from {', '.join(SETTINGS)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.settings.split(","):
            run = run_before if setting == "before" else lambda a, t, s=setting: run_here(s, a, t)
            rows.append(run(args, Path(tmp)))
    reference = next((r for r in rows if r.setting == "before"), rows[0])
    print(f"\n{args.env} {args.tasks} {args.split} {args.variations}, {args.policy}, rir/oracle-agent, "
          f"B_agent {args.budget_agent}, B_rb {args.budget_rollback}")  # fmt: skip
    print("| setting | episodes (won) | reviews | s / review | agent calls / review | prompt tokens / review "
          f"| tokens / s | pooled | batch (mean, max) | episodes deciding as {reference.setting} |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        per = max(r.reviews, 1)
        calls = f"{r.calls / per:.1f}" if r.calls is not None else "-"
        tokens = f"{r.tokens / per:.0f}" if r.tokens is not None else "-"
        rate = f"{r.tokens / r.seconds:.0f}" if r.tokens is not None and r.seconds else "-"
        pooled = f"{r.pooled:.0%}" if r.pooled is not None else "-"
        batch = f"{statistics.mean(r.batches):.1f}, {max(r.batches)}" if r.batches else "-"
        print(f"| {r.setting} | {r.episodes} ({r.successes}) | {r.reviews} | {r.seconds / per:.1f} | {calls} "
              f"| {tokens} | {rate} | {pooled} | {batch} | {same_decisions(r, reference)} |")  # fmt: skip


if __name__ == "__main__":
    main()
