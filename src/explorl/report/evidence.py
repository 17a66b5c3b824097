"""What the claims read (``Evidence``): per-run numbers, per-problem pass@k of every recipe and
of the base model at each evaluation temperature, and the pooled law; comparisons come back as
t intervals with their power (``study.stats``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from explorl.analysis.frontier import BASELINE
from explorl.report.stats import Interval, passk_diff, seed_interval

# The per-run numbers (``numbers.run_numbers``, with ``build_table``'s overheads) a declared
# claim may name (``run:<key>``, ``ratio:<key>``).
RUN_KEYS = (
    "steps", "initial_entropy", "final_entropy", "entropy_ratio", "initial_reward",
    "final_reward", "all_wrong_frac", "rollouts_per_step", "clip_frac", "tracked_entropy_mean",
    "H0", "tracking_error", "tracking_bias", "target_mean", "tracking_rel_bias", "anneal_beta",
    "anneal_entropy_ratio", "eepo_active_frac", "eepo_dH", "train_calls", "train_calls_counted",
    "train_responses", "eval_calls_per_response", "eval_call_frac", "eval_calls_per_correct",
    "step_s", "cpu_step_s", "cpu_run_s", "law_points", "law_r2", "law_rmse", "law_naive_rmse",
    "law_final_error", "law_ceiling", "overhead", "cpu_overhead",
)
PassK = dict[str, dict[int, np.ndarray]]  # recipe → k → (seeds, problems)


@dataclass
class Evidence:
    """Everything the claims read: per-run numbers, per-problem pass@k, the base model's.

    ``passk``/``base`` are at the main evaluation temperature ``temperature``; ``passk_t`` /
    ``base_t`` hold every evaluation temperature (the main one included) when the study
    evaluates at several.
    """

    per_run: dict[str, list[dict]]
    passk: PassK = field(default_factory=dict)  # (seeds, problems)
    seeds: dict[str, list[int]] = field(default_factory=dict)  # row order of passk[name]
    base: dict[int, np.ndarray] | None = None  # k → (1, problems)
    k_list: list[int] = field(default_factory=list)
    law: dict = field(default_factory=dict)  # pooled fit (study.numbers.pooled_law)
    temperature: float = 1.0
    passk_t: dict[float, PassK] = field(default_factory=dict)
    base_t: dict[float, dict[int, np.ndarray]] = field(default_factory=dict)
    stand_ins: dict[str, list[str]] = field(default_factory=dict)
    """method → its variants that only move its tuned knob (``eepo_open``): the arms that may
    stand in for it in a comparison with GRPO when its tuned setting never acted."""
    bases: dict[str, dict[float, dict[int, np.ndarray]]] = field(default_factory=dict)
    """The other models before RL (``base-<recipe>``: ``grpo_large``'s 9.6M lab model) →
    temperature → k → (1, problems); ``base``/``base_t`` are the study's first recipe's."""
    base_label: str = "base (before RL)"
    """What ``base`` is, for the figures: the model before RL, or with a ``start:`` run the
    policy every run continues from; ``base_short`` its short name."""
    base_short: str = "base"
    unfinished: set[str] = field(default_factory=set)
    """The study's arms with no finished run yet (a partial report): a claim that needs one
    is not run *yet*, which its row says."""
    baseline: str = BASELINE
    """The study's GRPO row, which the tables' − GRPO columns and the power table compare with
    (``real-grpo`` when the spec's claims read it as GRPO: ``as: {grpo: real-grpo}``)."""
    base_for: dict[str, str] = field(default_factory=dict)
    """Arm → the ``bases`` key of the model it starts from when that is not ``base`` (set even
    when that model's evaluation is missing, so its "− base" reads none rather than the wrong
    model's)."""

    @property
    def k_max(self) -> int:
        return max(self.k_list, default=1)

    @property
    def temperatures(self) -> list[float]:
        """Every evaluation temperature, the main one first."""
        return [self.temperature, *[t for t in self.passk_t if t != self.temperature]]

    def base_name(self, arm: str) -> str:
        """The model ``arm`` starts from: ``base`` or its key in ``bases``."""
        return self.base_for.get(arm, "base")

    def is_base(self, name: str) -> bool:
        return name == "base" or name in self.bases

    def _arm(self, name: str, t: float | None):
        if name in self.bases:
            return self.bases[name].get(self.temperature if t is None else t)
        if t is None or t == self.temperature:
            return self.base if name == "base" else self.passk.get(name)
        return self.base_t.get(t) if name == "base" else self.passk_t.get(t, {}).get(name)

    def pk(self, a: str, b: str, k: int, ta: float | None = None,
           tb: float | None = None) -> Interval | None:
        """pass@k of ``a`` at temperature ``ta`` minus ``b`` at ``tb`` (None: the main one;
        ``b = "base"``: the model ``a`` starts from, before RL), with its ``Power``."""
        return self._diff(a, b, lambda arm: arm.get(k), ta, tb)

    def margin(self, a: str, b: str, k: int) -> Interval | None:
        """The coverage margin pass@k − pass@1 of ``a`` minus ``b``'s, per seed and problem,
        paired as ``pk`` pairs (the main temperature)."""
        return self._diff(a, b, lambda arm: arm[k] - arm[1] if k in arm and 1 in arm else None)

    def _diff(self, a: str, b: str, get: Callable[[dict], np.ndarray | None],
              ta: float | None = None, tb: float | None = None) -> Interval | None:
        if b == "base":
            b = self.base_name(a)
        pa, pb = self._arm(a, ta), self._arm(b, tb)
        va = None if pa is None else get(pa)
        vb = None if pb is None else get(pb)
        if va is None or vb is None:
            return None
        if self.is_base(b):
            return passk_diff(va, vb, paired_seeds=False)
        common = [s for s in self.seeds[a] if s in self.seeds[b]]
        if not common:
            return passk_diff(va, vb, paired_seeds=False)
        ra = [self.seeds[a].index(s) for s in common]
        rb = [self.seeds[b].index(s) for s in common]
        return passk_diff(va[ra], vb[rb], paired_seeds=True)

    def mean_passk(self, name: str, k: int, t: float | None = None) -> float | None:
        arm = self._arm(name, t)
        return None if arm is None or k not in arm else float(arm[k].mean())

    def best_temperature(self, name: str, k: int) -> float | None:
        """The evaluation temperature with ``name``'s highest mean pass@k (the main one on a
        tie); None with one temperature. Chosen on the comparison's own problems, so it favours
        ``name`` (both arms of a best-T comparison get the same favour)."""
        if len(self.temperatures) < 2:
            return None
        got = [(self.mean_passk(name, k, t), -i, t) for i, t in enumerate(self.temperatures)]
        got = [g for g in got if g[0] is not None]
        return max(got)[2] if got else None

    def same_runs(self, a: str, b: str) -> bool:
        """Whether arms ``a`` and ``b`` trained identical runs: the same seeds, every seed's final
        entropy and reward equal, and the same per-problem test pass@k (a variant whose change
        the tuned setting had already made, or a controller that never acted differently)."""
        ra, rb = self.runs(a), self.runs(b)
        if not ra or ra.keys() != rb.keys() or self.seeds.get(a) != self.seeds.get(b):
            return False
        if any(ra[s].get(k) != rb[s].get(k) for s in ra for k in ("final_entropy", "final_reward")):
            return False
        pa, pb = self.passk.get(a, {}), self.passk.get(b, {})
        return pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa)

    def same_groups(self) -> list[list[str]]:
        """The arms that trained identical runs (``same_runs``), grouped, in table order; only
        groups of two or more."""
        groups: list[list[str]] = []
        for name in self.per_run:
            for g in groups:
                if self.same_runs(g[0], name):
                    g.append(name)
                    break
            else:
                groups.append([name])
        return [g for g in groups if len(g) > 1]

    def runs(self, name: str) -> dict[int, dict]:
        return {r["seed"]: r for r in self.per_run.get(name, [])}

    def one(self, name: str, fn: Callable[[dict], float | None]) -> Interval | None:
        """A per-run quantity of one recipe, over its seeds."""
        return seed_interval([safe_call(fn, r) for r in self.per_run.get(name, [])])

    def ratio(self, a: str, b: str, key: str) -> Interval | None:
        """Mean over the seeds both ran of ``a``'s ``key`` ÷ ``b``'s, with its t interval."""
        ra, rb = self.runs(a), self.runs(b)
        vals = []
        for s in sorted(set(ra) & set(rb)):
            x, y = safe_call(lambda r: r[key], ra[s]), safe_call(lambda r: r[key], rb[s])
            vals.append(None if x is None or not y else x / y)
        return seed_interval(vals)

    def every(self, fn: Callable[[dict], float | None]) -> Interval | None:
        """A per-run quantity over every run of the study (each run one resampling unit)."""
        return seed_interval([safe_call(fn, r) for runs in self.per_run.values() for r in runs])

    def pair(self, a: str, b: str, fn: Callable[[dict], float | None]) -> Interval | None:
        """fn(a's run) − fn(b's run), paired by seed, over the seeds both ran."""
        ra, rb = self.runs(a), self.runs(b)
        diffs = []
        for s in sorted(set(ra) & set(rb)):
            x, y = safe_call(fn, ra[s]), safe_call(fn, rb[s])
            diffs.append(None if x is None or y is None else x - y)
        return seed_interval(diffs)


def safe_call(fn, r):
    """fn(r) as a float; None when the run lacks a number it needs."""
    try:
        v = fn(r)
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    return None if v is None else float(v)
