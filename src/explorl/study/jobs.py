"""Running the study's (recipe, seed) jobs: each trains (or resumes) and evaluates its run in its
own process, ``jobs`` at a time; what is finished is skipped.

A job's process is ``python -m explorl train … --then eval …``: the two commands of the
``explorl`` command line, chained in one Python so the run pays the torch/transformers import
once. The study calls the command line only through that process, never by import.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from explorl.lab.registry import get_task
from explorl.outputs.checkpoint import list_checkpoints
from explorl.study.plan import (
    RunPlan,
    checkpoint_of,
    eval_done,
    eval_done_at,
    lab_ref,
    policy_evals,
    run_state,
)
from explorl.study.spec import StudyEvalSpec, StudySpec, auto_jobs

THEN = "--then"  # explorl.cli.THEN: separates commands run in turn in one process


def train_args(plan: RunPlan, state: str) -> list[str]:
    """``explorl train`` arguments that start (``fresh``/``restart``) or ``resume`` the run."""
    if state == "resume":
        return ["train", "--resume", str(plan.out)]
    args = ["train", str(plan.recipe), "--out", str(plan.out), "--seed", str(plan.seed),
            "--max-steps", str(plan.cfg.max_steps)]
    for s in plan.sets:
        args += ["--set", s]
    return args + (["--force"] if state == "restart" else [])


def _protocol(e: StudyEvalSpec) -> list[str]:
    args = ["--split", e.split, "--n", str(e.n), "--k", *map(str, e.k), "--temperature",
            str(e.temperature), "--seed", str(e.seed)]
    return args + (["--max-problems", str(e.max_problems)] if e.max_problems else [])


def eval_args(plan: RunPlan, spec: StudySpec, which: int = 0) -> list[str]:
    """``explorl eval`` arguments that evaluate the run's final checkpoint with its ``which``-th
    protocol (``plan.evals``: the main one into ``<run>/eval/``); an ``eval_step<N>`` one
    evaluates the checkpoint of step N, with the run's lab section and response length."""
    folder, e = plan.evals[which]
    step = checkpoint_of(folder)
    if step is not None:
        return base_eval_args(plan, spec, plan.out / folder, e,
                              model=str(plan.out / "checkpoints" / f"step-{step}"))
    return ["eval", str(plan.out), "--data", lab_ref(spec.task), *_protocol(e), "--out",
            str(plan.out / folder)]


def job_command(commands: list[list[str]]) -> list[str]:
    """The child process of one job: ``python -m explorl`` running ``commands`` in turn."""
    argv = [sys.executable, "-m", "explorl"]
    for i, c in enumerate(commands):
        argv += ([THEN] if i else []) + c
    return argv


def _env() -> dict[str, str]:
    # One thread per job: `jobs` runs share the cores; more threads per run only contend.
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}


EXIT_TIME_LIMIT = 75  # sysexits' EX_TEMPFAIL, as `explorl train` stopped by SIGTERM: rerun


def parse_duration(text: str) -> float:
    """Seconds of ``90``, ``90s``, ``50m``, ``2h`` or ``1h30m`` (``--time-limit``)."""
    import re

    t = str(text).strip().lower()
    m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", t)
    if not t or m is None or not any(m.groups()):
        raise ValueError(f"expected a duration such as 90s, 50m, 2h or 1h30m, got {text!r}")
    h, mins, sec = (float(g) if g else 0.0 for g in m.groups())
    total = h * 3600 + mins * 60 + sec
    if total <= 0:
        raise ValueError(f"must be more than 0, got {text!r}")
    return total


@dataclass
class Deadline:
    """A study invocation's time limit (``--time-limit``): a job starts only when it would save
    its work before the limit; at the limit the running jobs are stopped (SIGTERM: the runs
    write a checkpoint after their current step, a rerun resumes them).

    With ``times`` (``pricing.job_times``: a job's estimated wall seconds until it first saves
    work, and until it ends, from the model's measured rates) a job that trains starts when it
    would reach its next checkpoint (``log.checkpoint_every``) or its end, and one that only
    evaluates when it would finish, each × ``slower`` (the most a job of this invocation has
    overrun its estimate, at least 1). A job without an estimate starts when the longest job
    this invocation has finished would still end before the limit (the first jobs always
    start). ``clock``: ``time.monotonic`` (a test passes its own)."""

    at: float
    clock: Callable[[], float] = time.monotonic
    longest: float = 0.0
    reached: bool = False
    times: JobTimes | None = None
    slower: float = 1.0

    @classmethod
    def after(cls, seconds: float, times: JobTimes | None = None) -> Deadline:
        return cls(time.monotonic() + seconds, times=times)

    def estimate(self, plan: RunPlan | None, base: bool = False) -> tuple[float, float] | None:
        """(wall seconds until ``plan``'s job first saves work, until it ends), or None."""
        return None if self.times is None or plan is None else self.times(plan, base)

    def allows(self, plan: RunPlan | None = None, base: bool = False) -> bool:
        if self.reached:
            return False
        est = self.estimate(plan, base)
        need = self.longest if est is None else est[0] * self.slower
        return self.clock() + need <= self.at

    def finished(self, seconds: float, estimated: float | None = None) -> None:
        """A job ended in ``seconds`` (its whole estimate: ``estimated``)."""
        self.longest = max(self.longest, seconds)
        if estimated:
            self.slower = max(self.slower, seconds / estimated)


JobTimes = Callable[[RunPlan, bool], "tuple[float, float] | None"]
"""A job's estimated wall seconds (until it first saves work, until it ends): of ``plan``'s run,
or (True) of the evaluation of the model it starts from; None: no estimate."""


@dataclass
class JobResult:
    plan: RunPlan
    status: str  # "done" | "skipped" | "failed" | "interrupted" | "deferred" (the time limit)
    detail: str = ""
    seconds: float = 0.0


def execute(plan: RunPlan, spec: StudySpec, logs: Path, stop: threading.Event,
            deadline: Deadline | None = None, running: dict | None = None) -> JobResult:
    """Train (or resume) one run, then evaluate its final policy; skip what is already done.
    ``deadline``: a job that would not save its work before it is deferred (``Deadline``);
    ``running``: this job's process while it runs (key: the plan's), for the deadline to stop
    it."""
    t0 = time.perf_counter()
    state = run_state(plan)
    commands = []
    if state != "done":
        # Stale evaluations of an older policy.
        for folder, _ in plan.evals:
            shutil.rmtree(plan.out / folder, ignore_errors=True)
        commands.append(train_args(plan, state))
    for i, (folder, e) in enumerate(plan.evals):
        if state != "done" or not eval_done_at(plan.out / folder, e):
            commands.append(eval_args(plan, spec, i))
    if not commands:
        free_disk(plan, spec)
        return JobResult(plan, "skipped", state)
    est = deadline.estimate(plan) if deadline is not None else None
    if deadline is not None and not deadline.allows(plan):
        return JobResult(plan, "deferred", "the time limit")
    if stop.is_set():
        return JobResult(plan, "interrupted", "not started")
    log = logs / f"{plan.key}.log"
    rc = _spawn(commands, log, plan.key, deadline, running)
    seconds = time.perf_counter() - t0
    if deadline is not None and rc == 0:
        deadline.finished(seconds, est[1] if est else None)
    if rc == 130 or stop.is_set():
        return JobResult(plan, "interrupted", f"exit code {rc}", seconds)
    if rc != 0 or run_state(plan) != "done" or not eval_done(plan, spec):
        return JobResult(plan, "failed", f"exit code {rc}; log {log}", seconds)
    free_disk(plan, spec)
    return JobResult(plan, "done", state, seconds)


def _spawn(commands: list[list[str]], log: Path, key: str, deadline: Deadline | None,
           running: dict | None) -> int:
    """Run ``commands`` in one job process, appending to ``log``; its exit code. While it runs
    it is ``running[key]``, so the deadline can send it SIGTERM."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        proc = subprocess.Popen(job_command(commands), stdout=f, stderr=subprocess.STDOUT,
                                env=_env())
        if running is not None:
            running[key] = proc
            if deadline is not None and deadline.reached:  # the limit passed as it started
                proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait()
        finally:
            if running is not None:
                running.pop(key, None)


def free_disk(plan: RunPlan, spec: StudySpec) -> list[Path]:
    """With ``keep_finished: final``, remove a finished run's checkpoints but its last (every
    evaluation of them is done); the removed ones."""
    if spec.keep_finished != "final":
        return []
    stale = list_checkpoints(plan.out)[:-1]
    for ckpt in stale:
        shutil.rmtree(ckpt, ignore_errors=True)
    return stale


Before = Callable[[threading.Event, Deadline | None, dict], str]


def run_jobs(plans: list[RunPlan], spec: StudySpec, logs: Path,
             log: Callable[[str], None], deadline: Deadline | None = None,
             on_done: Callable[[], None] | None = None,
             before: Sequence[Before] = (), times: JobTimes | None = None
             ) -> list[JobResult] | None:
    """Every plan's job, ``spec.jobs`` at a time (``auto``: the cores this process may use),
    logging each as it ends and then calling ``on_done`` (for each that ran: not a skipped or
    deferred one); None if interrupted (the running jobs checkpoint and stop). With a
    ``deadline``, jobs that would not save their work before it are deferred, and at it the
    running ones are sent SIGTERM (they checkpoint and stop; ``deadline.reached`` says so).
    ``before``: jobs that are not runs (the base model's evaluation), started first in the same
    pool, so a core that one leaves free starts a run; each is called with (stop, deadline,
    running) and returns the line logged when it ends. ``times``: each run's estimated
    wall-clock (``pricing.job_times``; default the deadline's) for the ETA logged as each job
    ends."""
    t0 = time.perf_counter()
    plans = baseline_first(plans, spec)
    stop = threading.Event()
    running: dict = {}
    timer = None
    if deadline is not None:
        def expire() -> None:
            deadline.reached = True
            stop.set()
            for proc in list(running.values()):
                proc.send_signal(signal.SIGTERM)

        timer = threading.Timer(max(0.0, deadline.at - deadline.clock()), expire)
        timer.daemon = True
        timer.start()
    results: list[JobResult] = []
    workers = auto_jobs() if spec.jobs == "auto" else spec.jobs
    todo = sum(not finished(p) for p in plans)  # the runs that will train or evaluate
    times = times or (deadline.times if deadline is not None else None)
    whole = {}  # each run's estimated wall seconds, from the measured rates (for the ETA)
    for p in plans if times is not None else ():
        est = times(p, False)
        if est is not None:
            whole[p.key] = est[1]
    pool = ThreadPoolExecutor(max_workers=workers)
    extra = {pool.submit(job, stop, deadline, running): job for job in before}
    futures = {pool.submit(execute, p, spec, logs, stop, deadline, running): p for p in plans}
    i = 0
    try:
        for fut in as_completed([*extra, *futures]):
            if fut in extra:
                try:
                    log(f"  {fut.result()}")
                except Exception as e:  # noqa: BLE001 — the runs go on without it
                    log(f"  {type(e).__name__}: {e}")
                continue
            i += 1
            try:
                r = fut.result()
            except Exception as e:  # noqa: BLE001 — one broken run must not lose the others
                r = JobResult(futures[fut], "failed", f"{type(e).__name__}: {e}")
            results.append(r)
            if r.status == "deferred":  # counted once at the end (``time_limit_note``)
                continue
            done = (f" ({r.detail})" if r.status in ("failed", "interrupted")
                    else f" in {r.seconds:.0f}s")
            log(f"  [{i}/{len(plans)}] {r.plan.key}: {r.status}{done}"
                f"  [{(time.perf_counter() - t0) / 60:.1f} min"
                f"{eta(results, todo, workers, whole)}]")
            if on_done is not None and r.status != "skipped":
                on_done()
    except KeyboardInterrupt:
        stop.set()
        log("interrupt: the running jobs checkpoint and stop; rerun the same command to continue")
        for f in [*extra, *futures]:
            f.cancel()
        pool.shutdown(wait=True)
        return None
    finally:
        if timer is not None:
            timer.cancel()
    pool.shutdown(wait=True)
    return results


def baseline_first(plans: list[RunPlan], spec: StudySpec) -> list[RunPlan]:
    """The order the jobs start in: every seed of the baseline (the spec's first recipe, the one
    the arms are compared with) first, then the rest seed by seed. The baseline's spread over
    seeds is what sizes the study (its power table), so it is measured before the arms; a study
    stopped part-way holds whole seeds of the others. A frontier study keeps its own order
    (``plan_runs``: the baseline's points first)."""
    if spec.frontier.arms or not plans:
        return plans
    first = plans[0].name
    return sorted(plans, key=lambda p: p.name != first)  # stable: seed order kept


def time_limit_note(results: list[JobResult]) -> str | None:
    """What a time limit left (None when it left nothing): runs not started, runs stopped."""
    deferred = sum(r.status == "deferred" for r in results)
    stopped = sum(r.status == "interrupted" for r in results)
    if not deferred and not stopped:
        return None
    runs = lambda n: f"{n} run{'' if n == 1 else 's'}"  # noqa: E731
    return (f"time limit: {runs(deferred)} not started, {runs(stopped)} stopped mid-run (a run "
            "stopped while training writes its checkpoint); rerun the same command to continue")


def finished(plan: RunPlan) -> bool:
    """Whether the run is trained and every evaluation of it done (nothing left to run)."""
    try:
        return run_state(plan) == "done" and eval_done(plan)
    except Exception:  # noqa: BLE001 — the job itself reports what is wrong
        return False


def eta(results: list[JobResult], todo: int, workers: int,
        whole: dict[str, float] | None = None) -> str:
    """``, ~N min left``. With ``whole`` (each run's estimated wall seconds from the measured
    rates, taken when the study started: ``pricing.job_times``): the estimates of the runs not
    ended yet × how long the runs that ended took against theirs (Σ seconds ÷ Σ estimates), ÷
    the jobs at a time, and at least the longest of them; so runs that only evaluated do not
    stand for runs that train. Without: the runs still to train or evaluate (of ``todo``) × the
    mean time of those that ended so far ÷ the jobs at a time. Empty before the first one
    ends."""
    if whole:
        ended = {r.plan.key for r in results}
        done = [(r.seconds, whole[r.plan.key]) for r in results
                if r.status == "done" and whole.get(r.plan.key)]
        rest = [w for k, w in whole.items() if k not in ended and w > 0]
        if not done or not rest:
            return ""
        scale = sum(s for s, _ in done) / sum(w for _, w in done)
        left = max(sum(rest) / min(workers, len(rest)), max(rest)) * scale
        return f", ~{left / 60:.0f} min left"
    trained = [r.seconds for r in results if r.status == "done"]
    left = todo - sum(r.status != "skipped" for r in results)
    if not trained or not left:
        return ""
    return f", ~{left * (sum(trained) / len(trained)) / min(workers, left) / 60:.0f} min left"


def base_eval_args(plan: RunPlan, spec: StudySpec, out: Path,
                   e: StudyEvalSpec | None = None, model: str | None = None) -> list[str]:
    """``explorl eval`` of the model ``plan`` starts from before RL (the task's lab model, or
    the ``start`` run's final checkpoint; or ``model``, a checkpoint of ``plan``'s run), with
    the runs' evaluation protocol (``e``, default the spec's main one),
    lab section, response-length limit and tools (taken from ``plan``, any run of the study)."""
    e, cfg = e or spec.eval, plan.cfg
    ref = lab_ref(spec.task)
    length = cfg.rollout.max_response_len or get_task(ref[len("lab:"):]).max_response_len
    args = ["eval", model or cfg.model.path, "--data", ref, *_protocol(e), "--max-new-tokens",
            str(length), "--out", str(out)]
    if model is not None or plan.start is not None:  # a checkpoint (a run's, or the start
        # run's that every run starts from) has no run config: the task comes from data.train
        args += ["--set", f"data.train=[{ref}]"]
    for s in plan.sets:
        if s.startswith("lab."):
            args += ["--set", s]
    r = cfg.rollout
    if r.tools:  # the model before RL samples with the runs' tools, as their evaluations do
        args += ["--set", f"rollout.tools=[{', '.join(r.tools)}]",
                 "--set", f"rollout.max_turns={r.max_turns}",
                 "--set", f"rollout.tool_format={r.tool_format}",
                 "--set", f"rollout.tool_result_max_chars={r.tool_result_max_chars}"]
    return args


def base_evals_left(plan: RunPlan, out: Path) -> list[tuple[Path, StudyEvalSpec]]:
    """The evaluations of the model ``plan`` starts from still to run into ``out``: (folder,
    protocol), one per evaluation temperature."""
    return [(out / folder, e) for folder, e in policy_evals(plan.evals)
            if not eval_done_at(out / folder, e)]


def run_base_eval(plan: RunPlan, spec: StudySpec, out: Path, logs: Path,
                  stop: threading.Event | None = None, deadline: Deadline | None = None,
                  running: dict | None = None) -> bool:
    """Evaluate the model ``plan`` starts from (before RL) into ``out/<folder>`` at every
    evaluation temperature (``plan.evals``' protocols) unless done, logging to
    ``logs/<out's name>.log``; True when the main evaluation exists. As one of ``run_jobs``'
    jobs (``stop``, ``deadline``, ``running``) it does not start once the study is stopping or
    past its time limit, and the limit stops it (a later invocation evaluates again)."""
    todo = base_evals_left(plan, out)
    starting = not (stop is not None and stop.is_set()) and (deadline is None or
                                                              deadline.allows(plan, base=True))
    if todo and starting:
        t0 = time.perf_counter()
        est = deadline.estimate(plan, base=True) if deadline is not None else None
        rc = _spawn([base_eval_args(plan, spec, d, e) for d, e in todo], logs / f"{out.name}.log",
               f"base:{out}", deadline, running)
        if deadline is not None and rc == 0:
            deadline.finished(time.perf_counter() - t0, est[1] if est else None)
    folder, e = plan.evals[0]
    return eval_done_at(out / folder, e)
