"""How a run names its recovery controller, and the one parser of that name.

A name is a kind with its argument (`heuristic`, `oracle-agent:4`, `prompted:<model>`, `tuned:<dir>`,
`value:<dir>`), a review gate around a model-backed kind (`gated:tuned:<dir>`, `residual:prompted:<m>`),
or one kind per module (`when=heuristic;where=value:<dir>;what=heuristic`). Configs check names with
`ControllerSpec.parse`, workers build controllers from the parsed spec (`factory.make_controller`), and
the reports ask it what a controller is (hindsight, trained). The kinds themselves are a registry
(`ControllerKind`, filled by `factory.py`): a new kind is one controller module and one entry there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from rir_runtime.errors import UnknownNameError

if TYPE_CHECKING:
    from rir_runtime.controllers.base import Controller
    from rir_runtime.llm.base import Backend

BackendFactory = Callable[[str], "Backend"]
MODULES = ("when", "where", "what")
# The review gates a model-backed controller can be wrapped in (see composite.SignalGatedController).
GATES = ("gated", "residual")
Argument = Literal["none", "optional", "required"]
# Between modules: `;` in a name, `,` as a composite controller names itself in episode records.
MODULE_SEPARATOR = re.compile(r"[;,](?=(?:when|where|what)=)")


def _no_check(spec: ControllerSpec) -> None:
    return None


@dataclass(frozen=True)
class ControllerKind:
    """One kind a controller name can ask for: how its argument is spelled, what it is (a hindsight
    bound, a model a gate can save calls of, a trained adapter), and how it is checked before any
    episode runs (an adapter's card is read) and built in a worker."""

    name: str
    build: Callable[[ControllerSpec, BackendFactory | None], Controller]
    argument: Argument = "none"
    placeholder: str = ""  # how the argument is written in the kinds' list, e.g. "<adapter-folder>"
    hindsight: bool = False  # it sees the episode's future: an upper bound, never a contender
    model_backed: bool = False  # its reviews call a model (what `gated:`/`residual:` save)
    trained: bool = False  # it serves an adapter of `rir train`
    check: Callable[[ControllerSpec], None] = field(default=_no_check)

    def spellings(self) -> list[str]:
        with_argument = f"{self.name}:{self.placeholder}"
        return {"none": [self.name], "optional": [self.name, with_argument], "required": [with_argument]}[self.argument]


KINDS: dict[str, ControllerKind] = {}


def register_kind(kind: ControllerKind) -> None:
    """Make `kind` a name every command accepts (a second kind of one name replaces the first)."""
    KINDS[kind.name] = kind


def spellings() -> list[str]:
    """Every way to name a controller, for `--help` and the unknown-name error."""
    kinds = [s for kind in KINDS.values() for s in kind.spellings()]
    backed = " or ".join(k.name for k in KINDS.values() if k.model_backed)
    return [*kinds, *(f"{gate}:<{backed} controller>" for gate in GATES), "when=<name>;where=<name>;what=<name>"]


@dataclass(frozen=True)
class ControllerSpec:
    """A parsed controller name: one kind with its argument and optional review gate, or (`parts`)
    one spec per module, When, Where and What."""

    kind: str = ""
    argument: str = ""
    gate: str = ""
    parts: tuple[ControllerSpec, ...] = ()

    @classmethod
    def parse(cls, text: str) -> ControllerSpec:
        """The spec of a controller name; an unknown kind, a missing or stray argument, a gate around a
        rule, or a module swap without all three modules is refused with the valid spellings."""
        text = str(text).strip()
        if text.startswith(tuple(f"{m}=" for m in MODULES)) or ";" in text:
            return cls._parse_modules(text)
        gate, _, inner = text.partition(":")
        if gate in GATES:
            spec = cls._parse_kind(inner, text)
            if not KINDS[spec.kind].model_backed:
                raise UnknownNameError("controller", text, spellings(), "A gate saves model calls: a rule has none.")
            return cls(spec.kind, spec.argument, gate)
        return cls._parse_kind(text, text)

    @classmethod
    def try_parse(cls, text: str) -> ControllerSpec | None:
        """The spec, or None where `text` names no controller (a record of an older rir, say)."""
        try:
            return cls.parse(text)
        except UnknownNameError:
            return None

    @classmethod
    def _parse_kind(cls, text: str, whole: str) -> ControllerSpec:
        name, colon, argument = text.partition(":")
        kind = KINDS.get(name)
        if kind is None or (kind.argument == "required" and not argument) or (kind.argument == "none" and colon):
            raise UnknownNameError("controller", whole, spellings())
        return cls(name, argument)

    @classmethod
    def _parse_modules(cls, text: str) -> ControllerSpec:
        named = dict(part.split("=", 1) for part in MODULE_SEPARATOR.split(text) if "=" in part)
        missing = [m for m in MODULES if m not in named]
        if missing:
            raise UnknownNameError("composite controller part", ",".join(missing), list(MODULES))
        parts = tuple(cls.parse(named[m]) for m in MODULES)
        if any(p.parts for p in parts):
            raise UnknownNameError("controller", text, spellings(), "A module names one controller, not three.")
        return cls(parts=parts)

    def __str__(self) -> str:
        if self.parts:
            return ";".join(f"{m}={p}" for m, p in zip(MODULES, self.parts, strict=True))
        name = f"{self.kind}:{self.argument}" if self.argument else self.kind
        return f"{self.gate}:{name}" if self.gate else name

    def leaves(self) -> Iterator[ControllerSpec]:
        """The single-kind specs this one is made of (itself, or its three modules)."""
        if self.parts:
            for part in self.parts:
                yield from part.leaves()
        else:
            yield self

    @property
    def uses_hindsight(self) -> bool:
        """Whether any module sees the episode's future (`oracle`, `oracle-agent`)."""
        return any(KINDS[leaf.kind].hindsight for leaf in self.leaves())

    @property
    def uses_trained_model(self) -> bool:
        """Whether any module serves an adapter (`tuned:`, `value:`)."""
        return any(KINDS[leaf.kind].trained for leaf in self.leaves())

    def arguments_of(self, kind: str) -> list[str]:
        """The arguments of every module of `kind` (e.g. the adapter folders of `tuned`)."""
        return [leaf.argument for leaf in self.leaves() if leaf.kind == kind]

    def check(self) -> None:
        """What can be checked before any episode runs: an adapter's card, an argument's form."""
        for leaf in self.leaves():
            KINDS[leaf.kind].check(leaf)


def check_controller_name(text: str) -> ControllerSpec:
    """Parse and check a controller name before any work starts (a config's, a flag's)."""
    spec = ControllerSpec.parse(text)
    spec.check()
    return spec
