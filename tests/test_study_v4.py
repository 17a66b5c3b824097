"""Study v4's spec machinery: frontier sweeps (each arm × each learning rate as its own row) and
evaluations of intermediate checkpoints; the v4 specs plan."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import TINY_LAB_CONFIG

from explorl import config as C
from explorl import study as S
from explorl.cli import main
from explorl.study.jobs import base_eval_args, eval_args
from explorl.study.plan import checkpoint_of, final_evals, frontier_points, policy_evals

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "src" / "explorl" / "studies"


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "spec.yaml"
    recipes = ROOT / "src" / "explorl" / "recipes" / "lab"
    path.write_text(yaml.safe_dump({"recipe_dir": str(recipes), "task": "countdown", **data}))
    return path


def _frontier_spec(tmp_path, **extra):
    return _write(tmp_path, {
        "name": "f", "recipes": ["grpo", "kl_cov"], "seeds": [0, 1], "max_steps": 4,
        "variants": [{"name": "kl_x5", "recipe": "kl_cov", "set": ["algorithm.kl_cov_coef=0.8"]}],
        "recipe_set": {"kl_cov": ["algorithm.kl_cov_coef=0.16"]},
        "eval": {"n": 8, "k": [1, 8]},
        "frontier": {"values": [1.0e-4, 5.0e-5], "arms": ["kl_x5", "grpo"]}, **extra})


def test_frontier_arms_become_one_row_per_value_with_the_baseline_first(tmp_path):
    path = _frontier_spec(tmp_path)
    spec = S.load_spec(path)
    plans = S.plan_runs(spec, path, tmp_path / "out")
    # kl_cov is not swept: it keeps its one row at the recipe's lr; grpo's points train first,
    # every seed of them, then the rest seed by seed.
    assert [p.key for p in plans] == [
        "grpo@0.0001-seed0", "grpo@5.0e-05-seed0", "grpo@0.0001-seed1", "grpo@5.0e-05-seed1",
        "kl_cov-seed0", "kl_x5@0.0001-seed0", "kl_x5@5.0e-05-seed0",
        "kl_cov-seed1", "kl_x5@0.0001-seed1", "kl_x5@5.0e-05-seed1"]
    by = {p.key: p.cfg for p in plans}
    assert by["grpo@5.0e-05-seed0"].optim.lr == 5e-5 and by["grpo@5.0e-05-seed0"].name == \
        "grpo@5.0e-05"
    # the variant keeps its own knob (after the recipe's recipe_set) at every lr
    assert by["kl_x5@0.0001-seed1"].algorithm.kl_cov_coef == 0.8
    assert by["kl_cov-seed0"].algorithm.kl_cov_coef == 0.16
    assert frontier_points(spec) == {"grpo": [(1e-4, "grpo@0.0001"), (5e-5, "grpo@5.0e-05")],
                                     "kl_x5": [(1e-4, "kl_x5@0.0001"), (5e-5, "kl_x5@5.0e-05")]}
    assert S.order_rows(spec, plans)[:3] == ["grpo@0.0001", "grpo@5.0e-05", "kl_cov"]


@pytest.mark.parametrize("frontier, message", [
    ({"values": [1e-4], "arms": ["grpo"]}, "frontier.values: give at least two"),
    ({"values": [1e-4, 5e-5], "arms": ["kl_cov"]}, "frontier.baseline: 'grpo' must be one"),
    ({"values": [1e-4, 5e-5], "arms": ["grpo"], "k": 4}, "frontier.k: must be one of eval.k"),
    ({"values": [1e-4, 5e-5], "arms": ["grpo", "kl_cvo"]}, "did you mean 'kl_cov'"),
])
def test_frontier_spec_errors_name_the_key(tmp_path, frontier, message):
    path = _write(tmp_path, {"recipes": ["grpo", "kl_cov"], "eval": {"n": 8, "k": [1, 8]},
                             "frontier": frontier})
    with pytest.raises(C.ConfigError, match=message):
        S.plan_runs(S.load_spec(path), path, tmp_path / "out")


def test_checkpoint_evaluations_are_planned_after_the_policy_ones(tmp_path):
    path = _write(tmp_path, {
        "recipes": ["grpo"], "max_steps": 20, "seeds": [0],
        "set": ["log.checkpoint_every=5", "log.keep_checkpoints=4"],
        "eval": {"n": 8, "k": [1, 8], "temperatures": [1.2], "checkpoints": [10, 5]}})
    spec = S.load_spec(path)
    evals = final_evals(spec)
    assert [f for f, _ in evals] == ["eval", "eval_T1.2", "eval_step5", "eval_step10"]
    assert [checkpoint_of(f) for f, _ in evals] == [None, None, 5, 10]
    assert [f for f, _ in policy_evals(evals)] == ["eval", "eval_T1.2"]
    assert all(e.temperature == 1.0 for f, e in evals if checkpoint_of(f))
    plan = S.plan_runs(spec, path, tmp_path / "out")[0]
    args = eval_args(plan, spec, 2)  # the step-5 checkpoint, with the run's lab section
    assert args[1] == str(plan.out / "checkpoints" / "step-5")
    assert args[args.index("--out") + 1] == str(plan.out / "eval_step5")
    assert "--max-new-tokens" in args and args[:2] != base_eval_args(plan, spec, tmp_path)[:2]
    assert args[args.index("data.train=[lab:countdown]") - 1] == "--set"


@pytest.mark.parametrize("sets, checkpoints, message", [
    (["log.checkpoint_every=0"], [10], "does not keep its step-10 checkpoint"),
    (["log.checkpoint_every=5", "log.keep_checkpoints=2"], [10], "keep ≥ 4"),
    (["log.checkpoint_every=5", "log.keep_checkpoints=4"], [7], "every to divide 7"),
    (["log.checkpoint_every=5"], [20], r"eval.checkpoints: each step once, in \[1, max_steps"),
])
def test_checkpoints_the_runs_would_not_keep_are_refused(tmp_path, sets, checkpoints, message):
    path = _write(tmp_path, {"recipes": ["grpo"], "max_steps": 20, "set": sets,
                             "eval": {"n": 8, "k": [1, 8], "checkpoints": checkpoints}})
    with pytest.raises(C.ConfigError, match=message):
        S.plan_runs(S.load_spec(path), path, tmp_path / "out")


def test_v4_specs_plan_full_and_quick():
    for name in ("countdown_v4", "subset_sum_many_v4", "subset_sum_few_v4"):
        path = STUDIES / f"{name}.yaml"
        for quick in (False, True):
            spec = S.load_spec(path, quick=quick)
            plans = S.plan_runs(spec, path, Path("/tmp/unused"))
            points = frontier_points(spec)
            assert list(points)[0] == "grpo" and not spec.tune
            rows = {p.name for p in plans}
            assert rows == {n for pts in points.values() for _, n in pts}
            assert len(plans) == len(rows) * len(spec.seeds)
            n_grpo = len(points["grpo"]) * len(spec.seeds)
            assert all(p.name.startswith("grpo@") for p in plans[:n_grpo])
            if not quick:
                assert len(spec.frontier.values) >= 4 and len(spec.seeds) == 4
                assert {p.cfg.optim.lr for p in plans} == {1e-4, 5e-5, 2.5e-5, 1.25e-5}
    many = S.load_spec(STUDIES / "subset_sum_many_v4.yaml")
    assert many.eval.n == 256 and max(many.eval.k) == 256 and many.frontier.k is None
    few = S.load_spec(STUDIES / "subset_sum_few_v4.yaml")  # the same but 32 training problems
    plans = S.plan_runs(few, STUDIES / "subset_sum_few_v4.yaml", Path("/tmp/unused"))
    assert {p.cfg.data.max_train_prompts for p in plans} == {32}
    assert set(few.set) - set(many.set) == {"data.max_train_prompts=32"}
    long = STUDIES / "countdown_v4_long.yaml"
    for quick in (False, True):
        spec = S.load_spec(long, quick=quick)
        plans = S.plan_runs(spec, long, Path("/tmp/unused"))
        assert spec.eval.checkpoints and {p.cfg.max_steps for p in plans} == \
            {20 if quick else 1000}
    assert {p.name for p in plans} == {"grpo", "kl_cov_x5", "passk_k4"}


@pytest.mark.slow
def test_tiny_frontier_study_with_checkpoints_end_to_end(tiny_model, tmp_path, capsys):
    """A frontier study on the tiny model: GRPO's points train first, every run's step-2
    checkpoint is evaluated beside its final policy (the base model's is not), and the documents
    carry the frontier, its claim, its figure and the Checkpoints table; the archive keeps the
    checkpoint evaluations."""
    lab = [f"lab.{k}={v}" for k, v in TINY_LAB_CONFIG.items() if k != "params"]
    lab += [f"lab.params.{k}={v}" for k, v in TINY_LAB_CONFIG["params"].items()]
    spec = {
        "name": "tinyf", "task": "addition", "recipes": ["grpo", "kl_cov"], "seeds": [0],
        "max_steps": 4,
        "set": [f"model.path={tiny_model}", *lab, "data.prompts_per_step=4", "rollout.n_samples=4",
                "rollout.max_response_len=6", "eval.every=0", "reward.num_workers=1",
                "log.plots=false", "log.checkpoint_every=2", "log.keep_checkpoints=2"],
        "frontier": {"values": [1e-3, 1e-5], "arms": ["grpo", "kl_cov"]},
        "eval": {"n": 4, "k": [1, 4], "split": "test", "max_problems": 4, "checkpoints": [2]},
        "jobs": 1,
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"recipe_dir": str(ROOT / "src" / "explorl" / "recipes" /
                                                      "lab"), **spec}))
    out = tmp_path / "study"
    assert main(["study", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.index("grpo@1.0e-05-seed0") < printed.index("kl_cov@0.001-seed0")
    run = out / "runs" / "kl_cov@1.0e-05-seed0"
    assert json.loads((run / "eval_step2" / "eval.json").read_text())["settings"]["n"] == 4
    assert not (out / "base" / "eval_step2").exists()
    md = (out / "study.md").read_text()
    assert "## The pass@1–pass@4 frontier" in md and "## Checkpoints" in md
    assert "pass@1 step 2" in md and "report/frontier.png" in md
    assert (out / "report" / "frontier.png").is_file()
    assert "## Entropy over training" in md and (out / "report" / "horizon_entropy.png").is_file()
    assert "report/horizon_passk.png" in md and (out / "report" / "horizon_passk.png").is_file()
    data = json.loads((out / "study.json").read_text())
    assert data["checkpoints"]["steps"] == [2, 4] and data["checkpoints"]["k"] == 4
    assert [p["name"] for p in data["frontier"]["points"]["grpo"]] == ["grpo@0.001",
                                                                      "grpo@1.0e-05"]
    assert data["claims"][0]["id"] == "F-kl_cov"
    assert not [c for c in data["claims"] if c["verdict"] == "not run"]
    archive = tmp_path / "data.tar.xz"
    assert main(["study", str(path), "--out", str(out), "--pack", str(archive)]) == 0
    with tarfile.open(archive) as tar:
        assert "runs/grpo@0.001-seed0/eval_step2/problems.jsonl" in tar.getnames()
