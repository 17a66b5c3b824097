"""E3 temperature scheduler (ALGORITHMS 1a/1b): exact temperature traces worked out by hand."""

import math

import pytest
from control_helpers import make_ctx, make_knobs, make_stats

from explorl.control import ControlError, TemperatureScheduler

V = 100
LOG_V = math.log(V) + math.log(math.log(V))  # ln|V| + ln ln|V|


def knobs(temperature=1.0):
    return make_knobs(temperature=temperature)


def ctx(max_steps=10):
    return make_ctx(vocab_size=V, max_steps=max_steps)


def stats(step, entropy, max_steps=10):
    return make_stats(step, entropy=entropy, max_steps=max_steps, prompt_correct=[1.0, 2.0])


def run(ts, entropies, k, max_steps=10):
    """Drive the scheduler like the trainer; return (T used per step, metrics per step)."""
    used, logs = [], []
    for t, h in enumerate(entropies, 1):
        m = ts.before_step(t, k, [0, 1])
        used.append(k.temperature)
        m |= ts.after_step(stats(t, h, max_steps), k)
        logs.append(m)
    return used, logs


def e3(T, target, H):
    return T * (1 + T * math.log(target / H) / LOG_V)


def test_trace_without_annealing_by_hand():
    H = [2.0, 1.8, 1.5, 1.6, 2.2]
    ts, k = TemperatureScheduler(), knobs(1.0)
    ts.setup(ctx(), k)
    used, logs = run(ts, H, k)
    # step 1 records H0 = 2.0; the first update is after step 2
    T3 = e3(1.0, 2.0, 1.8)
    T4 = e3(T3, 2.0, 1.5)
    T5 = e3(T4, 2.0, 1.6)
    T6 = e3(T5, 2.0, 2.2)
    assert used == [1.0, 1.0, T3, T4, T5]
    assert ts.H0 == 2.0 and ts.T == T6
    assert T3 > 1.0 and T4 > T3 and T6 < T5  # entropy below H0 heats up, above it cools down
    # metric meanings: temperature = T of this step; _next = T of the next step
    assert [m["control/temperature"] for m in logs] == used
    assert [m["control/temperature_next"] for m in logs] == [1.0, T3, T4, T5, T6]
    assert [m["control/target_entropy"] for m in logs] == [2.0] * 5
    assert [m["control/temperature_clamped"] for m in logs] == [0.0] * 5


def test_t_init_overrides_the_knob():
    ts, k = TemperatureScheduler(t_init=0.8), knobs(1.0)
    ts.setup(ctx(), k)
    ts.before_step(1, k, [0, 1])
    assert k.temperature == 0.8


def test_clamp_high_and_low():
    # a collapse: entropy 2.0 → 0.01 → 0.001 asks for T above t_max
    ts, k = TemperatureScheduler(), knobs(1.0)
    ts.setup(ctx(), k)
    used, logs = run(ts, [2.0, 0.01, 0.001, 0.001], k)
    T3 = e3(1.0, 2.0, 0.01)
    assert T3 < 2.0 and e3(T3, 2.0, 0.001) > 2.0
    assert used == [1.0, 1.0, T3, 2.0]
    assert [m["control/temperature_clamped"] for m in logs] == [0.0, 0.0, 1.0, 1.0]
    # an entropy explosion at T = 0.6 asks for T below t_min
    ts, k = TemperatureScheduler(t_init=0.6), knobs(1.0)
    ts.setup(ctx(), k)
    assert e3(0.6, 2.0, 20.0) < 0.5
    used, logs = run(ts, [2.0, 20.0, 2.0], k)
    assert used == [0.6, 0.6, 0.5]
    assert [m["control/temperature_clamped"] for m in logs] == [0.0, 1.0, 0.0]
    assert logs[2]["control/temperature_next"] == 0.5  # H = H0: no change


def test_zero_entropy_goes_to_t_max_without_error():
    ts, k = TemperatureScheduler(), knobs(1.0)
    ts.setup(ctx(), k)
    used, logs = run(ts, [1.0, 0.0, 0.0], k)
    assert used[2] == 2.0 and logs[1]["control/temperature_clamped"] == 1.0


def test_annealing_targets_by_hand():
    # max_steps 10, ratio 0.4 → anneal_start 6; target = H0·[(1−β)·½(1+cos(π·p)) + β]
    ts, k = TemperatureScheduler(anneal=True), knobs(1.0)
    ts.setup(ctx(10), k)
    ts.H0 = 2.0
    assert ts.target(5) == 2.0
    assert ts.target(6) == pytest.approx(2.0, abs=1e-15)  # progress 0
    assert ts.target(8) == pytest.approx(2.0 * (0.1 * 0.5 + 0.9), abs=1e-15)  # progress 0.5 → 1.9
    assert ts.target(10) == pytest.approx(2.0 * 0.9, abs=1e-15)  # progress 1 → β·H0


def test_update_after_step_t_uses_target_of_step_t():
    # hold entropy at H0 every step: only the annealing target moves T, and the update
    # after step t must use target(t) (the published code would use target(t−1))
    H0 = 2.0
    ts, k = TemperatureScheduler(anneal=True), knobs(1.0)
    ts.setup(ctx(10), k)
    used, logs = run(ts, [H0] * 10, k)
    assert used[:7] == [1.0] * 7  # targets of steps 1..6 equal H0 → no change through step 7
    T, expected = 1.0, [1.0] * 7
    for t in (7, 8, 9):
        target = H0 * (0.1 * 0.5 * (1 + math.cos(math.pi * (t - 6) / 4)) + 0.9)
        assert logs[t - 1]["control/target_entropy"] == pytest.approx(target, abs=1e-15)
        T = e3(T, target, H0)
        expected.append(T)
    assert used == pytest.approx(expected, abs=1e-15)
    assert used[7] < 1.0  # a lower target cools the sampler


def test_annealing_ratio_too_small_means_no_annealing():
    ts, k = TemperatureScheduler(anneal=True, annealing_ratio=0.05), knobs(1.0)
    ts.setup(ctx(10), k)
    ts.H0 = 2.0
    assert [ts.target(t) for t in range(1, 11)] == [2.0] * 10


def test_state_round_trip_reproduces_the_run():
    H = [2.0, 1.8, 1.5, 1.6, 2.2, 1.9, 1.7]
    ts, k = TemperatureScheduler(anneal=True), knobs(1.0)
    ts.setup(ctx(7), k)
    full, _ = run(ts, H, k, max_steps=7)

    a, ka = TemperatureScheduler(anneal=True), knobs(1.0)
    a.setup(ctx(7), ka)
    first, _ = run(a, H[:3], ka, max_steps=7)
    b, kb = TemperatureScheduler(anneal=True), knobs(1.0)  # fresh knobs: T comes from the state
    b.setup(ctx(7), kb)
    b.load_state_dict(a.state_dict())
    rest = []
    for t, h in enumerate(H[3:], 4):
        b.before_step(t, kb, [0, 1])
        rest.append(kb.temperature)
        b.after_step(stats(t, h, 7), kb)
    assert first + rest == full


def test_invalid_configuration():
    with pytest.raises(ControlError):
        TemperatureScheduler(t_min=2.0, t_max=1.0)
    ts = TemperatureScheduler()
    with pytest.raises(ControlError, match="outside"):
        ts.setup(ctx(), knobs(3.0))
