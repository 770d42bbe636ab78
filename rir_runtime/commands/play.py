"""`rir play`: a person plays an environment with checkpoints and `:rollback N`.

Useful to get a feel for a benchmark and to see by hand what a restore brings back.
"""

from __future__ import annotations

import argparse

from rir_runtime.cli import add_task_selection
from rir_runtime.envs import make_env, parse_variations, resolve_tasks
from rir_runtime.envs.checkpoints import CheckpointStore, Step
from rir_runtime.errors import RestoreError

HELP = """commands: any action text | :actions | :expert | :checkpoints | :rollback N | :help | :quit"""


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text)
    add_task_selection(p)
    p.set_defaults(handler=lambda args: play(args.env, args.tasks, args.split, args.variations))


def play(env_name: str, tasks: str | None, split: str, variations: str | None) -> None:
    env = make_env(env_name)
    try:
        names = tasks.split(",") if tasks else type(env).task_names()[:1]
        spec = resolve_tasks(env, names[:1], split, (parse_variations(variations) or [0])[:1])[0]
        obs = env.reset(spec)
        print(f"== {spec.key}\nObjective: {obs.objective}\n\n{obs.text}\n\n{HELP}")
        store = CheckpointStore()
        history: tuple[Step, ...] = ()
        store.save(env, history)
        while True:
            try:
                line = input(
                    f"[step {len(history)} | score {store.latest.score if not history else history[-1].score}] > "
                )
            except EOFError:
                break
            line = line.strip()
            if line in (":quit", ":q"):
                break
            if line == ":help" or not line:
                print(HELP)
            elif line == ":actions":
                print("\n".join(env.admissible_actions()))
            elif line == ":expert":
                print(" -> ".join(env.expert_actions()) or "(no expert plan from this state)")
            elif line == ":checkpoints":
                for i in range(len(store)):
                    mark = "" if store.reason_not_admissible(i) is None else "  (not admissible)"
                    c = store[i]
                    print(f"  C_{i}: score {c.score}  {c.observation[:70]!r}{mark}")
            elif line.startswith(":rollback"):
                try:
                    index = int(line.split()[1])
                    checkpoint, restored = store.restore(env, index)
                except (IndexError, ValueError):
                    print("usage: :rollback N  (see :checkpoints)")
                    continue
                except RestoreError as err:
                    print(f"cannot roll back: {err}")
                    continue
                history = checkpoint.history
                print(f"(restored C_{index})\n{restored.text}")
            else:
                result = env.step(line)
                history = history + (
                    Step(len(history), line, result.observation, result.score, result.won, result.lost),
                )
                print(f"{result.observation}   [score {result.score}]")
                if result.done:
                    print(
                        "WON" if result.won else "LOST" if result.lost else "episode over", "- :rollback N to try again"
                    )
                else:
                    store.save(env, history)
    finally:
        env.close()
