"""EntroPIC's controller (arXiv 2511.15248; docs/methods/wider-field.md §6f): a PI loop on the
weight of positive vs negative samples among confident tokens.

At every step, before the update, α = clip(Kp·e + Ki·I, −1, 1) with e = H − H* (H: the global
entropy of the step's own rollouts, the pre-update policy's at the sampling temperature) and I
the sum of the earlier errors; then I += e. The update adds α · mean over confident tokens of
−ratio·|A| to the loss (``update.py``, ``algorithms.regularisers.entropic_confident_term``):
α > 0 (entropy above target) reinforces confident positives and spares confident negatives,
which sharpens; α < 0 does the opposite. **Ours**: one α per step from the global entropy (the
official code steps per micro-batch and per rank), I in the checkpoint.
"""

from __future__ import annotations

from typing import Any

from explorl.config import EntroPICControlConfig
from explorl.control.base import ControlContext, Controller, Decision, Knobs, StepStats
from explorl.control.laws import EntroPICLaw
from explorl.control.spec import ControllerSpec


class EntroPICController(Controller):
    """Owns ``pos_neg_weight`` (α), decided in ``before_update`` from the step's own entropy.

    Settings: ``control.entropic`` (``EntroPICControlConfig``): target H* (official 0.1 at
    T = 0.6; < 0 = off), kp (1), ki (0.01), anti_windup (off), p_min (0.95, read by the update).

    Metrics (before_update): ``control/target_entropy`` (H*), ``control/pos_neg_weight`` (the
    α of this step's update), ``control/entropic_integral`` (I after this step's error).
    """

    name = "entropic"
    actuators = ("pos_neg_weight",)

    def __init__(self, cfg: EntroPICControlConfig) -> None:
        self.target = cfg.target
        self.law = EntroPICLaw(cfg.target, cfg.kp, cfg.ki, anti_windup=cfg.anti_windup)

    def setup(self, ctx: ControlContext, knobs: Knobs) -> None:
        self.law.integral = 0.0

    def before_update(self, stats: StepStats, knobs: Knobs) -> Decision:
        alpha = self.law.step(stats.entropy)
        return Decision(knobs={"pos_neg_weight": alpha}, metrics={
            "control/target_entropy": float(self.target),
            "control/pos_neg_weight": float(alpha),
            "control/entropic_integral": float(self.law.integral),
        })

    def state_dict(self) -> dict[str, Any]:
        return self.law.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.law.load_state_dict(state)


SPEC = ControllerSpec(
    name="entropic",
    cls=EntroPICController,
    steers_entropy=True,
    metrics={
        "control/target_entropy": "the target entropy H*",
        "control/pos_neg_weight": "α of this step's update; > 0 sharpens, < 0 raises entropy",
        "control/entropic_integral": "the integral I after this step's error H − H*",
    },
)
