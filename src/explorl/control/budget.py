"""E3 dynamic rollout budgets: more samples for harder prompts (E3 §4.1, Alg. 1; docs/methods/e3.md
§1c).

Difficulty model: every prompt of the training set keeps its cumulative sample count and
cumulative reward (number of correct responses) over all epochs. At each epoch end the whole
dataset is ranked by average reward, descending: ``rank = position / N`` ∈ [0, 1), the
easiest prompt 0, the hardest (N−1)/N. A never-sampled prompt counts as average 0.
Ties keep dataset order (a stable sort), so among equal averages the lower dataset index
ranks as easier. Before the first epoch end every rank is 0, which allocates uniformly.

Allocation for a batch of B prompts (``allocate_budgets``) keeps N_tot = n_default·B fixed.

Bounds: [n_min, n_max] starts at [n_default, n_default] (epoch 1 is plain GRPO) and widens
by ``widen`` on each side at every epoch end, up to [n_min_limit, n_max_limit] (E3: 8 →
[6, 10] → [4, 12]). The allocator stores only the number of widenings and reads n_default
from ``knobs.n_samples`` at every step, so a curriculum that raises n_samples moves N_tot
and the bounds with it. A limit never excludes n_default (n_min ≤ n_default ≤ n_max
always), which keeps N_tot feasible: n_min·B ≤ N_tot ≤ n_max·B.

Once a curriculum switches ``knobs.dataset`` away from ``"train"``, prompt indices refer to
another dataset: the allocator then samples ``n_samples`` per prompt and stops accumulating
(the per-prompt statistics describe the training set only).

Knapsack RL (``allocator: knapsack``; arXiv 2509.25849, docs/methods/wider-field.md §6h) replaces
step 2's linear allocation with ``algorithms.knapsack_budgets``: the counts that maximise the
expected value of non-zero-gradient groups given each prompt's *last* observed success rate (kept
per dataset index; an unseen prompt gets n_default), within the same [n_min, n_max] and at the same
N_tot.
"""

from __future__ import annotations

import math
from typing import Any

from explorl.algorithms.knapsack import knapsack_budgets
from explorl.config import BudgetControlConfig, RunConfig
from explorl.control.base import (
    ControlContext,
    ControlError,
    Controller,
    Decision,
    Knobs,
    StepStats,
)
from explorl.control.spec import ControllerSpec, require

# Floor with a tolerance: n_min + extra·r_i is an integer in exact arithmetic surprisingly
# often (uniform ranks give exactly n_default), and float rounding must not drop it by one.
# Rounding up values within 1e-9 below an integer cannot push the sum past N_tot.
_FLOOR_TOL = 1e-9


def allocate_budgets(ranks: list[float], n_default: int, n_min: int, n_max: int) -> list[int]:
    """Per-prompt sample counts for one batch (E3 Algorithm 1, with n_max enforced everywhere).

    1. Normalise the batch's ranks to sum 1 (all zero → uniform 1/B).
    2. counts_i = floor(n_min + (N_tot − n_min·B)·r_i) with N_tot = n_default·B.
    3. Cap every count at n_max (ours: the published code caps only the leftover, so one
       very hard prompt in an easy batch could get far more than n_max).
    4. Hand what is missing to N_tot — the floor leftover plus any capped excess — to the
       prompts in descending rank (ties: batch order), filling each to n_max before the next.

    Returns B integers in [n_min, n_max] summing to N_tot; harder prompts never get fewer
    samples than easier ones.
    """
    B = len(ranks)
    if B == 0:
        return []
    if not 1 <= n_min <= n_default <= n_max:
        raise ValueError(f"need 1 ≤ n_min ≤ n_default ≤ n_max, got {n_min}, {n_default}, {n_max}")
    if any(r < 0 for r in ranks):
        raise ValueError("ranks must be ≥ 0")
    n_tot = n_default * B
    total = sum(ranks)
    r = [x / total for x in ranks] if total > 0 else [1.0 / B] * B
    extra = n_tot - n_min * B  # samples to distribute above the floor n_min
    counts = [min(n_max, math.floor(n_min + extra * ri + _FLOOR_TOL)) for ri in r]
    missing = n_tot - sum(counts)
    # sorted() is stable: equal ranks are served in batch order.
    for i in sorted(range(B), key=lambda i: -r[i]):
        if missing <= 0:
            break
        add = min(missing, n_max - counts[i])
        counts[i] += add
        missing -= add
    assert missing == 0 and sum(counts) == n_tot, (
        "infeasible budget (cannot happen when n_min ≤ n_default ≤ n_max)"
    )
    return counts


class BudgetAllocator(Controller):
    """Allocate each batch's rollouts by prompt difficulty at a constant batch total (E3 §4.1).

    Settings: ``control.budget`` (``BudgetControlConfig``): n_min_limit (E3: 4), n_max_limit
    (E3: 12), widen (E3: 2), how far each bound moves per completed epoch; allocator (``e3`` or
    ``knapsack``) and knapsack_alpha (the Knapsack RL code's fallback, 0.9).

    Metrics (before_step, for the step's batch):
        ``rollout/budget_min``, ``rollout/budget_max``: smallest and largest count allocated.
        ``control/budget_n_min``, ``control/budget_n_max``: the bounds in force this step.
    """

    name = "budget"
    actuators = ("budgets",)

    def __init__(self, cfg: BudgetControlConfig) -> None:
        self.n_min_limit, self.n_max_limit, self.widen = cfg.n_min_limit, cfg.n_max_limit, cfg.widen
        self.allocator, self.knapsack_alpha = cfg.allocator, cfg.knapsack_alpha
        # state (arrays indexed by dataset index)
        self.cum_samples: list[int] = []
        self.cum_reward: list[float] = []
        self.rank: list[float] = []
        self.last_rate: list[float | None] = []  # success rate at the prompt's last sighting
        self.widenings = 0  # epoch ends seen so far

    def setup(self, ctx: ControlContext, knobs: Knobs) -> None:
        n = ctx.dataset_size
        self.cum_samples = [0] * n
        self.cum_reward = [0.0] * n
        self.rank = [0.0] * n
        self.last_rate = [None] * n
        self.widenings = 0

    def bounds(self, n_default: int) -> tuple[int, int]:
        """[n_min, n_max] for the current number of widenings (always contains n_default)."""
        w = self.widenings * self.widen
        n_min = max(n_default - w, min(self.n_min_limit, n_default))
        n_max = min(n_default + w, max(self.n_max_limit, n_default))
        return n_min, n_max

    def _check_indices(self, indices: list[int]) -> None:
        bad = [i for i in indices if not 0 <= i < len(self.rank)]
        if bad:
            raise ControlError(
                f"budget: prompt indices {bad[:5]} outside the dataset of size {len(self.rank)}"
            )

    def before_step(self, step: int, knobs: Knobs, prompt_indices: list[int]) -> Decision:
        n_default = knobs.n_samples
        if knobs.dataset != "train":
            chosen = None
            n_min = n_max = n_default
            budgets = [n_default]
        else:
            self._check_indices(prompt_indices)
            n_min, n_max = self.bounds(n_default)
            if self.allocator == "knapsack":
                rates = [self.last_rate[i] for i in prompt_indices]
                budgets = knapsack_budgets(rates, n_default, n_min, n_max, self.knapsack_alpha)
            else:
                budgets = allocate_budgets(
                    [self.rank[i] for i in prompt_indices], n_default, n_min, n_max
                )
            chosen = budgets
        return Decision(knobs={"budgets": chosen}, metrics={
            "rollout/budget_min": float(min(budgets, default=n_default)),
            "rollout/budget_max": float(max(budgets, default=n_default)),
            "control/budget_n_min": float(n_min),
            "control/budget_n_max": float(n_max),
        })

    def after_step(self, stats: StepStats, knobs: Knobs) -> Decision:
        if knobs.dataset != "train":
            return Decision()
        self._check_indices(stats.prompt_indices)
        for i, c, n in zip(
            stats.prompt_indices, stats.prompt_correct, stats.prompt_samples, strict=True
        ):
            self.cum_samples[i] += int(n)
            self.cum_reward[i] += float(c)
            if n > 0:
                self.last_rate[i] = min(1.0, max(0.0, float(c) / int(n)))
        if stats.epoch_end:
            self._rerank()
            self.widenings += 1
        return Decision()

    def _rerank(self) -> None:
        """rank_i = position/N after a stable sort by average reward, descending."""
        avg = [r / s if s > 0 else 0.0 for r, s in zip(self.cum_reward, self.cum_samples)]
        order = sorted(range(len(avg)), key=lambda i: -avg[i])  # stable: ties keep index order
        n = len(avg)
        for pos, i in enumerate(order):
            self.rank[i] = pos / n

    def state_dict(self) -> dict[str, Any]:
        return {
            "cum_samples": list(self.cum_samples),
            "cum_reward": list(self.cum_reward),
            "rank": list(self.rank),
            "last_rate": list(self.last_rate),
            "widenings": self.widenings,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["rank"]) != len(self.rank):
            raise ControlError(
                f"budget: checkpoint covers {len(state['rank'])} prompts, "
                f"the dataset has {len(self.rank)}"
            )
        self.cum_samples = [int(x) for x in state["cum_samples"]]
        self.cum_reward = [float(x) for x in state["cum_reward"]]
        self.rank = [float(x) for x in state["rank"]]
        rates = state.get("last_rate", [None] * len(self.rank))  # absent in older checkpoints
        self.last_rate = [None if x is None else float(x) for x in rates]
        self.widenings = int(state["widenings"])


def check(cfg: RunConfig) -> None:
    """The limits never exclude n_default (``rollout.n_samples``)."""
    b, n = cfg.control.budget, cfg.rollout.n_samples
    require("control.budget.n_min_limit", not b.enabled or b.n_min_limit <= n,
            "must be ≤ rollout.n_samples")
    require("control.budget.n_max_limit", not b.enabled or b.n_max_limit >= n,
            "must be ≥ rollout.n_samples")


SPEC = ControllerSpec(
    name="budget",
    cls=BudgetAllocator,
    check=check,
    metrics={
        "rollout/budget_min": "the smallest per-prompt sample count of this step's batch",
        "rollout/budget_max": "the largest per-prompt sample count of this step's batch",
        "control/budget_n_min": "the lower bound n_min in force this step (widens per epoch)",
        "control/budget_n_max": "the upper bound n_max in force this step (widens per epoch)",
    },
)
