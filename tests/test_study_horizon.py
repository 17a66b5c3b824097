"""Entropy over a long horizon (``explorl.report.horizon``): the windows, the ratios, their seed
intervals, the collapse verdict and where an arm parts from the baseline, against numbers
worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from explorl.analysis.runs import Run
from explorl.report.horizon import (
    draw_horizon,
    entropy_horizon,
    horizon_json,
    horizon_lines,
    window_mean,
)


def _run(name, seed, entropies, first=1):
    return Run(Path("."), name, seed, [{"step": first + i, "entropy/mean": h}
                                       for i, h in enumerate(entropies)])


GROUPS = {
    # start (steps 1–2) 1.0; step 4: (0.8 + 0.6)/2 = 0.7; step 8: (0.3 + 0.1)/2 = 0.2
    "grpo": [_run("grpo", 0, [1.0, 1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.1]),
             # start 2.0; step 4: (1.6 + 1.2)/2 = 1.4 → 0.7; step 8: 0.4 → 0.2
             _run("grpo", 1, [2.0, 2.0, 1.6, 1.2, 1.0, 0.8, 0.4, 0.4])],
    # step 4: 1.0 both; step 8: 0.9 and 0.7
    "m": [_run("m", 0, [1, 1, 1, 1, 1, 1, 0.9, 0.9]), _run("m", 1, [1, 1, 1, 1, 1, 1, 0.7, 0.7])],
    "short": [_run("short", 0, [1.0, 1.0, 0.5, 0.5, 0.5, 0.5])],  # stopped at step 6
    "quiet": [Run(Path("."), "quiet", 0, [{"step": 1, "reward/mean": 0.5}])],  # no entropy
}


def test_window_means_by_step_not_by_position():
    steps, values = [1, 2, 3, 5, 6], [4.0, 2.0, 3.0, 1.0, 5.0]
    assert window_mean(steps, values, None, 2) == 3.0  # steps 1, 2
    assert window_mean(steps, values, 5, 2) == 1.0  # (3, 5]: step 5 alone (step 4 not logged)
    assert window_mean(steps, values, 6, 3) == 3.0  # (3, 6]: steps 5, 6
    assert window_mean([], [], 4, 2) is None
    assert window_mean([10, 11, 12], [1.0, 2.0, 6.0], None, 2) == 1.5  # starts where it starts


T1 = 12.7062047 * 0.1  # t(.975, 1) · SE for two values .2 apart


def test_ratios_collapse_and_parting_by_hand():
    h = entropy_horizon(GROUPS, [8, 4], window=2)
    assert h.steps == [4, 8] and set(h.ratio) == {"grpo", "m", "short"}  # "quiet": no entropy
    assert h.start["grpo"].estimate == pytest.approx(1.5)  # (1.0 + 2.0)/2
    g4, g8 = h.ratio["grpo"][4], h.ratio["grpo"][8]
    assert (g4.estimate, g4.low, g4.high) == pytest.approx((0.7, 0.7, 0.7))
    assert (g8.estimate, g8.low, g8.high) == pytest.approx((0.2, 0.2, 0.2))
    m8 = h.ratio["m"][8]
    # 0.7 and 0.9: SE = .1, t(.975, df 1) = 12.706: two seeds decide little
    assert (m8.estimate, m8.low, m8.high) == pytest.approx((0.8, 0.8 - T1, 0.8 + T1))
    assert h.collapse("grpo") == "collapses"  # 0.2 ≤ 0.30 at the top of its interval
    assert h.collapse("m") == "undecided"  # its interval straddles 0.30
    assert h.collapse("short") == "n/a" and 8 not in h.ratio["short"]
    assert h.ratio["short"][4].estimate == pytest.approx(0.5)
    d4, d8 = h.diff["m"][4], h.diff["m"][8]  # paired by seed: (0.3, 0.3) and (0.7, 0.5)
    assert (d4.estimate, d4.low, d4.high) == pytest.approx((0.3, 0.3, 0.3))
    assert (d8.estimate, d8.low, d8.high) == pytest.approx((0.6, 0.6 - T1, 0.6 + T1))
    assert h.parted("m") == [4]
    assert h.diff["short"][4].estimate == pytest.approx(0.5 - 0.7)  # seed 0 only
    # an undecided arm: 0.25 and 0.45 at the last step straddle 0.30
    mixed = {"grpo": [_run("grpo", 0, [1, 1, 0.25, 0.25]), _run("grpo", 1, [1, 1, 0.45, 0.45])]}
    assert entropy_horizon(mixed, [4], window=2).collapse("grpo") == "undecided"
    assert entropy_horizon(GROUPS, []) is None
    assert entropy_horizon({"quiet": GROUPS["quiet"]}, [4]) is None


def test_the_section_the_json_and_the_figure(tmp_path):
    h = entropy_horizon(GROUPS, [4, 8], window=2)
    md = "\n".join(horizon_lines(h))
    assert "| grpo | 2 | 1.500 [-4.853, 7.853] | 0.700 [0.700, 0.700] | 0.200 [0.200, 0.200] " \
           "| collapses |" in md
    assert "| m | +0.300 [+0.300, +0.300] | +0.600 [-0.671, +1.871] | 4 |" in md
    assert horizon_lines(None) == []
    js = json.loads(json.dumps(horizon_json(h)))
    assert js["arms"]["m"]["collapse"] == "undecided"
    assert js["arms"]["m"]["parted_at"] == [4]
    assert js["arms"]["grpo"]["ratio"]["8"]["estimate"] == pytest.approx(0.2)
    (title, name), = draw_horizon(GROUPS, h, tmp_path)
    assert (tmp_path / name).is_file() and "collapse" in title
    assert draw_horizon(GROUPS, None, tmp_path) == []


def test_one_seed_gives_values_without_intervals_or_verdicts():
    """One seed has no interval: its values are printed alone and nothing is decided."""
    one = {"grpo": [GROUPS["grpo"][0]], "m": [GROUPS["m"][0]]}
    h = entropy_horizon(one, [4, 8], window=2)
    assert h.collapse("grpo") == "one seed" and h.parted("m") == []
    md = "\n".join(horizon_lines(h))
    assert "| grpo | 1 | 1.000 | 0.700 | 0.200 | one seed |" in md
    assert "| m | +0.300 | +0.700 | one seed |" in md
