"""E3 temperature scheduler (docs/methods/e3.md §1a/§1b): exact temperature traces worked out by
hand."""

import math

import pytest
from control_helpers import make_bank, make_ctx, make_knobs, make_stats

from explorl import config as C
from explorl import validation
from explorl.config import TemperatureControlConfig
from explorl.control import ControlError, TemperatureScheduler

V = 100
LOG_V = math.log(V) + math.log(math.log(V))  # ln|V| + ln ln|V|


def knobs(temperature=1.0):
    return make_knobs(temperature=temperature)


def ctx(max_steps=10):
    return make_ctx(vocab_size=V, max_steps=max_steps)


def stats(step, entropy, max_steps=10):
    return make_stats(step, entropy=entropy, max_steps=max_steps, prompt_correct=[1.0, 2.0])


def scheduler(**kw):
    return TemperatureScheduler(TemperatureControlConfig(enabled=True, **kw))


def bank(ts, temperature=1.0, max_steps=10):
    return make_bank(ts, ctx(max_steps), knobs(temperature))


def run(b, entropies, max_steps=10, first=1):
    """Drive the bank like the trainer; return (T used per step, metrics per step)."""
    used, logs = [], []
    for t, h in enumerate(entropies, first):
        m = b.before_batch(t) | b.before_step(t, [0, 1])
        used.append(b.knobs.temperature)
        m |= b.after_step(stats(t, h, max_steps))
        logs.append(m)
    return used, logs


def e3(T, target, H):
    return T * (1 + T * math.log(target / H) / LOG_V)


def test_trace_without_annealing_by_hand():
    H = [2.0, 1.8, 1.5, 1.6, 2.2]
    ts = scheduler()
    used, logs = run(bank(ts), H)
    # step 1 records H0 = 2.0; the first update is after step 2
    T3 = e3(1.0, 2.0, 1.8)
    T4 = e3(T3, 2.0, 1.5)
    T5 = e3(T4, 2.0, 1.6)
    T6 = e3(T5, 2.0, 2.2)
    assert used == [1.0, 1.0, T3, T4, T5]
    assert ts.H0 == 2.0 and ts.T == T6
    assert T3 > 1.0 and T4 > T3 and T6 < T5  # entropy below H0 heats up, above it cools down
    # metric meanings: _next = T of the next step. The T a step used is the trainer's
    # control/temperature (logged once from the knobs), not the scheduler's.
    assert all("control/temperature" not in m for m in logs)
    assert [m["control/temperature_next"] for m in logs] == [1.0, T3, T4, T5, T6]
    assert [m["control/target_entropy"] for m in logs] == [2.0] * 5
    assert [m["control/temperature_clamped"] for m in logs] == [0.0] * 5


def test_t1_is_the_initial_knob():
    # T_1 is rollout.temperature (the knobs the trainer starts from), not a setting of its own
    ts = scheduler()
    b = bank(ts, temperature=0.8)
    b.before_step(1, [0, 1])
    assert b.knobs.temperature == 0.8 and ts.T == 0.8


def test_clamp_high_and_low():
    # a collapse: entropy 2.0 → 0.01 → 0.001 asks for T above t_max
    used, logs = run(bank(scheduler()), [2.0, 0.01, 0.001, 0.001])
    T3 = e3(1.0, 2.0, 0.01)
    assert T3 < 2.0 and e3(T3, 2.0, 0.001) > 2.0
    assert used == [1.0, 1.0, T3, 2.0]
    assert [m["control/temperature_clamped"] for m in logs] == [0.0, 0.0, 1.0, 1.0]
    # an entropy explosion at T = 0.6 asks for T below t_min
    assert e3(0.6, 2.0, 20.0) < 0.5
    used, logs = run(bank(scheduler(), temperature=0.6), [2.0, 20.0, 2.0])
    assert used == [0.6, 0.6, 0.5]
    assert [m["control/temperature_clamped"] for m in logs] == [0.0, 1.0, 0.0]
    assert logs[2]["control/temperature_next"] == 0.5  # H = H0: no change


def test_zero_entropy_goes_to_t_max_without_error():
    used, logs = run(bank(scheduler()), [1.0, 0.0, 0.0])
    assert used[2] == 2.0 and logs[1]["control/temperature_clamped"] == 1.0


def test_annealing_targets_by_hand():
    # max_steps 10, ratio 0.4 → anneal_start 6; target = H0·[(1−β)·½(1+cos(π·p)) + β]
    ts = scheduler(anneal=True)
    bank(ts, max_steps=10)
    ts.H0 = 2.0
    assert ts.target(5) == 2.0
    assert ts.target(6) == pytest.approx(2.0, abs=1e-15)  # progress 0
    assert ts.target(8) == pytest.approx(2.0 * (0.1 * 0.5 + 0.9), abs=1e-15)  # progress 0.5 → 1.9
    assert ts.target(10) == pytest.approx(2.0 * 0.9, abs=1e-15)  # progress 1 → β·H0


def test_update_after_step_t_uses_target_of_step_t():
    # hold entropy at H0 every step: only the annealing target moves T, and the update
    # after step t must use target(t) (the published code would use target(t−1))
    H0 = 2.0
    used, logs = run(bank(scheduler(anneal=True), max_steps=10), [H0] * 10)
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
    ts = scheduler(anneal=True, annealing_ratio=0.05)
    bank(ts, max_steps=10)
    ts.H0 = 2.0
    assert [ts.target(t) for t in range(1, 11)] == [2.0] * 10


def test_state_round_trip_reproduces_the_run():
    H = [2.0, 1.8, 1.5, 1.6, 2.2, 1.9, 1.7]
    full, _ = run(bank(scheduler(anneal=True), max_steps=7), H, max_steps=7)

    a = scheduler(anneal=True)
    first, _ = run(bank(a, max_steps=7), H[:3], max_steps=7)
    b = scheduler(anneal=True)
    bank_b = bank(b, max_steps=7)  # fresh knobs at T = 1.0: T comes from the state
    b.load_state_dict(a.state_dict())
    rest, _ = run(bank_b, H[3:], max_steps=7, first=4)
    assert first + rest == full
    assert len(set(full)) > 3  # the temperature moved: the equality is not trivial


@pytest.mark.parametrize("section, path", [
    ({"t_min": 2.0, "t_max": 1.0}, "control.temperature.t_min"),
    ({"t_min": 0.0}, "control.temperature.t_min"),
    ({"annealing_ratio": 1.0}, "control.temperature.annealing_ratio"),
    ({"beta": 0.0}, "control.temperature.beta"),
])
def test_invalid_configuration_names_the_key(section, path):
    with pytest.raises(C.ConfigError) as e:
        validation.from_dict({"control": {"temperature": {"enabled": True, **section}}})
    assert str(e.value).startswith(path + ":")


def test_initial_temperature_outside_the_clamp_and_tiny_vocab_are_rejected_at_setup():
    with pytest.raises(ControlError, match="outside"):
        scheduler().setup(ctx(), knobs(3.0))
    with pytest.raises(ControlError, match="vocab_size"):
        scheduler().setup(make_ctx(vocab_size=2), knobs())
