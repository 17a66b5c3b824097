"""A study whose arms start from different models (subset_sum_v3's grpo_large on the 9.6M lab
model) evaluates each of those models before RL, and compares each arm with its own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from explorl import study as S
from explorl.report.evidence import Evidence
from explorl.report.tables import passk_tables, temperature_tables
from explorl.study.cost import Rates, estimate
from explorl.study.data import _unit, packable
from explorl.study.plan import base_folders, base_of

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "src" / "explorl" / "studies" / "subset_sum_v3.yaml"


def _plans(out: Path = Path("/tmp/unused")):
    spec = S.load_spec(SPEC)
    return spec, S.plan_runs(spec, SPEC, out)


def _eval(d: Path, e, n_correct: int) -> None:
    """A finished evaluation with protocol ``e`` of one problem, ``n_correct`` of 64 right."""
    d.mkdir(parents=True)
    settings = {"n": e.n, "k": sorted(set(e.k)), "temperature": e.temperature,
                "split": e.split, "seed": e.seed}
    d.joinpath("eval.json").write_text(json.dumps({"settings": settings,
                                                   "overall": {"n_problems": 1}}))
    d.joinpath("problems.jsonl").write_text(
        json.dumps({"n_correct": n_correct, "n_samples": 64}) + "\n")


def test_each_starting_model_is_evaluated_once_under_its_own_folder():
    _, plans = _plans()
    folders = base_folders(plans)
    assert list(folders) == ["base", "base-grpo_large"]
    assert folders["base"].cfg.lab.model_size == "default"
    assert folders["base-grpo_large"].cfg.lab.model_size == "large"
    of = base_of(plans)
    assert of["grpo_large"] == "base-grpo_large"
    assert {f for n, f in of.items() if n != "grpo_large"} == {"base"}
    # the base evaluation of the large model runs the large model, with the runs' protocol
    from explorl.study.jobs import base_eval_args
    spec = S.load_spec(SPEC)
    args = base_eval_args(folders["base-grpo_large"], spec, Path("/tmp/b"))
    assert "lab.model_size=large" in args
    assert "lab.model_size=large" not in base_eval_args(folders["base"], spec, Path("/tmp/b"))


def test_a_study_on_one_model_has_one_base():
    spec = S.load_spec(ROOT / "src" / "explorl" / "studies" / "countdown_v3.yaml")
    plans = S.plan_runs(spec, ROOT / "src" / "explorl" / "studies" / "countdown_v3.yaml",
                        Path("/tmp/unused"))
    assert list(base_folders(plans)) == ["base"]


def _ev() -> Evidence:
    """GRPO from a base at pass@1 0.3; ``big`` from its own base at 0.1 (the study's base would
    make it look 0.2 better than it is). Two temperatures."""
    g = {1: np.full((2, 10), 0.5), 4: np.full((2, 10), 0.8)}
    big = {1: np.full((2, 10), 0.4), 4: np.full((2, 10), 0.7)}
    base = {1: np.full((1, 10), 0.3), 4: np.full((1, 10), 0.9)}
    own = {1: np.full((1, 10), 0.1), 4: np.full((1, 10), 0.6)}
    own_hot = {1: np.full((1, 10), 0.05), 4: np.full((1, 10), 0.65)}
    per_run = {n: [{"seed": s, "final_entropy": 0.3} for s in (0, 1)] for n in ("grpo", "big")}
    return Evidence(per_run, {"grpo": g, "big": big}, {"grpo": [0, 1], "big": [0, 1]}, base,
                    [1, 4], temperature=1.0,
                    passk_t={1.0: {"grpo": g, "big": big}, 1.2: {"grpo": g, "big": big}},
                    base_t={1.0: base, 1.2: base},
                    bases={"base-big": {1.0: own, 1.2: own_hot}}, base_for={"big": "base-big"})


def test_each_arm_is_compared_with_the_model_it_starts_from():
    ev = _ev()
    assert ev.pk("grpo", "base", 1).estimate == pytest.approx(0.2)
    assert ev.pk("big", "base", 1).estimate == pytest.approx(0.3)  # 0.4 − its own 0.1
    assert ev.pk("big", "base", 4).estimate == pytest.approx(0.1)
    assert ev.pk("big", "base", 1, tb=1.2).estimate == pytest.approx(0.35)
    assert ev.pk("big", "grpo", 1).estimate == pytest.approx(-0.1)  # arms: unchanged
    assert ev.mean_passk("base-big", 4, 1.2) == pytest.approx(0.65)
    assert ev.best_temperature("base-big", 4) == 1.2

    table = "\n".join(passk_tables(ev))
    assert "| **base** | 0.300 | 0.900 |" in table
    assert "| **base-big** | 0.100 | 0.600 |" in table
    assert "**base-big** the one of big" in table
    assert "| big | **+0.300 [+0.300, +0.300]**" in table
    temps = "\n".join(temperature_tables(ev))
    assert "| base-big | 0.100 | 0.050 | 0.600 | 0.650 | 1.2 |" in temps


def test_other_bases_are_packed_restored_and_costed(tmp_path):
    spec, plans = _plans(tmp_path)
    for folder in ("base", "base-grpo_large"):
        for sub, e in plans[0].evals:
            _eval(tmp_path / folder / sub, e, 1)
    files = packable(tmp_path, spec, plans)
    assert Path("base-grpo_large/eval/eval.json") in files
    assert Path("base-grpo_large/eval_T1.2/problems.jsonl") in files
    assert _unit(Path("base-grpo_large/eval/eval.json")) == Path("base-grpo_large/eval")

    rates = Rates(per_step={"grpo": 1.0, "grpo_large": 3.0}, mean=1.0, val_samples=0.0,
                  large=3.0)
    one = estimate(spec, [], [p for p in plans if p.name != "grpo_large"], rates)["base"]
    both = estimate(spec, [], plans, rates)["base"]
    assert both == pytest.approx(4 * one)  # the 9.6M model's evaluations cost 3× the small's


def test_an_arm_whose_own_base_is_missing_reads_none_not_the_study_base():
    ev = _ev()
    ev.bases.clear()  # base-big's evaluation failed or is absent
    assert ev.pk("big", "base", 1) is None
    assert ev.pk("grpo", "base", 1).estimate == pytest.approx(0.2)
    assert "| big | — | — |" in "\n".join(passk_tables(ev))


def test_pass_at_k_figure_draws_each_base_and_subtracts_each_arms_own(tmp_path, monkeypatch):
    import explorl.report.figures as F

    kept = []
    monkeypatch.setattr(F, "save_figure", lambda fig, path, dpi=100: kept.append(fig))
    F._draw_passk(_ev(), tmp_path)
    left, right = kept[0].axes[:2]
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in left.lines}
    assert lines["base (before RL)"] == pytest.approx([0.3, 0.9])
    assert lines["base-big (before RL)"] == pytest.approx([0.1, 0.6])
    diffs = {ln.get_label(): list(ln.get_ydata()) for ln in right.lines}
    assert diffs["big"] == pytest.approx([0.3, 0.1])  # 0.4 − 0.1, 0.7 − 0.6: its own base
    assert diffs["grpo"] == pytest.approx([0.2, -0.1])
    assert "each its own" in right.get_title()


def test_gathered_evidence_compares_each_arm_with_its_own_base_or_with_none(tmp_path):
    """From a study folder: grpo_large's "− base" reads base-grpo_large; without that
    evaluation it reads none, never the small model's base."""
    from explorl.study.analyse import gather_evidence

    spec, plans = _plans(tmp_path)
    done = [p for p in plans if p.name in ("grpo", "grpo_large")]
    for p in done:
        for sub, e in p.evals:
            _eval(p.out / sub, e, 32)  # pass@1 = 0.5
    for sub, e in plans[0].evals:
        _eval(tmp_path / "base" / sub, e, 16)  # 0.25
    ev = gather_evidence(tmp_path, spec, done, ["grpo", "grpo_large"], {}, {}, plans)
    assert ev.base_for == {"grpo_large": "base-grpo_large"} and not ev.bases
    assert ev.pk("grpo", "base", 1).estimate == pytest.approx(0.25)
    assert ev.pk("grpo_large", "base", 1) is None
    for sub, e in plans[0].evals:
        _eval(tmp_path / "base-grpo_large" / sub, e, 8)  # 0.125
    ev = gather_evidence(tmp_path, spec, done, ["grpo", "grpo_large"], {}, {}, plans)
    assert ev.pk("grpo_large", "base", 1).estimate == pytest.approx(0.375)
    assert set(ev.bases["base-grpo_large"]) == set(spec.eval.all_temperatures())
