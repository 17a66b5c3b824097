"""Target-entropy schedules (docs/methods/entropy-scheduling.md §4b), checked against values worked
out by hand."""

import math

import pytest

from explorl.control.schedules import (
    SCHEDULES,
    WSD,
    Constant,
    Cosine,
    anneal_progress,
    anneal_start,
    make_schedule,
)


def test_anneal_start_convention():
    # E3: max_steps − floor(max_steps · ratio)
    assert anneal_start(10, 0.4) == 6
    assert anneal_start(480, 0.4) == 480 - 192
    # 100·0.29 = 28.999999999999996 in floats; the recipe means 29 annealing steps
    assert anneal_start(100, 0.29) == 71
    # floor(...) = 0: no annealing phase at all
    assert anneal_start(10, 0.05) is None
    assert anneal_start(10, 0.0) is None


def test_anneal_progress_by_hand():
    assert anneal_progress(5, 10, 0.4) is None
    assert anneal_progress(6, 10, 0.4) == 0.0
    assert anneal_progress(8, 10, 0.4) == 0.5
    assert anneal_progress(10, 10, 0.4) == 1.0
    assert anneal_progress(10, 10, 0.05) is None


def test_constant():
    s = make_schedule("constant", target=0.4)
    assert isinstance(s, Constant)
    assert [s(t, 10) for t in (1, 5, 10)] == [0.4, 0.4, 0.4]
    assert not any(s.released(t, 10) for t in range(1, 11))


def test_cosine_by_hand():
    s = make_schedule("cosine", start=0.6, end=0.2)
    assert isinstance(s, Cosine)
    # max_steps 5: progress (t−1)/4 = 0, .25, .5, .75, 1
    assert s(1, 5) == pytest.approx(0.6, abs=1e-15)
    assert s(2, 5) == pytest.approx(0.2 + 0.4 * 0.5 * (1 + math.sqrt(0.5)), abs=1e-15)
    assert s(3, 5) == pytest.approx(0.4, abs=1e-15)
    assert s(4, 5) == pytest.approx(0.2 + 0.4 * 0.5 * (1 - math.sqrt(0.5)), abs=1e-15)
    assert s(5, 5) == pytest.approx(0.2, abs=1e-15)
    assert s(1, 1) == 0.6  # a one-step run stays at start


def test_wsd_cosine_and_linear_by_hand():
    # max_steps 10, anneal_ratio 0.4 → anneal_start 6, progress at 7 = 0.25
    cos_s = make_schedule("wsd", target=0.5, end=0.1, anneal_ratio=0.4)
    lin_s = make_schedule("wsd", target=0.5, end=0.1, anneal_ratio=0.4, decay="linear")
    for t in range(1, 7):  # stable phase, and progress 0 at step 6
        assert cos_s(t, 10) == 0.5 and lin_s(t, 10) == 0.5
    assert cos_s(7, 10) == pytest.approx(0.1 + 0.4 * 0.5 * (1 + math.cos(math.pi / 4)), abs=1e-15)
    assert lin_s(7, 10) == pytest.approx(0.5 - 0.4 * 0.25, abs=1e-15)
    assert cos_s(8, 10) == pytest.approx(0.3, abs=1e-15)
    assert lin_s(8, 10) == pytest.approx(0.3, abs=1e-15)
    assert cos_s(10, 10) == pytest.approx(0.1, abs=1e-15)
    assert lin_s(10, 10) == pytest.approx(0.1, abs=1e-15)
    assert not any(cos_s.released(t, 10) for t in range(1, 11))


def test_wsd_release_flags_the_annealing_phase():
    s = make_schedule("wsd", target=0.5, end=0.1, anneal_ratio=0.4, release=True)
    assert [s.released(t, 10) for t in range(1, 11)] == [False] * 5 + [True] * 5
    # the decayed target is still reported (for reference) while released
    assert s(8, 10) == pytest.approx(0.3, abs=1e-15)


def test_make_schedule_accepts_a_whole_config_section():
    section = {
        "kind": "wsd",
        "target": 0.4,
        "start": 0.6,
        "end": 0.2,
        "anneal_ratio": 0.1,
        "release": False,
    }
    s = make_schedule(**section)
    assert s == WSD(target=0.4, end=0.2, anneal_ratio=0.1, release=False)
    section["kind"] = "constant"
    assert make_schedule(**section) == Constant(0.4)


def test_make_schedule_errors_name_the_valid_choices():
    with pytest.raises(ValueError, match="constant, cosine, wsd"):
        make_schedule("linear", target=0.4)
    with pytest.raises(ValueError, match="unknown schedule parameter"):
        make_schedule("constant", targt=0.4)
    with pytest.raises(ValueError, match="decay"):
        make_schedule("wsd", target=0.4, end=0.2, decay="step")
    assert set(SCHEDULES) == {"constant", "cosine", "wsd"}
