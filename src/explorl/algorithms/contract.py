"""The knob contract (docs/methods/combining.md §7d, ours): the typed parameters of one update, and
which of them each policy loss and each advantage estimator reads.

A controller moves a knob (``control.Knobs``: eps_high, entropy_coef, kl_coef, pos_neg_weight,
temperature, ...); the knob must reach the loss, or the controller steers nothing while its
metric moves. ``LossParams`` is the one record the update passes to a loss, built in one place
(``LossParams.build``) from the ``algorithm`` section and the step's knobs. Each loss's spec
(``LossSpec.reads``) names the fields it reads (checked against the code by tests that record
every attribute a loss touches); ``knobs_read`` adds the terms the update puts on top of any
loss and the advantage side (``AdvantageSpec.reads_correctness``), so a config check can refuse
a controller whose knob nothing reads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from explorl.algorithms.advantages import ADVANTAGE_SPECS
from explorl.algorithms.losses import LOSS_SPECS, loss_agg
from explorl.algorithms.spec import owned_ranges

METHOD_RANGES: dict[str, str] = owned_ranges(
    [*LOSS_SPECS.values(), *ADVANTAGE_SPECS.values()])
"""``algorithm.<field>`` -> interval of every field a loss or an advantage estimator owns, from
their specs (``LossSpec.ranges``, ``AdvantageSpec.ranges``; one field's interval is the same in
every spec that declares it). ``validation`` checks them with ``config.RANGES``."""

LOSS_KNOBS = ("eps_high", "entropy_coef", "kl_coef", "pos_neg_weight", "temperature")
"""Knobs a controller may move that act through the update (``LossParams`` fields)."""

UPDATE_READS = frozenset({"entropy_coef", "kl_coef", "kl_estimator", "pos_neg_weight",
                          "temperature", "agg"})
"""Fields the update reads for every loss: the entropy bonus (entropy_coef), the reference KL
term (kl_coef, kl_estimator), EntroPIC's term (pos_neg_weight), the forward's temperature (the
log-probs of every loss) and the aggregation mode."""


@dataclass(frozen=True)
class LossParams:
    """Everything a policy loss and the update's extra terms read for one step.

    The ``algorithm`` fields are the recipe's; the five knobs are the step's (``control.Knobs``,
    possibly moved by a controller). ``kl_coef`` is the β of the KL *loss term*: 0 when
    ``algorithm.kl_in_reward`` moves the KL into the reward instead.
    """

    eps_low: float
    eps_high: float  # knob
    clip_c: float | None
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    kl_cov_coef: float
    kl_cov_tol: float
    cispo_w_max: float
    cispo_mask: bool
    sapo_tau_pos: float
    sapo_tau_neg: float
    vespo_k_pos: float
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float
    agg: str
    kl_estimator: str
    entropy_coef: float  # knob
    kl_coef: float  # knob (the loss term's β)
    pos_neg_weight: float  # knob (EntroPIC's α)
    temperature: float  # knob (the forward's temperature)

    @classmethod
    def build(cls, algorithm, knobs) -> LossParams:
        """The step's parameters: the knobs from ``knobs``, every other field from ``algorithm``
        (an ``AlgorithmConfig``). The only place a loss's parameters are assembled."""
        values = {}
        for f in dataclasses.fields(cls):
            source = knobs if f.name in LOSS_KNOBS else algorithm
            values[f.name] = getattr(source, f.name)
        if getattr(algorithm, "kl_in_reward", False):
            values["kl_coef"] = 0.0  # β acts in the reward (training/advantages.py)
        values["agg"] = loss_agg(algorithm.loss, algorithm.agg)  # unset: the loss's own
        return cls(**values)


def knobs_read(algorithm) -> frozenset[str]:
    """The ``LOSS_KNOBS`` that reach the loss or its advantages under this ``algorithm``
    section: the loss's own (``LossSpec.reads``), the update's terms (``UPDATE_READS``), and
    kl_coef moved into the reward by ``kl_in_reward``, which reaches only the estimators that
    read the reward (not the pass@k ones, ``AdvantageSpec.reads_correctness``)."""
    reads = set(LOSS_SPECS[algorithm.loss].reads) | UPDATE_READS
    if getattr(algorithm, "kl_in_reward", False):
        reads.discard("kl_coef")
        spec = ADVANTAGE_SPECS.get(algorithm.advantage)
        if spec is None or not spec.reads_correctness:
            reads.add("kl_coef")
    return frozenset(reads) & frozenset(LOSS_KNOBS)


def why_not_read(algorithm, knob: str) -> str:
    """One line saying why ``knob`` does not reach the update under ``algorithm``."""
    if knob == "kl_coef" and getattr(algorithm, "kl_in_reward", False):
        return (f"algorithm.kl_in_reward puts the KL into the reward, and advantage "
                f"{algorithm.advantage!r} reads correctness, not the reward")
    return LOSS_SPECS[algorithm.loss].why_not.get(
        knob, f"loss {algorithm.loss!r} does not read {knob}")
