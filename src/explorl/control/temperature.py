"""E3 temperature scheduler with optional annealing (E3 Eq. 4 and 5, docs/methods/e3.md §1a/§1b).

Step timing (t is the 1-based step):

- ``before_step(t)`` writes ``knobs.temperature = T_t``. The trainer samples, computes
  old log-probs and the loss's log-probs at T_t, and measures H_t at T_t.
- ``after_step(t)`` reads H_t. Step 1 only records ``H0 = H_1``. From step 2 on it computes
  the target for step t and the next temperature

      T_{t+1} = T_t · [1 + T_t · ln(target_t / H_t) / (ln|V| + ln ln|V|)],

  clamped to [t_min, t_max] (ours: the published code has no bounds). The first update is
  computed after step 2 (at step 1, H_1 = H0 would give ln 1 = 0 anyway), so T_1 = T_2 =
  t_init and T_3 is the first temperature that can differ.

Annealing target (Eq. 5): target_t = H0 for t < anneal_start, and for t ≥ anneal_start
``H0 · [(1−β)·½(1 + cos(π·progress_t)) + β]`` with progress_t = (t − anneal_start)/(max_steps −
anneal_start). The update after step t uses target_t, the target *of the step whose entropy
it compares* (the paper's statement). The published code lags by one step: it updates the
target after the temperature step, so its update after step t uses target_{t−1}.
"""

from __future__ import annotations

import math
from typing import Any

from explorl.config import RunConfig, TemperatureControlConfig
from explorl.control.base import (
    ControlContext,
    ControlError,
    Controller,
    Decision,
    Knobs,
    StepStats,
)
from explorl.control.schedules import anneal_progress
from explorl.control.spec import ControllerSpec, require

_TINY = 1e-12  # floor for entropies in ln(target/H): a collapsed policy (H = 0) asks for T_max


class TemperatureScheduler(Controller):
    """Hold the policy entropy at its first-step level H0 by retuning the sampling temperature.

    Settings: ``control.temperature`` (``TemperatureControlConfig``): t_min, t_max (our clamp),
    anneal, annealing_ratio (E3: 0.4), beta (E3: 0.9). T_1 is the knobs' initial temperature
    (``rollout.temperature``).

    Metrics (the trainer logs the temperature each step used as ``control/temperature``):
        ``control/temperature_next`` (after_step): T_{t+1} after clamping.
        ``control/target_entropy`` (after_step): target_t, the entropy H_t was steered
        towards (H0 at step 1).
        ``control/temperature_clamped`` (after_step): 1.0 when the unclamped T_{t+1} fell
        outside [t_min, t_max], else 0.0.
    """

    name = "temperature"
    actuators = ("temperature",)

    def __init__(self, cfg: TemperatureControlConfig) -> None:
        self.t_min, self.t_max = cfg.t_min, cfg.t_max
        self.anneal, self.annealing_ratio, self.beta = cfg.anneal, cfg.annealing_ratio, cfg.beta
        # state
        self.T: float = 1.0  # temperature of the coming step
        self.H0: float | None = None  # mean entropy of step 1

    def setup(self, ctx: ControlContext, knobs: Knobs) -> None:
        if ctx.vocab_size < 3:  # ln ln|V| must be defined and > 0
            raise ControlError(f"temperature: vocab_size must be ≥ 3, got {ctx.vocab_size}")
        self.max_steps = ctx.max_steps
        self.log_v = math.log(ctx.vocab_size) + math.log(math.log(ctx.vocab_size))
        t0 = knobs.temperature
        if not self.t_min <= t0 <= self.t_max:
            raise ControlError(
                f"temperature: initial T={t0} is outside [t_min, t_max] = "
                f"[{self.t_min}, {self.t_max}]"
            )
        self.T = float(t0)
        self.H0 = None

    def target(self, step: int) -> float:
        """Target entropy of ``step`` (E3 Eq. 5 when annealing; H0 otherwise)."""
        assert self.H0 is not None, "H0 is recorded at step 1"
        p = anneal_progress(step, self.max_steps, self.annealing_ratio) if self.anneal else None
        if p is None:
            return self.H0
        return self.H0 * ((1 - self.beta) * 0.5 * (1 + math.cos(math.pi * p)) + self.beta)

    def before_step(self, step: int, knobs: Knobs, prompt_indices: list[int]) -> Decision:
        return Decision(knobs={"temperature": self.T})

    def after_step(self, stats: StepStats, knobs: Knobs) -> Decision:
        if self.H0 is None:  # step 1: only record the level to hold
            self.H0 = float(stats.entropy)
            return Decision(metrics={
                "control/target_entropy": self.H0,
                "control/temperature_next": self.T,
                "control/temperature_clamped": 0.0,
            })
        target = self.target(stats.step)
        log_ratio = math.log(max(target, _TINY) / max(stats.entropy, _TINY))
        t_raw = self.T * (1 + self.T * log_ratio / self.log_v)
        self.T = min(self.t_max, max(self.t_min, t_raw))
        return Decision(metrics={
            "control/target_entropy": target,
            "control/temperature_next": self.T,
            "control/temperature_clamped": float(not self.t_min <= t_raw <= self.t_max),
        })

    def state_dict(self) -> dict[str, Any]:
        return {"T": self.T, "H0": self.H0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.T = float(state["T"])
        self.H0 = None if state["H0"] is None else float(state["H0"])


def check(cfg: RunConfig) -> None:
    """The clamp is an interval, and the run's first temperature lies inside it."""
    t = cfg.control.temperature
    require("control.temperature.t_min", t.t_min <= t.t_max, "must be ≤ control.temperature.t_max")
    require("rollout.temperature", not t.enabled or t.t_min <= cfg.rollout.temperature <= t.t_max,
            f"the temperature scheduler starts here, so it must be in control.temperature's "
            f"[t_min, t_max] = [{t.t_min}, {t.t_max}]")


SPEC = ControllerSpec(
    name="temperature",
    cls=TemperatureScheduler,
    check=check,
    steers_entropy=True,
    metrics={
        "control/target_entropy": "the entropy this step was steered towards (H0, or annealed)",
        "control/temperature_next": "the temperature of the next step, after clamping",
        "control/temperature_clamped": "1 when the formula's value was clamped to [t_min, t_max]",
    },
)
