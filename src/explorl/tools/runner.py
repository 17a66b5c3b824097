"""Tool calls run in the reward's sandboxed worker pool: a crash, a hang or a huge result is an
error message the model reads, counted, never a stalled run.

``ToolSpec`` is the job the pool's workers resolve (the pool runs any picklable spec with its own
``resolve`` and ``check``): the tool references, and the longest result the model may read.
The workers import the user's tools, so user code never runs in the trainer (what the trainer
needs to know of them, their schemas, ``tools.sandbox`` reads in a worker too); each call has
the pool's limits (``reward.timeout_s`` per call, the workers' memory cap,
``reward.num_workers`` workers; 0 runs them in-process with no limit, for trusted debugging).
The workers are quiet (their output goes to /dev/null), run in a session of their own and end
whatever a call started (``rewards.processes``); the first failure of each kind is logged once
(``ToolRunner.report``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from explorl.refs import search_dirs
from explorl.rewards.pool import ScoreResult, VerifierPool
from explorl.tools.functions import call, load_tool

log = logging.getLogger(__name__)


class ToolResultTooLong(ValueError):
    """A tool returned more text than ``rollout.tool_result_max_chars``."""


@dataclass(frozen=True)
class ToolSpec:
    """The tools a run names, as a worker-pool job (picklable, hashable)."""

    refs: tuple[str, ...]
    """``module:function`` / ``path/file.py:function`` references, in the recipe's order."""
    max_chars: int = 2000
    """A longer result is an error (checked in the worker: a huge one never crosses the pipe)."""
    dirs: tuple[str, ...] = ()
    """Directories searched for module references (the working directory at config time)."""

    kind = "tool"  # how the pool's log lines name it

    def load(self) -> dict[str, Callable]:
        """The tools by function name."""
        fns = [load_tool(r, self.dirs or None) for r in self.refs]
        return {fn.__name__: fn for fn in fns}

    def resolve(self, warm: bool = False) -> Callable:
        """``run(call_json, _, _) -> str``: the worker's job for one call, whose JSON is
        ``{"name": ..., "arguments": {...}}``."""
        tools = self.load()

        def run(call_json: str, _gt=None, _ctx=None) -> str:
            c = json.loads(call_json)
            return call(tools, c["name"], c["arguments"])
        return run

    def check(self, value) -> str:
        return check_text(value, self.max_chars)


def check_text(value, max_chars: int) -> str:
    """``value`` when it is a tool result the model may read: text of at most ``max_chars``."""
    if not isinstance(value, str):
        raise TypeError(f"tool result is a {type(value).__name__}, not text")
    if len(value) > max_chars:
        raise ToolResultTooLong(f"tool result too long ({len(value)} characters > "
                                f"rollout.tool_result_max_chars={max_chars})")
    return value


def failure_kind(why: str) -> str:
    """A failed call's kind, from the pool's message: ``timeouts``, ``crashes`` (the worker
    died), ``budget cuts`` (the turn's budget ran out), or the exception's type
    (``ToolResultTooLong failures``)."""
    if why.startswith("timed out"):
        return "timeouts"
    if why.startswith("the worker died"):
        return "crashes"
    if why.startswith("the call's time budget"):
        return "budget cuts"
    head = why.split(":", 1)[0]
    return f"{head} failures" if head.isidentifier() else "failures of this kind"


@dataclass(frozen=True)
class ToolAnswer:
    """What one call gave: its text, or why it failed (the model then reads the error)."""

    text: str
    error: str | None = None
    state: bytes | None = None
    """An environment's instance after the call (``tools.environments``); None otherwise."""


class ToolRunner:
    """Runs a batch of tool calls through a worker pool of its own (started on first use)."""

    def __init__(self, spec: ToolSpec, *, num_workers: int, timeout_s: float,
                 step_timeout_s: float | None = None, memory_limit_mb: int | None = 4096):
        self.spec = spec
        self.num_workers, self.timeout_s, self.memory_limit_mb = (num_workers, timeout_s,
                                                                  memory_limit_mb)
        self.step_timeout_s = step_timeout_s  # one turn's calls together (the pool's default)
        self._pool: VerifierPool | None = None
        self._logged: set[str] = set()  # the failure kinds already logged (``report``)

    @classmethod
    def from_config(cls, cfg) -> ToolRunner:
        """The runner of a ``RunConfig``: ``rollout.tools`` with the reward's pool limits."""
        r = cfg.reward
        spec = ToolSpec(tuple(cfg.rollout.tools), cfg.rollout.tool_result_max_chars,
                        search_dirs())
        return cls(spec, num_workers=r.num_workers, timeout_s=r.timeout_s,
                   step_timeout_s=r.step_timeout_s)

    def run(self, calls: list[tuple[str, dict]]) -> list[ToolAnswer]:
        """Answer each ``(name, arguments)`` call, in order."""
        if not calls:
            return []
        jobs = [json.dumps({"name": n, "arguments": a}) for n, a in calls]
        res = self._score(jobs, None)
        answers = []
        for i, value in enumerate(res.scores):
            why = res.failures.get(i)
            if why is None and not isinstance(value, str):  # never expected: not a bare 0.0
                why = f"tool result is a {type(value).__name__}, not text"
            answers.append(ToolAnswer("", why) if why is not None else ToolAnswer(value))
        self.report([n for n, _ in calls], answers)
        return answers

    def report(self, names: list[str], answers: list[ToolAnswer]) -> None:
        """Log the first failure of each kind (a timeout, a crash, an exception's type, ...)
        once, with its message; the rest are counted in ``tools/errors`` only."""
        for name, a in zip(names, answers):
            if a.error is None:
                continue
            kind = failure_kind(a.error)
            if kind in self._logged:
                continue
            self._logged.add(kind)
            log.warning("tool %r failed: %s (further %s are counted in tools/errors, not logged)",
                        name, a.error, kind)

    def _score(self, jobs: list, contexts: list | None) -> ScoreResult:
        """Run ``jobs`` (each with its context) through the pool, started on first use."""
        if self._pool is None:
            self._pool = VerifierPool(self.num_workers, self.timeout_s,
                                      step_timeout_s=self.step_timeout_s,
                                      memory_limit_mb=self.memory_limit_mb, quiet=True)
        return self._pool.score(self.spec, jobs, [""] * len(jobs), contexts)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
