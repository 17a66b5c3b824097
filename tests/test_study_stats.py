"""The study's bootstrap intervals against cases worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from explorl.study.stats import (
    Interval,
    passk_diff,
    problem_passk,
    seed_interval,
    verdict,
)


def test_constant_values_give_a_point_interval():
    iv = seed_interval([0.7, 0.7, 0.7])
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((0.7, 0.7, 0.7))
    assert seed_interval([None, None]) is None
    assert seed_interval([None, 0.5]).estimate == 0.5  # unmeasured runs are left out


def test_paired_shift_is_exact():
    """a = b + 0.1 on every problem and seed: every resample's difference is 0.1."""
    rng = np.random.default_rng(1)
    b = rng.random((3, 50))
    iv = passk_diff(b + 0.1, b, paired_seeds=True)
    assert iv.estimate == pytest.approx(0.1)
    assert iv.low == pytest.approx(0.1) and iv.high == pytest.approx(0.1)


def test_two_problem_interval_by_hand():
    """a = [1, 0], b = [0, 0] on 2 problems: a resample's mean of a is 0, ½ or 1 with
    probabilities ¼, ½, ¼, so the 95% interval is [0, 1] around the estimate ½."""
    iv = passk_diff(np.array([[1.0, 0.0]]), np.array([[0.0, 0.0]]), paired_seeds=True)
    assert iv.estimate == 0.5 and iv.low == 0.0 and iv.high == 1.0


def test_unpaired_seeds_against_a_single_base_row():
    """Three seeds of a method against one base evaluation: b has one row."""
    a = np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    b = np.array([[0.5, 0.5]])
    iv = passk_diff(a, b, paired_seeds=False)
    assert (iv.estimate, iv.low, iv.high) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="problems"):
        passk_diff(np.zeros((1, 3)), np.zeros((1, 2)), paired_seeds=False)
    with pytest.raises(ValueError, match="paired seeds"):
        passk_diff(np.zeros((3, 2)), np.zeros((1, 2)), paired_seeds=True)


def test_intervals_are_reproducible_and_cover_the_estimate():
    rng = np.random.default_rng(0)
    a, b = rng.random((3, 40)), rng.random((3, 40))
    one, two = passk_diff(a, b, paired_seeds=True), passk_diff(a, b, paired_seeds=True)
    assert one == two and one.low <= one.estimate <= one.high and one.low < one.high


@pytest.mark.parametrize(
    "low, high, direction, want",
    [(0.1, 0.3, +1, "shown"), (0.1, 0.3, -1, "opposite"), (-0.3, -0.1, -1, "shown"),
     (-0.3, -0.1, +1, "opposite"), (-0.1, 0.2, +1, "not shown"), (0.0, 0.2, +1, "not shown")],
)
def test_verdicts(low, high, direction, want):
    assert verdict(Interval((low + high) / 2, low, high, "x"), direction) == want
    assert verdict(None, +1) == "n/a"


def test_problem_passk_uses_the_unbiased_estimator(tmp_path):
    """n = 4 samples, c = 1 right: pass@1 = 1/4, pass@2 = 1 − C(3,2)/C(4,2) = 1/2, pass@4 = 1."""
    path = tmp_path / "problems.jsonl"
    rows = [{"responses": ["a", "b", "c", "d"], "n_correct": 1},
            {"responses": ["a", "b", "c", "d"], "n_correct": 0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = problem_passk(path, [1, 2, 4])
    assert got[1] == pytest.approx([0.25, 0.0]) and got[2] == pytest.approx([0.5, 0.0])
    assert got[4] == pytest.approx([1.0, 0.0])
