"""Exploration controllers: each reads step statistics and decides knobs (docs/methods/e3.md,
eepo.md, entropy-scheduling.md, combining.md).

``build_controllers`` turns the enabled sections of ``control`` into an ordered list, and
``ControlBank`` runs them for the trainer. For each step t and each controller in order::

    knobs <- c.before_batch(t, knobs)                  # then draw prompts from knobs.dataset
    knobs <- c.before_step(t, knobs, prompt_indices)   # then sample and score
    knobs <- c.before_update(stats, knobs)             # loss-side knobs; then update
    c.after_step(stats, knobs)                         # metrics only

Hooks return a ``Decision``; the bank applies its knob changes, rejecting a knob the controller
did not claim, so "one owner per knob" is enforced, not declared.

Each controller is registered by its ``ControllerSpec`` in ``CONTROLLER_SPECS``
(``control.registry``), whose order is the order they run (``CONTROLLER_ORDER``: the curriculum
before the budget, see there). ``before_update`` may change only the knobs the update alone reads
(``UPDATE_KNOBS``): the step is sampled by then.

The knobs are part of the trainer's checkpoint (``ControlBank.state_dict``), beside each
controller's own state: a knob no controller owns keeps its configured value, and one a
controller owns is rewritten from that controller's state every step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from explorl.config import ControlConfig
from explorl.control.adaptive import ACTUATOR_DEFAULTS, ActuatorSpec, AdaptiveController
from explorl.control.base import (
    ACTUATORS,
    ControlContext,
    ControlError,
    Controller,
    Decision,
    Knobs,
    StepStats,
    apply_decision,
    check_actuators,
)
from explorl.control.budget import BudgetAllocator, allocate_budgets
from explorl.control.curriculum import Curriculum
from explorl.control.eepo import EEPOGate
from explorl.control.entropic import EntroPICController
from explorl.control.entropy_coef import EntropyCoefController
from explorl.control.laws import EntroPICLaw, EntropyCoefLaw, PIGains, PILaw, pi_step
from explorl.control.registry import (
    CONTROLLER_ORDER,
    CONTROLLER_SPECS,
    CONTROLLERS,
    check_control_config,
    enabled_controllers,
)
from explorl.control.schedules import SCHEDULES, Schedule, make_schedule
from explorl.control.spec import ControllerSpec
from explorl.control.temperature import TemperatureScheduler

# Knobs only the update reads: the ones ``before_update`` may still change.
UPDATE_KNOBS = ("eps_high", "entropy_coef", "kl_coef", "pos_neg_weight")


def build_controllers(cfg: ControlConfig, ctx: ControlContext, knobs: Knobs, *,
                      anneal_dataset: bool = False) -> list[Controller]:
    """Instantiate the enabled controllers of ``cfg`` in ``CONTROLLER_ORDER`` and set them up."""
    check_control_config(cfg)
    controllers = [CONTROLLER_SPECS[name].make(getattr(cfg, name), anneal_dataset=anneal_dataset)
                   for name in enabled_controllers(cfg)]
    check_actuators(controllers)
    for c in controllers:
        c.setup(ctx, knobs)
    return controllers


def bank_from_config(cfg, *, vocab_size: int, dataset_size: int) -> ControlBank:
    """A run's controllers and its initial knobs, from a ``RunConfig``: the knobs start at the
    configured values (``rollout``, ``algorithm``) and the enabled controllers own some of them."""
    a = cfg.algorithm
    knobs = Knobs(
        temperature=cfg.rollout.temperature,
        eps_high=a.eps_high,
        entropy_coef=a.entropy_coef,
        kl_coef=a.kl_coef,
        n_samples=cfg.rollout.n_samples,
        max_response_len=cfg.rollout.max_response_len,
    )
    ctx = ControlContext(
        vocab_size=vocab_size,
        dataset_size=dataset_size,
        max_steps=cfg.max_steps,
        prompts_per_step=cfg.data.prompts_per_step,
        n_samples=cfg.rollout.n_samples,
    )
    controllers = build_controllers(cfg.control, ctx, knobs, anneal_dataset=bool(cfg.data.anneal))
    return ControlBank(controllers, knobs)


class ControlBank:
    """The run's controllers and the knobs they decide, applied in order with ownership checked."""

    def __init__(self, controllers: list[Controller], knobs: Knobs) -> None:
        check_actuators(controllers)
        self.controllers, self.knobs = controllers, knobs

    def _run(self, hook: str, *args) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for c in self.controllers:
            d = getattr(c, hook)(*args[:1], self.knobs, *args[1:])
            self.knobs = apply_decision(self.knobs, d, c)
            metrics.update(d.metrics)
        return metrics

    def before_batch(self, step: int) -> dict[str, float]:
        return self._run("before_batch", step)

    def before_step(self, step: int, prompt_indices: list[int]) -> dict[str, float]:
        return self._run("before_step", step, prompt_indices)

    def for_batch(self, sampled: Knobs | None = None) -> Knobs:
        """The knobs of the update of the batch ``sampled`` knobs drew: its sampling knobs, the
        loss-side ones (``UPDATE_KNOBS``) as decided now. Under ``rollout.async`` the bank has
        already decided the knobs of later batches; a batch's statistics belong to its own."""
        if sampled is None:
            return self.knobs
        return dataclasses.replace(sampled, **{k: getattr(self.knobs, k) for k in UPDATE_KNOBS})

    def before_update(self, stats: StepStats, sampled: Knobs | None = None) -> dict[str, float]:
        metrics: dict[str, float] = {}
        knobs = self.for_batch(sampled)
        for c in self.controllers:
            d = c.before_update(stats, knobs)
            late = sorted(set(d.knobs) - set(UPDATE_KNOBS))
            if late:
                raise ControlError(f"controller {c.name!r} changed {late} in before_update, "
                                   "after the step was sampled; use before_step")
            knobs = apply_decision(knobs, d, c)
            metrics.update(d.metrics)
        self.knobs = dataclasses.replace(self.knobs,
                                         **{k: getattr(knobs, k) for k in UPDATE_KNOBS})
        return metrics

    def after_step(self, stats: StepStats, sampled: Knobs | None = None) -> dict[str, float]:
        metrics: dict[str, float] = {}
        knobs = self.for_batch(sampled)
        for c in self.controllers:
            d = c.after_step(stats, knobs)
            if d.knobs:
                raise ControlError(
                    f"controller {c.name!r} changed knobs in after_step; use before_step"
                )
            metrics.update(d.metrics)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"knobs": dataclasses.asdict(self.knobs),
                "controllers": {c.name: c.state_dict() for c in self.controllers}}

    def load_state_dict(self, state: dict[str, Any], where: str = "checkpoint") -> None:
        knobs = dict(state["knobs"])
        if knobs.get("budgets") is not None:
            knobs["budgets"] = tuple(knobs["budgets"])
        self.knobs = Knobs(**knobs)
        for c in self.controllers:
            if c.name not in state["controllers"]:
                raise ControlError(f"{where} has no state for controller {c.name!r}; "
                                   "resume with the configuration the run started with")
            c.load_state_dict(state["controllers"][c.name])


__all__ = [
    "ACTUATORS",
    "ACTUATOR_DEFAULTS",
    "CONTROLLERS",
    "CONTROLLER_ORDER",
    "CONTROLLER_SPECS",
    "SCHEDULES",
    "ActuatorSpec",
    "AdaptiveController",
    "BudgetAllocator",
    "ControlBank",
    "ControlContext",
    "ControlError",
    "Controller",
    "ControllerSpec",
    "Curriculum",
    "Decision",
    "EEPOGate",
    "EntroPICController",
    "EntropyCoefController",
    "Knobs",
    "Schedule",
    "StepStats",
    "TemperatureScheduler",
    "allocate_budgets",
    "apply_decision",
    "bank_from_config",
    "build_controllers",
    "check_actuators",
    "check_control_config",
    "enabled_controllers",
    "make_schedule",
    # pure control laws (§6f, §6g) for controllers to wrap
    "EntroPICLaw",
    "EntropyCoefLaw",
    "PIGains",
    "PILaw",
    "pi_step",
]
