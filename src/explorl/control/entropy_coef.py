"""The adaptive entropy coefficient of Skywork-OR1 (arXiv 2505.22312, ``EntController``) and
TRL #6140 (docs/methods/wider-field.md §6g), as a controller owning ``entropy_coef``.

At step t with entropy e_t (global, the pre-update policy's on the step's own rollouts): first
c_t = clip(c_{t−1} ± Δ, c_min, c_max), + while e_t < H*, then the update's bonus coefficient is
c_t·1[e_t < H*] (update, then apply: Skywork-OR1's order; c_0 = ``init``). The law steps at
every step whatever c is: TRL's first version ran it only while c ≠ 0, so a run whose c reached
c_min = 0 never raised it again (the dead-at-zero pitfall).
"""

from __future__ import annotations

from typing import Any

from explorl.config import EntropyCoefControlConfig, RunConfig
from explorl.control.base import ControlContext, Controller, Decision, Knobs, StepStats
from explorl.control.laws import EntropyCoefLaw
from explorl.control.spec import ControllerSpec, require


class EntropyCoefController(Controller):
    """Owns ``entropy_coef``, decided in ``before_update`` from the step's own entropy.

    Settings: ``control.entropy_coef`` (``EntropyCoefControlConfig``): target (Skywork 0.2),
    delta (1e-4), init (0), min (0), max (5e-3), inclusive (TRL's ≤; off).

    Metrics (before_update): ``control/target_entropy`` (H*), ``control/entropy_coef_next``
    (c after this step's update, carried to the next step; the applied value when e < H*). The
    coefficient this step's update uses is ``control/entropy_coef``.
    """

    name = "entropy_coef"
    actuators = ("entropy_coef",)

    def __init__(self, cfg: EntropyCoefControlConfig) -> None:
        self.cfg = cfg
        self.law = self._law()

    def _law(self) -> EntropyCoefLaw:
        c = self.cfg
        return EntropyCoefLaw(c.target, c.delta, c.min, c.max, coef=c.init, inclusive=c.inclusive)

    def setup(self, ctx: ControlContext, knobs: Knobs) -> None:
        self.law = self._law()

    def before_update(self, stats: StepStats, knobs: Knobs) -> Decision:
        applied, nxt = self.law.step(stats.entropy)
        return Decision(knobs={"entropy_coef": applied}, metrics={
            "control/target_entropy": float(self.cfg.target),
            "control/entropy_coef_next": float(nxt),
        })

    def state_dict(self) -> dict[str, Any]:
        return self.law.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.law.load_state_dict(state)


def check(cfg: RunConfig) -> None:
    """c₀ lies inside the clamp."""
    ec = cfg.control.entropy_coef
    require("control.entropy_coef.init", ec.min <= ec.init <= ec.max,
            "need control.entropy_coef.min ≤ init ≤ max")


SPEC = ControllerSpec(
    name="entropy_coef",
    cls=EntropyCoefController,
    check=check,
    knob_range=lambda s: (s.init, s.min, s.max),
    steers_entropy=True,
    metrics={
        "control/target_entropy": "the target entropy H*",
        "control/entropy_coef_next": "the coefficient c the next step starts from",
    },
)
