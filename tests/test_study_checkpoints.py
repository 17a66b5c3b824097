"""pass@k at a long horizon's checkpoints (``explorl.report.checkpoints``): the means, the
one-arm interval, the paired difference with the baseline, the steps where it is resolved, the
table, the JSON and the figure, against numbers worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from explorl.report.checkpoints import checkpoint_json, checkpoint_table, draw_checkpoints
from explorl.report.frontier import mean_interval
from explorl.report.stats import passk_diff
from explorl.study.analyse import checkpoint_passk

N = 4  # samples per problem: pass@1 = c/4, pass@4 = 1 when c ≥ 1


def _eval(folder: Path, correct: list[int]) -> None:
    folder.mkdir(parents=True)
    (folder / "problems.jsonl").write_text(
        "".join(json.dumps({"n_samples": N, "n_correct": c}) + "\n" for c in correct)
    )


def _plan(root: Path, name: str, seed: int, at5: list[int], at10: list[int] | None):
    """A finished run with a checkpoint evaluation at step 5 and (unless ``at10`` is None, a
    run that has not finished) the final one at step 10."""
    out = root / f"{name}-seed{seed}"
    _eval(out / "eval_step5", at5)
    evals = [("eval", None), ("eval_step5", None)]
    if at10 is not None:
        _eval(out / "eval", at10)
    return SimpleNamespace(
        name=name, seed=seed, out=out, evals=evals, cfg=SimpleNamespace(max_steps=10)
    )


@pytest.fixture
def cp(tmp_path):
    done = [
        # GRPO at step 5: problems (0, 1) correct 0 and 1 of 4 → pass@1 (0, 0.25), pass@4 (0, 1)
        _plan(tmp_path, "grpo", 0, [0, 1], [4, 4]),
        _plan(tmp_path, "grpo", 1, [0, 1], [4, 4]),
        # m at step 5: 2 and 3 of 4 → pass@1 (0.5, 0.75), pass@4 (1, 1); step 10 as GRPO
        _plan(tmp_path, "m", 0, [2, 3], [4, 4]),
        _plan(tmp_path, "m", 1, [2, 3], [4, 4]),
        _plan(tmp_path, "late", 0, [4, 0], None),  # one seed, stopped before step 10
    ]
    base = {1: np.array([[0.25, 0.25]]), 4: np.array([[1.0, 1.0]])}
    return checkpoint_passk(done, ["grpo", "m", "late"], 4, "grpo", base)


def test_one_arm_interval_by_hand_and_as_a_difference_with_nothing():
    a = np.array([[0.0, 1.0], [1.0, 1.0]])
    iv = mean_interval(a)  # the checkpoints' bars and intervals
    # seed means .5, 1: var .125 / 2 = .0625; MS_problem = 2·var(.5, 1) = .25 = MS_resid
    # (residuals ±.25, one df): no problem part. SE = .25, df 1, t = 12.706: .75 ± 3.18,
    # clipped to what a pass@k (a level) can be, [0, 1], and a difference, [−1, 1]
    assert iv.se == pytest.approx(0.25) and iv.df == pytest.approx(1)
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((0.75, 0.0, 1.0))
    d = passk_diff(a, np.zeros_like(a), paired_seeds=True)  # the same array
    assert (d.low, d.high) == pytest.approx((-1.0, 1.0)) and d.se == iv.se


def test_means_differences_and_resolved_steps(cp):
    assert cp.steps == [5, 10]
    assert cp.mean("grpo", 1, 5) == pytest.approx(0.125)
    assert cp.mean("m", 1, 5) == pytest.approx(0.625)
    assert cp.mean("grpo", 4, 5) == pytest.approx(0.5)
    assert cp.mean("late", 1, 10) is None and cp.seeds("late", 1, 5) == [0]
    d = cp.diff("m", 1, 5)  # (0.5, 0.5) on every problem and seed: no spread
    assert (d.estimate, d.low, d.high) == pytest.approx((0.5, 0.5, 0.5))
    d4 = cp.diff("m", 4, 5)  # (1, 0) per seed: no seed part; MS_problem 1, MS_resid 0:
    # SE² = 1 / 4, df 1 → .5 ± 12.706·.5, clipped to what a difference can be: [−1, 1]
    assert (d4.estimate, d4.low, d4.high) == pytest.approx((0.5, -1.0, 1.0))
    assert d4.se == pytest.approx(0.5)
    assert cp.diff("m", 1, 10).estimate == pytest.approx(0.0)
    assert cp.resolved("m", 1) == [5] and cp.resolved("m", 4) == []
    assert cp.resolved("late", 1) == []  # one seed decides nothing
    assert cp.diff("late", 1, 10) is None


def test_the_table_the_json_and_the_figure(cp, tmp_path):
    md = "\n".join(checkpoint_table(cp))
    assert "| grpo | 0.125 | 1.000 | 0.500 | 1.000 |" in md
    assert "| m | 0.625 | 1.000 | 1.000 | 1.000 |" in md
    assert "| late | 0.500 | — | 0.500 | — |" in md  # (1, 0) at step 5
    assert "Step 0 is the base model: pass@1 0.250, pass@4 1.000." in md
    row = next(line for line in md.splitlines() if line.startswith("| m | **+0.500"))
    assert row.endswith("| 5 | none |")
    assert next(
        line for line in md.splitlines() if line.startswith("| late | ") and "one seed" in line
    )
    js = json.loads(json.dumps(checkpoint_json(cp)))
    assert js["steps"] == [5, 10] and js["base"] == {"pass@1": 0.25, "pass@4": 1.0}
    assert js["arms"]["m"]["pass@1"]["resolved_at"] == [5]
    assert js["arms"]["m"]["pass@1"]["at"]["5"]["minus_baseline"]["estimate"] == pytest.approx(0.5)
    assert js["arms"]["grpo"]["pass@4"]["at"]["5"]["mean"]["estimate"] == pytest.approx(0.5)
    assert "minus_baseline" not in js["arms"]["grpo"]["pass@1"]["at"]["5"]
    ((title, name),) = draw_checkpoints(cp, tmp_path)
    assert (tmp_path / name).is_file() and "pass@4" in title
    assert checkpoint_table(None) == [] and checkpoint_json(None) is None
    assert draw_checkpoints(None, tmp_path) == []


def test_no_checkpoint_evaluations_no_section(tmp_path):
    plan = SimpleNamespace(
        name="grpo", seed=0, out=tmp_path, evals=[("eval", None)], cfg=SimpleNamespace(max_steps=10)
    )
    assert checkpoint_passk([plan], ["grpo"], 4) is None


def _run(name, seed, entropies):
    from explorl.analysis.runs import Run
    return Run(Path("."), name, seed, [{"step": 1 + i, "entropy/mean": h}
                                       for i, h in enumerate(entropies)])


def test_horizon_claims_by_hand():
    """GRPO falls to 0.2 of its start (collapses); m ends 0.6 above it in entropy ratio and
    (1, 0) pass@4 above it per problem on both seeds; one-seed arms are n/a."""
    from explorl.report.checkpoints import Checkpoints, horizon_claims
    from explorl.report.horizon import entropy_horizon

    groups = {"grpo": [_run("grpo", 0, [1, 1, 0.8, 0.6, 0.5, 0.4, 0.3, 0.1]),
                       _run("grpo", 1, [2, 2, 1.6, 1.2, 1.0, 0.8, 0.4, 0.4])],
              "m": [_run("m", 0, [1, 1, 1, 1, 1, 1, 0.9, 0.9]),
                    _run("m", 1, [1, 1, 1, 1, 1, 1, 0.7, 0.7])],
              "solo": [_run("solo", 0, [1] * 8)]}
    h = entropy_horizon(groups, [4, 8], window=2)
    cp = Checkpoints([4, 8], 4, "grpo", ["grpo", "m", "solo"])
    for seed in (0, 1):
        for st in (4, 8):
            cp.got.setdefault(("grpo", 4, st), {})[seed] = np.array([0.0, 1.0])
            cp.got.setdefault(("m", 4, st), {})[seed] = np.array([1.0, 1.0] if st == 8
                                                                 else [0.0, 1.0])
    claims = {c["id"]: c for c in horizon_claims(h, cp)}
    assert list(claims) == ["H-collapse", "L-m", "L-solo"]
    col = claims["H-collapse"]
    assert col["verdict"] == "shown" and col["conditions"][0]["null"] == pytest.approx(0.3)
    assert col["conditions"][0]["interval"]["estimate"] == pytest.approx(0.2)
    lm = claims["L-m"]
    # entropy: +0.3 at step 4 (no spread: resolved), +0.6 (.5, .7: t(1) makes it [−.67, 1.87])
    # at 8; pass@4: 0 at 4, 0.5 ± 6.35 at 8
    assert [c["verdict"] for c in lm["conditions"]] == ["not shown", "not shown"]
    assert lm["verdict"] == "not shown"
    assert lm["conditions"][1]["interval"]["estimate"] == pytest.approx(0.5)
    assert lm["numbers"].endswith("entropy resolved at steps: 4; pass@4 resolved at steps: "
                                  "none")
    assert claims["L-solo"]["verdict"] == "n/a"
    assert "1 seed shared with grpo" in claims["L-solo"]["numbers"]
    assert horizon_claims(None, cp) == []
    # a baseline with one seed decides nothing either
    one = entropy_horizon({"grpo": groups["grpo"][:1]}, [4, 8], window=2)
    assert horizon_claims(one, None)[0]["verdict"] == "n/a"


def test_the_frontier_along_training_by_hand():
    """GRPO's checkpoints (0.4, 0.9) at step 5 and (0.6, 0.7) at 10: its frontier at pass@1 0.5
    is the chord's 0.8. m at step 5 (0.5, 0.85) lies 0.05 above it; m at step 10 (0.5, 0.80) is
    beaten by m's own step 5 and not judged. Every problem and seed alike: no spread."""
    from explorl.report.checkpoints import Checkpoints, training_frontier
    from explorl.report.frontier_report import claim_rule, frontier_claims, frontier_table

    cp = Checkpoints([5, 10], 4, "grpo", ["grpo", "m"])
    values = {("grpo", 5): (0.4, 0.9), ("grpo", 10): (0.6, 0.7), ("m", 5): (0.5, 0.85),
              ("m", 10): (0.5, 0.80)}
    for (arm, step), (p1, pk) in values.items():
        for seed in (0, 1):
            cp.got.setdefault((arm, 1, step), {})[seed] = np.full(3, p1)
            cp.got.setdefault((arm, 4, step), {})[seed] = np.full(3, pk)
    cp.base = {1: np.full(3, 0.3), 4: np.full(3, 0.95)}
    fr = training_frontier(cp)
    assert (fr.knob, fr.unit, fr.base) == ("step", "checkpoint", pytest.approx((0.3, 0.95)))
    m5, m10 = fr.points["m"]
    assert (m5.value, m5.name) == (5, "m@step5")
    assert (m5.gap_k.estimate, m5.gap_k.low, m5.gap_k.high) == pytest.approx((0.05, 0.05, 0.05))
    assert m10.beaten_by == (5,) and m5.beaten_by is None
    (claim,) = frontier_claims(fr, "T", " along training")
    assert claim["id"] == "T-m" and claim["verdict"] == "shown"
    assert claim["claim"] == "m moves the pass@1–pass@4 frontier along training outward"
    assert "step 10 (by step 5)" in claim["numbers"]
    md = "\n".join(frontier_table(fr))
    assert "| arm | step | pass@1 | pass@4 |" in md
    assert "Each arm's points are its checkpoints" in md
    assert "At step 5, 10 grpo loses pass@4" in md
    assert claim_rule(fr, "T").startswith("A frontier claim (T-…)")
    assert training_frontier(None) is None
    one = Checkpoints([10], 4, "grpo", ["grpo"], {k: v for k, v in cp.got.items() if k[2] == 10})
    assert training_frontier(one) is None  # one GRPO checkpoint defines no frontier
