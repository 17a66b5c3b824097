"""``explorl study --time-limit``: the duration, the rule that decides whether a job starts,
and a real job process stopped at the limit (SIGTERM) while the next is deferred."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from explorl.cli import main
from explorl.study import jobs as J


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("50m", 3000),
                                           ("2h", 7200), ("1h30m", 5400), ("1.5h", 5400),
                                           (" 10M ", 600)])
def test_durations(text, seconds):
    assert J.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5d", "0", "0m", "-5m", "m"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError):
        J.parse_duration(text)


def test_a_job_starts_only_if_the_longest_so_far_would_end_in_time():
    """Limit at t = 100. Before any job ends every job may start; after one took 30 s, a job may
    start at t = 70 (70 + 30 = 100) and not at t = 71; after a 40 s one, not at t = 61."""
    now = [0.0]
    d = J.Deadline(100.0, clock=lambda: now[0])
    now[0] = 99.0
    assert d.allows()  # nothing finished yet: no estimate, the job starts
    d.finished(30.0)
    now[0] = 70.0
    assert d.allows()
    now[0] = 71.0
    assert not d.allows()
    d.finished(40.0)
    d.finished(10.0)  # the longest counts
    now[0] = 60.0
    assert d.allows()
    now[0] = 61.0
    assert not d.allows()
    now[0] = 0.0
    d.reached = True  # after the limit nothing starts
    assert not d.allows()


def test_with_estimates_a_job_starts_if_it_saves_work_in_time():
    """Limit at t = 100; each job's estimate (until it first saves work, until it ends). A run
    that saves after 20 s starts at t = 80, not 81. One that took 100 s against its 50:
    every later estimate counts twice (40 s: t = 60, not 61); a faster one does not lower it.
    A job without an estimate (None) falls back to the longest finished one (100 s)."""
    now = [0.0]
    times = {"a": (20.0, 50.0), "b": None}
    d = J.Deadline(100.0, clock=lambda: now[0], times=lambda plan, base: times[plan])
    assert d.estimate("a") == (20.0, 50.0) and d.estimate(None) is None
    now[0] = 80.0
    assert d.allows("a")
    now[0] = 81.0
    assert not d.allows("a")
    d.finished(100.0, 50.0)
    d.finished(10.0, 50.0)  # faster than estimated: the most a job overran stays
    assert d.slower == 2.0
    now[0] = 60.0
    assert d.allows("a")
    now[0] = 61.0
    assert not d.allows("a")
    now[0] = 0.0
    assert d.allows("b") and d.allows()
    now[0] = 1.0
    assert not d.allows("b")


def _plan(tmp_path, name):
    return SimpleNamespace(name=name, seed=0, out=tmp_path / name, evals=[], key=f"{name}-seed0")


def sigterm_jobs(monkeypatch, got: Path, started: Path | None = None) -> None:
    """Every job process (a run's or the base model's evaluation) becomes one that would sleep
    60 s, writes ``started`` when it starts and, on SIGTERM, the signal's number into ``got``
    and exits 75."""
    child = ("import signal, sys, time, pathlib\n"
             + (f"pathlib.Path({str(started)!r}).write_text('x')\n" if started else "")
             + "def stop(n, f):\n"
             f"    pathlib.Path({str(got)!r}).write_text(str(n)); sys.exit(75)\n"
             "signal.signal(signal.SIGTERM, stop)\n"
             "time.sleep(60)\n")
    monkeypatch.setattr(J, "run_state", lambda plan: "fresh")
    monkeypatch.setattr(J, "train_args", lambda plan, state: ["train"])
    monkeypatch.setattr(J, "job_command", lambda commands: [sys.executable, "-c", child])


def test_the_running_job_is_stopped_at_the_limit_and_the_next_deferred(tmp_path, monkeypatch):
    """Two plans, one job at a time, a 1.5 s limit. The first job's process would run 60 s: at
    the limit it receives SIGTERM (the signal a run answers by checkpointing) and ends; the
    second never starts. The study's note counts both."""
    got = tmp_path / "signal"
    sigterm_jobs(monkeypatch, got, tmp_path / "started")
    plans = [_plan(tmp_path, "a"), _plan(tmp_path, "b")]
    spec = SimpleNamespace(jobs=1, frontier=SimpleNamespace(arms=[]))
    lines = []
    t0 = time.monotonic()
    ended = []
    results = J.run_jobs(plans, spec, tmp_path / "logs", lines.append, J.Deadline.after(1.5),
                         on_done=lambda: ended.append(1))
    assert time.monotonic() - t0 < 30  # not the child's 60 s
    assert [r.status for r in results] == ["interrupted", "deferred"]
    assert ended == [1]  # the study's clock ticks for the job that ran, not the deferred one
    assert got.read_text() == str(int(signal.SIGTERM))
    assert J.time_limit_note(results) == (
        "time limit: 1 run not started, 1 run stopped mid-run (a run stopped while training "
        "writes its checkpoint); rerun the same command to continue")
    assert not any("deferred" in line for line in lines)  # counted once, not per run
    assert J.time_limit_note([J.JobResult(plans[0], "done")]) is None


def test_the_command_line_refuses_a_bad_limit_and_a_limit_with_plan(capsys):
    assert main(["study", "lab", "--time-limit", "soon"]) == 2
    assert "--time-limit: expected a duration" in capsys.readouterr().err
    assert main(["study", "lab", "--plan", "--time-limit", "5m"]) == 2
    assert "--time-limit and --plan do not go together" in capsys.readouterr().err


def test_a_study_stopped_by_its_limit_exits_75_unanalysed(tiny_model, tmp_path, capsys):
    """A tiny two-run study with a limit far shorter than one run (2000 steps): the first run
    starts (no estimate yet) and is stopped at the limit (a run stopped while training writes
    its checkpoint: tests/test_cluster.py), the second is deferred, nothing is analysed; exit
    75."""
    import yaml
    from conftest import TINY_LAB_CONFIG

    lab = [f"lab.{k}={v}" for k, v in TINY_LAB_CONFIG.items() if k != "params"]
    lab += [f"lab.params.{k}={v}" for k, v in TINY_LAB_CONFIG["params"].items()]
    spec = {"name": "tl", "task": "addition", "recipes": ["grpo"], "seeds": [0, 1],
            "max_steps": 2000,
            "recipe_dir": str(Path(__file__).parents[1] / "src" / "explorl" / "recipes" / "lab"),
            "set": [f"model.path={tiny_model}", *lab, "data.prompts_per_step=2",
                    "rollout.n_samples=2", "rollout.max_response_len=4", "eval.every=0",
                    "reward.num_workers=1", "log.plots=false", "log.checkpoint_every=0"],
            "eval": {"n": 2, "k": [1, 2], "split": "test", "max_problems": 2}, "jobs": 1,
            "base_eval": False}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "study"
    assert main(["study", str(path), "--out", str(out), "--time-limit", "3s"]) == 75
    printed = capsys.readouterr().out
    assert "time limit: 1 run not started, 1 run stopped mid-run" in printed
    assert not (out / "study.md").exists()
