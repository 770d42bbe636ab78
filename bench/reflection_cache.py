"""Seconds per structured reflection with and without the kept prompt KV cache.

    python bench/reflection_cache.py                                # smollm2-135m-instruct, 20-step history
    python bench/reflection_cache.py --model tuned:runs/quickstart/sft/adapter --steps 40 --repeats 3

A structured reflection decodes in six passes over one prompt (`rir_runtime.structured`). The
context is synthetic (a walk through numbered rooms, the last steps abandoned), rendered by the
controllers' own `fit_decision`; what matters here is its length, printed with the timings. Both
ways must write the same reply: the script fails if they differ.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rir_runtime.envs.checkpoints import Step
from rir_runtime.llm.factory import make_backend
from rir_runtime.prompts import DecisionContext, fit_decision
from rir_runtime.structured import _fill, fill_reflection


def context(steps: int) -> DecisionContext:
    history = tuple(
        Step(i, f"go to room {i}", f"You move to room {i}. A door leads north; a table holds a lamp and a box.", 0.0)
        for i in range(steps)
    )
    return DecisionContext(
        task="bench", objective="Find the key and open the chest.", memory="", history=history,
        observation="Nothing happens.", score=0.0, restore_point=max(0, steps - 4),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a model spec of make_backend")
    parser.add_argument("--steps", type=int, default=20, help="history length of the context")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    backend = make_backend(args.model)
    ctx = context(args.steps)
    messages = fit_decision("reflect", ctx, 2048)
    timings: dict[str, list[float]] = {"recomputed": [], "kept cache": []}
    for _ in range(args.repeats):
        start = time.perf_counter()
        plain = _fill(backend, messages, ctx)
        timings["recomputed"].append(time.perf_counter() - start)
        start, before = time.perf_counter(), backend.reused_tokens
        kept = fill_reflection(backend, messages, ctx)
        timings["kept cache"].append(time.perf_counter() - start)
        if kept.raw != plain.raw:
            raise SystemExit(f"the replies differ:\n{plain.raw}\n{kept.raw}")
    passes, reused = plain.meta["passes"], backend.reused_tokens - before
    print(f"{args.model}: prompt {plain.prompt_tokens // passes} tokens, {passes} passes,", end=" ")
    print(f"{plain.completion_tokens} generated tokens; {reused} prompt tokens reused per reply")
    for way, seconds in timings.items():
        print(f"  {way:>11}: median {statistics.median(seconds):.2f} s per reflection over {len(seconds)}")


if __name__ == "__main__":
    main()
