"""The registry of controllers: one line per controller, in the order they run each step.

Order: curriculum, temperature, budget, adaptive, entropic, entropy_coef, eepo. The curriculum
comes first because it sets ``n_samples``, which the budget reads as n_default in the same
``before_step``; the others own disjoint knobs, so their order fixes the metric order only.
Every ``control.<name>`` section of ``ControlConfig`` has an entry here (a test checks both ways).
"""

from __future__ import annotations

import itertools

from explorl.config import ControlConfig
from explorl.control.adaptive import SPEC as ADAPTIVE
from explorl.control.base import ControlError, Controller
from explorl.control.budget import SPEC as BUDGET
from explorl.control.curriculum import SPEC as CURRICULUM
from explorl.control.eepo import SPEC as EEPO
from explorl.control.entropic import SPEC as ENTROPIC
from explorl.control.entropy_coef import SPEC as ENTROPY_COEF
from explorl.control.spec import ControllerSpec
from explorl.control.temperature import SPEC as TEMPERATURE

CONTROLLER_SPECS: dict[str, ControllerSpec] = {spec.name: spec for spec in (
    CURRICULUM, TEMPERATURE, BUDGET, ADAPTIVE, ENTROPIC, ENTROPY_COEF, EEPO,
)}
"""Section name -> the controller's spec, in the order the controllers run."""

CONTROLLERS: dict[str, type[Controller]] = {n: s.cls for n, s in CONTROLLER_SPECS.items()}
"""Section name -> controller class."""

CONTROLLER_ORDER = tuple(CONTROLLER_SPECS)

# Controllers that each steer entropy towards their own target. Run together they fight over the
# same quantity (and each logs control/target_entropy), so a recipe may enable only one.
ENTROPY_TRACKERS = tuple(n for n, s in CONTROLLER_SPECS.items() if s.steers_entropy)
EXCLUSIVE = tuple(itertools.combinations(ENTROPY_TRACKERS, 2))


def enabled_controllers(cfg: ControlConfig) -> list[str]:
    """Names of the enabled controller sections, in ``CONTROLLER_ORDER``."""
    return [name for name in CONTROLLER_ORDER if getattr(cfg, name).enabled]


def controller_writes(cfg: ControlConfig) -> dict[str, tuple[str, ...]]:
    """Enabled controller name -> the actuators it writes."""
    return {name: CONTROLLER_SPECS[name].writes(getattr(cfg, name))
            for name in enabled_controllers(cfg)}


def check_control_config(cfg: ControlConfig) -> None:
    """Conflicts between enabled controllers, checkable before anything is built."""
    on = set(enabled_controllers(cfg))
    for a, b in EXCLUSIVE:
        if a in on and b in on:
            raise ControlError(
                f"control.{a} and control.{b} both steer entropy towards their own target "
                "and would fight each other; enable one of them"
            )
    owners: dict[str, str] = {}
    for name, claimed in controller_writes(cfg).items():
        for act in claimed:
            if act in owners:
                raise ControlError(f"actuator {act!r} is owned by both control.{owners[act]} and "
                                   f"control.{name}; each knob may have one controller")
            owners[act] = name
