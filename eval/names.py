"""Short labels for method keys in report tables, with the legend that maps them back.

A method key is `<method>[/<controller>]`, and a controller's name can run to 70 characters (a module swap,
`when=heuristic,where=oracle-agent,what=heuristic`; an adapter's folder): as a table's first column it
pushes the table wider than a window. A key longer than `MAX_NAME` is shown by a label derived from its
parts (a module swap by the modules that are not the heuristic's, an adapter by the end of its folder),
and the report lists each label with the full key; summary.json keeps the full keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rir_runtime.controllers import ControllerSpec
from rir_runtime.controllers.spec import MODULES

MAX_NAME = 40  # characters: a key up to this long is shown whole
DEFAULT_MODULE = "heuristic"  # the module a swap's label leaves out
ELLIPSIS = "..."


def summary_names(summary: Mapping[str, Any]) -> dict[str, str]:
    """The label of every key a summary's tables show (its methods and both sides of its pairs)."""
    methods, paired = summary.get("methods"), summary.get("paired")
    keys = [str(k) for k in methods] if isinstance(methods, Mapping) else []
    if isinstance(paired, list):
        keys += [str(e.get(side)) for e in paired if isinstance(e, Mapping) for side in ("a", "b")]
    return short_names(keys)


def controller_spec(key: str) -> ControllerSpec | None:
    """The parsed controller of a method key; None for a method without one (react) or a name this rir
    does not know (an older run's)."""
    _, _, controller = key.partition("/")
    return ControllerSpec.try_parse(controller) if controller else None


def short_names(keys: Iterable[str]) -> dict[str, str]:
    """Each key's label in tables, unique among `keys`: the key itself where it is short enough, else its
    derived label (a second key with the same label gets ` #2`, and so on, in sorted order)."""
    unique = sorted(set(keys))
    labels = {k: k for k in unique if len(k) <= MAX_NAME}
    taken = set(labels)
    for key in (k for k in unique if k not in labels):
        label, n = short_label(key), 1
        while label in taken:
            n += 1
            label = f"{short_label(key, room=len(f' #{n}'))} #{n}"
        labels[key] = label
        taken.add(label)
    return labels


def legend(labels: dict[str, str]) -> list[tuple[str, str]]:
    """(label, full key) for every key shown shortened, by label."""
    return sorted((label, key) for key, label in labels.items() if label != key)


def short_label(key: str, room: int = 0) -> str:
    """A key's label of at most `MAX_NAME - room` characters, readable where the key's controller parses:
    arguments (folders, model names) are cut to their last two parts first, and only then the label."""
    limit = MAX_NAME - room
    if len(key) <= limit:
        return key
    spec = controller_spec(key)
    if spec is None:
        return _cut(key, limit)
    for depth in (None, 2):
        label = f"{key.partition('/')[0]}/{_spec_label(spec, depth)}"
        if len(label) <= limit:
            return label
    return _cut(label, limit)


def _spec_label(spec: ControllerSpec, depth: int | None) -> str:
    """A controller's name with each argument cut to its last `depth` path parts (None: whole); a module
    swap names only the modules that are not the heuristic's (the legend has the whole name)."""
    if spec.parts:
        swapped = [f"{m}={_spec_label(p, depth)}" for m, p in zip(MODULES, spec.parts, strict=True)]
        changed = [s for s, p in zip(swapped, spec.parts, strict=True) if str(p) != DEFAULT_MODULE]
        return "+".join(changed) or DEFAULT_MODULE
    argument = _tail(spec.argument, depth)
    name = f"{spec.kind}:{argument}" if argument else spec.kind
    return f"{spec.gate}:{name}" if spec.gate else name


def _tail(argument: str, depth: int | None) -> str:
    """An argument's last `depth` path parts (an adapter's folder ends in what tells it apart)."""
    return argument if depth is None else "/".join(argument.split("/")[-depth:])


def _cut(text: str, limit: int) -> str:
    """`text` in `limit` characters around `...`: its start up to the controller's kind (`rir/tuned:`) where
    that is short, else its first half, and its end (a folder's end tells adapters apart)."""
    if len(text) <= limit:
        return text
    kept = limit - len(ELLIPSIS)
    kind = text.find(":") + 1
    head = kind if 0 < kind <= kept // 2 else kept // 2
    return text[:head] + ELLIPSIS + text[len(text) - (kept - head) :]
