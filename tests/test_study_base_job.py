"""The base model's evaluation is a job of the study's pool (``run_jobs``' ``before``): it
starts first and runs beside the first run, so no core waits for it; a stopped study does not
start it, and the time limit stops it as it stops a run."""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import SimpleNamespace

from test_study_time_limit import _plan, sigterm_jobs

from explorl.study import jobs as J
from explorl.study import run as R


def _sleeper(marks, seconds):
    """A job process that records when it started and ended (monotonic clock)."""
    return ("import pathlib, sys, time\n"
            f"p = pathlib.Path({str(marks)!r}) / sys.argv[1]\n"
            "p.write_text(str(time.monotonic()))\n"
            f"time.sleep({seconds})\n"
            "p.with_suffix('.end').write_text(str(time.monotonic()))\n")


def _jobs(tmp_path, monkeypatch, seconds=0.5):
    marks = tmp_path / "marks"
    marks.mkdir()
    child = _sleeper(marks, seconds)
    monkeypatch.setattr(J, "run_state", lambda plan: "fresh")
    monkeypatch.setattr(J, "train_args", lambda plan, state: [plan.name])
    monkeypatch.setattr(J, "job_command",
                        lambda commands: [sys.executable, "-c", child, commands[0][0]])
    return marks


def _base(tmp_path):
    """A ``before`` job running a process named "base" through ``_spawn`` (as the base model's
    evaluation does)."""
    def job(stop, deadline, running):
        rc = J._spawn([["base"]], tmp_path / "logs" / "base.log", "base", deadline, running)
        return f"base: exit code {rc}"
    return job


def test_the_base_evaluation_runs_beside_the_first_run(tmp_path, monkeypatch):
    """Two jobs at a time, the base job and two runs of 0.5 s: the base job and the first run
    start together; the second run starts when one of them ends (not after the base job and
    then the first run in turn). The base job's line is logged; the runs are counted 1/2, 2/2
    (the base job is not a run)."""
    marks = _jobs(tmp_path, monkeypatch)
    spec = SimpleNamespace(jobs=2, frontier=SimpleNamespace(arms=[]))
    lines: list[str] = []
    results = J.run_jobs([_plan(tmp_path, "a"), _plan(tmp_path, "b")], spec, tmp_path / "logs",
                         lines.append, before=[_base(tmp_path)])
    assert [r.status for r in results] == ["failed", "failed"]  # no run folder: not "done"
    start = {n: float((marks / n).read_text()) for n in ("base", "a", "b")}
    end = {n: float((marks / f"{n}.end").read_text()) for n in ("base", "a", "b")}
    assert abs(start["base"] - start["a"]) < 0.4  # together
    assert start["b"] >= min(end["base"], end["a"]) - 0.05  # b waited for a free worker
    assert "  base: exit code 0" in lines
    assert sum(x.startswith("  [") for x in lines) == 2
    assert any(x.startswith("  [2/2] b-seed0") for x in lines)


def test_a_stopped_study_does_not_start_the_base_evaluation(tmp_path, monkeypatch):
    """``run_base_eval`` as a job: with the study stopping (``stop`` set) or past its limit, it
    starts no process and says the evaluation is not there."""
    started = []
    monkeypatch.setattr(J, "base_evals_left", lambda plan, out: [(out / "eval", None)])
    monkeypatch.setattr(J, "_spawn", lambda *a, **k: started.append(a) or 0)
    monkeypatch.setattr(J, "eval_done_at", lambda folder, e: bool(started))
    plan = SimpleNamespace(evals=[("eval", None)])
    stop = threading.Event()
    stop.set()
    assert not J.run_base_eval(plan, None, tmp_path / "base", tmp_path / "logs", stop)
    past = J.Deadline.after(10.0)
    past.reached = True
    assert not J.run_base_eval(plan, None, tmp_path / "base", tmp_path / "logs",
                               threading.Event(), past)
    assert started == []
    monkeypatch.setattr(J, "base_evals_left", lambda plan, out: [(out / "eval", None)])
    monkeypatch.setattr(J, "base_eval_args", lambda plan, spec, d, e: ["eval", str(d)])
    assert J.run_base_eval(plan, None, tmp_path / "base", tmp_path / "logs", threading.Event())
    assert len(started) == 1 and started[0][2] == f"base:{tmp_path / 'base'}"


def test_the_time_limit_stops_the_base_evaluation(tmp_path, monkeypatch):
    """A 1 s limit, one job at a time: the base job's process (60 s) gets SIGTERM at the limit
    like a run's, and the run behind it is deferred."""
    got = tmp_path / "signal"
    sigterm_jobs(monkeypatch, got)
    spec = SimpleNamespace(jobs=1, frontier=SimpleNamespace(arms=[]))
    lines: list[str] = []
    t0 = time.monotonic()
    results = J.run_jobs([_plan(tmp_path, "a")], spec, tmp_path / "logs", lines.append,
                         J.Deadline.after(1.0), before=[_base(tmp_path)])
    assert time.monotonic() - t0 < 30
    assert got.read_text() == str(int(signal.SIGTERM))
    assert "  base: exit code 75" in lines
    assert [r.status for r in results] == ["deferred"]


def test_the_study_hands_its_base_evaluations_to_the_pool(tmp_path, monkeypatch):
    """``run_study``'s base job: a model evaluated before is said so without a process; else it
    logs that it starts, evaluates, and says in how long."""
    plan = SimpleNamespace(name="grpo", evals=[("eval", None)])
    left = [[("x", None)], []]
    monkeypatch.setattr(R, "base_evals_left", lambda plan, out: left[0])
    monkeypatch.setattr(R, "run_base_eval", lambda *a: left.pop(0) is not None)
    lines: list[str] = []
    job = R._base_eval_job(plan, None, tmp_path, "base", lines.append)
    assert job(threading.Event(), None, {}).startswith("the base model: evaluated in ")
    assert lines == ["  evaluating the base model (the model before RL)"]
    assert job(threading.Event(), None, {}) == "the base model: evaluated before"
    other = R._base_eval_job(plan, None, tmp_path, "base-grpo", lines.append)
    assert other(threading.Event(), None, {}) == "the base model of grpo: evaluated before"
