"""The controller protocol: explicit state in, knob changes out.

A controller reads the statistics of the step that just finished (``after_step``) and decides
knobs for the next one (``before_batch``/``before_step``), or, from the statistics of the step's
own rollouts, knobs of that step's update (``before_update``: the loss-side coefficients).
Hooks never write the knobs: they
return a ``Decision`` (the knob values they want and the metrics to log), and ``ControlBank``
applies it, rejecting a write to a knob the controller did not claim. Each knob — an
*actuator* — has at most one owner; ``check_actuators`` rejects a configuration where two
controllers claim the same one (docs/methods/combining.md §5).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from explorl.errors import ControlError

# Every knob a controller may own. "budgets" = per-prompt sample counts; "unlearn" = the EEPO
# gate; "curriculum" = (dataset, n_samples, max_response_len) switched together;
# "pos_neg_weight" = EntroPIC's α, the weight of positive vs negative confident tokens (§6f).
ACTUATORS = ("temperature", "eps_high", "entropy_coef", "kl_coef", "budgets", "unlearn",
             "curriculum", "pos_neg_weight")

# The actuator that owns each field of ``Knobs``.
KNOB_ACTUATOR = {
    "temperature": "temperature", "eps_high": "eps_high", "entropy_coef": "entropy_coef",
    "kl_coef": "kl_coef", "budgets": "budgets", "unlearn": "unlearn",
    "dataset": "curriculum", "n_samples": "curriculum", "max_response_len": "curriculum",
    "pos_neg_weight": "pos_neg_weight",
}


@dataclass(frozen=True)
class Knobs:
    """What the trainer uses for the coming step. Read-only: controllers return changes."""

    temperature: float
    eps_high: float
    entropy_coef: float
    kl_coef: float
    n_samples: int  # default samples per prompt (n_default)
    max_response_len: int
    budgets: tuple[int, ...] | None = None  # per-prompt sample counts; None = n_samples each
    dataset: str = "train"  # "train", or "anneal" once a curriculum switches datasets
    unlearn: bool = False  # EEPO: take the unlearning step between the two sampling stages
    pos_neg_weight: float = 0.0  # EntroPIC α: loss += α·mean over confident tokens of −ratio·|A|

    def budgets_for(self, n_prompts: int) -> list[int]:
        return list(self.budgets) if self.budgets is not None else [self.n_samples] * n_prompts


@dataclass
class Decision:
    """What a hook wants: knob values for the coming step and metrics to log."""

    knobs: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def apply_decision(knobs: Knobs, decision: Decision, controller: Controller) -> Knobs:
    """``knobs`` with ``decision.knobs`` applied; a knob ``controller`` does not own is an error."""
    for k in decision.knobs:
        if k not in KNOB_ACTUATOR:
            raise ControlError(f"controller {controller.name!r} set unknown knob {k!r}")
        if KNOB_ACTUATOR[k] not in controller.actuators:
            raise ControlError(
                f"controller {controller.name!r} set knob {k!r}, owned by actuator "
                f"{KNOB_ACTUATOR[k]!r}, which it did not claim ({controller.actuators})"
            )
    changes = dict(decision.knobs)
    if changes.get("budgets") is not None:
        changes["budgets"] = tuple(int(n) for n in changes["budgets"])
    return dataclasses.replace(knobs, **changes) if changes else knobs


@dataclass
class ControlContext:
    """Static facts a controller may need, given once at setup."""

    vocab_size: int
    dataset_size: int
    max_steps: int
    prompts_per_step: int
    n_samples: int  # n_default


@dataclass
class StepStats:
    """Global statistics of the step that just finished (identical on every rank)."""

    step: int  # 1-based index of the finished step
    max_steps: int
    entropy: float  # mean token entropy of the policy's own responses at the sampling temperature
    prompt_indices: list[int]  # dataset index of each prompt of the step
    prompt_correct: list[float]  # per prompt: number of correct responses
    prompt_samples: list[int]  # per prompt: number of responses
    epoch: int  # 0-based epoch the step's batch came from
    epoch_end: bool  # True when this step consumed the last batch of its epoch
    extra: dict[str, float] = field(default_factory=dict)


class Controller:
    """Base class; subclasses override what they need. Hooks return a ``Decision``."""

    name: str = "controller"
    actuators: tuple[str, ...] = ()

    def setup(self, ctx: ControlContext, knobs: Knobs) -> None:
        """Called once before the first step (and before ``load_state_dict`` on resume)."""

    def before_batch(self, step: int, knobs: Knobs) -> Decision:
        """Knobs that decide which prompts ``step`` draws (``dataset``).

        Called for every controller before the step's prompts are drawn, then
        ``before_step`` is called with them. Only the curriculum uses it today.
        """
        return Decision()

    def before_step(self, step: int, knobs: Knobs, prompt_indices: list[int]) -> Decision:
        """Knobs for ``step`` (1-based), whose batch holds ``prompt_indices``."""
        return Decision()

    def before_update(self, stats: StepStats, knobs: Knobs) -> Decision:
        """Knobs of the update of ``stats.step``, from the statistics of its own rollouts (sampled
        and scored, not yet trained on: ``stats.entropy`` is the pre-update policy's). Only the
        loss-side knobs can still change here (entropy_coef, kl_coef, eps_high, pos_neg_weight)."""
        return Decision()

    def after_step(self, stats: StepStats, knobs: Knobs) -> Decision:
        """Update state from the finished step's statistics (metrics only: no knob changes)."""
        return Decision()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def check_actuators(controllers: list[Controller]) -> None:
    """Raise ``ControlError`` when two controllers own one actuator, or one is unknown."""
    owner: dict[str, str] = {}
    for c in controllers:
        for a in c.actuators:
            if a not in ACTUATORS:
                raise ControlError(f"controller {c.name!r} claims unknown actuator {a!r}; "
                                   f"known: {', '.join(ACTUATORS)}")
            if a in owner:
                raise ControlError(
                    f"actuator {a!r} is owned by both {owner[a]!r} and {c.name!r}; "
                    "each knob may have one controller (disable one of them in the recipe)"
                )
            owner[a] = c.name
