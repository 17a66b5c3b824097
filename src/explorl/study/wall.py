"""A study's wall-clock over the invocations that built it (``wall.json``): each invocation adds
its own as it goes (``Wall``), so a study run in pieces, or killed without a word, still states
what it cost."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from explorl.files import write_text_atomic


def study_files(out: Path) -> frozenset:
    """What the study in ``out`` holds so far: each run's metrics (a step appends to them) and
    each evaluation's files, with their modification times."""
    found = set()
    for runs in ("runs/*", "tune/runs/*", "start"):
        for name in ("metrics.jsonl", "summary.json", "eval*/eval.json", "eval*/problems.jsonl"):
            found |= {(str(f), f.stat().st_mtime_ns) for f in out.glob(f"{runs}/{name}")}
    for name in ("eval.json", "problems.jsonl"):
        found |= {(str(f), f.stat().st_mtime_ns) for f in out.glob(f"base*/eval*/{name}")}
    return frozenset(found)


def add_wall(out: Path, seconds: float, before: frozenset | None = None,
             jobs: int | None = None) -> float:
    """Add an invocation's wall-clock to ``out/wall.json`` and return the study's total: it adds
    up over every invocation that built the study, interrupted ones included (a study from
    before this file: its study.json's total is the start); ``jobs``, the invocation's job
    count, joins the file's list (``wall_jobs``). With ``before`` (``study_files`` when the
    invocation started), one that finished nothing new (it only re-analysed) adds nothing:
    publishing the same study again leaves its cost and its archive as they were."""
    path = out / "wall.json"
    if path.exists():
        data = json.loads(path.read_text())
    elif (out / "study.json").exists():
        data = {"wall_s": json.loads((out / "study.json").read_text()).get("timing", {})
                .get("wall_s") or 0}
    else:
        data = {"wall_s": 0.0}
    if before is None or study_files(out) != before:
        data["wall_s"] += seconds
        if jobs is not None:
            data["jobs"] = sorted({*data.get("jobs", []), jobs})
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(data) + "\n")
    return data["wall_s"]


class Wall:
    """An invocation's wall-clock, added to the study's (``add_wall``) as it goes: ``tick``
    after each job that ends, so an invocation killed without a word (its machine taken away,
    a job killed at its limit) has counted its time up to its last finished job; ``close`` at
    the end adds the rest, and, when no job ended, only if the invocation finished something
    (a rerun that only re-analyses adds nothing). Returns the study's total."""

    def __init__(self, out: Path, jobs, clock: Callable[[], float] = time.perf_counter):
        self.out, self.jobs, self.clock = out, jobs, clock
        self.before, self.mark, self.ticked = study_files(out), clock(), False

    def tick(self) -> float:
        now = self.clock()
        total = add_wall(self.out, now - self.mark, None, self.jobs)
        self.mark, self.ticked = now, True
        return total

    def close(self) -> float:
        now = self.clock()
        total = add_wall(self.out, now - self.mark, None if self.ticked else self.before,
                         self.jobs)
        self.mark = now
        return total


def wall_jobs(out: Path) -> list[int]:
    """The job counts of the invocations that built the study in ``out`` (``add_wall``); empty
    for a study from before they were recorded."""
    try:
        return list(json.loads((out / "wall.json").read_text()).get("jobs", []))
    except (OSError, ValueError):
        return []
