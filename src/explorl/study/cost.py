"""What a study will cost before it runs: ``plan_study`` (``explorl study SPEC --plan``) prints
its runs and prices them from its model's measured rates (``explorl.study.pricing``), or, given
the lab's committed study reports (``study.json``), from their per-run CPU seconds (below).

From reports, training: each run's steps × the reference's CPU seconds per step for that recipe
(the mean of its runs' ``cpu_run_s / steps``, validation included; a variant falls back to its
recipe, a recipe the reference lacks to the reference's mean over runs), × the size factor of
the lab model (the reference's ``grpo_large`` per-step cost over its ``grpo``'s). Evaluation:
every sample of the final and tuning evaluations, the base model's and the validation samples
beyond the reference's, at ``EVAL_CPU_S_PER_SAMPLE`` (× the size factor). Start-up is included
in both rates. A report of another model than the study's is refused (``check_same_model``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from explorl import config as C
from explorl.errors import ConfigError
from explorl.study.calibrate import calibrate as measure
from explorl.study.plan import (
    RunPlan,
    base_folders,
    plan_runs,
    plan_tuning,
    policy_evals,
    start_checkpoint_of,
    with_start,
)
from explorl.study.pricing import cost_lines, find_rates, models_of
from explorl.study.run import progress
from explorl.study.spec import StudySpec, auto_jobs, load_spec

EVAL_CPU_S_PER_SAMPLE = 15.0 / (256 * 64)
"""CPU seconds per evaluation sample of the ~0.9M lab model, start-up included: ≈ 15 s for 256
problems × 64 samples on subset_sum (docs/lab-study/regime.md, 2-core machine)."""


@dataclass
class Rates:
    """CPU seconds per training step per recipe name, their mean, validation samples per run
    of the reference, and the large model's cost factor."""

    per_step: dict[str, float]
    mean: float
    val_samples: float
    large: float

    @classmethod
    def from_reports(cls, paths: list[Path]) -> Rates:
        by: dict[str, list[float]] = {}
        val = []
        for path in paths:
            try:
                data = json.loads(Path(path).read_text())
                sets = data["spec"]["set"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ConfigError(
                    f"--cost-from {path}: not a study report's study.json ({e})") from e
            before = len(val)
            every = _set_value(sets, "eval.every", 10)
            n = _set_value(sets, "eval.n_samples", 4) * _set_value(sets, "eval.max_problems", 128)
            for key, run in data["runs"].items():
                if run.get("cpu_run_s") and run.get("steps"):
                    by.setdefault(key.rsplit("-seed", 1)[0], []).append(
                        run["cpu_run_s"] / run["steps"])
                    val.append((run["steps"] // every + 1) * n)
            if len(val) == before:
                raise ConfigError(f"--cost-from {path}: no run records its CPU seconds "
                                  "(cpu_run_s); give a study report that does, e.g. "
                                  "docs/lab-study/subset_sum/study.json")
        per = {k: statistics.fmean(v) for k, v in by.items()}
        small = [v for k, v in per.items() if not k.endswith("_large")]
        large = per["grpo_large"] / per["grpo"] if "grpo_large" in per and "grpo" in per else 1.0
        return cls(per, statistics.fmean(small), statistics.fmean(val), large)

    def step(self, plan: RunPlan) -> float:
        for name in (plan.name, plan.recipe.stem):
            if name in self.per_step and not name.endswith("_large"):
                return self.per_step[name] * self.size(plan)
        return self.mean * self.size(plan)

    def size(self, plan: RunPlan) -> float:
        return self.large if plan.cfg.lab.model_size == "large" else 1.0


def _set_value(sets: list[str], key: str, default: int) -> int:
    for s in reversed(sets):
        if s.startswith(key + "="):
            return int(s.split("=", 1)[1])
    return default


def run_cpu_s(plan: RunPlan, rates: Rates) -> float:
    """One run: training + its validations beyond the reference's + its final evaluations."""
    cfg, size = plan.cfg, rates.size(plan)
    ev = cfg.eval
    val = ((cfg.max_steps // ev.every + 1) * ev.n_samples * ev.max_problems if ev.every else 0)
    samples = max(0.0, val - rates.val_samples)
    for _, e in plan.evals:
        samples += e.n * _problems(cfg, e.split, e.max_problems)
    return cfg.max_steps * rates.step(plan) + samples * EVAL_CPU_S_PER_SAMPLE * size


def _problems(cfg, split: str, max_problems: int | None) -> int:
    n = {"train": cfg.lab.n_train, "val": cfg.lab.n_val, "test": cfg.lab.n_test}[split]
    return min(n, max_problems) if max_problems else n


def estimate(spec: StudySpec, tuning: list[RunPlan], final: list[RunPlan],
             rates: Rates) -> dict[str, float]:
    """CPU seconds of the ``start`` run, the tuning runs, the final runs and the evaluations of
    each model the final runs start from (``base_folders``: the 9.6M lab model's at its cost
    factor)."""
    base = 0.0
    for p in base_folders(final).values() if spec.base_eval else ():
        base += sum(e.n * _problems(p.cfg, e.split, e.max_problems)
                    for _, e in policy_evals(p.evals)) * EVAL_CPU_S_PER_SAMPLE * rates.size(p)
    start = with_start(final)[: len(with_start(final)) - len(final)]
    return {"start": sum(run_cpu_s(p, rates) for p in start),
            "tuning": sum(run_cpu_s(p, rates) for p in tuning),
            "final": sum(run_cpu_s(p, rates) for p in final), "base": base}


def plan_text(spec: StudySpec, tuning: list[RunPlan], final: list[RunPlan],
              rates: Rates | None, jobs: int) -> list[str]:
    """The lines ``explorl study SPEC --plan`` prints."""
    steps = sum(p.cfg.max_steps for p in with_start([*tuning, *final]))
    extend = (f", up to {spec.tuning.extend * len(spec.tune) * len(spec.tuning.seeds)} more "
              "where a choice is its grid's edge" if spec.tuning.extend else "")
    tuned = (f"{len(tuning)} tuning runs ({len(spec.tune)} grids × {len(spec.tuning.seeds)} "
             f"seeds{extend})" if spec.tune else "no tuning")
    lines = [f"study {spec.name}: {tuned} + {len(final)} final runs "
             f"({len(final) // max(1, len(spec.seeds))} rows × {len(spec.seeds)} seeds); "
             f"{steps} training steps; {len(spec.eval.all_temperatures())} evaluation "
             "temperature(s)", *start_lines(final)]
    if rates is None:
        return lines + ["(pass --cost-from REPORT/study.json for a CPU-hour estimate)"]
    got = estimate(spec, tuning, final, rates)
    total = sum(got.values())
    lines.append("estimated CPU-hours: " + ", ".join(f"{k} {v / 3600:.2f}" for k, v in got.items())
                 + f"; total {total / 3600:.2f} (lab model builds not included)")
    for j in sorted({jobs, 2, 16}):
        lines.append(f"  ≈ {total / 3600 / j:.1f} h of wall-clock with {j} jobs on {j} free cores")
    return lines


def start_lines(final: list[RunPlan]) -> list[str]:
    """The ``start`` run of ``--plan`` (none without one)."""
    return [f"start: {p.recipe.stem} seed {p.seed}, {p.cfg.max_steps} steps → {p.out}, trained "
            f"first; every run starts from its final checkpoint {start_checkpoint_of(p)}, and "
            "the base model's evaluation is of that policy"
            for p in with_start(final)[: len(with_start(final)) - len(final)]]


def report_model(data: dict) -> str | None:
    """The model a report's runs trained: its spec's ``model.path`` override, else its lab
    task's model (None when the report names neither)."""
    spec = data.get("spec") or {}
    for s in reversed(spec.get("set") or []):
        if str(s).startswith("model.path="):
            return str(s).split("=", 1)[1].strip()
    return f"lab:{spec['task']}" if spec.get("task") else None


def check_same_model(paths: list[Path], plans: list[RunPlan]) -> None:
    """``--cost-from`` reports price a study only when their runs trained its models: a report
    of the lab model says nothing about SmolLM2's cost."""
    found = {}
    for path in paths:
        try:
            found[path] = report_model(json.loads(Path(path).read_text()))
        except (OSError, ValueError, AttributeError, TypeError):
            continue  # Rates.from_reports says what is wrong with it
    mine = sorted({(p.start or p).cfg.model.path for p in plans})  # a start's: its network
    for path, model in found.items():
        if model is not None and model not in mine:
            raise ConfigError(f"--cost-from {path}: its runs trained {model}, this study trains "
                              f"{', '.join(mine)}: price it from runs of the same model "
                              "(--cost-from a run or study directory) or with --calibrate")


def plan_study(spec_path: str | Path, *, quick: bool = False, jobs: int | str | None = None,
               recipes: str | Path | None = None, cost_from: list[str] | None = None,
               out: str | Path | None = None, calibrate: int | None = None,
               log: Callable[[str], None] = print) -> int:
    """``explorl study SPEC --plan``: check the spec, print its runs, the estimated CPU-hours
    and wall-clock from its models' measured rates (``find_rates``; ``calibrate``: measure them
    first with that many training steps; ``cost_from``: run or study directories, or the lab's
    committed ``study.json`` reports, ``explorl.study.cost``) and, when the study directory
    exists, how far it has got; train nothing (a calibration trains its few steps)."""
    spec_path = Path(spec_path)
    spec = load_spec(spec_path, quick=quick)
    if recipes is not None:
        spec.recipe_dir = str(Path(recipes).resolve())
    jobs = jobs or spec.jobs
    jobs = auto_jobs() if jobs == "auto" else jobs
    out = Path(out) if out else Path("runs") / f"study-{spec.name}{'-quick' if quick else ''}"
    tuning = plan_tuning(spec, spec_path, out) if spec.tune else []
    final = plan_runs(spec, spec_path, out)
    paths = [Path(p) for p in cost_from or []]
    reports = [p for p in paths if not p.is_dir()]
    if reports and calibrate:
        raise C.ConfigError("--calibrate and --cost-from STUDY_JSON do not go together")
    if reports:  # the lab's committed reports: CPU seconds per step of the same recipes
        if len(reports) < len(paths):
            raise C.ConfigError("--cost-from: give study.json reports or run/study directories, "
                                "not both")
        check_same_model(reports, [*tuning, *final])
        for line in plan_text(spec, tuning, final, Rates.from_reports(reports), jobs):
            log(line)
    else:
        for line in plan_text(spec, tuning, final, None, jobs)[:1 + len(start_lines(final))]:
            log(line)
        rates = {}
        if calibrate:
            rates = {m: measure(p, spec, calibrate, log)
                     for m, p in models_of([*tuning, *final]).items()}
        else:
            rates = find_rates([*tuning, *final], out, paths or None)
            if paths and not rates:
                raise C.ConfigError(f"--cost-from {' '.join(map(str, paths))}: no run there "
                                    "trained " + ", ".join(models_of([*tuning, *final]))
                                    + " with timed steps (metrics.jsonl's time/cpu_s)")
        for line in cost_lines(spec, tuning, final, rates, jobs):
            log(line)
    if out.is_dir():
        log(progress(spec, spec_path, out))
    return 0
