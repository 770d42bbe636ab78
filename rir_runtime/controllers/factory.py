"""The controller kinds: how each is checked and built from its parsed name (`spec.ControllerSpec`).

A new kind is its controller module and one `ControllerKind` entry in `BUILTIN_KINDS`; every command
then accepts, checks and serves it, and `--help` lists it.
"""

from __future__ import annotations

from collections.abc import Callable

from rir_runtime.controllers.base import Controller
from rir_runtime.controllers.composite import CompositeController, SignalGatedController
from rir_runtime.controllers.heuristic import ExploringController, HeuristicController
from rir_runtime.controllers.oracle import AgentOracleController, OracleController
from rir_runtime.controllers.prompted import PromptedController, card_prompt_tokens
from rir_runtime.controllers.spec import KINDS, BackendFactory, ControllerKind, ControllerSpec, register_kind
from rir_runtime.errors import UserInputError


def make_controller(spec: ControllerSpec | str, backend_factory: BackendFactory | None = None) -> Controller:
    """The controller a name asks for; `when=A;where=B;what=C` composes modules from three controllers."""
    spec = spec if isinstance(spec, ControllerSpec) else ControllerSpec.parse(spec)
    if spec.parts:
        return CompositeController(*(make_controller(part, backend_factory) for part in spec.parts))
    if spec.gate:
        return SignalGatedController(
            make_controller(ControllerSpec(spec.kind, spec.argument), backend_factory), spec.gate
        )
    return KINDS[spec.kind].build(spec, backend_factory)


def prompted_controller(spec: ControllerSpec, backend_factory: BackendFactory | None) -> Controller:
    """`prompted:<model>`: the model through its backend, prompted with the decision."""
    from rir_runtime.llm import make_backend

    return PromptedController((backend_factory or make_backend)(spec.argument), name=str(spec))


def tuned_controller(spec: ControllerSpec, backend_factory: BackendFactory | None) -> Controller:
    """`tuned:<dir>`: a controller adapter over its base model, with the review threshold it was calibrated to."""
    from rir_runtime.llm import make_backend
    from rir_runtime.llm.card import read_card

    card = read_card(spec.argument)
    threshold = card.get("review_threshold", 0.0)
    if threshold is None:  # written before calibration, which did not finish
        raise UserInputError(
            f"adapter {spec.argument} has no calibrated review threshold (training stopped while "
            "calibrating): rerun the same `rir train` command; it resumes from the last checkpoint and calibrates"
        )
    # the backend name keeps its `tuned:` prefix: the factory loads base + adapter after checking its card
    backend = (backend_factory or make_backend)(str(spec))
    return PromptedController(
        backend, name=str(spec), max_prompt_tokens=card_prompt_tokens(card), review_threshold=float(threshold)
    )


def check_card(expect: str) -> Callable[[ControllerSpec], None]:
    """A check that reads the adapter's card, so a wrong or stale adapter fails before any episode runs."""

    def check(spec: ControllerSpec) -> None:
        from rir_runtime.llm.card import check_adapter_weights, read_card

        read_card(spec.argument, expect=expect)
        check_adapter_weights(spec.argument)

    return check


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


def check_model(spec: ControllerSpec) -> None:
    """A prompted controller's model that cannot be had (an unknown name, the Hub unreachable) fails now."""
    from rir_runtime.llm.factory import check_backend_spec

    check_backend_spec(spec.argument)


def check_draws(spec: ControllerSpec) -> None:
    """`oracle-agent:<K>`'s K, checked before any episode runs."""
    hindsight_draws(spec.argument)


def value_controller(spec: ControllerSpec, backend_factory: BackendFactory | None = None) -> Controller:
    """`value:<dir>`: the adapter's value model (one per process) with the margin its card calibrated; an
    adapter trained on the Where's decisions alone (`decision_types: [locate]`) leaves the When to the rule."""
    from rir_runtime.controllers.value import ValueController
    from rir_runtime.llm.card import read_card
    from rir_runtime.llm.value import cached_value_scorer

    adapter = spec.argument
    card = read_card(adapter, expect="value")
    margin = card.get("review_threshold", 0.0)  # calibrated as a generative adapter's is (train/common/calibrate.py)
    if margin is None:  # written before calibration, which did not finish
        raise UserInputError(
            f"value adapter {adapter} has no calibrated margin (training stopped while calibrating): rerun the same "
            "`rir train value` command; it resumes from the last checkpoint and calibrates"
        )
    where_only = "review" not in card.get("decision_types", ["review"])  # trained on the Where's decisions alone
    return ValueController(cached_value_scorer(adapter), f"value:{adapter}", float(margin), where_only=where_only)


BUILTIN_KINDS = (
    ControllerKind("heuristic", lambda spec, backends: HeuristicController()),
    ControllerKind("oracle", lambda spec, backends: OracleController(), hindsight=True),
    ControllerKind(
        "oracle-agent",
        lambda spec, backends: AgentOracleController(hindsight_draws(spec.argument)),
        argument="optional",
        placeholder="<K>",
        hindsight=True,
        check=check_draws,
    ),
    ControllerKind("prompted", prompted_controller, "required", "<model>", model_backed=True, check=check_model),
    ControllerKind(
        "tuned",
        tuned_controller,
        "required",
        "<adapter-folder>",
        model_backed=True,
        trained=True,
        check=check_card("controller"),
    ),
    ControllerKind("value", value_controller, "required", "<adapter-folder>", trained=True, check=check_card("value")),
    ControllerKind("random-review", lambda spec, backends: ExploringController(True, False)),
    ControllerKind("random-restore", lambda spec, backends: ExploringController(False, True)),
)
for _kind in BUILTIN_KINDS:
    register_kind(_kind)
