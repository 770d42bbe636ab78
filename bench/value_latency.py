"""Seconds per value-controller decision on this machine: one prompt and its options, as served.

    python bench/value_latency.py --adapter runs/quickstart/value --data runs/quickstart/data
    python bench/value_latency.py --adapter runs/quickstart/value --data runs/quickstart/data --no-merge

The decision points are the `value_pref` validation prompts of a build (every option a point's pairs
name, in a fixed sample of `--points`); each is scored once after one warm-up, on `--threads` torch
threads. Prints the median and p90 seconds a decision, and the mean prompt and option tokens, which
is what a decision's cost follows. `--no-merge` serves the adapter unmerged (LoRA applied on the
fly), the way the runtime served it before it merged the weights.
"""

from __future__ import annotations

import argparse
import statistics
import time


def decision_points(data: str, n: int) -> list[tuple[str, list[str]]]:
    """(prompt, its options) for up to n validation decision points, spread over the split."""
    from datasets import load_from_disk

    from train.value import value_folder

    rows = load_from_disk(str(value_folder(data)))["validation"]
    options: dict[str, set[str]] = {}
    for row in rows:
        options.setdefault(row["prompt"], set()).update((row["chosen"], row["rejected"]))
    points = sorted(options.items())
    step = max(1, len(points) // n)
    return [(prompt, sorted(texts)) for prompt, texts in points[::step][:n]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter", required=True, help="a value adapter folder (`rir train value`)")
    parser.add_argument("--data", required=True, help="a build with a value_pref dataset (`rir build-data`)")
    parser.add_argument("--points", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-merge", action="store_true", help="apply the LoRA on the fly instead of merged")
    args = parser.parse_args()

    from rir_runtime.llm.value import encode, load_value_scorer

    scorer = load_value_scorer(args.adapter, "cpu", args.threads, merge=not args.no_merge)
    tokenizer = scorer.tokenizer
    points = decision_points(args.data, args.points)
    scorer.score(*points[0])  # warm-up
    seconds = []
    for prompt, options in points:
        start = time.perf_counter()
        scorer.score(prompt, options)
        seconds.append(time.perf_counter() - start)
    seconds.sort()
    prompt_tokens = statistics.mean(len(encode(tokenizer, p, o[0])[0]) for p, o in points)
    option_tokens = statistics.mean(sum(len(encode(tokenizer, p, x)[1]) for x in o) for p, o in points)
    n_options = statistics.mean(len(o) for _, o in points)
    print(
        f"{args.adapter} ({'unmerged' if args.no_merge else 'merged'}, {args.threads} thread(s)): "
        f"{len(points)} decisions, {prompt_tokens:.0f} prompt tokens and {n_options:.1f} options of "
        f"{option_tokens:.0f} tokens in all on average; median {statistics.median(seconds):.3f} s, "
        f"p90 {seconds[int(0.9 * (len(seconds) - 1))]:.3f} s a decision"
    )


if __name__ == "__main__":
    main()
