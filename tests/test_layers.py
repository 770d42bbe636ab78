"""The layers of docs/architecture.md, checked on every module's imports (those inside functions and
under TYPE_CHECKING too): a module imports only its own layer and the layers below it, train and eval
never import each other, no two modules import each other through any chain (an import circle), and the
`rir` entry point names the command modules without importing them."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rir_runtime", "data_gen", "train", "eval")
COMMANDS = ("rir_runtime.cli", "rir_runtime.commands", "data_gen.commands", "eval.commands", "train.commands")
# Lowest first: the runtime, orchestration, data_gen, train and eval (siblings), the CLI.
LAYERS = {"runtime": 0, "orchestration": 1, "data_gen": 2, "train": 3, "eval": 3, "cli": 4}


def layer(module: str) -> str:
    if any(module == c or module.startswith(c + ".") for c in COMMANDS):
        return "cli"
    if module == "rir_runtime.orchestration" or module.startswith("rir_runtime.orchestration."):
        return "orchestration"
    top = module.split(".")[0]
    return "runtime" if top == "rir_runtime" else top


@functools.cache
def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path) -> set[str]:
    """The project modules a file imports, wherever in the file the import stands."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name for name in names if name.split(".")[0] in PACKAGES}


def module_edges(path: Path) -> set[str]:
    """The project modules a file imports by name: `from train import grpo` is an arrow to `train.grpo`,
    `from train.grpo import main` one to `train.grpo` (a package's __init__ is not counted as imported)."""
    known, edges = modules(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            edges |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            named = {f"{node.module}.{alias.name}" for alias in node.names} & set(known)
            edges |= named or {node.module}
    return {e for e in edges if e in known}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_circles_finds_a_chain_back_to_its_start() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_between_modules() -> None:
    graph = {module: module_edges(path) - {module} for module, path in modules().items()}
    assert circles(graph) == [], "modules that import each other (move what both need to a module below them)"


@pytest.mark.parametrize("module", sorted(modules()))
def test_a_module_imports_only_its_layer_and_those_below(module: str) -> None:
    mine = layer(module)
    up = [m for m in imports(modules()[module]) if LAYERS[layer(m)] > LAYERS[mine]]
    sideways = [m for m in imports(modules()[module]) if {mine, layer(m)} == {"train", "eval"}]
    assert not up, f"{module} ({mine}) imports a layer above it: {up}"
    assert not sideways, f"{module} ({mine}) imports its sibling: {sideways} (share it from data_gen/scoring)"


def test_the_entry_point_names_the_command_modules_without_importing_them() -> None:
    from rir_runtime.cli import COMMANDS as TABLE

    assert not [m for m in imports(ROOT / "rir_runtime" / "cli.py") if layer(m) == "cli"]
    assert {command.module for command in TABLE.values()} <= set(modules())
