"""A study priced from its own model's measured rates (``explorl study SPEC --plan``, and the
check of ``--time-limit`` before a study starts).

Rates (``explorl.study.rates``: CPU-s per generated, trained and evaluated token, per process
start) come from ``--cost-from`` run or study directories, else ``--calibrate``, else the
study's own runs in ``--out``, else a cached calibration of the same model and shape. Tokens
come from the spec: a training step generates and trains ``prompts_per_step`` ×
``n_samples`` replies of L tokens, L the measured mean reply length (at most
``rollout.max_response_len``; the upper bound, every reply at the limit, is printed too).

- training: steps × prompts × samples × L × (sampling rate + update rate × ``ppo_epochs``),
  plus one process start per run;
- validation: the in-training validations (``eval.every``, the last step, one before
  training) × their replies (``eval.n_samples`` per problem + a greedy one) × L × the
  evaluation rate;
- evaluation: each final and checkpoint evaluation, (n + 1 greedy) replies per problem × L ×
  the evaluation rate; the base model's (before RL) likewise, plus one process start.

Wall-clock: CPU ÷ (runs at a time × the cores one job keeps busy), and at least the phase's
longest job, phase by phase (the start run, the tuning runs, the final runs with the base
model's evaluation: one more job of their pool), twice: at ``parallel``, the CPU-s per
wall-clock second the measured job got (low where its cores were shared), and with each job's
threads on free cores (``threads_of``: at best).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from explorl import config as C
from explorl.lab.registry import get_task
from explorl.outputs.checkpoint import latest_checkpoint
from explorl.study.plan import (
    RunPlan,
    base_folders,
    eval_done,
    eval_done_at,
    policy_evals,
    run_state,
    with_start,
)
from explorl.study.rates import (
    TokenRates,
    cached,
    from_runs,
    model_id,
    records,
    run_dirs,
    split_size,
    threads_of,
    val_replies,
    validations,
)
from explorl.study.spec import StudySpec


def reply_cap(cfg: C.RunConfig, unknown: float) -> float:
    """Most tokens a reply may have: ``rollout.max_response_len``, else the lab task's, else
    ``unknown``."""
    if cfg.rollout.max_response_len:
        return cfg.rollout.max_response_len
    src = cfg.data.train[0] if cfg.data.train else ""
    try:
        return get_task(src[len("lab:"):]).max_response_len if src.startswith("lab:") else unknown
    except (KeyError, ValueError, ImportError):
        return unknown


@dataclass
class Cost:
    """CPU seconds by part."""

    training: float = 0.0
    validation: float = 0.0
    evaluation: float = 0.0
    base: float = 0.0

    def total(self) -> float:
        return self.training + self.validation + self.evaluation + self.base

    def add(self, other: Cost) -> None:
        self.training += other.training
        self.validation += other.validation
        self.evaluation += other.evaluation
        self.base += other.base


def eval_rate(r: TokenRates) -> float:
    """The evaluation rate; without a measured one, the training sampling rate."""
    return r.eval_s if r.eval_s is not None else r.sample_s


def run_cost(plan: RunPlan, r: TokenRates, length: float | None = None,
             steps: int | None = None, evals: bool = True) -> Cost:
    """One run: ``steps`` (default all) training steps with their validations, one process
    start, and (``evals``) its final and checkpoint evaluations; replies of ``length`` tokens
    (default the measured mean, at most the run's limit)."""
    cfg = plan.cfg
    L = min(r.length, reply_cap(cfg, r.length)) if length is None else length
    steps = cfg.max_steps if steps is None else steps
    replies = cfg.data.prompts_per_step * cfg.rollout.n_samples
    c = Cost(training=steps * replies * L * (r.sample_s + r.update_s * cfg.optim.ppo_epochs)
             + r.start_s)
    c.validation = (validations(cfg, cfg.max_steps - steps) * val_replies(cfg) * L
                    * eval_rate(r))
    if evals:
        c.evaluation = sum(split_size(cfg, e.split, e.max_problems) * (e.n + 1)
                           for _, e in plan.evals) * L * eval_rate(r)
    return c


def base_cost(plan: RunPlan, r: TokenRates, length: float | None = None) -> float:
    """The evaluations of ``plan``'s model before RL (one process)."""
    cfg = plan.cfg
    L = min(r.length, reply_cap(cfg, r.length)) if length is None else length
    replies = sum(split_size(cfg, e.split, e.max_problems) * (e.n + 1)
                  for _, e in policy_evals(plan.evals))
    return replies * L * eval_rate(r) + r.start_s


@dataclass
class Estimate:
    cpu: Cost
    wall_s: float
    upper_cpu_s: float  # every reply at its limit


def estimate(spec: StudySpec, tuning: list[RunPlan], final: list[RunPlan],
             rates: dict[str, TokenRates], jobs: int,
             left: Callable[[RunPlan], tuple[int, bool]] | None = None,
             base_left: Callable[[str, RunPlan], bool] | None = None,
             free: bool = False) -> Estimate:
    """The study's cost (``left``: a plan's (steps, whether its evaluations) still to run;
    ``base_left``: whether a base folder's evaluation is still to run; default: all); its
    wall-clock at the measured ``parallel``, or (``free``) with each job's threads on free
    cores."""
    total, wall, upper = Cost(), 0.0, 0.0
    start = with_start(final)[: len(with_start(final)) - len(final)]  # trained first, alone
    for phase in (start, tuning, final):
        cpu = longest = 0.0  # wall: the phase's CPU over its jobs, at least its longest job
        n = 0
        for p in phase:
            steps, evals = left(p) if left else (p.cfg.max_steps, True)
            if not steps and not evals:
                continue
            r = rates[rated(p)]
            c = run_cost(p, r, steps=steps, evals=evals)
            total.add(c)
            one = c.total() / (threads_of(p.cfg) if free else r.parallel)
            cpu, longest = cpu + one, max(longest, one)
            upper += run_cost(p, r, float(reply_cap(p.cfg, r.length)), steps, evals).total()
            n += 1
        if phase is final and spec.base_eval:  # jobs of the final runs' pool
            for folder, p in base_folders(final).items():
                if base_left and not base_left(folder, p):
                    continue
                r = rates[rated(p)]
                b = base_cost(p, r)
                total.base += b
                one = b / (threads_of(p.cfg) if free else r.parallel)
                cpu, longest = cpu + one, max(longest, one)
                upper += base_cost(p, r, float(reply_cap(p.cfg, r.length)))
                n += 1
        wall += max(cpu / max(1, min(jobs, n)), longest)
    return Estimate(total, wall, upper)


def rated(plan: RunPlan) -> str:
    """The model whose rates price ``plan``: its own (``model_id``), or for a run after a
    ``start`` one, the start's (the same network, the start run's checkpoint)."""
    return model_id((plan.start or plan).cfg)


def models_of(plans: list[RunPlan]) -> dict[str, RunPlan]:
    """Each model the plans train, with its first plan (the ``start`` run first)."""
    out: dict[str, RunPlan] = {}
    for p in with_start(plans):
        out.setdefault(rated(p), p)
    return out


def find_rates(plans: list[RunPlan], out: Path, cost_from: list[Path] | None = None
               ) -> dict[str, TokenRates]:
    """The measured rates of each model of ``plans``: from ``cost_from`` (run or study
    directories), else from the study's own runs in ``out``, else a cached calibration."""
    got: dict[str, TokenRates] = {}
    if cost_from:
        dirs = [d for p in cost_from for d in run_dirs(p)]
        for model in models_of(plans):
            r = from_runs(dirs, model, "runs in " + ", ".join(map(str, cost_from)))
            if r is not None:
                got[model] = r
        return got
    own = run_dirs(out) if out.is_dir() else []
    for model, p in models_of(plans).items():
        r = from_runs(own, model, f"this study's runs in {out}") if own else None
        got_r = r or cached(p.cfg)
        if got_r is not None:
            got[model] = got_r
    return got


def hours(s: float) -> str:
    return f"{s / 3600:.3g}"


def rate_lines(rates: dict[str, TokenRates]) -> list[str]:
    lines = []
    for model, r in rates.items():
        ev = (f"evaluation {r.eval_s:.4g} per token ({r.per_reply():.3g} per reply)"
              if r.eval_s is not None else "evaluation not measured: priced at the sampling rate")
        start = f", start-up {r.start_s:.0f} CPU-s per process" if r.start_s else \
            " (process start-up not measured)"
        lines.append(f"rates of {model} ({r.source}; {r.steps} steps at {r.threads} "
                     f"thread{'s' if r.threads > 1 else ''}): CPU-s {r.sample_s:.4g} per "
                     f"generated token, {r.update_s:.4g} per trained token, {ev}{start}; "
                     f"replies {r.length:.1f} tokens on average; one job kept {r.parallel:.2f} "
                     "cores busy")
    return lines


def cost_lines(spec: StudySpec, tuning: list[RunPlan], final: list[RunPlan],
               rates: dict[str, TokenRates], jobs: int) -> list[str]:
    """The estimate's lines of ``--plan``."""
    missing = [m for m in models_of([*tuning, *final]) if m not in rates]
    if missing:
        return [f"no measured rates of {m} at this study's shape: price it with --calibrate "
                "(a few training steps and an evaluation, cached) or --cost-from a run or "
                "study directory of the same model" for m in missing]
    est = estimate(spec, tuning, final, rates, jobs)
    free = estimate(spec, tuning, final, rates, jobs, free=True).wall_s
    c = est.cpu
    p = final[0]
    r = rates[rated(p)]
    L = min(r.length, reply_cap(p.cfg, r.length))
    step = (p.cfg.data.prompts_per_step * p.cfg.rollout.n_samples * L
            * (r.sample_s + r.update_s * p.cfg.optim.ppo_epochs))
    other = [f"  (measured at {rates[m].threads} thread(s); this study's {p.name} runs with "
             f"{threads_of(p.cfg)}: its CPU seconds per token and the cores a job keeps busy "
             "differ; --calibrate measures them at its own setting)"
             for m, p in models_of([*tuning, *final]).items()
             if rates[m].threads != threads_of(p.cfg)]
    return [*rate_lines(rates), *other,
            f"  a training step of {p.name}: {p.cfg.data.prompts_per_step} prompts × "
            f"{p.cfg.rollout.n_samples} samples × {L:.1f} tokens ≈ {step:.3g} CPU-s",
            f"estimated CPU-hours: training {hours(c.training)}, validation "
            f"{hours(c.validation)}, evaluation {hours(c.evaluation)} (final and checkpoints), "
            f"base model {hours(c.base)}; total {hours(c.total())} (at most "
            f"{hours(est.upper_cpu_s)} if every reply ran to its limit)",
            *check_lines(final, rates),
            f"  wall-clock with {jobs} job{'s' if jobs > 1 else ''} at a time (CPU ÷ jobs ÷ the "
            f"cores one job keeps busy): ≈ {hours(est.wall_s)} h at the {r.parallel:.2f} cores "
            f"a job got when measured, ≈ {hours(free)} h with each job's {threads_of(p.cfg)} "
            f"thread{'s' if threads_of(p.cfg) > 1 else ''} on free cores (at best)"]


def measured_cpu(plan: RunPlan) -> float | None:
    """CPU seconds a finished run took for the work ``run_cost`` prices, process start-ups
    excluded: its steps' ``time/cpu_s`` (their validations included) and its evaluations'
    ``cpu_seconds``. None unless it finished training and every evaluation, each measured."""
    if _left(plan) != (0, False):
        return None
    steps = {r["step"]: float(r["time/cpu_s"]) for r in records(plan.out)
             if r.get("time/cpu_s") is not None and "step" in r}
    if len(steps) < plan.cfg.max_steps:  # a step without its time: not measured whole
        return None
    evals = 0.0
    for folder, _ in plan.evals:
        try:
            cpu = json.loads((plan.out / folder / "eval.json").read_text())["settings"][
                "cpu_seconds"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if cpu is None:
            return None
        evals += float(cpu)
    return sum(steps.values()) + evals


def check_lines(final: list[RunPlan], rates: dict[str, TokenRates]) -> list[str]:
    """The price of the final runs that finished beside what they took (``measured_cpu``): in
    all, and the range of the per-run ratio. Rates pooled from these same runs fit their total
    by construction; the per-run range shows how far one run's reply lengths move its cost."""
    pairs = []
    for p in final:
        took = measured_cpu(p)
        r = rates.get(rated(p))
        if took and r is not None:
            pairs.append((run_cost(p, r).total() - r.start_s, took))
    if not pairs:
        return []
    priced, took = sum(a for a, _ in pairs), sum(b for _, b in pairs)
    ratios = sorted(a / b for a, b in pairs)
    per_run = (f"; per run {ratios[0]:.2f}–{ratios[-1]:.2f}×" if len(pairs) > 1 else "")
    return [f"  the {len(pairs)} finished run{'s' if len(pairs) > 1 else ''} took "
            f"{hours(took)} CPU-hours (process start-ups excluded); these rates price "
            f"{'them' if len(pairs) > 1 else 'it'} at {hours(priced)} ({priced / took:.2f}×"
            f"{per_run})"]


def time_limit_lines(spec: StudySpec, tuning: list[RunPlan], final: list[RunPlan], out: Path,
                     jobs: int, limit_s: float, rates: dict[str, TokenRates] | None = None
                     ) -> list[str]:
    """Before a study starts under ``--time-limit``: whether what is left of it fits, from
    ``rates`` (default: those ``find_rates`` finds; none: how to get them)."""
    rates = find_rates([*tuning, *final], out) if rates is None else rates
    missing = [m for m in models_of([*tuning, *final]) if m not in rates]
    lim = f"--time-limit {limit_s / 3600:.2g} h"
    if missing:
        return [f"{lim}: no measured rates of {', '.join(missing)} to check it against (price "
                "the study first: explorl study SPEC --plan --calibrate)"]
    est = estimate(spec, tuning, final, rates, jobs, _left, _base_left(spec))
    if est.wall_s <= limit_s:
        return [f"{lim}: the work left is estimated at {hours(est.wall_s)} h of wall-clock "
                f"({hours(est.cpu.total())} CPU-hours): it fits"]
    return [f"WARNING {lim}: the work left is estimated at {hours(est.wall_s)} h of "
            f"wall-clock ({hours(est.cpu.total())} CPU-hours at {jobs} job"
            f"{'s' if jobs > 1 else ''} at a time), more than the limit: this invocation "
            "will not finish the study; it stops at the limit (exit 75) and a rerun, or "
            "--pack and --from elsewhere, continues it"]


def job_times(rates: dict[str, TokenRates]) -> Callable[[RunPlan, bool], tuple[float, float]
                                                             | None]:
    """For ``--time-limit`` (``jobs.Deadline``): a job's estimated wall seconds at the rates'
    measured ``parallel`` (until it first saves work, until it ends). A run with steps left
    saves at its next checkpoint (``log.checkpoint_every`` steps; 0: its end): its process
    start, those steps and their share of its validations; an evaluation saves nothing until it
    ends. ``base``: the evaluation of the model the run starts from. None: no rates of its
    model."""
    def times(plan: RunPlan, base: bool = False) -> tuple[float, float] | None:
        r = rates.get(rated(plan))
        if r is None:
            return None
        if base:
            b = base_cost(plan, r) / r.parallel
            return b, b
        steps, evals = _left(plan)
        whole = run_cost(plan, r, steps=steps, evals=evals).total() / r.parallel
        if not steps:
            return whole, whole
        every = plan.cfg.log.checkpoint_every or plan.cfg.max_steps
        done = plan.cfg.max_steps - steps
        k = min(steps, every - done % every)
        train = run_cost(plan, r, steps=steps, evals=False)
        first = (r.start_s + (train.training - r.start_s) * k / steps
                 + train.validation * k / steps) / r.parallel
        return first, whole
    return times


def _left(plan: RunPlan) -> tuple[int, bool]:
    """Steps still to train and whether evaluations are left, of a run in its folder."""
    try:
        state = run_state(plan)
    except C.ConfigError:
        state = "restart"
    if state == "done":
        return 0, not eval_done(plan)
    ckpt = latest_checkpoint(plan.out) if state == "resume" else None
    done = int(ckpt.name.split("-")[-1]) if ckpt is not None else 0
    return plan.cfg.max_steps - done, True


def _base_left(spec: StudySpec) -> Callable[[str, RunPlan], bool]:
    def left(folder: str, plan: RunPlan) -> bool:
        out = plan.out.parent.parent / folder
        return not all(eval_done_at(out / f, e) for f, e in policy_evals(plan.evals))
    return left

