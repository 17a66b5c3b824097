"""Adaptive clip-higher and its variants (docs/methods/entropy-scheduling.md §4a): knob traces
worked out by hand."""

import pytest
from control_helpers import make_ctx, make_knobs, make_stats

from explorl import config as C
from explorl import validation
from explorl.config import AdaptiveControlConfig, ScheduleConfig
from explorl.control import (
    ACTUATOR_DEFAULTS,
    AdaptiveController,
    ControlBank,
    make_schedule,
)


def knobs():
    return make_knobs()


def ctx(max_steps=10):
    return make_ctx(max_steps=max_steps)


def stats(step, entropy, max_steps=10):
    return make_stats(step, entropy=entropy, max_steps=max_steps)


def run(ac, entropies, max_steps=10, first=1):
    """Drive a bank of ``ac`` (set up by ``make``) like the trainer; return (knob value used per
    step, merged metrics per step). The bank starts from fresh knobs: the knob comes from ac."""
    bank = ControlBank([ac], knobs())
    used, logs = [], []
    for t, h in enumerate(entropies, first):
        m = bank.before_batch(t) | bank.before_step(t, [0, 1])
        used.append(getattr(bank.knobs, ac.actuator))
        m |= bank.after_step(stats(t, h, max_steps))
        logs.append(m)
    return used, logs


def make(schedule=None, max_steps=10, sign=None, **kw):
    """``schedule``: a Schedule overriding the section's (constant 0.4); ``kw``: config fields."""
    section = ScheduleConfig(kind="constant", target=0.4)
    cfg = AdaptiveControlConfig(enabled=True, schedule=section, **kw)
    ac = AdaptiveController(cfg, schedule=schedule, sign=sign)
    ac.setup(ctx(max_steps), knobs())
    return ac


def test_steps_down_holds_and_steps_up_by_hand():
    ac = make(warmup=2, window=2)
    H = [0.5, 0.5, 0.3, 0.3, 0.401, 0.399]
    used, logs = run(ac, H)
    # after 1: warm-up. after 2: mean(.5,.5)=.5 > .4 → −δ. after 3: mean(.5,.3)=.4 → hold.
    # after 4: .3 < .4 → +δ. after 5: .3505 < .4 by more than 2% → +δ. after 6: .4 → hold.
    assert used == pytest.approx([0.28, 0.28, 0.27, 0.27, 0.28, 0.29], abs=1e-12)
    assert ac.c == pytest.approx(0.29, abs=1e-12)
    # tracking_error = mean(H over window) − mean(target over window); positive = too high
    errs = [m["control/tracking_error"] for m in logs]
    assert errs == pytest.approx([0.1, 0.1, 0.0, -0.1, -0.0495, 0.0], abs=1e-12)
    assert all("control/eps_high" not in m for m in logs)  # the trainer logs the knob used
    assert [m["control/target_entropy"] for m in logs] == [0.4] * 6
    assert [m["control/adaptive_released"] for m in logs] == [0.0] * 6


def test_dead_band_is_two_percent_of_the_target():
    for h, expected in [
        (0.4 * 1.015, 0.28),
        (0.4 * 0.985, 0.28),
        (0.4 * 1.03, 0.27),
        (0.4 * 0.97, 0.29),
    ]:
        ac = make(warmup=0, window=1)
        assert ac.after_step(stats(1, h), knobs()).knobs == {}  # after_step only updates state
        assert ac.c == pytest.approx(expected, abs=1e-12), h


def test_warmup_holds_c0():
    ac = make(warmup=5, window=3)
    used, _ = run(ac, [0.1] * 8)  # far below target: wants more entropy every step
    # steps 1–5 run at c0; the first update (after step 5) is used at step 6
    assert used == pytest.approx([0.28] * 5 + [0.29, 0.30, 0.31], abs=1e-12)


def test_clamped_to_bounds():
    ac = make(warmup=0, window=1)
    used, _ = run(ac, [0.1] * 20)
    assert max(used) == 0.4 and used[-1] == 0.4  # 0.28 + 12·0.01 would pass 0.4
    ac = make(warmup=0, window=1)
    used, _ = run(ac, [0.9] * 20)
    assert min(used) == 0.2 and used[-1] == 0.2


def test_window_averages_the_scheduled_target_too():
    # cosine target 0.6 → 0.2 over 5 steps; window 3 after step 3 averages targets of steps 1–3
    s = make_schedule("cosine", start=0.6, end=0.2)
    ac = make(s, max_steps=5, warmup=0, window=3)
    H = [0.5, 0.5, 0.5]
    _, logs = run(ac, H, max_steps=5)
    mean_target = (s(1, 5) + s(2, 5) + s(3, 5)) / 3
    assert logs[2]["control/tracking_error"] == pytest.approx(0.5 - mean_target, abs=1e-12)
    assert [m["control/target_entropy"] for m in logs] == [s(t, 5) for t in (1, 2, 3)]


@pytest.mark.parametrize("actuator", ["eps_high", "entropy_coef", "kl_coef", "temperature"])
def test_each_actuator_defaults_and_sign(actuator):
    spec = ACTUATOR_DEFAULTS[actuator]
    ac = make(actuator=actuator, warmup=0, window=1)
    assert ac.actuators == (actuator,)
    assert (ac.c0, ac.delta, ac.c_min, ac.c_max) == (spec.c0, spec.delta, spec.c_min, spec.c_max)
    used, logs = run(ac, [0.1, 0.1, 0.9])  # too low, too low, too high
    c0, d = spec.c0, spec.delta
    # every default knob raises entropy (sign +1): entropy too low → knob up
    assert used == pytest.approx([c0, c0 + d, c0 + 2 * d], abs=1e-12)
    assert ac.c == pytest.approx(c0 + d, abs=1e-12)
    assert all(f"control/{actuator}" not in m for m in logs)  # the trainer logs the knob used


def test_default_table():
    d = ACTUATOR_DEFAULTS
    assert (d["eps_high"].c0, d["eps_high"].delta, d["eps_high"].c_min, d["eps_high"].c_max) == (
        0.28,
        0.01,
        0.2,
        0.4,
    )
    assert (d["entropy_coef"].c0, d["entropy_coef"].delta, d["entropy_coef"].c_max) == (
        0.0,
        1e-3,
        0.05,
    )
    assert (d["kl_coef"].c0, d["kl_coef"].delta, d["kl_coef"].c_max) == (1e-3, 1e-3, 0.1)
    assert (d["temperature"].c0, d["temperature"].delta, d["temperature"].c_min) == (1.0, 0.02, 0.5)
    assert {a: s.sign for a, s in d.items()} == {
        "eps_high": 1,
        "entropy_coef": 1,
        "kl_coef": 1,
        "temperature": 1,
    }


def test_negative_sign_moves_the_other_way():
    ac = make(actuator="kl_coef", sign=-1, warmup=0, window=1)
    used, _ = run(ac, [0.1, 0.9, 0.9])  # too low → knob down (clamped at 0), then up
    assert used == pytest.approx([1e-3, 0.0, 1e-3], abs=1e-15)


def test_explicit_bounds_and_step_override_defaults():
    ac = make(warmup=0, window=1, delta=0.05, init=0.3, min=0.25, max=0.35)
    used, _ = run(ac, [0.1, 0.1, 0.1])
    assert used == pytest.approx([0.3, 0.35, 0.35], abs=1e-12)


def test_wsd_release_drops_the_knob_to_its_floor():
    # anneal_start 6 of 10: from step 6 the knob sits at c_min and the loop stops
    s = make_schedule("wsd", target=0.4, end=0.2, anneal_ratio=0.4, release=True)
    ac = make(s, warmup=0, window=1)
    used, logs = run(ac, [0.1] * 10)  # entropy far too low the whole run
    assert used[:5] == pytest.approx([0.28, 0.29, 0.30, 0.31, 0.32], abs=1e-12)
    assert used[5:] == [0.2] * 5
    assert [m["control/adaptive_released"] for m in logs] == [0.0] * 5 + [1.0] * 5


def test_schedule_from_the_config_section_or_overridden():
    section = ScheduleConfig(kind="constant", target=0.3, start=0.6, end=0.2, anneal_ratio=0.1,
                             release=False)
    ac = AdaptiveController(AdaptiveControlConfig(enabled=True, schedule=section))
    ac.setup(ctx(), knobs())
    assert ac.schedule(3, 10) == 0.3
    # schedule= takes any (step, max_steps) -> float in place of the section's
    ac = AdaptiveController(AdaptiveControlConfig(enabled=True, schedule=section),
                            schedule=lambda t, n: t / n)
    ac.setup(ctx(), knobs())
    assert ac.schedule(3, 10) == 0.3 and ac.schedule(4, 10) == 0.4


def test_state_round_trip_reproduces_the_run():
    H = [0.5, 0.45, 0.3, 0.3, 0.35, 0.42, 0.38, 0.2, 0.3, 0.5]
    s = make_schedule("wsd", target=0.4, end=0.2, anneal_ratio=0.3)
    full, full_logs = run(make(s, warmup=2, window=3), H)
    for cut in range(1, 10):
        a = make(s, warmup=2, window=3)
        first, first_logs = run(a, H[:cut])
        b = make(s, warmup=2, window=3)
        b.load_state_dict(a.state_dict())
        rest, rest_logs = run(b, H[cut:], first=cut + 1)  # fresh knobs: c comes from the state
        assert first + rest == full and first_logs + rest_logs == full_logs
    assert len(set(full)) > 2  # the knob moved: the equality is not trivial


def reject(section):
    with pytest.raises(C.ConfigError) as e:
        validation.from_dict({"control": {"adaptive": {"enabled": True, **section}}})
    return str(e.value)


def test_invalid_configuration_names_the_key():
    msg = reject({"actuator": "eps_low"})
    assert msg.startswith("control.adaptive.actuator:")
    assert "eps_high, entropy_coef, kl_coef, temperature" in msg
    assert reject({"window": 0}).startswith("control.adaptive.window:")
    assert reject({"warmup": -1}).startswith("control.adaptive.warmup:")
    assert reject({"schedule": {"kind": "linear"}}).startswith("control.adaptive.schedule.kind:")


# The controller used to reject these itself; validation.validate checks them.
@pytest.mark.parametrize("section, path", [
    ({"init": 0.5}, "control.adaptive.init"),  # outside eps_high's default [0.2, 0.4]
    ({"min": 0.3, "max": 0.25, "init": 0.3}, "control.adaptive."),
    ({"delta": -0.01}, "control.adaptive.delta"),
    ({"deadband": -0.1}, "control.adaptive.deadband"),
])
def test_invalid_knob_range_names_the_key(section, path):
    assert reject(section).startswith(path)
