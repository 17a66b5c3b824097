"""Control laws (docs/methods/wider-field.md §6f, §6g): fixed entropy sequences replay to exact knob
sequences worked out by hand, and a law resumed from its state_dict continues identically."""

import pytest

from explorl.control.laws import EntroPICLaw, EntropyCoefLaw, PIGains, PILaw, pi_step

# EntroPIC's official defaults: H* = 0.1, Kp = 1, Ki = 0.01.
H = [0.3, 0.25, 0.05, 2.0, 0.1]
# e = H − 0.1 = [0.2, 0.15, −0.05, 1.9, 0.0]; α_t = clip(e_t + 0.01·I_t, −1, 1), I_{t+1} = I_t + e_t
#   t1: I 0    -> α 0.2                  I 0.2
#   t2: I 0.2  -> α 0.15 + 0.002 = 0.152 I 0.35
#   t3: I 0.35 -> α −0.05 + 0.0035       I 0.30
#   t4: I 0.30 -> raw 1.903 -> α 1       I 2.20   (anti-windup: saturated and e > 0, I stays 0.30)
#   t5: I 2.20 -> α 0.022                         (anti-windup: α 0.003)
ALPHA = [0.2, 0.152, -0.0465, 1.0, 0.022]
ALPHA_AW = [0.2, 0.152, -0.0465, 1.0, 0.003]


def test_entropic_worked_example_and_replay():
    law = EntroPICLaw(target=0.1, kp=1.0, ki=0.01)
    got = [law.step(h) for h in H]
    assert got == pytest.approx(ALPHA, abs=1e-12)
    assert law.integral == pytest.approx(2.2, abs=1e-12)


def test_entropic_anti_windup_stops_integrating_while_pinned():
    law = EntroPICLaw(target=0.1, kp=1.0, ki=0.01, anti_windup=True)
    assert [law.step(h) for h in H] == pytest.approx(ALPHA_AW, abs=1e-12)
    assert law.integral == pytest.approx(0.30, abs=1e-12)


def test_entropic_negative_target_is_off():
    law = EntroPICLaw(target=-1.0, kp=1.0, ki=0.01)
    assert [law.step(h) for h in H] == [0.0] * 5 and law.integral == 0.0


@pytest.mark.parametrize("anti_windup", [False, True])
def test_entropic_resumes_exactly(anti_windup):
    full = EntroPICLaw(target=0.1, kp=1.0, ki=0.01, anti_windup=anti_windup)
    expected = [full.step(h) for h in H]
    first = EntroPICLaw(target=0.1, kp=1.0, ki=0.01, anti_windup=anti_windup)
    head = [first.step(h) for h in H[:2]]
    resumed = EntroPICLaw(target=0.1, kp=1.0, ki=0.01, anti_windup=anti_windup)
    resumed.load_state_dict(first.state_dict())
    assert head + [resumed.step(h) for h in H[2:]] == expected  # bit-exact


def test_pi_law_with_bias_and_bounds_as_a_knob_law():
    # A knob c = clip(0.28 + 0.5·e + 0.1·I, 0.2, 0.4), e = target − H (entropy must rise: widen).
    gains = PIGains(kp=0.5, ki=0.1, u_min=0.2, u_max=0.4, bias=0.28)
    law = PILaw(gains)
    errors = [0.1, 0.1, -0.4, 0.0]
    # t1: 0.28+0.05+0     = 0.33   I 0.1
    # t2: 0.28+0.05+0.01  = 0.34   I 0.2
    # t3: 0.28−0.2+0.02   = 0.10 -> 0.2 (floor)  I −0.2
    # t4: 0.28+0−0.02     = 0.26   I −0.2
    assert [law.step(e) for e in errors] == pytest.approx([0.33, 0.34, 0.2, 0.26], abs=1e-12)
    assert law.state_dict() == {"integral": pytest.approx(-0.2)}


def test_pi_step_is_pure():
    gains = PIGains(kp=1.0, ki=0.5, u_min=-1.0, u_max=1.0, anti_windup=True)
    assert pi_step(gains, 0.0, 0.5) == (0.5, 0.5)
    assert pi_step(gains, 4.0, 0.5) == (1.0, 4.0)  # raw 2.5 pinned: no windup
    assert pi_step(gains, 4.0, -0.5) == (1.0, 3.5)  # raw 1.5, error pulls back: integrate
    with pytest.raises(ValueError):
        PIGains(kp=1.0, ki=0.0, u_min=1.0, u_max=0.0)


# --------------------------------------------------------------------------- §6g

SKYWORK = {"target": 0.2, "delta": 1e-4, "c_min": 0.0, "c_max": 5e-3, "coef": 0.0}
E = [0.15, 0.25, 0.1, 0.1, 0.2, 0.3]
# strict (Skywork, e < H*): update c, then apply c·1[e < H*] (§6g: c 0, e 0.15 -> c 1e-4, applied)
#   e 0.15: c 1e-4, applied 1e-4      e 0.25: c 0, applied 0
#   e 0.1:  c 1e-4, applied 1e-4      e 0.1:  c 2e-4, applied 2e-4
#   e 0.2:  not below: c 1e-4, applied 0      e 0.3: c 0, applied 0
STRICT = [(1e-4, 1e-4), (0.0, 0.0), (1e-4, 1e-4), (2e-4, 2e-4), (0.0, 1e-4), (0.0, 0.0)]
# inclusive (TRL, e ≤ H*): the same until e = 0.2, which now counts as below
INCLUSIVE = STRICT[:4] + [(3e-4, 3e-4), (0.0, 2e-4)]


def test_entropy_coef_algorithms_example_updates_then_applies():
    """docs/methods/wider-field.md §6g: c = 0, e = 0.15 → c = 1e-4, applied; e = 0.25 → c = 0,
    applied 0."""
    law = EntropyCoefLaw(**SKYWORK)
    assert law.step(0.15) == pytest.approx((1e-4, 1e-4), abs=1e-15)
    assert law.step(0.25) == (0.0, 0.0)


@pytest.mark.parametrize("inclusive, expected", [(False, STRICT), (True, INCLUSIVE)])
def test_entropy_coef_replay(inclusive, expected):
    law = EntropyCoefLaw(**SKYWORK, inclusive=inclusive)
    got = [law.step(e) for e in E]
    for (a, c), (ea, ec) in zip(got, expected, strict=True):
        assert a == pytest.approx(ea, abs=1e-15) and c == pytest.approx(ec, abs=1e-15)


def test_entropy_coef_is_not_dead_at_zero():
    """TRL #6140's pitfall: gated on coef != 0, the law never left c_min = 0. Here it climbs
    by Δ per step while entropy stays low, up to c_max."""
    law = EntropyCoefLaw(target=0.2, delta=2e-3, c_min=0.0, c_max=5e-3, coef=0.0)
    coefs = [law.step(0.1)[1] for _ in range(4)]
    assert coefs == pytest.approx([2e-3, 4e-3, 5e-3, 5e-3], abs=1e-15)


def test_entropy_coef_resumes_exactly():
    full = EntropyCoefLaw(**SKYWORK)
    expected = [full.step(e) for e in E]
    first = EntropyCoefLaw(**SKYWORK)
    head = [first.step(e) for e in E[:3]]
    resumed = EntropyCoefLaw(**SKYWORK)
    resumed.load_state_dict(first.state_dict())
    assert head + [resumed.step(e) for e in E[3:]] == expected


def test_entropy_coef_checks_its_bounds():
    with pytest.raises(ValueError):
        EntropyCoefLaw(**{**SKYWORK, "coef": 1.0})


def test_laws_are_exported():
    from explorl import control

    names = {"EntroPICLaw", "EntropyCoefLaw", "PIGains", "PILaw", "pi_step"}
    assert names <= set(control.__all__) and all(hasattr(control, n) for n in names)
