"""The wider field's controllers through ControlBank, as the trainer drives them
(docs/methods/wider-field.md §6f-h): fixed entropy sequences replay to knob sequences worked out by
hand, a run resumed from a checkpoint of the bank (through JSON) continues exactly, and the
combination rules hold."""

from __future__ import annotations

import json

import pytest
from control_helpers import make_ctx, make_knobs, make_stats

from explorl import config as C
from explorl.control import (
    CONTROLLER_ORDER,
    ControlBank,
    ControlError,
    Controller,
    Decision,
    build_controllers,
    check_control_config,
)


def control_cfg(sections: dict) -> C.ControlConfig:
    return C.build(C.ControlConfig, {k: {"enabled": True, **v} for k, v in sections.items()})


def bank_for(sections: dict, dataset_size: int = 4, max_steps: int = 40) -> ControlBank:
    knobs = make_knobs(eps_high=0.28)
    ctx = make_ctx(dataset_size=dataset_size, max_steps=max_steps)
    return ControlBank(build_controllers(control_cfg(sections), ctx, knobs), knobs)


def drive(sections: dict, entropies: list[float], *, resume_after: int | None = None,
          batches=None, correct=None, samples=None, epoch_end=None):
    """The trainer's hook order for each step t: before_batch, before_step, (sample, score),
    before_update(stats_t), (update), after_step(stats_t). Returns per step (the knobs the
    update used, every metric). With ``resume_after`` the bank is rebuilt from the config and
    loaded from its JSON-serialised state after that step, as a resumed run does."""
    bank = bank_for(sections)
    log = []
    for t, h in enumerate(entropies, 1):
        if resume_after is not None and t == resume_after + 1:
            state = json.loads(json.dumps(bank.state_dict()))
            bank = bank_for(sections)
            bank.load_state_dict(state)
        idx = batches[t - 1] if batches else [0, 1]
        metrics = bank.before_batch(t)
        metrics |= bank.before_step(t, idx)
        n = samples[t - 1] if samples else bank.knobs.budgets_for(len(idx))
        stats = make_stats(t, max_steps=40, entropy=h, prompt_indices=idx,
                           prompt_correct=correct[t - 1] if correct else [1.0] * len(idx),
                           prompt_samples=list(n), epoch_end=bool(epoch_end and epoch_end[t - 1]))
        metrics |= bank.before_update(stats)
        used = bank.knobs
        metrics |= bank.after_step(stats)
        log.append((used, metrics))
    return log


# ----------------------------------------------------------------------------- EntroPIC (§6f)

ENTROPIC = {"entropic": {"target": 0.1, "kp": 1.0, "ki": 0.01}}
H_E = [0.3, 0.25, 0.05, 2.0, 0.1]
# α from the step's own entropy (no lag): e = H − 0.1, α = clip(e + 0.01·I, −1, 1), then I += e
#   t1: α 0.2  I 0.2 | t2: 0.15 + 0.002 = 0.152  I 0.35 | t3: −0.05 + 0.0035 = −0.0465  I 0.30
#   t4: 1.9 + 0.003 → 1 (clipped)  I 2.2 | t5: 0 + 0.022 = 0.022  I 2.2
ALPHA = [0.2, 0.152, -0.0465, 1.0, 0.022]
INTEGRAL = [0.2, 0.35, 0.30, 2.2, 2.2]


def test_entropic_replays_to_the_worked_alphas():
    log = drive(ENTROPIC, H_E)
    assert [u.pos_neg_weight for u, _ in log] == pytest.approx(ALPHA, abs=1e-12)
    assert [m["control/pos_neg_weight"] for _, m in log] == pytest.approx(ALPHA, abs=1e-12)
    assert [m["control/entropic_integral"] for _, m in log] == pytest.approx(INTEGRAL, abs=1e-12)
    assert all(m["control/target_entropy"] == 0.1 for _, m in log)
    assert all(u.entropy_coef == 0.0 and u.eps_high == 0.28 for u, _ in log)  # owns α only


def test_entropic_anti_windup_through_the_config():
    log = drive({"entropic": {**ENTROPIC["entropic"], "anti_windup": True}}, H_E)
    # t4 is pinned at +1 with e > 0: I stays 0.30, so t5's α = 0.01·0.30
    assert [u.pos_neg_weight for u, _ in log] == pytest.approx(ALPHA[:4] + [0.003], abs=1e-12)


# ------------------------------------------------------------------ entropy coefficient (§6g)

COEF = {"entropy_coef": {"target": 0.2, "delta": 1e-4, "init": 0.0, "min": 0.0, "max": 2e-4}}
H_C = [0.15, 0.15, 0.15, 0.25, 0.25, 0.25, 0.1, 0.2]
# c_t = clip(c_{t−1} ± 1e-4, 0, 2e-4), then applied_t = c_t·1[H_t < 0.2] (update, then apply):
#   c: (0 →) 1e-4 → 2e-4 → 2e-4 (cap) → 1e-4 → 0 → 0 (floor) → 1e-4 (not dead at 0) → 0
APPLIED = [1e-4, 2e-4, 2e-4, 0.0, 0.0, 0.0, 1e-4, 0.0]
NEXT = [1e-4, 2e-4, 2e-4, 1e-4, 0.0, 0.0, 1e-4, 0.0]


def test_entropy_coef_replays_and_is_not_dead_at_zero():
    log = drive(COEF, H_C)
    assert [u.entropy_coef for u, _ in log] == pytest.approx(APPLIED, abs=1e-15)
    assert [m["control/entropy_coef_next"] for _, m in log] == pytest.approx(NEXT, abs=1e-15)


def test_entropy_coef_inclusive_counts_the_target_as_below():
    log = drive({"entropy_coef": {**COEF["entropy_coef"], "inclusive": True}}, H_C)
    assert log[-1][0].entropy_coef == pytest.approx(2e-4, abs=1e-15)  # H = 0.2 ≤ 0.2: c 1e-4 → 2e-4
    assert log[-1][1]["control/entropy_coef_next"] == pytest.approx(2e-4, abs=1e-15)


# ----------------------------------------------------------------------------- adaptive PI law

PI = {"adaptive": {"law": "pi", "warmup": 1, "window": 1, "actuator": "eps_high",
                   "schedule": {"kind": "constant", "target": 0.4}}}
H_P = [0.5, 0.3, 0.3, 0.0, 0.0, 0.4]
# eps_high defaults: c0 0.28, δ 0.01 → kp 0.1, ki 0.01; e = 0.4 − H after each step, for the next:
#   after 1: e −0.1 → 0.28 − 0.01 = 0.27            I −0.1
#   after 2: e  0.1 → 0.28 + 0.01 − 0.001 = 0.289   I 0
#   after 3: e  0.1 → 0.29                          I 0.1
#   after 4: e  0.4 → 0.28 + 0.04 + 0.001 = 0.321   I 0.5
#   after 5: e  0.4 → 0.28 + 0.04 + 0.005 = 0.325   I 0.9
PI_USED = [0.28, 0.27, 0.289, 0.29, 0.321, 0.325]


def test_adaptive_pi_replays_by_hand():
    log = drive(PI, H_P)
    assert [u.eps_high for u, _ in log] == pytest.approx(PI_USED, abs=1e-12)
    assert [m["control/tracking_error"] for _, m in log] == pytest.approx(
        [0.1, -0.1, -0.1, -0.4, -0.4, 0.0], abs=1e-12)


@pytest.mark.parametrize("anti_windup,integral", [(True, 8.75), (False, 10.5)])
def test_adaptive_pi_anti_windup(anti_windup, integral):
    # H = 0.05 for 30 steps: e = 0.35, raw after step t = 0.315 + 0.0035·(t − 1) first passes
    # 0.4 at t = 26; with anti-windup I stops at 0.35·25 = 8.75, without it reaches 0.35·30.
    sections = {"adaptive": {**PI["adaptive"], "anti_windup": anti_windup}}
    bank = bank_for(sections)
    for t in range(1, 31):
        bank.before_step(t, [0, 1])
        bank.after_step(make_stats(t, max_steps=40, entropy=0.05))
    (ac,) = bank.controllers
    assert ac.pi.integral == pytest.approx(integral, abs=1e-9)
    bank.before_step(31, [0, 1])
    assert bank.knobs.eps_high == pytest.approx(0.4)


def test_bang_bang_stays_the_default():
    assert C.AdaptiveControlConfig().law == "bang_bang"


# --------------------------------------------------------------------- knapsack budgets (§6h)

# 4 prompts, 2 per step, 2 steps per epoch; bounds [8, 8] in epoch 1, then n_min =
# max(8 − 6, 2) = 2, n_max = min(8 + 6, 12) = 12.
KNAP = {"budget": {"allocator": "knapsack", "n_min_limit": 2, "n_max_limit": 12, "widen": 6}}
BATCHES = [[0, 1], [2, 3], [0, 1], [2, 3], [1, 2]]
CORRECT = [[8.0, 4.0], [0.0, 2.0], [4.0, 2.0], [0.0, 2.0], [3.0, 4.0]]
EPOCH_END = [False, True, False, True, False]


def _knapsack_run(alpha, resume_after=None):
    sections = {"budget": {**KNAP["budget"], "knapsack_alpha": alpha}}
    return drive(sections, [0.5] * 5, batches=BATCHES, correct=CORRECT, epoch_end=EPOCH_END,
                 resume_after=resume_after)


def test_knapsack_budgets_by_hand():
    # t3: last rates p0 = 1, p1 = 0.5. Without the fallback the valued prompt takes all it can
    # (12) and the solved one the rest (4). With α = 0.9 prompt 1 needs only
    # int(ln 0.1 / ln 0.5) = 3 → at least 16 − 12 = 4, and the excess 10 goes to prompt 0.
    # t4: p2 = 0, p3 = 0.25: no fallback → [4, 12]; α = 0.9 → prompt 3 needs
    # int(ln 0.1 / ln 0.75) = 8, prompt 2 the remaining 8.
    # t5: rates from the last sightings (2 correct of prompt 1's t3 count, 0 of prompt 2's t4
    # count). No fallback: p1 = 2/12, p2 = 0 → the valued prompt takes 12, prompt 2 the floor 4.
    # α = 0.9: p1 = 2/4 needs 3 → at least 4; prompt 2 (p = 0) gets the other 12.
    plain = [u.budgets for u, _ in _knapsack_run(None)]
    assert plain == [(8, 8), (8, 8), (4, 12), (4, 12), (12, 4)]  # epoch 1: unseen → n_samples
    fallback = [u.budgets for u, _ in _knapsack_run(0.9)]
    assert fallback == [(8, 8), (8, 8), (12, 4), (8, 8), (4, 12)]


def test_knapsack_conserves_the_total_within_the_bounds():
    for u, m in _knapsack_run(0.9):
        b = u.budgets_for(2)
        assert sum(b) == 16
        assert m["rollout/budget_min"] == min(b) and m["rollout/budget_max"] == max(b)
        assert m["control/budget_n_min"] <= min(b) and max(b) <= m["control/budget_n_max"]


# ----------------------------------------------------------------------------- resume, rules

CASES = {
    "entropic": (ENTROPIC, H_E * 2, {}),
    "entropy_coef": (COEF, H_C, {}),
    "adaptive_pi": (PI, H_P * 2, {}),
    "knapsack": ({"budget": {**KNAP["budget"], "knapsack_alpha": 0.9}}, [0.5] * 5,
                 {"batches": BATCHES, "correct": CORRECT, "epoch_end": EPOCH_END}),
    "entropic+knapsack": ({**ENTROPIC, "budget": KNAP["budget"]}, H_E,
                          {"batches": BATCHES, "correct": CORRECT, "epoch_end": EPOCH_END}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_resume_reproduces_the_uninterrupted_run(name):
    sections, entropies, kw = CASES[name]
    full = drive(sections, entropies, **kw)
    for cut in range(1, len(entropies)):
        assert drive(sections, entropies, resume_after=cut, **kw) == full, f"resume after {cut}"


def test_order_and_registry():
    assert CONTROLLER_ORDER == ("curriculum", "temperature", "budget", "adaptive", "entropic",
                                "entropy_coef", "eepo")


@pytest.mark.parametrize("pair", [("entropic", "adaptive"), ("entropy_coef", "temperature"),
                                  ("entropic", "entropy_coef")])
def test_entropy_trackers_are_exclusive(pair):
    with pytest.raises(ControlError, match="fight"):
        check_control_config(control_cfg({p: {} for p in pair}))


def test_one_owner_per_knob_holds_for_the_new_knob():
    class Rogue(Controller):
        name = "rogue"
        actuators = ("entropy_coef",)

        def before_update(self, stats, knobs):
            return Decision(knobs={"pos_neg_weight": 0.5})

    bank = ControlBank([Rogue()], make_knobs())
    with pytest.raises(ControlError, match="pos_neg_weight"):
        bank.before_update(make_stats(1))


def test_before_update_cannot_change_what_was_sampled():
    class Late(Controller):
        name = "late"
        actuators = ("temperature",)

        def before_update(self, stats, knobs):
            return Decision(knobs={"temperature": 2.0})

    bank = ControlBank([Late()], make_knobs())
    with pytest.raises(ControlError, match="after the step was sampled"):
        bank.before_update(make_stats(1))
