"""``start:`` in a study spec: one run trained first, whose final checkpoint every arm starts
from and whose final policy is the base model's evaluation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import TINY_LAB_CONFIG

from explorl import config as C
from explorl import study as S
from explorl.cli import main
from explorl.config import builtin
from explorl.study.plan import base_folders, plan_start, start_checkpoint, with_start


def _write(tmp_path: Path, data: dict, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"recipe_dir": str(builtin.folder("recipe") / "lab"), **data}))
    return path


def _tiny(model: Path) -> dict:
    lab = [f"lab.{k}={v}" for k, v in TINY_LAB_CONFIG.items() if k != "params"]
    lab += [f"lab.params.{k}={v}" for k, v in TINY_LAB_CONFIG["params"].items()]
    return {
        "name": "tiny",
        "task": "addition",
        "recipes": ["grpo"],
        "variants": [{"name": "grpo_hot", "recipe": "grpo", "set": ["rollout.temperature=1.2"]}],
        "seeds": [0],
        "max_steps": 2,
        "set": [f"model.path={model}", *lab, "data.prompts_per_step=4", "rollout.n_samples=4",
                "rollout.max_response_len=6", "optim.lr=1.0e-3", "eval.every=2",
                "eval.n_samples=2", "eval.k=[1, 2]", "eval.max_problems=4",
                "reward.num_workers=1", "log.plots=false"],
        "eval": {"n": 2, "k": [1, 2], "split": "test", "max_problems": 4},
        "start": {"recipe": "grpo", "seed": 0, "steps": 2},
        "jobs": 2,
    }


@pytest.mark.parametrize("start, message", [
    ({"recipe": "grpo", "stepz": 3}, "start.stepz: unknown key; did you mean 'start.steps'?"),
    ({"recipe": "grpo", "steps": 0}, "start.steps: must be ≥ 1"),
    ({"recipe": "grop"}, "start.recipe: unknown recipe 'grop'; did you mean 'grpo'?"),
    ({"recipe": "grpo", "set": ["optim.lrr=1"]}, "optim.lrr: unknown key"),
    ("grpo", "start: expected StartSpec or None"),
])
def test_start_errors_name_the_key(tmp_path, start, message):
    path = _write(tmp_path, {"recipes": ["grpo"], "start": start})
    with pytest.raises(C.ConfigError) as e:
        S.plan_runs(S.load_spec(path), path, tmp_path / "out")
    assert message in str(e.value) and str(path) in str(e.value)


def test_start_plan_sets_every_run_model_path_last(tmp_path):
    """Every arm and tuning run starts from the start run's last checkpoint, set after every
    other override (the study's ``set`` naming a model included); the start run itself trains
    the task's model with the study's and its own overrides, and keeps its weights."""
    path = _write(tmp_path, {
        "recipes": ["grpo"], "seeds": [0, 1], "max_steps": 5,
        "set": ["optim.lr=2.0e-3", "log.save_model=false"],
        "variants": [{"name": "hot", "recipe": "grpo", "set": ["rollout.temperature=1.2"]}],
        "tune": {"grpo": {"key": "optim.lr", "values": [1.0e-3, 2.0e-3]}},
        "tuning": {"seeds": [7]},
        "start": {"recipe": "grpo", "seed": 3, "steps": 4, "set": ["optim.lr=5.0e-4"]},
        "quick": {"start": {"steps": 1}}})
    spec, out = S.load_spec(path), tmp_path / "o"
    ckpt = out / "start" / "checkpoints" / "step-4"
    assert start_checkpoint(spec, out) == ckpt
    start = plan_start(spec, path, out)
    assert (start.out, start.seed, start.cfg.max_steps, start.cfg.seed) == (out / "start", 3, 4, 3)
    assert start.cfg.model.path == "lab:addition" and start.cfg.optim.lr == 5.0e-4
    assert start.cfg.log.save_model  # its last checkpoint holds the weights the arms load
    plans = S.plan_runs(spec, path, out, {"grpo": 1.0e-3})
    tuning = S.plan_tuning(spec, path, out)
    assert len(plans) == 4 and len(tuning) == 2
    for p in plans + tuning:
        assert p.cfg.model.path == str(ckpt) and p.start.out == out / "start"
        assert [s for s in p.sets if s.startswith("model.path=")][-1] == f"model.path={ckpt}"
    assert next(p for p in plans if p.name == "hot").sets[-3:-1] == [f"model.path={ckpt}",
                                                                      "name=hot"]
    assert [p.name for p in with_start(plans + tuning)] == ["start", *[p.name for p in
                                                                      plans + tuning]]
    # one base model: the start's policy
    assert list(base_folders(plans)) == ["base"]
    quick = S.load_spec(path, quick=True)
    assert (quick.start.steps, quick.start.seed, quick.start.recipe) == (1, 3, "grpo")


def test_study_without_start_is_unchanged(tmp_path):
    path = _write(tmp_path, {"recipes": ["grpo"]})
    (p,) = S.plan_runs(S.load_spec(path), path, tmp_path / "o")
    assert p.start is None and p.cfg.model.path == "lab:addition"


@pytest.mark.slow
def test_study_trains_the_start_once_and_every_arm_from_it(tiny_model, tmp_path, capsys):
    path = _write(tmp_path, _tiny(tiny_model))
    out = tmp_path / "study"
    assert main(["study", str(path), "--out", str(out), "--plan"]) == 0
    planned = capsys.readouterr().out
    assert "start: grpo seed 0, 2 steps" in planned and str(out / "start") in planned

    assert main(["study", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    ckpt = out / "start" / "checkpoints" / "step-2"
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "config.json").is_file()
    assert json.loads((out / "start" / "summary.json").read_text())["steps"] == 2
    digest = (out / "start" / "model.sha256").read_text().strip()
    assert len(digest) == 64
    for run in ("grpo-seed0", "grpo_hot-seed0"):
        cfg = yaml.safe_load((out / "runs" / run / "config.yaml").read_text())
        assert cfg["model"]["path"] == str(ckpt), run
    base = json.loads((out / "base" / "eval" / "eval.json").read_text())
    assert str(ckpt) in json.dumps(base)  # the base row is the start's policy
    assert "start: grpo seed 0, 2 steps" in printed
    md = (out / "study.md").read_text()
    assert "start: `grpo` seed 0 after 2 steps" in md and "the base row is that policy" in md
    from explorl.study.analyse import base_names
    assert base_names(S.load_spec(path)) == ("start (grpo seed 0, 2 steps)", "start")
    assert base_names(S.load_spec(builtin.find("subset_sum_v3", "study"))) == (
        "base (before RL)", "base")

    # Rerun: the start run is not trained again, nor are the arms.
    stamps = {p: p.stat().st_mtime_ns for p in [*out.glob("start/*.jsonl"),
                                                *out.glob("runs/*/metrics.jsonl")]}
    assert main(["study", str(path), "--out", str(out)]) == 0
    assert "0 to train" in capsys.readouterr().out
    assert stamps == {p: p.stat().st_mtime_ns for p in stamps}

    # --pack / --from: the start's numbers and digest travel, not its weights; the restored
    # study is analysed without training it again (nothing left needs its policy) ...
    archive = tmp_path / "data.tar.xz"
    assert main(["study", str(path), "--out", str(out), "--pack", str(archive)]) == 0
    capsys.readouterr()
    other = tmp_path / "elsewhere"
    assert main(["study", str(path), "--out", str(other), "--from", str(archive)]) == 0
    assert not (other / "start" / "checkpoints").exists()
    assert (other / "start" / "model.sha256").read_text().strip() == digest
    capsys.readouterr()
    # ... and one with a run left to train trains the start again, to the same weights.
    shutil.rmtree(other / "runs" / "grpo_hot-seed0")
    assert main(["study", str(path), "--out", str(other)]) == 0
    printed = capsys.readouterr().out
    assert "training it again" in printed and "WARNING" not in printed
    assert (other / "start" / "model.sha256").read_text().strip() == digest


def test_plan_prices_the_start_run_first_at_its_models_rates(tiny_model, tmp_path, capsys):
    """test_study_cost's spec and measured rates (a 10-step run: training 7200, validation
    1080, evaluation 1200 CPU-s; the base model's evaluation 1200; one job keeps 5/11 cores
    busy), two seeds, after a 4-step start run: training 4 × 720 = 2880, 2 validations (before
    training, the last step) × 12 replies × 5 tokens × 6.0 = 720, no evaluation → 3600 CPU-s,
    trained alone before the rest. The arms are priced at the start model's rates; the base
    model's evaluation is one more job of their pool. 2 jobs: (3600 + (2 × 9480 + 1200) / 2) ×
    11/5 = 30096 s; 1 job: (3600 + 1200 + 2 × 9480) × 11/5 = 52272 s; CPU 23760 s."""
    from test_study_cost import _fake_run, _spec

    from explorl.study.pricing import estimate, models_of
    from explorl.study.rates import from_runs, model_id

    path = _spec(tmp_path, tiny_model, seeds=[0, 1], start={"recipe": "grpo", "steps": 4})
    spec = S.load_spec(path)
    plans = S.plan_runs(spec, path, tmp_path / "o")
    start = plans[0].start
    model = model_id(start.cfg)
    assert model_id(plans[0].cfg) != model  # the arms' model.path is the start's checkpoint
    assert list(models_of(plans)) == [model] and models_of(plans)[model] is start
    _fake_run(tmp_path / "ref", start.cfg)
    rates = {model: from_runs([tmp_path / "ref"], model, "r")}
    est = estimate(spec, [], plans, rates, 2)
    assert est.wall_s == pytest.approx(30096)
    assert estimate(spec, [], plans, rates, 1).wall_s == pytest.approx(52272)
    assert est.cpu.total() == pytest.approx(23760)
    assert est.cpu.training == pytest.approx(2880 + 2 * 7200)

    assert main(["study", str(path), "--out", str(tmp_path / "o"), "--plan", "--cost-from",
                 str(tmp_path / "ref")]) == 0
    printed = capsys.readouterr().out
    assert f"start: grpo seed 0, 4 steps → {tmp_path / 'o' / 'start'}" in printed
    assert "24 training steps" in printed  # 4 + 2 × 10
    assert "total 6.6 " in printed  # 23760 CPU-s
