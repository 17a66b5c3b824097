"""The controller protocol: explicit state in, knobs out.

A controller reads the statistics of the step that just finished (``after_step``) and sets
knobs for the next one (``before_step``). Each knob — an *actuator* — has at most one owner;
``check_actuators`` rejects a configuration where two controllers claim the same one
(ALGORITHMS.md §5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from explorl.errors import ControlError

# Every knob a controller may own. "budgets" = per-prompt sample counts; "unlearn" = the EEPO
# gate; "curriculum" = (dataset, n_samples, max_response_len) switched together.
ACTUATORS = ("temperature", "eps_high", "entropy_coef", "kl_coef", "budgets", "unlearn", "curriculum")


@dataclass
class Knobs:
    """What the trainer uses for the coming step. Controllers mutate it in ``before_step``."""

    temperature: float
    eps_high: float
    entropy_coef: float
    kl_coef: float
    n_samples: int  # default samples per prompt (n_default)
    max_response_len: int
    budgets: list[int] | None = None  # per-prompt sample counts for this batch; None = n_samples each
    dataset: str = "train"  # "train", or "anneal" once a curriculum switches datasets
    unlearn: bool = False  # EEPO: take the unlearning step between the two sampling stages

    def budgets_for(self, n_prompts: int) -> list[int]:
        return list(self.budgets) if self.budgets is not None else [self.n_samples] * n_prompts


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
    entropy: float  # mean token entropy of the step's responses at the sampling temperature
    prompt_indices: list[int]  # dataset index of each prompt of the step
    prompt_correct: list[float]  # per prompt: number of correct responses
    prompt_samples: list[int]  # per prompt: number of responses
    epoch: int  # 0-based epoch the step's batch came from
    epoch_end: bool  # True when this step consumed the last batch of its epoch
    extra: dict[str, float] = field(default_factory=dict)


class Controller:
    """Base class; subclasses override what they need. Hooks return metrics to log."""

    name: str = "controller"
    actuators: tuple[str, ...] = ()

    def setup(self, ctx: ControlContext, knobs: Knobs) -> None:  # noqa: B027 - optional hook
        """Called once before the first step (and before ``load_state_dict`` on resume)."""

    def before_batch(self, step: int, knobs: Knobs) -> dict[str, float]:
        """Set knobs that decide which prompts ``step`` draws (``knobs.dataset``).

        Called for every controller before the step's prompts are drawn, then
        ``before_step`` is called with them. Only the curriculum uses it today.
        """
        return {}

    def before_step(self, step: int, knobs: Knobs, prompt_indices: list[int]) -> dict[str, float]:
        """Set knobs for ``step`` (1-based), whose batch holds ``prompt_indices``."""
        return {}

    def after_step(self, stats: StepStats, knobs: Knobs) -> dict[str, float]:
        """Update state from the finished step's statistics."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027
        pass


def check_actuators(controllers: list[Controller]) -> None:
    """Raise ``ControlError`` when two controllers own one actuator, or one is unknown."""
    owner: dict[str, str] = {}
    for c in controllers:
        for a in c.actuators:
            if a not in ACTUATORS:
                raise ControlError(f"controller {c.name!r} claims unknown actuator {a!r}; known: {', '.join(ACTUATORS)}")
            if a in owner:
                raise ControlError(
                    f"actuator {a!r} is owned by both {owner[a]!r} and {c.name!r}; "
                    "each knob may have one controller (disable one of them in the recipe)"
                )
            owner[a] = c.name
