"""What explorl needs to know about a policy loss or an advantage estimator, declared beside it.

Each loss module ends with its ``LossSpec`` (one per loss), each estimator with its
``AdvantageSpec``; one line in ``losses.LOSS_SPECS`` or ``advantages.ADVANTAGE_SPECS`` registers
it. Everything generic reads the spec: dispatch (``LOSSES``, ``compute_advantages``), the
aggregation rules and their config check, how the rollout correction reaches the loss, the knob
contract (``contract.knobs_read``: the fields a loss reads, why it ignores a knob), the allowed
interval of every ``algorithm`` field a method owns (``ranges``, checked at load) and the page
that documents it (``docs``, checked by a test). Adding a loss is one function and one
registration.

Plain data: the specs hold names and interval strings, never the config classes (``explorl.config``
sits below; ``validation`` joins the two).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from explorl.algorithms.aggregation import AGG_MODES

CORRECTION_FORMS = ("token", "fold", "response-mean")
"""How a loss takes the rollout correction's token weights w_t: ``token`` (its per-token loss
times w_t), ``fold`` (into its own sequence weight, VESPO), ``response-mean`` (each response's
loss times the mean of its tokens' weights, LUSPO)."""


@dataclass(frozen=True)
class LossSpec:
    """One policy loss: its ``algorithm.loss`` name, function, aggregation, correction form,
    the fields it reads and owns, and its documentation."""

    name: str
    """The ``algorithm.loss`` value."""
    fn: Callable
    """``fn(logp, old_logp, advantages, mask, cfg, generator=None, selection=None, **extra)
    -> (per_token_loss, metrics)`` (``losses`` module docstring)."""
    docs: str
    """Its section in the documentation, ``page.md#anchor`` relative to docs/."""
    reads: frozenset[str]
    """The ``LossParams`` fields the loss and its selector read (a test records every attribute
    they touch). A knob it does not read is refused for a controller (the knob contract)."""
    ranges: Mapping[str, str] = field(default_factory=dict)
    """The ``algorithm`` fields it owns -> their interval (``"(0, inf)"``), checked at load. A
    field read by several losses is owned by one (the PPO clip's by ``ppo``)."""
    agg: str = "token-mean"
    """Its aggregation: what ``algorithm.agg`` left unset means."""
    aggs: tuple[str, ...] = AGG_MODES
    """The aggregations it can take; any other is refused at load, naming ``algorithm.agg``."""
    agg_why: str = ""
    """Why it takes only ``aggs`` (for the error), when they are not all of ``AGG_MODES``."""
    entropy_agg: str | None = None
    """The entropy bonus's aggregation; None = as the policy term."""
    correction: str = "token"
    """How it takes the rollout correction's token weights (``CORRECTION_FORMS``)."""
    correction_modes: tuple[str, ...] | None = None
    """The rollout correction modes it accepts besides auto and off; None = all."""
    selector: Callable | None = None
    """Its token selection over a whole mini-batch (Clip-Cov, KL-Cov), run before the batch's
    micro-batches."""
    why_not: Mapping[str, str] = field(default_factory=dict)
    """Knob -> why the loss does not read it, for the knob contract's error."""

    def __post_init__(self) -> None:
        bad = ([self.agg] if self.agg not in self.aggs else []) + [
            a for a in self.aggs if a not in AGG_MODES]
        if bad or self.correction not in CORRECTION_FORMS or not self.ranges.keys() <= self.reads:
            raise ValueError(f"LossSpec {self.name!r}: aggregations {bad}, correction "
                             f"{self.correction!r}, owned fields not read "
                             f"{sorted(set(self.ranges) - self.reads)}")
        if self.correction_modes is not None and self.correction != "fold":
            raise ValueError(f"LossSpec {self.name!r}: correction_modes only for a fold")
        if tuple(self.aggs) != AGG_MODES and not self.agg_why:
            raise ValueError(f"LossSpec {self.name!r}: say why it takes only {self.aggs}")


@dataclass(frozen=True)
class AdvantageSpec:
    """One advantage estimator: its ``algorithm.advantage`` name, function, what it takes
    besides the rewards, the fields it owns and its documentation."""

    name: str
    """The ``algorithm.advantage`` value."""
    fn: Callable
    """``fn(rewards, group_index, eps, **kw) -> advantages`` (``advantages`` module docstring)."""
    docs: str
    """Its section in the documentation, ``page.md#anchor`` relative to docs/."""
    ranges: Mapping[str, str] = field(default_factory=dict)
    """The ``algorithm`` fields it reads -> their interval; an interval declared by several
    estimators must be the same in each."""
    takes_k: bool = False
    """It optimises pass@k for a given k (``algorithm.passk_k``, required)."""
    takes_lengths: bool = False
    """It whitens over tokens: it takes each response's number of valid tokens."""
    reads_correctness: bool = False
    """It reads the verifier's correctness (0/1), not the shaped reward, so a KL moved into the
    reward never reaches it (the knob contract)."""


def owned_ranges(specs, prefix: str = "algorithm.") -> dict[str, str]:
    """``prefix + field -> interval`` over ``specs``; two specs declaring one field must agree."""
    out: dict[str, str] = {}
    owner: dict[str, str] = {}
    for spec in specs:
        for name, interval in spec.ranges.items():
            key = prefix + name
            if key in out and out[key] != interval:
                raise ValueError(f"{key}: {owner[key]!r} declares {out[key]}, "
                                 f"{spec.name!r} {interval}")
            out[key], owner[key] = interval, spec.name
    return out
