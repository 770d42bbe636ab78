"""Recovery controllers: drop-in implementations of When (review), Where (locate) and What (reflect).

Every controller answers the same four calls with a `Decision` whose value has the JSON shape of
`rir_runtime.decisions`, so implementations are interchangeable per module:

- `HeuristicController`: rules, no model.
- `PromptedController`: any model through a backend; one retry on a parse error, then the safe
  default (continue / latest admissible checkpoint / empty reflection), counted.
- `OracleController`: hindsight values by branch re-execution (an upper bound; also labels).
- `AgentOracleController` (`oracle-agent`): the same, valued by continuations of the agent being
  controlled, with a recovery's lesson kept: the upper bound on this agent.
- `CompositeController`: one module from each, e.g. a tuned Where with a prompted When.
- `SignalGatedController` (`gated:<spec>`, `residual:<spec>`): a model-backed controller whose
  scheduled reviews ask the model only when a failure signal is visible (`gated:`), or only when
  none is and the heuristic's rule decides the rest (`residual:`), so fewer reviews cost agent calls.
The `tuned` controller (a base model plus LoRA adapter) is a `PromptedController` over the
adapter's backend. `ControllerSpec` (spec.py) parses a controller's name; `make_controller` builds it.
"""

from rir_runtime.controllers.base import Controller
from rir_runtime.controllers.composite import CompositeController, SignalGatedController
from rir_runtime.controllers.factory import make_controller
from rir_runtime.controllers.heuristic import ExploringController, HeuristicController
from rir_runtime.controllers.oracle import AgentOracleController, OracleController
from rir_runtime.controllers.prompted import (
    DEFAULT_PROMPT_TOKENS,
    PromptedController,
    candidates,
    card_prompt_tokens,
)
from rir_runtime.controllers.rules import (
    PASSIVE_VERBS,
    FailureSignal,
    default_value,
    failure_signal,
    latest_admissible_in,
    reflection_for,
    rule_review,
    segments_containing,
    suspect_step,
)
from rir_runtime.controllers.spec import GATES, ControllerKind, ControllerSpec, check_controller_name, register_kind

__all__ = [
    "DEFAULT_PROMPT_TOKENS",
    "GATES",
    "PASSIVE_VERBS",
    "AgentOracleController",
    "CompositeController",
    "Controller",
    "ControllerKind",
    "ControllerSpec",
    "ExploringController",
    "FailureSignal",
    "HeuristicController",
    "OracleController",
    "PromptedController",
    "SignalGatedController",
    "candidates",
    "card_prompt_tokens",
    "check_controller_name",
    "default_value",
    "failure_signal",
    "latest_admissible_in",
    "make_controller",
    "reflection_for",
    "register_kind",
    "rule_review",
    "segments_containing",
    "suspect_step",
]
