"""A calibration (``explorl study SPEC --plan --calibrate``): a few training steps of a study's
first run of each model, with the study's settings, then an evaluation, in one job process as
the study runs them; its CPU rates (``explorl.study.rates``) are cached per model and shape.

The job trains ``steps`` steps with a validation at the last and then runs ``explorl eval``
with the study's samples per problem. Both sample a whole generation batch
(``rollout.batch_size`` rows) where the study's would: a CPU decodes many rows per step more
cheaply per token than a few, so a smaller batch would overprice the study's evaluations. The
process's CPU time (``getrusage`` of the child, its own children included) less the steps' and
the evaluation's is its start-up: imports, model loads, the final save.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from explorl.errors import ConfigError
from explorl.study.jobs import _env, eval_args, job_command, train_args
from explorl.study.plan import RunPlan
from explorl.study.rates import TokenRates, from_runs, model_id, split_size, store
from explorl.study.spec import StudyEvalSpec, StudySpec


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def batch_problems(rows: int, n: int, available: int) -> int:
    """Problems whose ``n`` samples each fill ``rows`` generation rows, at most ``available``."""
    return max(1, min(available, -(-rows // n)))


def calibration_commands(plan: RunPlan, spec: StudySpec, out: Path,
                         steps: int) -> list[list[str]]:
    """``explorl train`` of ``plan`` for ``steps`` steps into ``out`` (a validation at the last,
    no checkpoints but the final one), then ``explorl eval`` of it: each a generation batch of
    the study's samples per problem (``batch_problems``)."""
    cfg, e = plan.cfg, spec.eval
    rows = cfg.rollout.batch_size
    val = batch_problems(rows, cfg.eval.n_samples, split_size(cfg, "val", cfg.eval.max_problems))
    sets = [*plan.sets, f"eval.every={steps}", "eval.before_training=false",
            f"eval.max_problems={val}", "eval.k=[1]", "log.checkpoint_every=0",
            "log.plots=false", "log.progress=false"]
    problems = batch_problems(rows, e.n, split_size(cfg, e.split, e.max_problems))
    small = StudyEvalSpec(n=e.n, temperature=e.temperature, k=[1], split=e.split,
                          max_problems=problems, seed=e.seed)
    cal = dataclasses.replace(plan, sets=sets, out=out, evals=[("eval", small)],
                              cfg=dataclasses.replace(cfg, max_steps=steps))
    return [train_args(cal, "fresh"), eval_args(cal, spec)]


def calibrate(plan: RunPlan, spec: StudySpec, steps: int = 2,
              log: Callable[[str], None] = print, keep: Path | None = None) -> TokenRates:
    """Measure and cache the rates of ``plan``'s model at its shape (``keep``: the run's
    directory, for a test; default a temporary one, removed)."""
    model = model_id(plan.cfg)
    log(f"calibrating {model}: {steps} training steps of {plan.name}, a validation and an "
        "evaluation of one generation batch each, one job as the study runs it …")
    with tempfile.TemporaryDirectory(prefix="explorl-calibrate-") as tmp:
        out = keep or Path(tmp) / "run"
        logfile = out.parent / f"{out.name}.calibration.log"
        out.parent.mkdir(parents=True, exist_ok=True)
        cpu0, t0 = _child_cpu(), time.perf_counter()
        with logfile.open("w") as f:
            rc = subprocess.call(job_command(calibration_commands(plan, spec, out, steps)),
                                 stdout=f, stderr=subprocess.STDOUT, env=_env())
        cpu, wall = _child_cpu() - cpu0, time.perf_counter() - t0
        if rc != 0:
            tail = "\n".join(logfile.read_text().splitlines()[-15:])
            raise ConfigError(f"calibration of {model} failed (exit code {rc}):\n{tail}")
        rates = from_runs([out], model, f"calibration: {steps} steps of {plan.name}")
        if rates is None or rates.eval_s is None:
            raise ConfigError(f"calibration of {model}: its run recorded no timed step or "
                              f"evaluation (see {out})")
        rates.start_s = max(0.0, cpu - _measured_cpu(out))
    path = store(plan.cfg, rates)
    log(f"  {cpu:.0f} CPU-s in {wall:.0f} s of wall-clock; rates cached in {path}")
    return rates


def _measured_cpu(run: Path) -> float:
    """CPU seconds the run's steps and evaluations recorded (``time/cpu_s``, ``cpu_seconds``)."""
    total = 0.0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            total += float(json.loads(line).get("time/cpu_s", 0.0))
        except ValueError:
            continue
    for ev in run.glob("eval*/eval.json"):
        total += float(json.loads(ev.read_text())["settings"].get("cpu_seconds", 0.0))
    return total
