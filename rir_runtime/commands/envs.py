"""`rir envs list|check`: the environments and their tasks, and the contract checker on some of them."""

from __future__ import annotations

import argparse

from rir_runtime.cli import add_task_selection


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    envs = sub.add_parser(name, help=help_text)
    envs_sub = envs.add_subparsers(dest="envs_command", required=True, metavar="ACTION")
    envs_sub.add_parser("list", help="environments and their tasks").set_defaults(handler=list_envs)
    check = envs_sub.add_parser(
        "check", help="run the contract checker (reset/step types, determinism, checkpoint-restore) on tasks"
    )
    add_task_selection(check)
    check.set_defaults(handler=check_envs)


def list_envs(args: argparse.Namespace) -> int:
    from rir_runtime.envs import ENV_CLASSES, env_class

    for name in ENV_CLASSES:
        tasks = env_class(name).task_names()
        shown = ", ".join(tasks[:8]) + (f", ... ({len(tasks)} tasks)" if len(tasks) > 8 else "")
        print(f"{name:<18} {shown}")
    return 0


def check_envs(args: argparse.Namespace) -> int:
    from rir_runtime.envs import make_env, parse_variations, resolve_tasks
    from rir_runtime.envs.checker import check_env

    env = make_env(args.env)
    try:
        tasks = args.tasks.split(",") if args.tasks else type(env).task_names()[:1]
        specs = resolve_tasks(env, tasks, args.split, parse_variations(args.variations))
        failed = 0
        print(f"{'task':<40} {'check':<18} result")
        for spec in specs:
            for r in check_env(env, spec):
                failed += not r.passed
                mark = "PASS" if r.passed else f"FAIL  {r.message}"
                print(f"{spec.key:<40} {r.name:<18} {mark}")
        print(f"\n{'all checks passed' if not failed else f'{failed} check(s) failed'}")
        return 1 if failed else 0
    finally:
        env.close()
