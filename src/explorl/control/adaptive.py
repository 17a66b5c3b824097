"""Adaptive controller tracking a target-entropy schedule (Entropy Scheduling Alg. 1;
docs/methods/entropy-scheduling.md §4a).

The paper's adaptive clip-higher: after ``warmup`` steps at c_0, every step compares the mean
entropy of the last ``window`` steps (H_curr) with the mean scheduled target over the same
steps (H_sched) and moves the knob c by ±δ, clamped to [c_min, c_max]. Ours: a dead-band —
no move while |H_sched − H_curr| ≤ deadband·H_sched — so c does not chatter around the target.

The same loop can drive another knob. Each actuator has a *sign*: +1 when raising the knob
raises entropy, −1 when it lowers it (``sign=`` overrides it). Defaults (``ACTUATOR_DEFAULTS``):

============  =====  =====  =====  =====  ====  ===========================================
actuator      c_0    δ      c_min  c_max  sign  why
============  =====  =====  =====  =====  ====  ===========================================
eps_high      0.28   0.01   0.2    0.4    +1    the paper; a wider upper clip lets unlikely
                                                tokens grow (DAPO clip-higher)
entropy_coef  0.0    1e-3   0.0    0.05   +1    the bonus pushes entropy up
kl_coef       1e-3   1e-3   0.0    0.1    +1    the KL pulls the policy towards the frozen
                                                reference, whose entropy is higher once RLVR
                                                collapses entropy; the paper uses the KL
                                                penalty to *hold* entropy and removes it to
                                                let entropy anneal (see the note below)
temperature   1.0    0.02   0.5    2.0    +1    a hotter sampler has higher entropy
============  =====  =====  =====  =====  ====  ===========================================

Note on kl_coef: a KL to the reference raises entropy only while the policy's entropy is
below the reference's (the normal RLVR regime). For a run whose entropy sits *above* the
reference (e.g. a strong entropy bonus) the effect reverses; pass ``sign=-1`` there. A wrong
sign turns the loop into positive feedback: the knob runs to a bound and stays there.

Step timing: H_t is known only after step t, so the value set for step t+1 uses the window
of steps ending at t (the paper writes the window ending at t for the clip of step t; with
the entropy measured during the update that value would not exist yet). Steps 1..warmup run
at c_0; the first update is computed after step ``warmup`` and used at step warmup+1.

Release (WSD with ``release=True``): during the annealing phase the knob is held at c_min and
the loop stops, so entropy anneals naturally (eps_high back to 0.2, no bonus, no KL penalty).

PI law (``law: pi``, docs/methods/entropy-scheduling.md#a-pi-law-instead-of; bang-bang stays the
paper's default): with e = sign·(H_sched − H_curr) over the same window, c = clip(c_0 + kp·e + ki·I,
c_min, c_max) and then I += e (``control.laws.pi_step``; conditional-integration anti-windup on by
default, ours). No dead-band: the proportional term is already small near the target. Defaults
(ours): kp = 10·δ (a 0.1-nat error moves the knob by δ), ki = δ. Warm-up and release as above; while
released, I is frozen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from explorl.algorithms.contract import METHOD_RANGES
from explorl.config import AdaptiveControlConfig, RunConfig
from explorl.config.ranges import ADAPTIVE_KNOB_FIELDS, RANGES, Interval
from explorl.control.base import ControlContext, Controller, Decision, Knobs, StepStats
from explorl.control.laws import PIGains, PILaw
from explorl.control.schedules import SCHEDULES, Schedule, make_schedule
from explorl.control.spec import ControllerSpec, check_choice, fail


@dataclass(frozen=True)
class ActuatorSpec:
    """Default c_0, δ and bounds of one actuator, and the sign of its effect on entropy."""

    c0: float
    delta: float
    c_min: float
    c_max: float
    sign: int  # +1: raising the knob raises entropy; −1: raising it lowers entropy


ACTUATOR_DEFAULTS = {
    "eps_high": ActuatorSpec(c0=0.28, delta=0.01, c_min=0.2, c_max=0.4, sign=+1),
    "entropy_coef": ActuatorSpec(c0=0.0, delta=1e-3, c_min=0.0, c_max=0.05, sign=+1),
    "kl_coef": ActuatorSpec(c0=1e-3, delta=1e-3, c_min=0.0, c_max=0.1, sign=+1),
    "temperature": ActuatorSpec(c0=1.0, delta=0.02, c_min=0.5, c_max=2.0, sign=+1),
}


class AdaptiveController(Controller):
    """Move one knob by ±δ per step so the windowed entropy tracks a schedule (ES Algorithm 1).

    Settings: ``control.adaptive`` (``AdaptiveControlConfig``): actuator (``eps_high`` is the
    paper's), schedule, warmup T (ours: 5), window w (ours: 3), delta/init/min/max (δ, c_0 and
    the clamp; ``None`` = the actuator's row of ``ACTUATOR_DEFAULTS``), deadband (ours: 0.02),
    law (``bang_bang`` or ``pi``) with kp, ki, anti_windup (see the module note on the PI law).
    ``schedule=`` overrides the configured schedule with any ``(step, max_steps) -> float``;
    ``sign=`` overrides the actuator's sign (see the module note on kl_coef).

    Metrics:
        ``control/target_entropy`` (before_step): the scheduled target of step t.
        ``control/adaptive_released`` (before_step): 1.0 when a release schedule has released
        the loop at step t (knob at c_min), else 0.0.
        ``control/tracking_error`` (after_step): H_curr − H_sched over the window of the last
        min(w, t) steps ending at t; positive = entropy above schedule.
    """

    name = "adaptive"

    def __init__(self, cfg: AdaptiveControlConfig, *,
                 schedule: Schedule | Callable[[int, int], float] | None = None,
                 sign: int | None = None) -> None:
        spec = ACTUATOR_DEFAULTS[cfg.actuator]
        self.actuator = cfg.actuator
        self.actuators = (cfg.actuator,)
        self.schedule = (
            schedule if schedule is not None else make_schedule(**dataclasses.asdict(cfg.schedule))
        )
        self.warmup, self.window, self.deadband = cfg.warmup, cfg.window, cfg.deadband
        self.delta = spec.delta if cfg.delta is None else cfg.delta
        self.c0 = spec.c0 if cfg.init is None else cfg.init
        self.c_min = spec.c_min if cfg.min is None else cfg.min
        self.c_max = spec.c_max if cfg.max is None else cfg.max
        self.sign = spec.sign if sign is None else sign
        if self.sign not in (1, -1):  # a code-level argument: the config never sets it
            raise ValueError(f"adaptive: sign must be +1 or -1, got {self.sign}")
        self.law = cfg.law
        kp = 10 * self.delta if cfg.kp is None else cfg.kp
        ki = self.delta if cfg.ki is None else cfg.ki
        self.gains = PIGains(kp, ki, self.c_min, self.c_max, bias=self.c0,
                             anti_windup=cfg.anti_windup)
        self.pi = PILaw(self.gains)
        # state
        self.c = self.c0  # knob value of the coming step
        self.history: list[tuple[int, float]] = []  # (step, H_step) of the last `window` steps

    def setup(self, ctx: ControlContext, knobs: Knobs) -> None:
        self.max_steps = ctx.max_steps
        self.c = self.c0
        self.history = []
        self.pi = PILaw(self.gains)

    def _released(self, step: int) -> bool:
        released = getattr(self.schedule, "released", None)
        return bool(released(step, self.max_steps)) if released is not None else False

    def before_step(self, step: int, knobs: Knobs, prompt_indices: list[int]) -> Decision:
        released = self._released(step)
        if released:
            self.c = self.c_min
        return Decision(knobs={self.actuator: self.c}, metrics={
            "control/target_entropy": float(self.schedule(step, self.max_steps)),
            "control/adaptive_released": float(released),
        })

    def after_step(self, stats: StepStats, knobs: Knobs) -> Decision:
        self.history = (self.history + [(stats.step, float(stats.entropy))])[-self.window :]
        h_curr = sum(h for _, h in self.history) / len(self.history)
        h_sched = sum(self.schedule(s, self.max_steps) for s, _ in self.history) / len(self.history)
        control = stats.step >= self.warmup and not self._released(stats.step + 1)
        if control and self.law == "pi":
            self.c = self.pi.step(self.sign * (h_sched - h_curr))
        elif control and abs(h_sched - h_curr) > self.deadband * abs(h_sched):
            direction = 1 if h_sched > h_curr else -1  # +1: entropy must rise
            self.c = min(self.c_max, max(self.c_min, self.c + self.sign * direction * self.delta))
        return Decision(metrics={"control/tracking_error": h_curr - h_sched})

    def state_dict(self) -> dict[str, Any]:
        return {"c": self.c, "history": [[s, h] for s, h in self.history], **self.pi.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.c = float(state["c"])
        self.history = [(int(s), float(h)) for s, h in state["history"]]
        self.pi.load_state_dict({"integral": state.get("integral", 0.0)})  # bang-bang runs: none


def knob_range(ad: AdaptiveControlConfig) -> tuple[float, float, float] | None:
    """(init, min, max) of the knob, with the actuator's defaults (None: unknown actuator)."""
    spec = ACTUATOR_DEFAULTS.get(ad.actuator)
    if spec is None:
        return None
    pick = lambda v, d: d if v is None else v  # noqa: E731
    return pick(ad.init, spec.c0), pick(ad.min, spec.c_min), pick(ad.max, spec.c_max)


def check(cfg: RunConfig) -> None:
    """Known actuator and schedule; when enabled, the knob's values with the actuator's defaults
    filled in satisfy min ≤ init ≤ max inside the knob's own range (e.g. temperature > 0)."""
    ad = cfg.control.adaptive
    check_choice("control.adaptive.actuator", ad.actuator, ACTUATOR_DEFAULTS, "actuator")
    check_choice("control.adaptive.schedule.kind", ad.schedule.kind, SCHEDULES, "schedule")
    if not ad.enabled:
        return
    init, lo, hi = knob_range(ad)
    knob = ADAPTIVE_KNOB_FIELDS[ad.actuator]
    interval = Interval.parse({**RANGES, **METHOD_RANGES}[knob])  # eps_high: the PPO clip's
    for key, v in (("min", lo), ("max", hi), ("init", init)):
        if v not in interval:
            fail(f"control.adaptive.{key}", f"{ad.actuator} must be {interval.describe()} "
                 f"(the range of {knob}), got {v!r}")
    if not lo <= hi:
        fail("control.adaptive.max", f"must be ≥ control.adaptive.min ({lo}), got {hi}")
    if not lo <= init <= hi:
        fail("control.adaptive.init", f"must be in [min, max] = [{lo}, {hi}], got {init}")


SPEC = ControllerSpec(
    name="adaptive",
    cls=AdaptiveController,
    check=check,
    knobs=lambda ad: (ad.actuator,),
    knob_key="actuator",
    knob_range=knob_range,
    steers_entropy=True,
    metrics={
        "control/target_entropy": "the schedule's target entropy of this step",
        "control/adaptive_released": "1 while a WSD release holds the knob at its floor",
        "control/tracking_error": "window mean entropy minus window mean target; > 0 = too high",
    },
)
