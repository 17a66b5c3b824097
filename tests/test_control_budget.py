"""E3 dynamic rollout budgets (docs/methods/e3.md §1c): allocations and rankings worked out by
hand."""

import math
import random

import pytest
from control_helpers import make_bank, make_ctx, make_knobs, make_stats

from explorl import config as C
from explorl import validation
from explorl.config import BudgetControlConfig, CurriculumControlConfig
from explorl.control import BudgetAllocator, Curriculum, allocate_budgets


def knobs(n=8, **kw):
    return make_knobs(n_samples=n, **kw)


def allocator(**kw):
    return BudgetAllocator(BudgetControlConfig(enabled=True, **kw))


def ctx(dataset_size=6, B=3):
    return make_ctx(dataset_size=dataset_size, max_steps=100, prompts_per_step=B)


def stats(step, idx, correct, samples, epoch_end, epoch=0):
    return make_stats(
        step,
        max_steps=100,
        prompt_indices=idx,
        prompt_correct=correct,
        prompt_samples=samples,
        epoch=epoch,
        epoch_end=epoch_end,
    )


# ----------------------------------------------------------------------------- allocate_budgets


def test_all_zero_ranks_are_uniform():
    assert allocate_budgets([0.0, 0.0, 0.0], 8, 4, 12) == [8, 8, 8]
    assert allocate_budgets([0.5, 0.5, 0.5, 0.5], 8, 4, 12) == [8, 8, 8, 8]


def test_allocation_by_hand():
    # B 4, N_tot 32, n_min 6 → extra 8; r = [0, 1/6, 1/3, 1/2]
    # floor(6 + 8·r) = [6, 7, 8, 10] → 31; the leftover 1 goes to the hardest prompt with
    # room: prompt 3 is at n_max, so prompt 2 gets it.
    assert allocate_budgets([0.0, 0.25, 0.5, 0.75], 8, 6, 10) == [6, 7, 9, 10]


def test_exact_integers_survive_float_rounding():
    # r = [1/6, 2/6, 3/6], extra 18 → 2 + 18·r = [5, 8, 11] exactly; in floats the last two
    # are 7.999… and 10.999…, and a bare floor would give [5, 7, 10] + 2 leftover → [5, 7, 12].
    ranks = [1 / 5, 2 / 5, 3 / 5]
    assert [2 + 18 * r / sum(ranks) for r in ranks][1:] != [8.0, 11.0]  # the float trap is real
    assert allocate_budgets(ranks, 8, 2, 14) == [5, 8, 11]


def test_published_failure_case_is_capped_and_redistributed():
    # One hard prompt in an easy batch: the published code gives it floor(6 + 8·1) = 14 > n_max.
    ranks, n_default, n_min, n_max = [0.9, 0.0, 0.0, 0.0], 8, 6, 10
    uncapped = math.floor(n_min + (n_default * 4 - n_min * 4) * 1.0)
    assert uncapped == 14 > n_max
    # ours: cap at 10 and hand the excess 4 to the next-hardest prompts (equal ranks: batch order)
    assert allocate_budgets(ranks, n_default, n_min, n_max) == [10, 10, 6, 6]


def test_invariants_on_random_batches():
    rng = random.Random(0)
    for _ in range(500):
        B = rng.randint(1, 12)
        n_default = rng.randint(1, 16)
        n_min = rng.randint(1, n_default)
        n_max = rng.randint(n_default, 24)
        ranks = [rng.choice([0.0, rng.random()]) for _ in range(B)]
        counts = allocate_budgets(ranks, n_default, n_min, n_max)
        assert sum(counts) == n_default * B
        assert all(n_min <= c <= n_max for c in counts)
        for i in range(B):
            for j in range(B):
                if ranks[i] > ranks[j]:  # harder never gets fewer
                    assert counts[i] >= counts[j], (ranks, counts)


def test_infeasible_bounds_are_rejected():
    with pytest.raises(ValueError):
        allocate_budgets([0.1, 0.2], 8, 9, 12)
    assert allocate_budgets([], 8, 4, 12) == []


# ----------------------------------------------------------------------------- the controller


def step(bank, t, idx, correct, epoch_end):
    m = bank.before_batch(t) | bank.before_step(t, idx)
    budgets = bank.knobs.budgets_for(len(idx))
    m |= bank.after_step(stats(t, idx, correct, budgets, epoch_end))
    return budgets, m


def test_epochs_rank_widen_and_allocate_by_hand():
    ba = allocator(n_min_limit=4, n_max_limit=12, widen=2)
    bank = make_bank(ba, ctx(6, 3), knobs(8))
    # epoch 1: plain GRPO, bounds [8, 8]
    b, m = step(bank, 1, [0, 1, 2], [8, 4, 0], False)
    assert b == [8, 8, 8]
    assert m == {
        "rollout/budget_min": 8.0,
        "rollout/budget_max": 8.0,
        "control/budget_n_min": 8.0,
        "control/budget_n_max": 8.0,
    }
    b, _ = step(bank, 2, [3, 4, 5], [6, 2, 4], True)
    assert b == [8, 8, 8]
    # averages 1, .5, 0, .75, .25, .5 → descending (stable): 0, 3, 1, 5, 4, 2
    assert ba.rank == [0 / 6, 2 / 6, 5 / 6, 1 / 6, 4 / 6, 3 / 6]
    assert ba.bounds(8) == (6, 10)
    # epoch 2, bounds [6, 10]: ranks [5/6, 0, 4/6] → r = [5/9, 0, 4/9], extra 6
    # floor(6 + 6r) = [9, 6, 8] → 23; the leftover goes to prompt 2 (hardest) → [10, 6, 8]
    b, m = step(bank, 3, [2, 0, 4], [0, 8, 1], False)
    assert b == [10, 6, 8]
    assert m == {
        "rollout/budget_min": 6.0,
        "rollout/budget_max": 10.0,
        "control/budget_n_min": 6.0,
        "control/budget_n_max": 10.0,
    }
    b, _ = step(bank, 4, [1, 3, 5], [4, 6, 4], True)
    assert b == [8, 7, 9]  # r = [1/3, 1/6, 1/2]: exact
    assert ba.bounds(8) == (4, 12)
    b, m = step(bank, 5, [0, 1, 2], [8, 4, 0], True)
    assert (m["control/budget_n_min"], m["control/budget_n_max"]) == (4.0, 12.0)
    assert sum(b) == 24 and all(4 <= x <= 12 for x in b)
    assert ba.bounds(8) == (4, 12)  # limits reached: no further widening


def test_cumulative_statistics_use_the_real_sample_counts():
    ba = allocator()
    bank = make_bank(ba, ctx(6, 3), knobs(8))
    bank.after_step(stats(1, [0, 1, 2], [3, 0, 5], [4, 10, 10], False))
    bank.after_step(stats(2, [0, 3, 4], [1, 2, 2], [4, 8, 8], False))
    assert ba.cum_samples == [8, 10, 10, 8, 8, 0]
    assert ba.cum_reward == [4.0, 0.0, 5.0, 2.0, 2.0, 0.0]


def test_never_sampled_prompts_count_as_average_zero():
    ba = allocator()
    bank = make_bank(ba, ctx(4, 2), knobs(8))
    bank.after_step(stats(1, [0, 1], [8, 0], [8, 8], True))
    # p0 avg 1; p1 (all wrong), p2 and p3 (never sampled) avg 0 → ties in index order
    assert ba.rank == [0.0, 0.25, 0.5, 0.75]


def test_n_default_is_read_from_the_knobs_each_step():
    # a curriculum raising n_samples (from step 3, ahead of the budget in the bank) moves N_tot
    # and the bounds with it
    cur = Curriculum(CurriculumControlConfig(enabled=True, n_samples=16), start_step=3)
    ba = allocator(n_min_limit=4, n_max_limit=12, widen=2)
    bank = make_bank([cur, ba], ctx(6, 3), knobs(8))
    b, _ = step(bank, 1, [0, 1, 2], [8, 4, 0], False)
    assert sum(b) == 24
    step(bank, 2, [3, 4, 5], [6, 2, 4], True)
    b, m = step(bank, 3, [2, 0, 4], [0, 8, 1], False)
    assert bank.knobs.n_samples == 16
    assert sum(b) == 48
    # bounds always contain n_default: [max(16−2, 4), min(16+2, max(12, 16))] = [14, 16]
    assert (m["control/budget_n_min"], m["control/budget_n_max"]) == (14.0, 16.0)


def test_other_dataset_falls_back_to_uniform_and_does_not_accumulate():
    ba = allocator()
    bank = make_bank(ba, ctx(6, 3), knobs(8, budgets=(1, 2, 3), dataset="anneal"))
    m = bank.before_step(1, [40, 41, 42])  # indices of another dataset
    assert bank.knobs.budgets is None and bank.knobs.budgets_for(3) == [8, 8, 8]
    assert m["rollout/budget_min"] == m["rollout/budget_max"] == 8.0
    bank.after_step(stats(1, [40, 41, 42], [1, 1, 1], [8, 8, 8], True))
    assert ba.widenings == 0 and sum(ba.cum_samples) == 0


def test_state_round_trip_reproduces_the_run():
    batches = [([0, 1, 2], [8, 4, 0], False), ([3, 4, 5], [6, 2, 4], True),
               ([2, 0, 4], [0, 8, 1], False), ([1, 3, 5], [4, 6, 4], True),
               ([5, 2, 0], [1, 0, 7], False)]
    bank = make_bank(allocator(), ctx(6, 3), knobs(8))
    full = [step(bank, t, *b) for t, b in enumerate(batches, 1)]
    assert any(len(set(b)) > 1 for b, _ in full)  # the ranks moved the budgets
    for cut in range(1, len(batches)):
        a = allocator()
        ka = make_bank(a, ctx(6, 3), knobs(8))
        first = [step(ka, t, *b) for t, b in enumerate(batches[:cut], 1)]
        b_ = allocator()
        kb = make_bank(b_, ctx(6, 3), knobs(8))
        b_.load_state_dict(a.state_dict())
        rest = [step(kb, t, *b) for t, b in enumerate(batches[cut:], cut + 1)]
        assert first + rest == full, cut


def test_invalid_configuration_names_the_key():
    # the allocator's bounds are checked by validation.validate against rollout.n_samples (8)
    for section, path in [({"n_min_limit": 0}, "control.budget.n_min_limit"),
                          ({"n_max_limit": 6}, "control.budget.n_max_limit"),
                          ({"widen": -1}, "control.budget.widen")]:
        with pytest.raises(C.ConfigError) as e:
            validation.from_dict({"control": {"budget": {"enabled": True, **section}}})
        assert str(e.value).startswith(path + ":"), section
