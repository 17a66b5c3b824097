"""``explorl study --plan``'s estimate from the study model's own measured rates: rates read
from a run's metrics by hand, the printed CPU-hours and wall-clock, ``--time-limit`` checked
before any work, and a calibration of the tiny lab model."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from conftest import TINY_LAB_CONFIG

from explorl import config as C
from explorl.cli import main
from explorl.study import load_spec, plan_runs
from explorl.study import run as R
from explorl.study.cost import plan_study
from explorl.study.pricing import estimate
from explorl.study.rates import from_runs, model_id, validations

RECIPES = Path(__file__).parents[1] / "src" / "explorl" / "recipes" / "lab"


@pytest.fixture(autouse=True)
def _cost_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORL_COST_CACHE", str(tmp_path / "cost-cache"))


def _spec(tmp_path, model, **extra) -> Path:
    """GRPO on ``model``: 10 steps of 2 prompts × 4 samples (≤ 10 tokens); validation every 5
    steps of 4 problems × (2 samples + greedy) and one before training: 3 × 12 replies; a
    final evaluation of 8 test problems × (4 + greedy)."""
    lab = [f"lab.{k}={v}" for k, v in TINY_LAB_CONFIG.items() if k != "params"]
    lab += [f"lab.params.{k}={v}" for k, v in TINY_LAB_CONFIG["params"].items()]
    spec = {"name": "c", "task": "addition", "recipes": ["grpo"], "seeds": [0], "max_steps": 10,
            "recipe_dir": str(RECIPES),
            "set": [f"model.path={model}", *lab, "data.prompts_per_step=2", "rollout.n_samples=4",
                    "rollout.max_response_len=10", "eval.every=5", "eval.n_samples=2",
                    "eval.k=[1]", "eval.max_problems=4", "reward.num_workers=1",
                    "log.plots=false"],
            "eval": {"n": 4, "k": [1, 4], "split": "test", "max_problems": 8}, "jobs": 1,
            **extra}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


# Two measured steps (CPU and wall seconds ×360 so the hours print round):
#   step 1: 720 CPU-s in 1800 s; generate 360 s, train 1080 s → sampling 180, update 540
#   step 2: 1080 CPU-s in 2160 s, of which validation 720 s → 360 CPU-s to validation; the
#           other 720 split 1 : 3 → sampling 180, update 540
# Each step: 8 replies of 5 tokens, all trained: 40 generated and 40 trained tokens.
#   sampling 360 / 80 = 4.5, update 1080 / 80 = 13.5 CPU-s per token
# The evaluation (eval.json's measured CPU): 8 problems × (4 + greedy) × 5 = 200 tokens in
# 1200 CPU-s → 6.0 CPU-s per evaluated token (the validation's CPU, a wall-clock share, is not
# used beside a measured one). One job keeps 1800 / 3960 = 5/11 cores busy.
STEPS = [
    {"step": 1, "time/cpu_s": 720.0, "time/step_s": 1800.0, "time/generate_s": 360.0,
     "time/score_s": 0.0, "time/train_s": 1080.0, "response/length_mean": 5.0,
     "rollout/n_samples": 8.0, "rollout/n_trained": 8.0},
    {"step": 2, "time/cpu_s": 1080.0, "time/step_s": 2160.0, "time/generate_s": 270.0,
     "time/score_s": 90.0, "time/train_s": 1080.0, "time/val_s": 720.0,
     "response/length_mean": 5.0, "rollout/n_samples": 8.0, "rollout/n_trained": 8.0,
     "val/accuracy": 0.5},
]


def _fake_run(run: Path, cfg: C.RunConfig) -> None:
    run.mkdir(parents=True)
    C.save(cfg, run / "config.yaml")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in STEPS))
    (run / "eval").mkdir()
    (run / "eval" / "eval.json").write_text(json.dumps({
        "overall": {"n_problems": 8},
        "settings": {"n": 4, "max_new_tokens": 10, "seconds": 1500.0, "cpu_seconds": 1200.0}}))


def test_plan_rates_from_a_runs_metrics_by_hand(tiny_model, tmp_path):
    path = _spec(tmp_path, tiny_model)
    (plan,) = plan_runs(load_spec(path), path, tmp_path / "o")
    _fake_run(tmp_path / "ref", plan.cfg)
    r = from_runs([tmp_path / "ref"], model_id(plan.cfg), "ref")
    assert (r.sample_s, r.update_s, r.eval_s) == pytest.approx((4.5, 13.5, 6.0))
    assert r.length == 5.0 and r.steps == 2 and r.threads == 1 and r.start_s == 0.0
    assert r.parallel == pytest.approx(1800 / 3960)
    assert from_runs([tmp_path / "ref"], "another-model", "ref") is None
    bad = tmp_path / "bad"  # a run whose config this version cannot read prices nothing
    bad.mkdir()
    (bad / "config.yaml").write_text("optim: {lr: [}\n")
    (bad / "metrics.jsonl").write_text(json.dumps(STEPS[0]) + "\n")
    assert from_runs([bad, tmp_path / "ref"], model_id(plan.cfg), "ref").steps == 2


def test_plan_rates_prefer_the_measured_validation_cpu(tiny_model, tmp_path):
    """Without eval.json: step 2's validation measured 300 CPU-s (``time/val_cpu_s``) → the
    other 780 split 1 : 3 (195, 585); sampling (180 + 195) / 80, update (540 + 585) / 80;
    validation 12 replies × 5 tokens: 300 / 60 = 5.0 per token. Without ``time/val_cpu_s``
    the validation's wall-clock share, 360 CPU-s: 6.0 per token."""
    path = _spec(tmp_path, tiny_model)
    (plan,) = plan_runs(load_spec(path), path, tmp_path / "o")
    _fake_run(tmp_path / "ref", plan.cfg)
    (tmp_path / "ref" / "eval" / "eval.json").unlink()
    model = model_id(plan.cfg)
    assert from_runs([tmp_path / "ref"], model, "ref").eval_s == pytest.approx(6.0)
    steps = [STEPS[0], {**STEPS[1], "time/val_cpu_s": 300.0}]
    (tmp_path / "ref" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    r = from_runs([tmp_path / "ref"], model, "ref")
    assert (r.sample_s, r.update_s, r.eval_s) == pytest.approx((375 / 80, 1125 / 80, 5.0))


def test_plan_validations_count_every_eval_step_the_last_and_the_one_before(tiny_model, tmp_path):
    path = _spec(tmp_path, tiny_model)
    (plan,) = plan_runs(load_spec(path), path, tmp_path / "o")
    cfg = plan.cfg
    assert validations(cfg) == 3  # before training, steps 5 and 10
    assert validations(cfg, 5) == 1  # resumed at 5: step 10
    cfg.max_steps = 12
    assert validations(cfg) == 4 and validations(cfg, 10) == 1  # 0, 5, 10, 12; then 12
    cfg.eval.before_training = False
    assert validations(cfg) == 3


# The study of ``_spec`` at those rates, replies of 5 tokens (the measured mean, ≤ 10):
#   training: 10 steps × 40 tokens × (4.5 + 13.5) = 7200 CPU-s = 2.00 h
#   validation: 3 × 12 replies × 5 tokens × 6.0 = 1080 CPU-s = 0.300 h
#   evaluation: 8 × 5 replies × 5 tokens × 6.0 = 1200 CPU-s = 0.333 h; the base model's: the same
#   total 10680 CPU-s = 2.97 h; every reply at its 10 tokens: twice that, 5.93 h
#   wall: 10680 ÷ (1 job × 5/11) = 23496 s = 6.53 h; on a free core (1 thread): 2.97 h
def test_plan_prints_cpu_hours_from_a_run_directory(tiny_model, tmp_path, capsys):
    path = _spec(tmp_path, tiny_model)
    (plan,) = plan_runs(load_spec(path), path, tmp_path / "o")
    _fake_run(tmp_path / "ref", plan.cfg)
    assert main(["study", str(path), "--plan", "--out", str(tmp_path / "o"), "--cost-from",
                 str(tmp_path / "ref")]) == 0
    out = capsys.readouterr().out
    assert ("CPU-s 4.5 per generated token, 13.5 per trained token, evaluation 6 per token "
            "(30 per reply)") in out
    assert "2 prompts × 4 samples × 5.0 tokens ≈ 720 CPU-s" in out
    assert ("estimated CPU-hours: training 2, validation 0.3, evaluation 0.333 (final and "
            "checkpoints), base model 0.333; total 2.97 (at most 5.93 if every reply ran to its "
            "limit)") in out
    assert ("wall-clock with 1 job at a time (CPU ÷ jobs ÷ the cores one job keeps busy): ≈ 6.53 "
            "h at the 0.45 cores a job got when measured, ≈ 2.97 h with each job's 1 thread on "
            "free cores (at best)") in out
    # two jobs: the base model's evaluation runs beside the one run, which takes
    # 9480 × 11/5 = 20856 s = 5.79 h (more than half of the two together)
    assert main(["study", str(path), "--plan", "--jobs", "2", "--out", str(tmp_path / "o"),
                 "--cost-from", str(tmp_path / "ref")]) == 0
    assert "with 2 jobs at a time (CPU ÷ jobs ÷ the cores one job keeps busy): ≈ 5.79 h" in \
        capsys.readouterr().out


def test_plan_reads_the_studys_own_runs_without_cost_from(tiny_model, tmp_path, capsys):
    path = _spec(tmp_path, tiny_model)
    out = tmp_path / "o"
    (plan,) = plan_runs(load_spec(path), path, out)
    assert main(["study", str(path), "--plan", "--out", str(out)]) == 0
    got = capsys.readouterr().out
    assert "no measured rates of" in got and "price it with --calibrate" in got
    _fake_run(plan.out, plan.cfg)
    assert main(["study", str(path), "--plan", "--out", str(out)]) == 0
    got = capsys.readouterr().out
    assert f"this study's runs in {out}" in got and "total 2.97" in got


def test_plan_refuses_cost_from_another_model(tiny_model, tmp_path, capsys):
    """A lab report (study.json) of another model, or a directory without a run of this one,
    cannot price the study: a one-line error."""
    path = _spec(tmp_path, tiny_model)
    ref = tmp_path / "study.json"
    ref.write_text(json.dumps({"spec": {"task": "subset_sum", "set": []},
                               "runs": {"grpo-seed0": {"cpu_run_s": 20.0, "steps": 100}}}))
    assert main(["study", str(path), "--plan", "--cost-from", str(ref)]) != 0
    err = capsys.readouterr().err
    assert f"--cost-from {ref}: its runs trained lab:subset_sum, this study trains" in err
    (tmp_path / "empty").mkdir()
    assert main(["study", str(path), "--plan", "--cost-from", str(tmp_path / "empty")]) != 0
    assert "no run there trained" in capsys.readouterr().err
    assert main(["study", str(path), "--calibrate"]) != 0
    assert "--cost-from and --calibrate go with --plan" in capsys.readouterr().err


class _Started(Exception):
    pass


def test_a_time_limit_shorter_than_the_estimate_is_said_before_training(tiny_model, tmp_path,
                                                                        monkeypatch):
    """The study's own run (2 steps, no checkpoint: it restarts) prices what is left: 9480
    CPU-s without the base model, 9480 × 11/5 = 20856 s = 5.79 h of wall-clock. A 1 h limit
    warns before the first job starts; 6 h fits."""
    path = _spec(tmp_path, tiny_model, base_eval=False)
    out = tmp_path / "o"
    (plan,) = plan_runs(load_spec(path), path, out)
    _fake_run(plan.out, plan.cfg)
    lines: list[str] = []

    def started(*a, **k):
        lines.append("JOBS START")
        raise _Started

    monkeypatch.setattr(R, "run_jobs", started)
    with pytest.raises(_Started):
        R.run_study(path, out=out, time_limit=3600, log=lines.append)
    warn = next(i for i, x in enumerate(lines) if x.startswith("WARNING --time-limit 1 h"))
    assert warn < lines.index("JOBS START")
    assert ("the work left is estimated at 5.79 h of wall-clock (2.63 CPU-hours at 1 job at a "
            "time), more than the limit") in lines[warn]
    lines.clear()
    with pytest.raises(_Started):
        R.run_study(path, out=out, time_limit=6 * 3600, log=lines.append)
    assert any(x.endswith("5.79 h of wall-clock (2.63 CPU-hours): it fits") for x in lines)


def test_a_time_limit_without_rates_says_how_to_get_them(tiny_model, tmp_path, monkeypatch):
    path = _spec(tmp_path, tiny_model, base_eval=False)
    lines: list[str] = []
    monkeypatch.setattr(R, "run_jobs", lambda *a, **k: (_ for _ in ()).throw(_Started()))
    with pytest.raises(_Started):
        R.run_study(path, out=tmp_path / "o", time_limit=3600, log=lines.append)
    assert any("no measured rates of" in x and "--plan --calibrate" in x for x in lines)


def test_a_calibration_samples_a_whole_generation_batch(tiny_model, tmp_path):
    """``rollout.batch_size=6``: the validation (2 samples per problem) takes 3 problems, the
    evaluation (the study's n = 4) 2; a batch larger than the split takes all it has (4
    validation problems, 8 test problems)."""
    from explorl.study.calibrate import batch_problems, calibration_commands

    assert batch_problems(256, 64, 256) == 4 and batch_problems(256, 4, 64) == 64
    assert batch_problems(256, 300, 10) == 1 and batch_problems(6, 4, 8) == 2
    for rows, val, ev in ((6, 3, 2), (256, 4, 8)):
        path = _spec(tmp_path, tiny_model)
        spec = load_spec(path)
        spec.set.append(f"rollout.batch_size={rows}")
        (plan,) = plan_runs(spec, path, tmp_path / "o")
        train, evaluate = calibration_commands(plan, spec, tmp_path / "cal", 2)
        assert train[train.index("--max-steps") + 1] == "2"
        last = [a for a in train if a.startswith("eval.max_problems=")][-1]  # the one applied
        assert "eval.every=2" in train and last == f"eval.max_problems={val}"
        assert evaluate[evaluate.index("--n") + 1] == "4"
        assert evaluate[evaluate.index("--max-problems") + 1] == str(ev)


def test_plan_calibrates_the_lab_model_and_caches_its_rates(tiny_model, tmp_path):
    """One training step and a small evaluation of the tiny lab model (seconds): rates > 0,
    the evaluation's own CPU seconds recorded in its eval.json, the start-up the rest of the
    job's CPU time; a second --plan finds the cached rates."""
    from explorl.study.calibrate import calibrate

    path = _spec(tmp_path, tiny_model)
    spec = load_spec(path)
    (plan,) = plan_runs(spec, path, tmp_path / "o")
    run = tmp_path / "cal" / "run"
    r = calibrate(plan, spec, 1, log=lambda s: None, keep=run)
    settings = json.loads((run / "eval" / "eval.json").read_text())["settings"]
    assert 0 < settings["cpu_seconds"] <= settings["seconds"] * 1.5 + 0.5  # one thread
    assert r.sample_s > 0 and r.update_s > 0 and r.eval_s > 0 and r.start_s > 0
    assert r.steps == 1 and r.source == "calibration: 1 steps of grpo"
    (step,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert 0 < step["time/val_cpu_s"] < step["time/cpu_s"]  # the validation at step 1
    again = from_runs([run], model_id(plan.cfg), "calibration: 1 steps of grpo")
    assert again.sample_s == r.sample_s and again.eval_s == r.eval_s
    lines: list[str] = []
    assert plan_study(path, out=tmp_path / "o", log=lines.append) == 0
    assert any(x.startswith(f"rates of {model_id(plan.cfg)} (calibration: 1 steps of grpo")
               for x in lines)
    est = estimate(spec, [], [plan], {model_id(plan.cfg): r}, 1)
    assert est.cpu.training == pytest.approx(
        10 * 8 * min(r.length, 10) * (r.sample_s + r.update_s) + r.start_s)


def test_timed_adds_wall_and_cpu_seconds():
    """``timed(metrics, key, cpu_key)``: a sleep adds wall-clock but almost no CPU time; work
    adds CPU time (the CPU key of ``time/val_cpu_s``); both add up over phases."""
    import time

    from explorl.training.metrics import timed

    m: dict = {}
    with timed(m, "w", "c"):
        time.sleep(0.2)
    assert m["w"] >= 0.2 and m["c"] < 0.1
    with timed(m, "w", "c"):
        c0 = time.process_time()
        while time.process_time() - c0 < 0.05:
            pass
    assert m["c"] >= 0.05 and m["w"] >= 0.25
    with timed(m, "only"):
        pass
    assert set(m) == {"w", "c", "only"}


def test_plan_wall_clock_divides_each_phase_by_the_runs_at_a_time(tiny_model, tmp_path):
    """Two seeds: each run 9480 CPU-s, the base model's evaluation 1200 (one more job of the
    runs' pool), one job keeping 5/11 cores busy. 2 jobs: (2 × 9480 + 1200) / 2 × 11/5 =
    22176 s; 1 job: (2 × 9480 + 1200) × 11/5 = 44352 s; on free cores (1 thread): × 5/11. Three
    jobs: no less than the longest job, one run, 9480 × 11/5 = 20856 s."""
    path = _spec(tmp_path, tiny_model, seeds=[0, 1])
    spec = load_spec(path)
    plans = plan_runs(spec, path, tmp_path / "o")
    _fake_run(tmp_path / "ref", plans[0].cfg)
    rates = {model_id(plans[0].cfg): from_runs([tmp_path / "ref"], model_id(plans[0].cfg), "r")}
    assert estimate(spec, [], plans, rates, 2).wall_s == pytest.approx(22176)
    assert estimate(spec, [], plans, rates, 3).wall_s == pytest.approx(20856)
    assert estimate(spec, [], plans, rates, 1).wall_s == pytest.approx(44352)
    assert estimate(spec, [], plans, rates, 1, free=True).wall_s == pytest.approx(20160)
    assert estimate(spec, [], plans, rates, 1).cpu.total() == pytest.approx(20160)


def test_a_time_limit_prices_what_is_left_from_the_last_checkpoint(tiny_model, tmp_path):
    """The run has its step-5 checkpoint: 5 steps × 720 + 1 validation (step 10) × 360 + its
    evaluation 1200 = 5160 CPU-s = 1.43 h, × 11/5 = 3.15 h of wall-clock. Finished and
    evaluated: nothing is left."""
    from explorl.outputs.checkpoint import STATE_FILE
    from explorl.study.pricing import time_limit_lines

    path = _spec(tmp_path, tiny_model, base_eval=False)
    out = tmp_path / "o"
    spec = load_spec(path)
    (plan,) = plan_runs(spec, path, out)
    _fake_run(plan.out, plan.cfg)
    (plan.out / "checkpoints" / "step-5").mkdir(parents=True)
    (plan.out / "checkpoints" / "step-5" / STATE_FILE).write_text("")
    (line,) = time_limit_lines(spec, [], [plan], out, 1, 3600)
    assert "estimated at 3.15 h of wall-clock (1.43 CPU-hours at 1 job at a time)" in line
    (plan.out / "summary.json").write_text(json.dumps({"steps": 10, "max_steps": 10}))
    (plan.out / "eval" / "eval.json").write_text(json.dumps({
        "overall": {"n_problems": 8}, "settings": {
            "n": 4, "k": [1, 4], "temperature": 1.0, "split": "test", "seed": 0,
            "max_new_tokens": 10, "cpu_seconds": 1200.0}}))
    (plan.out / "eval" / "problems.jsonl").write_text("{}\n" * 8)
    (line,) = time_limit_lines(spec, [], [plan], out, 1, 3600)
    assert "estimated at 0 h of wall-clock (0 CPU-hours): it fits" in line


def _finished(plan, cpu_per_step: float, eval_cpu: float | None) -> None:
    """``plan``'s run finished and evaluated: 10 steps of ``cpu_per_step`` CPU-s each and an
    evaluation of ``eval_cpu`` (None: not measured)."""
    plan.out.mkdir(parents=True)
    C.save(plan.cfg, plan.out / "config.yaml")
    steps = [{**STEPS[0], "step": i, "time/cpu_s": cpu_per_step} for i in range(1, 11)]
    (plan.out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (plan.out / "summary.json").write_text(json.dumps({"steps": 10, "max_steps": 10}))
    (plan.out / "eval").mkdir()
    (plan.out / "eval" / "eval.json").write_text(json.dumps({
        "overall": {"n_problems": 8}, "settings": {
            "n": 4, "k": [1, 4], "temperature": 1.0, "split": "test", "seed": 0,
            "max_new_tokens": 10, "cpu_seconds": eval_cpu}}))
    (plan.out / "eval" / "problems.jsonl").write_text("{}\n" * 8)


def test_plan_sets_the_price_of_finished_runs_beside_what_they_took(tiny_model, tmp_path):
    """Seed 0 took 10 × 100 + 300 = 1300 CPU-s, seed 1 10 × 400 + 700 = 4700: 6000 = 1.67 h.
    The reference's rates price each at 9480 − 0 (start-up) CPU-s (training 7200, validation
    1080, evaluation 1200): 18960 = 5.27 h, 3.16× in all, per run 9480/4700 = 2.02 to
    9480/1300 = 7.29. A run whose evaluation's CPU was not measured, or unfinished, is left
    out; none left: no line."""
    from explorl.study.pricing import check_lines, measured_cpu

    path = _spec(tmp_path, tiny_model, seeds=[0, 1, 2])
    plans = plan_runs(load_spec(path), path, tmp_path / "o")
    _fake_run(tmp_path / "ref", plans[0].cfg)
    model = model_id(plans[0].cfg)
    rates = {model: from_runs([tmp_path / "ref"], model, "r")}
    assert check_lines(plans, rates) == []
    _finished(plans[0], 100.0, 300.0)
    _finished(plans[1], 400.0, 700.0)
    _finished(plans[2], 100.0, None)
    assert [measured_cpu(p) for p in plans] == [1300.0, 4700.0, None]
    (line,) = check_lines(plans, rates)
    assert line == ("  the 2 finished runs took 1.67 CPU-hours (process start-ups excluded); "
                    "these rates price them at 5.27 (3.16×; per run 2.02–7.29×)")
    steps = (plans[1].out / "metrics.jsonl").read_text().splitlines()
    (plans[1].out / "metrics.jsonl").write_text("\n".join(steps[:-1]) + "\n")  # a step untimed
    assert measured_cpu(plans[1]) is None
    assert check_lines(plans, rates)[0].startswith("  the 1 finished run took 0.361 CPU-hours")


def test_a_run_from_the_studys_start_is_priced_as_the_start_runs_model(tiny_model, tmp_path):
    """A final run whose ``model.path`` is the study's ``start/checkpoints/step-N`` measured
    the start run's model (the same network): its steps count in that model's rates, also
    when the study was moved (the path is read from the run's own study folder)."""
    from explorl.study.rates import run_config, run_model

    path = _spec(tmp_path, tiny_model)
    (plan,) = plan_runs(load_spec(path), path, tmp_path / "o")
    study = tmp_path / "moved"
    _fake_run(study / "start", plan.cfg)
    run = study / "runs" / "grpo-seed0"
    cfg = copy.deepcopy(plan.cfg)
    cfg.model.path = "elsewhere/start/checkpoints/step-10"
    _fake_run(run, cfg)
    model = model_id(plan.cfg)
    assert run_model(run, run_config(run)) == model
    assert from_runs([study / "start", run], model, "s").steps == 4
    (study / "start" / "config.yaml").unlink()  # no start run beside it: its own path
    assert from_runs([run], model, "s") is None


def test_a_jobs_time_to_its_next_checkpoint_and_its_end(tiny_model, tmp_path):
    """At the reference's rates (one job keeps 5/11 cores busy: CPU-s × 2.2 = wall s), a run of
    10 steps checkpointing every 5: its first 5 steps 5 × 720 = 3600 CPU-s and half its 3
    validations' 1080 = 540 → (3600 + 540) × 2.2 = 9108 s; the whole job 9480 × 2.2 = 20856 s.
    From its step-5 checkpoint: 5 steps 3600 and the step-10 validation 360 → 8712 s; with the
    evaluation 1200: 11352 s. The base model's evaluation, 1200 × 2.2 = 2640 s, saves at its
    end; so does a trained run's evaluation. No rates of the model: None."""
    from explorl.outputs.checkpoint import STATE_FILE
    from explorl.study.pricing import job_times

    path = _spec(tmp_path, tiny_model)
    (plan,) = plan_runs(load_spec(path), path, tmp_path / "o")
    plan.cfg.log.checkpoint_every = 5
    _fake_run(tmp_path / "ref", plan.cfg)
    model = model_id(plan.cfg)
    times = job_times({model: from_runs([tmp_path / "ref"], model, "r")})
    assert times(plan, False) == pytest.approx((9108, 20856))
    assert times(plan, True) == pytest.approx((2640, 2640))
    _fake_run(plan.out, plan.cfg)
    (plan.out / "checkpoints" / "step-5").mkdir(parents=True)
    (plan.out / "checkpoints" / "step-5" / STATE_FILE).write_text("")
    assert times(plan, False) == pytest.approx((8712, 11352))
    (plan.out / "summary.json").write_text(json.dumps({"steps": 10, "max_steps": 10}))
    assert times(plan, False) == pytest.approx((2640, 2640))
    assert job_times({})(plan, False) is None
