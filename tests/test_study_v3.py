"""The study's tuning, evaluation temperatures, power and ablations: hand-worked values, the
spec's checks, and a tiny tuned study end to end."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from conftest import TINY_LAB_CONFIG

from explorl import config as C
from explorl import study as S
from explorl.cli import main
from explorl.report.evidence import Evidence
from explorl.report.figures import highlighted
from explorl.report.stats import MDE_Z, passk_diff, t_ppf, variance_components
from explorl.report.tables import ablation_tables, passk_tables, power_table, temperature_tables
from explorl.study import data as data_mod
from explorl.study.jobs import JobResult
from explorl.study.plan import final_evals, plan_tuning, value_text
from explorl.study.tuning import GridPoint, grid_table, pick, tuning_markdown

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, data: dict, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    recipes = ROOT / "src" / "explorl" / "recipes" / "lab"
    path.write_text(yaml.safe_dump({"recipe_dir": str(recipes), **data}))
    return path


# ----------------------------------------------------------------------------- power


def test_variance_components_and_mde_by_hand():
    """d = [[.1, .3, .2], [.5, .7, .3]] (2 seeds × 3 problems). Row means .2, .5; column means
    .3, .5, .25; grand mean .35. MS_seed = 3·var(.2, .5) = 3·.045 = .135; MS_problem =
    2·var(.3, .5, .25) = 2·.0175 = .035; residuals ±.05, ±.05, ±.1 → MS_resid = .03 / 2 = .015.
    σ²_seed = (.135 − .015)/3 = .04, σ²_problem = (.035 − .015)/2 = .01, σ²_resid = .015.
    The interval's SE² = MS_seed/6 + (MS_problem − MS_resid)/6 = .0225 + .003333 = .0258333;
    Satterthwaite: df_problem = .02²/(.035²/2 + .015²/2) = .55172, df = .0258333²/(.0225²/1 +
    .003333²/.55172) = 1.26781 (reported). MDE, a t pair per term: the seeds' at df 1, the
    problems' at .55 counted as 1: (t(.975, 1) + t(.80, 1)) · .160728 = 14.0826 · .160728 =
    2.26346. Projected at S seeds: the seeds' term (.04 + .015/3)/S at df S − 1, the problems'
    .01/3 at df 2: √((t(.975, S−1) + t(.8, S−1))² · .045/S + 5.3634² · .003333): S = 4 gives
    .539, S = 5 .469: 5 seeds are the fewest reaching .5; for .3 the problem term alone (5.3634 ·
    √.003333 = .3097) is too much: None."""
    p = variance_components(np.array([[0.1, 0.3, 0.2], [0.5, 0.7, 0.3]]))
    assert (p.var_problem, p.var_seed, p.var_resid) == pytest.approx((0.01, 0.04, 0.015))
    assert p.se() == pytest.approx(0.0258333 ** 0.5, rel=1e-5)
    assert p.dof() == pytest.approx(1.26781, abs=1e-5)
    assert MDE_Z == pytest.approx(2.8016, abs=1e-4)
    assert p.mde() == pytest.approx((t_ppf(0.975, 1) + t_ppf(0.8, 1)) * p.se())
    assert p.mde() == pytest.approx(2.26346, abs=1e-4)
    assert p.seeds_for(0.5) == 5 and p.mde(seeds=5) <= 0.5 < p.mde(seeds=4)
    assert p.mde(seeds=4) == pytest.approx(0.539, abs=1e-3)
    assert p.seeds_for(0.3) is None
    # more problems shrink the problem and residual terms only
    seed, prob = (0.04 + 0.015 / 300) / 2, 0.01 / 300
    f = lambda df: t_ppf(0.975, df) + t_ppf(0.8, df)  # noqa: E731
    assert p.mde(seeds=2, problems=300) == pytest.approx(
        (f(1) ** 2 * seed + f(299) ** 2 * prob) ** 0.5)


def test_one_seed_power_is_problem_variance_only():
    d = np.array([[0.0, 1.0, 0.0, 1.0]])  # var over problems (ddof 1) = 1/3, df P − 1 = 3
    p = variance_components(d)
    assert p.var_seed is None and p.var_problem == pytest.approx(1 / 3)
    assert p.mde() == pytest.approx((3.1824463 + 0.9784723) * (1 / 3 / 4) ** 0.5, rel=1e-6)
    assert p.seeds_for(0.1) is None


def test_passk_diff_carries_the_power_of_the_paired_difference():
    rng = np.random.default_rng(0)
    b = rng.random((3, 40))
    a = b + rng.normal(0, 0.1, (3, 40))
    iv = passk_diff(a, b, paired_seeds=True)
    want = variance_components(a - b)
    assert iv.mde == pytest.approx(want.mde()) and iv.to_json()["power"]["mde"] == iv.mde
    # against one base evaluation: the base row is subtracted from every run
    base = rng.random((1, 40))
    assert passk_diff(a, base, paired_seeds=False).power.seeds == 3


# ----------------------------------------------------------------------------- tuning


def test_pick_breaks_ties_by_pass1_then_grid_order():
    pts = [GridPoint(1, 0.80, 0.30, 2), GridPoint(2, 0.82, 0.25, 2), GridPoint(3, 0.81, 0.40, 2)]
    assert pick(pts, tie=0.0) == 1  # the best pass@k
    assert pick(pts, tie=0.01) == 2  # .81 is within .01 of .82: pass@1 .40 wins
    assert pick(pts, tie=0.05) == 2
    same = [GridPoint(1, 0.8, 0.3, 2), GridPoint(2, 0.8, 0.3, 2)]
    assert pick(same, tie=0.0) == 0


def _tuned_spec(tmp_path, **extra):
    data = {"recipes": ["grpo", "e3"], "seeds": [0, 1], "max_steps": 20,
            "variants": [{"name": "e3_no_anneal", "recipe": "e3",
                          "set": ["control.temperature.anneal=false"]}],
            "tune": {"grpo": {"key": "optim.lr", "values": [5e-05, 1e-4]},
                     "e3": {"key": "control.temperature.beta", "values": [0.8, 0.9]}},
            "tuning": {"seeds": [100, 101], "k": 4, "max_steps": 10, "n": 8},
            "eval": {"n": 8, "k": [1, 4], "temperatures": [0.8, 1.2]}, **extra}
    return _write(tmp_path, data)


def test_tuning_plans_every_value_and_seed_and_the_choice_reaches_the_final_runs(tmp_path):
    path = _tuned_spec(tmp_path)
    spec = S.load_spec(path)
    plans = plan_tuning(spec, path, tmp_path / "out")
    assert len(plans) == 2 * 2 * 2  # 2 recipes × 2 values × 2 tuning seeds
    lr = {(p.seed, p.value): p.cfg.optim.lr for p in plans if p.name == "grpo"}
    assert lr == {(100, 5e-05): 5e-05, (100, 1e-4): 1e-4, (101, 5e-05): 5e-05, (101, 1e-4): 1e-4}
    assert {p.cfg.max_steps for p in plans} == {10}
    p0 = next(p for p in plans if p.name == "grpo")
    assert p0.out == tmp_path / "out" / "tune" / "runs" / "grpo@5.0e-05-seed100"
    ((folder, ev),) = p0.evals
    assert (folder, ev.split, ev.n, ev.k) == ("eval", "val", 8, [1, 4])

    # each grid point's validation result → the choice
    for p in plans:
        d = p.out / "eval"
        d.mkdir(parents=True)
        good = (p.name == "grpo" and p.value == 1e-4) or (p.name == "e3" and p.value == 0.8)
        (d / "eval.json").write_text(json.dumps(
            {"overall": {"pass@4": 0.9 if good else 0.7, "pass@1": 0.3}}))
    table = grid_table(spec, plans)
    assert S.tuning.choices(table) == {"grpo": 1e-4, "e3": 0.8}
    assert [p.passk for p in table["grpo"]] == [0.7, 0.9] and table["grpo"][1].seeds == 2
    final = S.plan_runs(spec, path, tmp_path / "out", S.tuning.choices(table))
    by = {(p.name, p.seed): p.cfg for p in final}
    assert by["grpo", 0].optim.lr == 1e-4 and by["grpo", 1].optim.lr == 1e-4
    assert by["e3", 1].control.temperature.beta == 0.8
    # the variant inherits its recipe's choice, and keeps its own change
    v = by["e3_no_anneal", 0]
    assert v.control.temperature.beta == 0.8 and v.control.temperature.anneal is False
    # every final run is evaluated at each temperature, the main one into eval/
    assert [(f, e.temperature) for f, e in final[0].evals] == [
        ("eval", 1.0), ("eval_T0.8", 0.8), ("eval_T1.2", 1.2)]


def test_shared_key_takes_the_source_choice_unless_a_row_tunes_it(tmp_path):
    """tuning.share {optim.lr: grpo}: e3's grid runs and every final run without an lr grid of
    its own train at GRPO's chosen lr; a recipe that tunes the lr keeps its own."""
    path = _tuned_spec(tmp_path, recipes=["grpo", "e3", "e3_ts"],
                       tune={"grpo": {"key": "optim.lr", "values": [5e-05, 1e-4]},
                             "e3_ts": {"key": "optim.lr", "values": [2e-4, 3e-4]},
                             "e3": {"key": "control.temperature.beta", "values": [0.8, 0.9]}},
                       tuning={"seeds": [100], "k": 4, "max_steps": 10, "n": 8,
                               "share": {"optim.lr": "grpo"}})
    spec = S.load_spec(path)
    # the second stage, as run_tuning plans it: GRPO's grid done, its choice shared
    later = dataclasses.replace(spec, tune={n: g for n, g in spec.tune.items() if n != "grpo"})
    stage2 = plan_tuning(later, path, tmp_path / "out", {"grpo": 5e-05})
    lr = {(p.name, p.value): p.cfg.optim.lr for p in stage2}
    assert lr[("e3", 0.8)] == lr[("e3", 0.9)] == 5e-05  # shared
    assert lr[("e3_ts", 2e-4)] == 2e-4 and len(lr) == 4  # its own grid; GRPO's is not rerun
    final = S.plan_runs(spec, path, tmp_path / "out", {"grpo": 1e-4, "e3_ts": 3e-4, "e3": 0.9})
    by = {p.name: p.cfg for p in final if p.seed == 0}
    assert by["e3"].optim.lr == 1e-4 and by["e3_no_anneal"].optim.lr == 1e-4
    assert by["e3_ts"].optim.lr == 3e-4 and by["grpo"].optim.lr == 1e-4
    assert by["e3"].control.temperature.beta == 0.9
    lines = tuning_markdown(spec, {n: [GridPoint(v, 0.5, 0.5, 1, chosen=True)] for n, v in
                                   {"grpo": 1e-4, "e3_ts": 3e-4, "e3": 0.9}.items()})
    assert "uses grpo's choice, 0.0001, in its grid runs and its final runs" in lines[0]


@pytest.mark.parametrize("share, message", [
    ({"optim.lr": "e3"}, "e3 must tune optim.lr"),
    ({"optim.lr": "nobody"}, "nobody must tune optim.lr"),
])
def test_share_needs_a_source_that_tunes_the_key(tmp_path, share, message):
    path = _tuned_spec(tmp_path, tuning={"seeds": [100], "k": 4, "n": 8, "share": share})
    with pytest.raises(C.ConfigError, match=message):
        S.load_spec(path)


def test_beyond_edge_steps_by_the_edge_ratio_or_step():
    from explorl.study.tuning import beyond_edge

    assert beyond_edge([5e-5, 1e-4, 2e-4], 5e-5) == 2.5e-5  # positive: the edge's ratio
    assert beyond_edge([5e-5, 1e-4, 2e-4], 2e-4) == 4e-4
    assert beyond_edge([0.27, 0.34, 0.43], 0.43) == 0.544  # 0.43 · 0.43/0.34, 3 digits
    assert beyond_edge([2, 4, 8], 8) == 16 and isinstance(beyond_edge([2, 4, 8], 8), int)
    assert beyond_edge([-0.1, 0.0, 0.1], -0.1) == pytest.approx(-0.2)  # not positive: the step
    assert beyond_edge([5e-5, 1e-4, 2e-4], 1e-4) is None  # inside the grid
    assert beyond_edge(["a", "b"], "a") is None and beyond_edge([1.0], 1.0) is None


def test_edge_notes_say_why_an_edge_choice_was_not_extended():
    from explorl.study.tuning import edge_notes

    def table(*points):
        return {"grpo": [GridPoint(v, pk, 0.5, 2, chosen=c, added=a) for v, pk, c, a in points]}

    spec = S.StudySpec(recipes=["grpo"], tune={"grpo": S.spec.TuneGrid("optim.lr", [1e-4, 2e-4])},
                       tuning=S.spec.TuningSpec(extend=2))
    inside = table((1e-4, 0.8, False, False), (2e-4, 0.7, False, False), (5e-5, 0.9, False, True),
                   (2.5e-5, 0.95, True, True))
    assert edge_notes(spec, inside) == [
        "grpo: added 5.0e-05, 2.5e-05; the choice, 2.5e-05, is still the grid's edge after 2 "
        "added values: the knob's best value may lie beyond it"]
    interior = table((1e-4, 0.8, False, False), (2e-4, 0.7, False, False),
                     (5e-5, 0.9, True, True), (2.5e-5, 0.85, False, True))
    assert edge_notes(spec, interior) == [
        "grpo: added 5.0e-05, 2.5e-05; the choice, 5.0e-05, lies inside the grid"]
    spec.tuning.extend = 0  # the grid as written: an edge choice is flagged, nothing added
    assert edge_notes(spec, table((1e-4, 0.9, True, False), (2e-4, 0.7, False, False))) == [
        "grpo: the choice, 0.0001, is still the grid's edge: the knob's best value may lie "
        "beyond it"]
    assert edge_notes(spec, {"grpo": [GridPoint(1e-4, 0.9, 0.5, 2, chosen=True)]}) == []
    flat = table((1e-4, 0.9, True, False), (2e-4, 0.9, False, False))  # a tie: grid order
    assert edge_notes(spec, flat) == [
        "grpo: the choice, 0.0001, is the grid's edge only by grid order (its neighbour scores "
        "the same): no direction to extend in"]


def test_tuning_stages_share_the_source_choice_and_extend_edges(tmp_path, monkeypatch):
    """run_tuning with a fake trainer whose validation pass@k is a known function of the value:
    GRPO (the share source) first, its lr grid extended twice downwards (the edge keeps
    winning), then e3's β grid at GRPO's lr, not extended (its choice is inside); the log,
    choices.json and the Tuning table say so."""
    import explorl.study.run as R

    path = _tuned_spec(tmp_path, tuning={"seeds": [100], "k": 4, "max_steps": 10, "n": 8,
                                         "extend": 2, "share": {"optim.lr": "grpo"}},
                       tune={"grpo": {"key": "optim.lr", "values": [5e-05, 1e-4]},
                             "e3": {"key": "control.temperature.beta", "values": [0.8, 0.9, 1.0]}})
    spec = S.load_spec(path)
    trained = []

    def fake_jobs(plans, spec, logs, log, deadline=None, on_done=None):
        for p in plans:
            if p.name == "grpo":  # smaller lr is better, down to 1.25e-5
                score = 1.0 - abs(math.log2(p.value / 1.25e-5)) / 10
            else:
                score = 1.0 - abs(p.value - 0.9)
            trained.append((p.name, p.value, p.cfg.optim.lr))
            (p.out / "eval").mkdir(parents=True, exist_ok=True)
            (p.out / "eval" / "eval.json").write_text(json.dumps(
                {"overall": {"pass@4": score, "pass@1": 0.5}}))
        return [JobResult(p, "done") for p in plans]

    monkeypatch.setattr(R, "run_jobs", fake_jobs)
    printed = []
    table = R.run_tuning(spec, path, tmp_path / "out", printed.append)
    assert [p.value for p in table["grpo"]] == [5e-05, 1e-4, 2.5e-05, 1.25e-05]
    assert S.tuning.choices(table) == {"grpo": 1.25e-05, "e3": 0.9}
    assert [p.added for p in table["grpo"]] == [False, False, True, True]
    assert {lr for name, _, lr in trained if name == "e3"} == {1.25e-05}  # shared
    assert any("adding 2.5e-05" in x for x in printed) and any(
        "shared with the other grids: optim.lr = 1.25e-05" in x for x in printed)
    md = "\n".join(tuning_markdown(spec, table))
    assert "| grpo | `optim.lr` | 1.25e-05 (added) |" in md
    assert "- grpo: added 2.5e-05, 1.25e-05; the choice, 1.25e-05, is still the grid's edge " \
           "after 2 added values" in md and "- e3" not in md
    saved = json.loads((tmp_path / "out" / "tune" / "choices.json").read_text())
    assert [p["added"] for p in saved["grpo"]] == [False, False, True, True]
    assert md in (tmp_path / "out" / "tune" / "tuning.md").read_text()  # readable before the end

    # --plan reports progress: tuning finished, no final run yet; while tuning reruns (a
    # choices.json from an earlier invocation is gone), it counts the grid runs evaluated
    assert R.progress(spec, path, tmp_path / "out") == (
        f"progress in {tmp_path / 'out'}: tuning finished; 0 of 6 final runs finished (seeds "
        "with every row finished: none)")
    monkeypatch.setattr(R, "_tune_stage", lambda *a, **k: 130)
    assert R.run_tuning(spec, path, tmp_path / "out", printed.append) == 130
    assert R.progress(spec, path, tmp_path / "out").startswith(
        f"progress in {tmp_path / 'out'}: tuning, 7 grid runs evaluated (of 7 started")


def test_an_edge_is_extended_only_when_it_beats_its_neighbour():
    from explorl.study.tuning import edge_won

    def pts(*scores, chosen):
        return [GridPoint(v, pk, p1, 2, chosen=v == chosen)
                for v, (pk, p1) in zip([0.8, 0.9, 1.0], scores)]

    assert edge_won(pts((0.9, 0.5), (0.8, 0.5), (0.7, 0.5), chosen=0.8), tie=0.01)
    assert not edge_won(pts((0.9, 0.5), (0.9, 0.5), (0.7, 0.5), chosen=0.8), tie=0.01)
    assert edge_won(pts((0.7, 0.5), (0.895, 0.5), (0.9, 0.6), chosen=1.0), tie=0.01)  # pass@1
    assert not edge_won(pts((0.7, 0.5), (0.9, 0.6), (0.9, 0.5), chosen=1.0), tie=0.01)


def test_value_text_reads_back_as_the_same_value():
    for v in (5e-05, 1e-4, 0.9, 2, True, "cosine", 1.0e-10):
        assert yaml.safe_load(value_text(v)) == v


@pytest.mark.parametrize("extra, message", [
    ({"tuning": {"seeds": [0, 100]}}, "tuning.seeds: must differ from seeds"),
    ({"tuning": {"split": "test"}}, "tuning.split: must differ from eval.split"),
    ({"tuning": {"k": 16, "n": 8}}, "tuning.k: must be in [1, tuning.n = 8]"),
    ({"tune": {"grop": {"key": "optim.lr", "values": [1e-4]}}},
     "tune.grop: no recipe or variant of that name; did you mean 'grpo'?"),
    ({"tune": {"grpo": {"key": "optim.lrr", "values": [1e-4]}}}, "optim.lrr: unknown key"),
    ({"tune": {"grpo": {"key": "optim.lr", "values": []}}}, "tune.grpo.values: give at least"),
    ({"ablations": {"e3": ["e3_tss"]}}, "ablations.e3.e3_tss: no recipe or variant"),
    ({"eval": {"n": 8, "k": [1, 4], "temperatures": [0.0]}}, "eval.temperatures: every"),
    ({"power": {"k": 64}}, "power.k: must be one of eval.k"),
    ({"jobs": 0}, "jobs: must be ≥ 1 or auto"),
])
def test_tuning_spec_errors_name_the_key(tmp_path, extra, message):
    path = _tuned_spec(tmp_path, **extra)
    with pytest.raises(C.ConfigError) as e:
        spec = S.load_spec(path)
        plan_tuning(spec, path, tmp_path / "out")
        S.plan_runs(spec, path, tmp_path / "out")
    assert message in str(e.value)


def test_jobs_auto_is_the_cores_this_process_may_use(tmp_path):
    import os

    path = _write(tmp_path, {"recipes": ["grpo"], "jobs": "auto"})
    assert S.load_spec(path).jobs == "auto"
    assert S.spec.auto_jobs() == len(os.sched_getaffinity(0))


# ----------------------------------------------------------------------------- temperatures


def _ev(**kw) -> Evidence:
    """GRPO and a method on 10 problems, 2 seeds; GRPO gains 0.1 at pass@4 when hotter."""
    g = {1: np.full((2, 10), 0.5), 4: np.full((2, 10), 0.7)}
    m = {1: np.full((2, 10), 0.5), 4: np.full((2, 10), 0.75)}
    hot = {1: np.full((2, 10), 0.45), 4: np.full((2, 10), 0.8)}
    per_run = {n: [{"seed": s, "final_entropy": 0.3} for s in (0, 1)] for n in ("grpo", "eepo")}
    return Evidence(per_run, {"grpo": g, "eepo": m}, {"grpo": [0, 1], "eepo": [0, 1]}, None,
                    [1, 4], temperature=1.0,
                    passk_t={1.0: {"grpo": g, "eepo": m}, 1.2: {"grpo": hot, "eepo": m}}, **kw)


def test_large_k_claims_also_face_grpo_at_its_best_temperature():
    ev = _ev()
    assert ev.temperatures == [1.0, 1.2] and ev.best_temperature("grpo", 4) == 1.2
    assert ev.pk("eepo", "grpo", 4).estimate == pytest.approx(0.05)
    assert ev.pk("eepo", "grpo", 4, tb=1.2).estimate == pytest.approx(-0.05)
    c = {x["id"]: x for x in S.evaluate_claims(ev)}["8b"]
    labels = [x["label"] for x in c["conditions"]]
    # eepo is 0.75 at both temperatures (its best: the main one on a tie); GRPO 0.8 at 1.2
    assert labels == ["eepo − GRPO, test pass@4",
                      "eepo at its best T = 1 − GRPO at its best T = 1.2, test pass@4"]
    assert c["conditions"][1]["interval"]["estimate"] == pytest.approx(-0.05)
    assert [x["verdict"] for x in c["conditions"]] == ["shown", "opposite"]
    assert c["verdict"] == "mixed"
    # a method that gains from heat as much as GRPO is judged at its own best temperature
    ev.passk_t[1.2]["eepo"] = {1: np.full((2, 10), 0.45), 4: np.full((2, 10), 0.85)}
    c = {x["id"]: x for x in S.evaluate_claims(ev)}["8b"]
    assert c["conditions"][1]["label"].startswith("eepo at its best T = 1.2 − GRPO")
    assert c["conditions"][1]["interval"]["estimate"] == pytest.approx(0.05)
    assert c["verdict"] == "shown"
    ev = _ev()
    # one evaluation temperature: the claim has only its main condition
    one = Evidence(ev.per_run, ev.passk, ev.seeds, None, [1, 4])
    assert len({x["id"]: x for x in S.evaluate_claims(one)}["8b"]["conditions"]) == 1
    md = "\n".join(temperature_tables(ev))
    assert "| grpo | 0.500 | 0.450 | 0.700 | 0.800 | 1.2 |" in md  # T ascending: 1.0, 1.2
    assert "best temperature T = 1.2" in md
    head = ("| recipe | − GRPO T=1, pass@4 | at T=1 − GRPO at T=1.2, pass@4 | its best T | "
            "at its best T − GRPO at T=1.2, pass@4 | at its best T − GRPO at T=1.2, pass@1 |")
    assert head in md
    row = next(x for x in md.splitlines() if x.startswith("| eepo | **+0.050"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert [c.split(" [")[0] for c in cells] == [
        "eepo", "**+0.050", "**-0.050", "1", "**-0.050", "**+0.050"]  # its best T: 1.0


def test_final_evals_put_the_main_temperature_first():
    spec = S.StudySpec(recipes=["grpo"], eval=S.StudyEvalSpec(temperature=1.0,
                                                              temperatures=[0.8, 1.0, 1.2]))
    assert [f for f, _ in final_evals(spec)] == ["eval", "eval_T0.8", "eval_T1.2"]


# ----------------------------------------------------------------------------- documents


def test_pass_at_k_figure_highlights_by_result():
    km = 4
    passk = {n: {km: np.full((1, 5), v)} for n, v in
             [("grpo", 0.5), ("a", 0.9), ("b", 0.1), ("c", 0.6), ("d", 0.4), ("e", 0.7),
              ("f", 0.2), ("g", 0.55)]}
    ev = Evidence({}, passk, {}, None, [km])
    assert highlighted(ev) == ["grpo", "a", "e", "c", "f", "b"]  # best 3, worst 2
    few = Evidence({}, {n: passk[n] for n in ("grpo", "a", "b")}, {}, None, [km])
    assert highlighted(few) == ["grpo", "a", "b"]
    # an arm that trained the same runs as an earlier one is drawn once, under both names
    from explorl.report.figures import twin_labels

    per_run = {n: [{"seed": 0, "final_entropy": v, "final_reward": v}]
               for n, v in [("grpo", 0.5), ("a", 0.9), ("a2", 0.9), ("b", 0.1)]}
    passk2 = {n: {km: np.full((1, 5), per_run[n][0]["final_entropy"])} for n in per_run}
    seeds = {n: [0] for n in per_run}
    twin = Evidence(per_run, passk2, seeds, None, [km])
    assert highlighted(twin) == ["grpo", "a", "b"]
    assert twin_labels(twin)["a"] == "a = a2" and twin_labels(twin)["b"] == "b"
    # a partial report: GRPO over 4 seeds, "b" over 1 so far: each label says how many
    twin.seeds["grpo"] = [0, 1, 2, 3]
    assert twin_labels(twin)["grpo"] == "grpo (4 seeds)" and twin_labels(twin)["b"] == "b (1 seed)"
    # a learning-rate sweep: GRPO's row is its best mean pass@1 (grpo@5e-05: 0.6 > 0.4), the
    # other GRPO rows are ranked with the methods
    sweep = {"grpo@1e-04": (0.4, 0.3), "grpo@5e-05": (0.6, 0.5), "m@1e-04": (0.5, 0.9),
             "m@5e-05": (0.3, 0.1)}
    ev = Evidence({}, {n: {1: np.full((1, 5), a), km: np.full((1, 5), b)}
                       for n, (a, b) in sweep.items()}, {}, None, [1, km])
    assert highlighted(ev) == ["grpo@5e-05", "m@1e-04", "grpo@1e-04", "m@5e-05"]


def test_power_and_ablation_tables():
    ev = _ev()
    ev.passk["e3_ts"] = ev.passk["eepo"]
    ev.seeds["e3_ts"] = [0, 1]
    ev.per_run["e3_ts"] = ev.per_run["eepo"]
    spec = S.StudySpec(recipes=["grpo"], power=S.spec.PowerSpec(target_mde=0.03),
                       ablations={"eepo": ["e3_ts"]})
    lines = power_table(spec, ev)
    row = next(x for x in lines if x.startswith("| eepo − grpo"))
    assert "0.000" in row and "2 × 10" in row  # constant differences: no variance, MDE 0
    abl = "\n".join(ablation_tables(spec, ev))
    assert "| e3_ts |" in abl and "− eepo, pass@4" in abl
    assert "e3_ts: the same runs as eepo, number for number" in abl  # a copy of eepo's runs
    ev.passk["e3_ts"] = {k: v + 0.01 for k, v in ev.passk["eepo"].items()}
    assert "the same runs" not in "\n".join(ablation_tables(spec, ev))


def test_grpo_best_at_the_main_temperature_is_said_not_tabled_twice():
    ev = _ev()
    cold = {1: np.full((2, 10), 0.45), 4: np.full((2, 10), 0.6)}
    ev.passk_t[1.2] = {"grpo": cold, "eepo": cold}
    assert ev.best_temperature("grpo", 4) == 1.0
    md = "\n".join(temperature_tables(ev))
    assert "GRPO's pass@4 is highest at T = 1" in md and "at T=1 − GRPO at T=1," not in md
    assert ("| recipe | − GRPO T=1, pass@4 | its best T | at its best T − GRPO at T=1, pass@4 |"
            in md)


def test_annealing_claim_needs_a_beta_below_one():
    def claim(beta):
        runs = [{"seed": s, "anneal_beta": beta, "anneal_entropy_ratio": 0.9 - 0.01 * s}
                for s in (0, 1, 2)]
        return {x["id"]: x for x in S.evaluate_claims(Evidence({"e3": runs}))}["2b"]

    flat = claim(1.0)  # Eq. 5 with β = 1 keeps the target at H0: nothing anneals
    assert flat["verdict"] == "n/a" and "β = 1" in json.dumps(flat, ensure_ascii=False)
    assert claim(0.9)["verdict"] == "shown"  # H falls 10% in the annealing phase


# ----------------------------------------------------------------------------- end to end


def test_v3_specs_plan_tuning_and_final_runs_full_and_quick():
    for name in ("subset_sum_v3.yaml", "countdown_v3.yaml"):
        path = ROOT / "src" / "explorl" / "studies" / name
        for quick in (False, True):
            spec = S.load_spec(path, quick=quick)
            tune = plan_tuning(spec, path, Path("/tmp/unused"))
            assert len(tune) == len(spec.tuning.seeds) * sum(len(g.values)
                                                              for g in spec.tune.values())
            final = S.plan_runs(spec, path, Path("/tmp/unused"))
            names = set(S.order_rows(spec, final))
            assert "grpo" in spec.tune and "grpo" in names
            assert len(spec.eval.all_temperatures()) >= 3 or quick
            if not quick:
                assert {n for c in S.CLAIMS for n in c.needs} <= names
                assert {"e3_ts", "e3_budget_only", "e3_no_anneal"} <= set(spec.ablations["e3"])
                assert spec.power.target_mde == 0.03 and spec.jobs == "auto"
                assert {p.cfg.lab.n_test for p in final} == {1024}


@pytest.mark.slow
def test_tiny_tuned_study_end_to_end(tiny_model, tmp_path, capsys):
    """A tuned study on the tiny model: the grid runs on the validation split, the choice
    reaches the final runs, each final policy and the base model are evaluated at every
    temperature, and the documents carry the grid, temperatures, power and ablations; a rerun
    trains nothing."""
    lab = [f"lab.{k}={v}" for k, v in TINY_LAB_CONFIG.items() if k != "params"]
    lab += [f"lab.params.{k}={v}" for k, v in TINY_LAB_CONFIG["params"].items()]
    spec = {
        "name": "tiny", "task": "addition", "recipes": ["grpo", "e3_ts"], "seeds": [0, 1],
        "max_steps": 2,
        "set": [f"model.path={tiny_model}", *lab, "data.prompts_per_step=4", "rollout.n_samples=4",
                "rollout.max_response_len=6", "eval.every=1", "eval.n_samples=2", "eval.k=[1, 2]",
                "eval.max_problems=4", "reward.num_workers=1", "log.plots=false",
                "log.checkpoint_every=0"],
        "tune": {"grpo": {"key": "optim.lr", "values": [1e-3, 1e-5]},
                 "e3_ts": {"key": "control.temperature.t_max", "values": [2.0]}},
        "tuning": {"seeds": [100], "n": 4, "k": 4, "max_problems": 4, "max_steps": 2,
                   "extend": 1, "share": {"optim.lr": "grpo"}},
        "ablations": {"e3_ts": ["grpo"]},
        "power": {"target_mde": 0.3},
        "eval": {"n": 4, "k": [1, 4], "split": "test", "max_problems": 4,
                 "temperatures": [0.7, 1.0]},
        "jobs": "auto",
    }
    path = _write(tmp_path, spec)
    out = tmp_path / "study"
    assert main(["study", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 grid runs (2 to do)" in printed and "tuned grpo: optim.lr = " in printed
    got = json.loads((out / "tune" / "choices.json").read_text())["grpo"]
    chosen = next(p["value"] for p in got if p["chosen"])
    # then e3_ts's grid, at GRPO's chosen lr (tuning.share)
    assert f"shared with the other grids: optim.lr = {value_text(chosen)}" in printed
    assert yaml.safe_load((out / "tune" / "runs" / "e3_ts@2.0-seed100" / "config.yaml")
                          .read_text())["optim"]["lr"] == chosen
    for run in ("grpo-seed1", "e3_ts-seed0"):  # e3_ts shares GRPO's tuned lr
        assert yaml.safe_load((out / "runs" / run / "config.yaml").read_text())[
            "optim"]["lr"] == chosen
    for d in ("eval", "eval_T0.7"):
        assert (out / "runs" / "grpo-seed0" / d / "problems.jsonl").is_file()
        assert (out / "base" / d / "problems.jsonl").is_file()
    assert json.loads((out / "runs" / "grpo-seed0" / "eval_T0.7" / "eval.json").read_text())[
        "settings"]["temperature"] == 0.7
    md = (out / "study.md").read_text()
    for section in ("## Tuning", "## Evaluation temperature", "## Power", "## Ablations"):
        assert section in md
    data = json.loads((out / "study.json").read_text())
    assert data["tuning"]["grpo"] and set(data["passk_t"]) == {"1", "0.7"}
    c8 = [c for c in data["claims"] if c["id"] == "N2"][0]["conditions"][0]["interval"]
    assert "power" in c8 and c8["power"]["seeds"] == 2

    assert main(["study", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "(0 to do)" in printed and "0 to train" in printed

    # packed and restored into an empty folder (another machine): nothing trains again, and
    # the numbers are the same (problems.jsonl carries the counts, not the responses)
    archive = tmp_path / "data.tar.xz"
    assert main(["study", str(path), "--out", str(out), "--pack", str(archive)]) == 0
    assert "packed 7 finished runs" in capsys.readouterr().out  # 3 grid points + 4 final
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "runs/grpo-seed0/eval_T0.7/problems.jsonl" in names and "base/eval/eval.json" in names
    assert not [n for n in names if "checkpoint" in n or n.endswith((".safetensors", ".png"))]
    again = tmp_path / "elsewhere"
    assert main(["study", str(path), "--out", str(again), "--from", str(archive)]) == 0
    printed = capsys.readouterr().out
    assert "restored 9 finished runs and evaluations" in printed  # + 2 base evaluations
    assert "(0 to do)" in printed and "0 to train" in printed
    row = json.loads((again / "runs" / "grpo-seed0" / "eval" / "problems.jsonl").read_text()
                     .splitlines()[0])
    assert "responses" not in row and row["n_samples"] == 4
    got = json.loads((again / "study.json").read_text())
    assert got["claims"] == data["claims"] and got["passk_t"] == data["passk_t"]


def test_plan_estimates_cpu_seconds_from_a_reference_report(tmp_path, capsys):
    """Reference: GRPO 20 CPU-s per 100 steps (0.2 s/step), validations (100//50 + 1) × 2 × 4 =
    24 samples. Plan: GRPO, 10 steps, validation (10//5 + 1) × 2 × 4 = 24 samples (none extra),
    evaluated at 2 temperatures × 8 test problems × 4 samples = 64 samples:
    10 · 0.2 + 64 · 15/16384 = 2.0586 CPU-s; the base model's 64 samples: 0.0586."""
    from explorl.study.cost import EVAL_CPU_S_PER_SAMPLE, Rates, estimate

    ref = tmp_path / "study.json"
    ref.write_text(json.dumps({
        "spec": {"set": ["eval.every=50", "eval.n_samples=2", "eval.max_problems=4"]},
        "runs": {"grpo-seed0": {"cpu_run_s": 20.0, "steps": 100},
                 "e3-seed0": {"cpu_run_s": 40.0, "steps": 100}}}))
    rates = Rates.from_reports([ref])
    assert rates.per_step == {"grpo": 0.2, "e3": 0.4} and rates.val_samples == 24
    path = _write(tmp_path, {"recipes": ["grpo"], "max_steps": 10,
                             "set": ["eval.every=5", "eval.n_samples=2", "eval.k=[1]",
                                     "eval.max_problems=4"],
                             "eval": {"n": 4, "k": [1, 4], "max_problems": 8,
                                      "temperatures": [0.8]}})
    spec = S.load_spec(path)
    got = estimate(spec, [], S.plan_runs(spec, path, tmp_path / "o"), rates)
    assert EVAL_CPU_S_PER_SAMPLE == pytest.approx(15 / 16384)
    assert got["final"] == pytest.approx(2.0 + 64 * 15 / 16384)
    assert got["base"] == pytest.approx(64 * 15 / 16384) and got["tuning"] == 0
    assert main(["study", str(path), "--plan", "--cost-from", str(ref)]) == 0
    out = capsys.readouterr().out
    assert "no tuning + 1 final runs (1 rows × 1 seeds)" in out and "estimated CPU-hours" in out


def test_plan_refuses_a_reference_without_cpu_seconds_by_name(tmp_path, capsys):
    """A report whose runs record no ``cpu_run_s`` (the addition study's) or a missing file is a
    one-line error naming the file, not a traceback."""
    path = _write(tmp_path, {"recipes": ["grpo"], "max_steps": 10})
    ref = tmp_path / "old.json"
    ref.write_text(json.dumps({"spec": {"set": []}, "runs": {"grpo-seed0": {"steps": 100}}}))
    assert main(["study", str(path), "--plan", "--cost-from", str(ref)]) != 0
    err = capsys.readouterr().err
    assert f"--cost-from {ref}: no run records its CPU seconds" in err and "Traceback" not in err
    assert main(["study", str(path), "--plan", "--cost-from", str(tmp_path / "nope.json")]) != 0
    assert "not a study report's study.json" in capsys.readouterr().err


def test_early_fit_claim_is_judged_per_grpo_run_and_across_every_run():
    """Claim 7b: early-fit RMSE − persistence RMSE below 0, over GRPO's runs and over every
    run of the study (each run one resampling unit)."""
    def run(seed, fit, naive):
        return {"seed": seed, "law_rmse": fit, "law_naive_rmse": naive}

    per_run = {"grpo": [run(0, 0.02, 0.05), run(1, 0.03, 0.05), run(2, 0.025, 0.05)],
               "eepo": [run(0, 0.075, 0.05), run(1, 0.08, 0.05), run(2, 0.07, 0.05)]}
    c = {x["id"]: x for x in S.evaluate_claims(Evidence(per_run))}["7b"]
    grpo, every = c["conditions"]
    # GRPO: −.03, −.02, −.025: SE .00289, t(.975, 2) = 4.303 → [−.0374, −.0126]
    assert grpo["interval"]["estimate"] == pytest.approx(-0.025) and grpo["verdict"] == "shown"
    assert every["label"].endswith("(every run)")
    assert every["interval"]["estimate"] == pytest.approx(0.0) and every["verdict"] == "not shown"
    assert c["verdict"] == "partial"


def test_wall_clock_adds_up_over_interrupted_invocations(tmp_path):
    from explorl.study.wall import add_wall

    assert add_wall(tmp_path / "a", 10.0) == 10.0 and add_wall(tmp_path / "a", 5.0) == 15.0
    old = tmp_path / "b"  # a study written before wall.json: its study.json's total counts
    old.mkdir()
    (old / "study.json").write_text(json.dumps({"timing": {"wall_s": 100.0}}))
    assert add_wall(old, 1.0) == 101.0 and add_wall(old, 1.0) == 102.0


def test_wall_clock_counts_each_finished_job_so_a_killed_invocation_keeps_its_time(tmp_path):
    """Invocation 1 ticks at 10 s and 25 s (two jobs ended) and is then killed (no close): the
    study has 25 s. Invocation 2 finishes nothing and only re-analyses: close adds none of its
    30 s. Invocation 3: one job ends at 5 s, the analysis ends at 8 s: 8 s more, 33 s."""
    from explorl.study.wall import Wall, wall_jobs

    t = iter([0.0, 10.0, 25.0])
    w = Wall(tmp_path, 2, clock=lambda: next(t))
    assert w.tick() == 10.0 and w.tick() == 25.0
    t = iter([100.0, 130.0])
    assert Wall(tmp_path, 1, clock=lambda: next(t)).close() == 25.0
    t = iter([0.0, 5.0, 8.0])
    w = Wall(tmp_path, 1, clock=lambda: next(t))
    assert w.tick() == 30.0 and w.close() == 33.0
    assert wall_jobs(tmp_path) == [1, 2]


def test_an_invocation_that_only_reanalyses_adds_no_wall_clock(tmp_path):
    """Re-publishing a finished study leaves its recorded cost (and its archive) alone; a step
    logged or an evaluation written in the invocation counts."""
    from explorl.report.documents import _jobs_text
    from explorl.study.wall import add_wall, study_files, wall_jobs

    run = tmp_path / "runs" / "grpo-seed0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    before = study_files(tmp_path)
    assert add_wall(tmp_path, 10.0, before) == 0.0  # nothing new: only the analysis ran
    with (run / "metrics.jsonl").open("a") as f:
        f.write("{}\n")
    os.utime(run / "metrics.jsonl", ns=(1, 1))  # a new mtime, whatever the clock's resolution
    assert add_wall(tmp_path, 10.0, before) == 10.0
    before = study_files(tmp_path)
    (tmp_path / "base-grpo_large" / "eval").mkdir(parents=True)
    (tmp_path / "base-grpo_large" / "eval" / "eval.json").write_text("{}")
    assert add_wall(tmp_path, 5.0, before, jobs=16) == 15.0
    assert wall_jobs(tmp_path) == [16]
    assert add_wall(tmp_path, 1.0, study_files(tmp_path), jobs=2) == 15.0  # nothing new
    assert wall_jobs(tmp_path) == [16]  # a re-analysis's jobs are not the study's
    assert add_wall(tmp_path, 1.0, jobs=2) == 16.0 and wall_jobs(tmp_path) == [2, 16]
    assert _jobs_text([2, 16]) == "2 or 16 jobs" and _jobs_text([1]) == "1 job"


def test_eta_is_the_runs_left_times_the_mean_trained_run_over_the_jobs():
    from explorl.study.jobs import eta

    def r(status, s):
        return JobResult(None, status, seconds=s)

    got = [r("done", 100.0), r("skipped", 0.0), r("done", 200.0)]  # of 9 to train
    assert eta(got, 9, 2) == ", ~9 min left"  # 7 left × 150 s ÷ 2 jobs = 525 s
    assert eta(got, 3, 2) == ", ~2 min left"  # 1 left: one job runs it, 150 s
    assert eta([r("skipped", 0.0)], 10, 2) == "" and eta(got, 2, 2) == ""


def test_eta_from_the_measured_rates_counts_each_run_at_its_own_estimate():
    """Estimates (s): a 600, b 1200 (ended: took 900 and 1800, 1.5× their estimates), c 2000,
    d 1800, e 1400 left → (2000 + 1800 + 1400) ÷ 2 jobs × 1.5 = 3900 s = 65 min. One job left,
    c: no less than it, 2000 × 1.5 = 50 min (not half of it for the idle second job). Runs
    that only evaluated (short estimates) do not stand for ones that train. No estimate ended
    yet, or none left: empty."""
    from explorl.study.jobs import eta

    def r(key, status, s):
        return JobResult(SimpleNamespace(key=key), status, seconds=s)

    whole = {"a": 600.0, "b": 1200.0, "c": 2000.0, "d": 1800.0, "e": 1400.0, "f": 0.0}
    got = [r("a", "done", 900.0), r("b", "done", 1800.0), r("f", "skipped", 0.0)]
    assert eta(got, 5, 2, whole) == ", ~65 min left"
    assert eta([*got, r("d", "done", 2700.0), r("e", "done", 2100.0)], 5, 2, whole) == \
        ", ~50 min left"
    assert eta([r("f", "skipped", 0.0)], 5, 2, whole) == ""
    assert eta([r(k, "done", 1.0) for k in whole], 5, 2, whole) == ""


def test_claims_on_two_arms_that_trained_the_same_runs_are_not_judged():
    """WSD vs constant when the controller never acted differently, and a "stronger" variant at
    its recipe's tuned value: the same runs, so n/a with the reason, not a zero-width "not
    shown"; a pair that differs is still judged."""
    def arm(h, pk):
        runs = [{"seed": s, "final_entropy": h + 0.01 * s, "final_reward": 0.5} for s in (0, 1, 2)]
        return runs, {1: np.full((3, 4), pk)}

    names = {"es_constant": (0.3, 0.5), "es_wsd": (0.3, 0.5), "clip_cov": (0.3, 0.5),
             "clip_cov_more": (0.3, 0.5), "kl_cov": (0.3, 0.5), "kl_cov_strong": (0.4, 0.5)}
    per_run, passk = {}, {}
    for n, (h, pk) in names.items():
        per_run[n], passk[n] = arm(h, pk)
    ev = Evidence(per_run, passk, {n: [0, 1, 2] for n in names}, None, [1])
    claims = {c["id"]: c for c in S.evaluate_claims(ev)}
    assert claims["5b"]["verdict"] == "n/a" and "same runs" in json.dumps(claims["5b"])
    assert [c["label"] for c in claims["3b"]["conditions"]] == ["H final kl_cov_strong − kl_cov"]
    assert claims["3b"]["verdict"] == "shown"  # +0.1 nats in every seed
    per_run["kl_cov_strong"], passk["kl_cov_strong"] = arm(0.3, 0.5)
    assert {c["id"]: c for c in S.evaluate_claims(ev)}["3b"]["verdict"] == "n/a"


def test_a_method_that_trained_grpos_runs_is_not_compared_with_grpo():
    """EEPO at an α whose gate never opens trains GRPO's runs number for number: its large-k and
    pass@1 claims are n/a with the gate's fraction (not GRPO at T = 1 against GRPO at its best
    T, labelled EEPO), its table cells read "same runs", the pass@k section names the group."""
    ev = _ev()
    ev.passk["eepo"] = ev.passk["grpo"]
    ev.passk_t[1.0]["eepo"] = ev.passk["grpo"]
    ev.passk_t[1.2]["eepo"] = ev.passk_t[1.2]["grpo"]
    for r in ev.per_run["eepo"]:
        r["eepo_active_frac"] = 0.0
    assert ev.same_runs("eepo", "grpo") and ev.same_groups() == [["grpo", "eepo"]]
    claims = {x["id"]: x for x in S.evaluate_claims(ev)}
    for cid in ("8b", "9b"):
        assert claims[cid]["verdict"] == "n/a" and claims[cid]["conditions"] == []
        assert "eepo trained the same runs as GRPO" in claims[cid]["numbers"]
        assert "gate was open on 0% of steps" in claims[cid]["numbers"]
    md = "\n".join(passk_tables(ev) + temperature_tables(ev))
    assert "| eepo | same runs | same runs | same runs |" in md  # not −0.1 against hot GRPO
    assert "Trained the same runs, number for number" in md and "grpo = eepo" in md
    spec = S.StudySpec(recipes=["grpo", "eepo"], power=S.spec.PowerSpec(target_mde=0.03))
    row = next(x for x in power_table(spec, ev) if x.startswith("| eepo − grpo"))
    assert row == "| eepo − grpo | same runs | — | — | — | — | — | — |"


def test_only_the_idle_method_of_a_family_claim_is_dropped():
    """Claim 8c names two arms: one that trained GRPO's runs drops out, the other is judged."""
    g = {1: np.full((2, 10), 0.5), 4: np.full((2, 10), 0.7)}
    up = {1: np.full((2, 10), 0.5), 4: np.full((2, 10), 0.8)}
    per_run = {n: [{"seed": s, "final_entropy": 0.3} for s in (0, 1)]
               for n in ("grpo", "es_constant", "es_wsd")}
    ev = Evidence(per_run, {"grpo": g, "es_constant": g, "es_wsd": up},
                  {n: [0, 1] for n in per_run}, None, [1, 4])
    c = {x["id"]: x for x in S.evaluate_claims(ev)}["8c"]
    assert [x["label"] for x in c["conditions"]] == ["es_wsd − GRPO, test pass@4"]
    assert c["verdict"] == "shown"


def test_rule_notes_give_the_t_tails_of_the_seeds():
    """The seeds' term always has df = seeds − 1: t(.975, 3) = 3.18, t(.975, 7) = 2.36."""
    from explorl.report.claims import rule_notes

    assert "so 4 seeds give it tails of 3.18 SEs" in " ".join(rule_notes(4).split())
    assert "so 8 seeds give it tails of 2.36 SEs" in " ".join(rule_notes(8).split())
    assert "Monte-Carlo error is 0" in " ".join(rule_notes(4).split())


def test_eepo_mechanism_is_judged_on_an_arm_whose_gate_opened():
    """The tuned α never opened the gate; a variant with a larger α did: claim 4 reads the
    variant's stage-2 − stage-1 entropy and names it; with no open arm it is n/a, naming them."""
    closed = [{"seed": s, "eepo_active_frac": 0.0, "eepo_dH": None} for s in (0, 1, 2)]
    opened = [{"seed": s, "eepo_active_frac": 0.6, "eepo_dH": 0.02 + 0.01 * s}
              for s in (0, 1, 2)]
    c = {x["id"]: x for x in S.evaluate_claims(Evidence({"eepo": closed,
                                                         "eepo_open": opened}))}["4"]
    assert [x["label"] for x in c["conditions"]] == [
        "eepo_open H stage 2 − stage 1 (gate open on 60% of steps)"]
    assert c["conditions"][0]["interval"]["estimate"] == pytest.approx(0.03)
    assert c["verdict"] == "shown"
    none = {x["id"]: x for x in S.evaluate_claims(Evidence({"eepo": closed,
                                                            "eepo_b": closed}))}["4"]
    assert none["verdict"] == "n/a" and "in every EEPO arm (eepo, eepo_b)" in none["numbers"]


def test_an_acting_variant_stands_in_for_a_method_that_trained_grpos_runs():
    """EEPO's tuned α trained GRPO's runs; eepo_open (a larger α) acted: 8b/9b compare it with
    GRPO, named in the label, instead of going n/a."""
    ev = _ev()
    ev.passk["eepo_open"] = ev.passk["eepo"]  # the method's numbers (+0.05 at pass@4)
    ev.passk_t[1.0]["eepo_open"], ev.passk_t[1.2]["eepo_open"] = ev.passk["eepo"], ev.passk["eepo"]
    ev.per_run["eepo_open"] = [{"seed": s, "final_entropy": 0.4} for s in (0, 1)]
    ev.seeds["eepo_open"] = [0, 1]
    ev.passk["eepo"] = ev.passk_t[1.0]["eepo"] = ev.passk["grpo"]
    ev.passk_t[1.2]["eepo"] = ev.passk_t[1.2]["grpo"]
    assert ev.same_runs("eepo", "grpo") and not ev.same_runs("eepo_open", "grpo")
    # only a variant the spec declares at another value of the method's tuned knob stands in
    assert {x["id"]: x for x in S.evaluate_claims(ev)}["8b"]["verdict"] == "n/a"
    ev.stand_ins = {"eepo": ["eepo_open"]}
    claims = {x["id"]: x for x in S.evaluate_claims(ev)}
    assert [x["label"] for x in claims["8b"]["conditions"]] == [
        "eepo_open − GRPO, test pass@4",
        "eepo_open at its best T = 1 − GRPO at its best T = 1.2, test pass@4"]
    assert claims["8b"]["conditions"][0]["interval"]["estimate"] == pytest.approx(0.05)
    assert [x["label"] for x in claims["9b"]["conditions"]] == ["eepo_open − GRPO, test pass@1"]


def test_an_eepo_whose_gate_hardly_opened_gives_way_to_its_open_gate_variant():
    """EEPO's tuned α opened the gate on 0.5% of steps (runs of its own, nearly GRPO's): the
    large-k and pass@1 claims judge eepo_open (gate open on 80%), as claim 4 does."""
    ev = _ev(stand_ins={"eepo": ["eepo_open"]})
    ev.passk["eepo_open"] = {k: v + 0.01 for k, v in ev.passk["eepo"].items()}
    ev.passk_t[1.0]["eepo_open"] = ev.passk["eepo_open"]
    ev.passk_t[1.2]["eepo_open"] = ev.passk["eepo_open"]
    ev.seeds["eepo_open"] = [0, 1]
    for r in ev.per_run["eepo"]:
        r["eepo_active_frac"] = 0.005
    ev.per_run["eepo_open"] = [{"seed": s, "final_entropy": 0.4, "eepo_active_frac": 0.8}
                               for s in (0, 1)]
    claims = {x["id"]: x for x in S.evaluate_claims(ev)}
    assert claims["8b"]["conditions"][0]["label"] == "eepo_open − GRPO, test pass@4"
    assert claims["8b"]["conditions"][0]["interval"]["estimate"] == pytest.approx(0.06)
    assert claims["9b"]["conditions"][0]["label"] == "eepo_open − GRPO, test pass@1"
    for r in ev.per_run["eepo"]:  # a gate open on 10% of steps is EEPO acting: judged itself
        r["eepo_active_frac"] = 0.1
    claims = {x["id"]: x for x in S.evaluate_claims(ev)}
    assert claims["8b"]["conditions"][0]["label"] == "eepo − GRPO, test pass@4"


def test_study_data_keeps_counts_restores_unfinished_and_refuses_escapes(tmp_path):
    """problems.jsonl keeps each row's counts (n_samples = the responses' number) and pass@k is
    unchanged; unpacking replaces a partial local run, keeps a finished one, and refuses a
    member outside the study folder."""
    from explorl.report.stats import problem_passk
    from explorl.study.data import counts_only, pack, unpack

    rows = [{"index": 0, "prompt": "1+1", "n_correct": 1, "responses": ["2", "3", "4"],
             "scores": [1, 0, 0]}, {"index": 1, "prompt": "2+2", "n_correct": 0,
                                     "responses": ["5", "6", "7"], "scores": [0, 0, 0]}]
    raw = tmp_path / "problems.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(counts_only(raw.read_bytes()))
    assert json.loads(cut.read_text().splitlines()[0]) == {"index": 0, "prompt": "1+1",
                                                           "n_correct": 1, "n_samples": 3}
    for k in (1, 2, 3):  # 1 of 3 correct: pass@1 = 1/3, pass@2 = 1 − C(2,2)/C(3,2) = 2/3
        assert np.allclose(problem_passk(cut, [k])[k], problem_passk(raw, [k])[k])
    assert problem_passk(cut, [2])[2] == pytest.approx([2 / 3, 0])

    src = tmp_path / "src"
    for run, steps in (("runs/a-seed0", 2), ("runs/b-seed0", 2)):
        (src / run).mkdir(parents=True)
        (src / run / "config.yaml").write_text("x: 1\n")
        (src / run / "summary.json").write_text(json.dumps({"steps": steps}))
    archive = tmp_path / "d.tar.xz"
    pack(src, [Path("runs/a-seed0/config.yaml"), Path("runs/a-seed0/summary.json"),
               Path("runs/b-seed0/config.yaml"), Path("runs/b-seed0/summary.json")], archive)
    dst = tmp_path / "dst"
    (dst / "runs" / "a-seed0").mkdir(parents=True)  # partial: a config, no summary
    (dst / "runs" / "a-seed0" / "config.yaml").write_text("x: 1\n")
    (dst / "runs" / "a-seed0" / "metrics.jsonl").write_text("{}\n")
    (dst / "runs" / "b-seed0").mkdir(parents=True)  # finished here: kept as it is
    (dst / "runs" / "b-seed0" / "config.yaml").write_text("x: 2\n")
    (dst / "runs" / "b-seed0" / "summary.json").write_text(json.dumps({"steps": 2}))
    assert unpack(archive, dst) == ["runs/a-seed0"]
    assert not (dst / "runs" / "a-seed0" / "metrics.jsonl").exists()
    assert (dst / "runs" / "a-seed0" / "summary.json").exists()
    assert (dst / "runs" / "b-seed0" / "config.yaml").read_text() == "x: 2\n"
    assert pack(src, [Path("runs/a-seed0/config.yaml")], archive) == 1
    first = archive.read_bytes()
    pack(src, [Path("runs/a-seed0/config.yaml")], archive)
    assert archive.read_bytes() == first  # reproducible: a re-pack does not churn the repository

    bad = tmp_path / "bad.tar.xz"
    with tarfile.open(bad, "w:xz") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ValueError, match="outside the study folder"):
        unpack(bad, dst)
    assert not (tmp_path / "outside.txt").exists()


def test_packed_lab_model_is_installed_where_missing_and_a_different_build_refused(
        tmp_path, monkeypatch):
    """The lab model travels with the runs: restored into an empty lab cache byte for byte; a
    cached build with other weights (another CPU's) is refused rather than mixed in."""
    from explorl.study.data import pack, unpack

    build = tmp_path / "built" / "countdown-abc"
    build.mkdir(parents=True)
    (build / "model.safetensors").write_bytes(b"weights-A")
    (build / "lab.json").write_text("{}")
    lab = {f"lab/countdown-abc/{f}": build / f for f in ("model.safetensors", "lab.json")}
    lab["lab/countdown-abc/model.sha256"] = build / "model.safetensors"
    archive = tmp_path / "d.tar.xz"
    (tmp_path / "src").mkdir()
    pack(tmp_path / "src", [], archive, lab)
    cache = tmp_path / "cache"
    monkeypatch.setenv("EXPLORL_LAB_CACHE", str(cache))
    assert unpack(archive, tmp_path / "dst") == ["lab/countdown-abc"]
    assert (cache / "countdown-abc" / "model.safetensors").read_bytes() == b"weights-A"
    assert unpack(archive, tmp_path / "dst") == []  # the same build: nothing to do
    (cache / "countdown-abc" / "model.safetensors").write_bytes(b"weights-B")
    with pytest.raises(C.ConfigError, match="differs from the one the packed runs started"):
        unpack(archive, tmp_path / "dst")


def test_stand_ins_are_variants_of_a_tuned_knob_not_ablations():
    from explorl.study.analyse import stand_ins

    for name in ("countdown_v3.yaml", "subset_sum_v3.yaml"):
        spec = S.load_spec(ROOT / "src" / "explorl" / "studies" / name)
        assert stand_ins(spec) == {"clip_cov": ["clip_cov_more"], "kl_cov": ["kl_cov_strong"],
                                   "eepo": ["eepo_open"]}  # no e3 ablation, no grpo_large


def test_study_flags_that_would_ignore_each_other_are_refused(capsys):
    assert main(["study", "countdown_v3", "--plan", "--from", "x.tar.xz"]) != 0
    assert "--plan and --from do not go together" in capsys.readouterr().err


def test_study_header_says_which_every_run_overrides_the_tuning_replaces(tmp_path):
    from explorl.report.documents import _tuned_note

    spec = S.load_spec(_tuned_spec(tmp_path, set=["optim.lr=1.0e-4", "eval.every=10"]))
    assert _tuned_note(spec) == " (the tuned settings replace `optim.lr`: see Tuning)"
    assert _tuned_note(S.load_spec(_tuned_spec(tmp_path, set=["eval.every=10"]))) == ""


def test_a_build_too_large_to_pack_is_republished_without_being_built(tmp_path, monkeypatch):
    """An archive holds only lab.json and the digest of a large lab model: unpacking keeps the
    two in ``<study>/lab``, ``lab_models`` builds nothing and re-packs them, so re-analysing and
    republishing such a study never waits on the model's SFT."""
    from explorl.study.data import lab_models, pack, unpack

    build = tmp_path / "built" / "subset_sum-big"
    build.mkdir(parents=True)
    (build / "model.safetensors").write_bytes(b"weights")
    (build / "lab.json").write_text('{"size": "large"}')
    digest = hashlib.sha256(b"weights").hexdigest() + "\n"
    lab = {"lab/subset_sum-big/lab.json": build / "lab.json",
           "lab/subset_sum-big/model.sha256": build / "model.safetensors"}
    archive = tmp_path / "d.tar.xz"
    (tmp_path / "src").mkdir()
    pack(tmp_path / "src", [], archive, lab)
    cache = tmp_path / "cache"
    monkeypatch.setenv("EXPLORL_LAB_CACHE", str(cache))
    dst = tmp_path / "dst"
    assert unpack(archive, dst) == []  # nothing installed: the weights are not in the archive
    assert not (cache / "subset_sum-big").exists()
    assert (dst / "lab" / "subset_sum-big" / "model.sha256").read_text() == digest

    class Plan:  # what lab_models reads of a run plan
        cfg = SimpleNamespace(model=SimpleNamespace(path="lab:subset_sum"), lab=None)

    monkeypatch.setattr(data_mod, "resolve_model_path",
                        lambda path, lab, build=True: cache / "subset_sum-big")
    got = lab_models([Plan()], dst / "lab")
    assert sorted(got) == ["lab/subset_sum-big/lab.json", "lab/subset_sum-big/model.sha256"]
    again = tmp_path / "again.tar.xz"
    pack(dst, [], again, got)
    with tarfile.open(again, mode="r:xz") as tar:
        assert tar.extractfile("lab/subset_sum-big/model.sha256").read().decode() == digest
    assert lab_models([Plan()]) == {}  # no record kept: left out, not built
