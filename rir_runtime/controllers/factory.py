"""Controller names (`heuristic`, `oracle`, `tuned:<dir>`, `when=;where=;what=`, ...) to controllers."""

from __future__ import annotations

from collections.abc import Callable

from rir_runtime.controllers.base import Controller
from rir_runtime.controllers.composite import CompositeController, SignalGatedController, gated_spec
from rir_runtime.controllers.heuristic import ExploringController, HeuristicController
from rir_runtime.controllers.oracle import AgentOracleController, OracleController
from rir_runtime.controllers.prompted import PromptedController, card_prompt_tokens
from rir_runtime.errors import UnknownNameError, UserInputError
from rir_runtime.llm.base import Backend

CONTROLLER_KINDS = (
    "heuristic",
    "oracle",
    "oracle-agent",
    "oracle-agent:<K>",
    "prompted:<model>",
    "tuned:<adapter-folder>",
    "value:<adapter-folder>",
    "gated:<prompted or tuned controller>",
    "residual:<prompted or tuned controller>",
    "random-review",
    "random-restore",
)
HINDSIGHT_CONTROLLERS = ("oracle", "oracle-agent")  # they see the episode's future: upper bounds, never contenders


def make_controller(spec: str, backend_factory: Callable[[str], Backend] | None = None) -> Controller:
    """Resolve a controller name. `when=A;where=B;what=C` composes modules from three controllers."""
    if ";" in spec:
        parts = dict(p.split("=", 1) for p in spec.split(";") if "=" in p)
        missing = {"when", "where", "what"} - set(parts)
        if missing:
            raise UnknownNameError("composite controller part", ",".join(sorted(missing)), ["when", "where", "what"])
        return CompositeController(*(make_controller(parts[k], backend_factory) for k in ("when", "where", "what")))
    gated = gated_spec(spec)
    if gated is not None:
        gate, inner = gated
        return SignalGatedController(make_controller(inner, backend_factory), gate)
    kind, _, arg = spec.partition(":")
    if kind == "heuristic":
        return HeuristicController()
    if kind == "oracle":
        return OracleController()
    if kind == "oracle-agent":
        return AgentOracleController(hindsight_draws(arg))
    if kind in ("random-review", "random-restore"):
        return ExploringController(kind == "random-review", kind == "random-restore")
    if kind in ("prompted", "tuned") and arg:
        from rir_runtime.llm import make_backend

        factory = backend_factory or make_backend
        if kind == "prompted":
            return PromptedController(factory(arg), name=spec)
        from rir_runtime.llm.card import read_card

        # `tuned:<dir>` keeps its prefix: the backend factory loads base + adapter after checking its card
        card = read_card(arg)
        threshold = card.get("review_threshold", 0.0)
        if threshold is None:  # written before calibration, which did not finish
            raise UserInputError(
                f"adapter {arg.removeprefix('tuned:')} has no calibrated review threshold (training stopped while "
                "calibrating): rerun the same `rir train` command; it resumes from the last checkpoint and calibrates"
            )
        return PromptedController(
            factory(spec), name=spec, max_prompt_tokens=card_prompt_tokens(card), review_threshold=float(threshold)
        )
    if kind == "value" and arg:
        return value_controller(arg)
    raise UnknownNameError("controller", spec, list(CONTROLLER_KINDS))


def hindsight_draws(arg: str) -> int:
    """`oracle-agent:<K>`'s K (fresh draws of the agent's noise per option); none: 0, its own future."""
    if not arg:
        return 0
    if not arg.isdigit() or int(arg) < 1:
        raise UserInputError(
            f"oracle-agent:{arg}: the argument is how many fresh continuations value an option, a whole number >= 1 "
            "(e.g. oracle-agent:4); plain oracle-agent plays the agent's own future"
        )
    return int(arg)


def value_controller(adapter: str) -> Controller:
    """`value:<dir>`: the adapter's value model (one per process) with the margin its card calibrated; an
    adapter trained on the Where's decisions alone (`decision_types: [locate]`) leaves the When to the rule."""
    from rir_runtime.controllers.value import ValueController
    from rir_runtime.llm.card import read_card
    from rir_runtime.llm.value import cached_value_scorer

    card = read_card(adapter, expect="value")
    margin = card.get("review_threshold", 0.0)  # calibrated as a generative adapter's is (train/calibrate.py)
    if margin is None:  # written before calibration, which did not finish
        raise UserInputError(
            f"value adapter {adapter} has no calibrated margin (training stopped while calibrating): rerun the same "
            "`rir train value` command; it resumes from the last checkpoint and calibrates"
        )
    where_only = "review" not in card.get("decision_types", ["review"])  # trained on the Where's decisions alone
    return ValueController(cached_value_scorer(adapter), f"value:{adapter}", float(margin), where_only=where_only)
