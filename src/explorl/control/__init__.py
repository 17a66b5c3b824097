"""Exploration controllers: each reads step statistics and sets knobs (ALGORITHMS §1, 3, 4, 5).

``build_controllers`` turns the enabled controllers of a recipe into an ordered list. The
trainer calls, for each step t and each controller in that order::

    metrics |= c.before_batch(t, knobs)                  # then draw prompts from knobs.dataset
    metrics |= c.before_step(t, knobs, prompt_indices)   # then sample, score, update
    metrics |= c.after_step(stats, knobs)

Order (``CONTROLLER_ORDER``): curriculum, temperature, budget, adaptive, eepo. The curriculum
comes first because it sets ``knobs.n_samples``, which the budget reads as n_default in the
same ``before_step``; the others own disjoint knobs and read only their own statistics, so
their relative order does not change any knob (it fixes the metric order only).

Every controller rewrites the knobs it owns at every ``before_step`` from its own state, so
knobs need not be checkpointed: ``{c.name: c.state_dict()}`` is enough to resume exactly.
"""

from __future__ import annotations

from typing import Any

from explorl.control.adaptive import ACTUATOR_DEFAULTS, ActuatorSpec, AdaptiveController
from explorl.control.base import (
    ACTUATORS,
    ControlContext,
    ControlError,
    Controller,
    Knobs,
    StepStats,
    check_actuators,
)
from explorl.control.budget import BudgetAllocator, allocate_budgets
from explorl.control.curriculum import Curriculum
from explorl.control.eepo import EEPOGate, sample_then_forget, unlearn_step
from explorl.control.schedules import SCHEDULES, Schedule, make_schedule
from explorl.control.temperature import TemperatureScheduler

CONTROLLERS: dict[str, type[Controller]] = {
    "temperature": TemperatureScheduler,
    "budget": BudgetAllocator,
    "eepo": EEPOGate,
    "adaptive": AdaptiveController,
    "curriculum": Curriculum,
}

CONTROLLER_ORDER = ("curriculum", "temperature", "budget", "adaptive", "eepo")

# Pairs that each steer entropy towards their own target. Run together they fight over the
# same quantity (and both log control/target_entropy), so a recipe may enable only one.
EXCLUSIVE = (("temperature", "adaptive"),)


def build_controllers(
    specs: dict[str, dict[str, Any]], ctx: ControlContext, knobs: Knobs
) -> list[Controller]:
    """Instantiate the enabled controllers in ``CONTROLLER_ORDER`` and set them up.

    ``specs`` maps a controller name (a ``CONTROLLERS`` key) to its constructor kwargs; only
    enabled controllers appear. Raises ``ControlError`` for an unknown name, bad kwargs, two
    owners of one actuator, or two entropy trackers (temperature and adaptive).
    """
    unknown = set(specs) - set(CONTROLLERS)
    if unknown:
        raise ControlError(
            f"unknown controller(s) {', '.join(sorted(unknown))}; valid: {', '.join(CONTROLLERS)}"
        )
    controllers: list[Controller] = []
    for name in CONTROLLER_ORDER:
        if name not in specs:
            continue
        try:
            controllers.append(CONTROLLERS[name](**specs[name]))
        except TypeError as e:  # a misspelt or missing kwarg
            raise ControlError(f"controller {name!r}: {e}") from e
    check_actuators(controllers)
    for a, b in EXCLUSIVE:
        if a in specs and b in specs:
            raise ControlError(
                f"controllers {a!r} and {b!r} both steer entropy towards their own target and would "
                "fight each other; enable one of them"
            )
    for c in controllers:
        c.setup(ctx, knobs)
    return controllers


__all__ = [
    "ACTUATORS",
    "ACTUATOR_DEFAULTS",
    "CONTROLLERS",
    "CONTROLLER_ORDER",
    "SCHEDULES",
    "ActuatorSpec",
    "AdaptiveController",
    "BudgetAllocator",
    "ControlContext",
    "ControlError",
    "Controller",
    "Curriculum",
    "EEPOGate",
    "Knobs",
    "Schedule",
    "StepStats",
    "TemperatureScheduler",
    "allocate_budgets",
    "build_controllers",
    "check_actuators",
    "make_schedule",
    "sample_then_forget",
    "unlearn_step",
]
