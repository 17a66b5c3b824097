"""EEPO's gate: when to take the unlearning step (EEPO §3.2, Eq. 4–5; docs/methods/eepo.md §3).

The two-stage sampling itself is a sampling strategy (``explorl.rollout.two_stage``); this
controller only owns the ``unlearn`` knob.
"""

from __future__ import annotations

from typing import Any

from explorl.config import EEPOControlConfig, RunConfig
from explorl.control.base import ControlContext, Controller, Decision, Knobs, StepStats
from explorl.control.spec import ControllerSpec, require


class EEPOGate(Controller):
    """Open the unlearning gate when the m-step moving-average entropy is below α (EEPO Eq. 4–5).

    ``unlearn`` for step t is True iff the mean of ``stats.entropy`` over the last min(m, t−1)
    finished steps is < α. At step 1 there is no history and the gate is closed. The paper's
    H̄_t includes step t; here step t's entropy is known only after step t, so the average ends
    at t−1 (verl likewise measures entropy during the previous update). ``stats.entropy`` is
    the policy's own entropy — stage 1, and stage 2 when it was sampled by the policy — never
    that of the unlearned copy: Algorithm 1 checks the policy before unlearning, and a gate fed
    the copy's raised entropy would shut itself every other step.

    Settings: ``control.eepo`` (``EEPOControlConfig``): window m (EEPO: 3), alpha α (EEPO: 0.3);
    lr, eps_l and eps_r belong to the sampler (``rollout/two_stage.py``).

    Metric (before_step): ``eepo/entropy_ma``: the moving average compared with α (absent at
    step 1). Whether the step ran is the sampler's ``eepo/active``.
    """

    name = "eepo"
    actuators = ("unlearn",)

    def __init__(self, cfg: EEPOControlConfig) -> None:
        self.window, self.alpha = cfg.window, cfg.alpha
        self.history: list[float] = []  # entropies of the last `window` finished steps

    def setup(self, ctx: ControlContext, knobs: Knobs) -> None:
        self.history = []

    def before_step(self, step: int, knobs: Knobs, prompt_indices: list[int]) -> Decision:
        if not self.history:
            return Decision(knobs={"unlearn": False})
        ma = sum(self.history) / len(self.history)
        return Decision(knobs={"unlearn": ma < self.alpha}, metrics={"eepo/entropy_ma": ma})

    def after_step(self, stats: StepStats, knobs: Knobs) -> Decision:
        self.history = (self.history + [float(stats.entropy)])[-self.window:]
        return Decision()

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = [float(h) for h in state["history"]]


def check(cfg: RunConfig) -> None:
    """p_clip's interval is not empty; the gate needs groups it can split into two stages."""
    e = cfg.control.eepo
    require("control.eepo.eps_r", e.eps_l < 1 - e.eps_r, "need control.eepo.eps_l < 1 − eps_r")
    require("control.eepo.enabled", not e.enabled or cfg.rollout.n_samples >= 2,
            "EEPO needs rollout.n_samples ≥ 2")


SPEC = ControllerSpec(
    name="eepo",
    cls=EEPOGate,
    check=check,
    metrics={"eepo/entropy_ma": "the moving-average entropy the gate compared with α"},
)
