"""Verification in worker processes with a wall-clock limit per response and per call."""

from __future__ import annotations

import atexit
import functools
import importlib
import logging
import math
import multiprocessing as mp
import signal
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from explorl import refs
from explorl.rewards.functions import Context, RewardSpec, load_reward, scheme_modules
from explorl.rewards.processes import (
    PARENT_DECIDES,
    close_if_alive,
    end_children,
    isolate_worker,
    kill_tree,
    main_hidden,
    stop_signals_ignored,
    sweep,
)
from explorl.rewards.scores import (  # noqa: F401 (SCORE_*: the rules, read here)
    SCORE_RANGE,
    SCORE_TOLERANCE,
    ScoreResult,
    call_budget,
    check_score,
    checked,
    describe,
    report_failures,
    resolve_spec,
    score_inline,
)

log = logging.getLogger(__name__)

# Chunks of this many responses at most; smaller chunks balance load, larger ones save
# round trips. Four chunks per worker per call keeps both small.
_MAX_CHUNK = 64
_CHUNKS_PER_WORKER = 4
# Raise after this many workers failed to start/warm up within one call.
_MAX_START_FAILURES = 3

def _worker_main(conn: Connection, memory_limit_mb: int | None,
                 schemes: tuple[str, ...] = (), token: str = "", quiet: bool = False) -> None:
    """Worker loop: receive ``(spec, [(i, response, gt, ctx), ...])``, send ``(i, score,
    problem)`` per item (``ctx``: the record's ``(prompt, data_source, extra)``, see
    ``rewards.functions``; ``problem`` is None, or why the item failed: an exception or a bad
    score).

    When a spec is new to this worker it first resolves and warms the verifier and sends
    ``"ready"``, so imports do not eat into the first response's time limit.
    """
    isolate_worker(token, quiet)  # its own session, adopts its orphans, quiet: no output
    refs.IN_WORKER = True
    for module in schemes:  # the packages that resolve lab:/rg: references (rewards.functions)
        importlib.import_module(module)
    # Ctrl-C goes to the whole process group, and a cluster's SIGTERM/SIGUSR1 often to every
    # process of the job; the parent decides when workers stop (it finishes its step first).
    for sig in PARENT_DECIDES:
        signal.signal(sig, signal.SIG_IGN)
    if memory_limit_mb:
        try:
            import resource

            limit = memory_limit_mb << 20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass
    verifiers: dict = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        spec, items = msg
        if spec not in verifiers:
            try:
                verifiers[spec], problem = resolve_spec(spec, warm=True), None
            except BaseException as e:  # every item of this spec then counts as an error
                verifiers[spec], problem = None, f"{type(e).__name__}: {e}"
            conn.send(("ready", problem))
        fn = verifiers[spec]
        for i, response, ground_truth, ctx in items:
            try:
                if fn is None:
                    raise RuntimeError(f"{describe(spec)} failed to load")
                score, problem = checked(spec, fn(response, ground_truth, ctx)), None
            except BaseException as e:  # includes SystemExit and MemoryError from the verifier
                score, problem = 0.0, f"{type(e).__name__}: {e}"[:200]
            end_children()  # what the call started ends with it
            conn.send((i, score, problem))


@dataclass
class _Worker:
    proc: mp.process.BaseProcess
    conn: Connection
    token: str = ""
    """Its ``processes.MARK`` value, which its descendants inherit (``processes.sweep``)."""
    specs: set = field(default_factory=set)
    """Verifier specs this worker has resolved and warmed."""
    items: deque[int] = field(default_factory=deque)
    """Indices sent and not yet answered, in the order the worker processes them."""
    warming: bool = False
    deadline: float = math.inf
    """When the first of ``items`` (or the warm-up) must have answered."""


@dataclass
class _Call:
    """One ``score`` call's progress in the workers: what is left to verify, what came back."""

    spec: Any
    responses: list[str]
    gts: list[str]
    ctxs: list
    budget: float
    """The call's seconds (``step_timeout_s`` or ``call_budget``), from a worker being ready."""
    deadline: float
    """When the budget runs out; inf until a worker has warmed the verifier."""
    pending: deque[list[int]]
    """Chunks of indices not yet handed to a worker."""
    scores: list[float]
    left: int
    """Responses neither answered nor failed."""
    timeouts: int = 0
    errors: int = 0
    start_failures: int = 0
    problem: str | None = None
    """The first failed response's reason, for the log."""
    failures: dict[int, str] = field(default_factory=dict)
    answered: set[int] = field(default_factory=set)

    @property
    def n(self) -> int:
        return len(self.responses)


class VerifierPool:
    """Scores responses in ``num_workers`` persistent processes, ``timeout_s`` per response.

    A verification that hangs, raises, returns something other than a finite score in
    ``SCORE_RANGE``, or kills its worker (``os._exit``, segfault, the ``memory_limit_mb``
    address-space cap) scores 0.0 and is counted in ``ScoreResult``; a stuck or dead worker is
    killed and replaced, and ``score`` neither stalls nor raises for it. Work is sent in chunks
    and answered per response, so the deadline is enforced here, in the parent, per response.
    One call also has a budget (``step_timeout_s``, default ``call_budget``), counted from the
    moment a worker is ready: when it runs out, the responses not yet verified score 0.0 and
    count as timeouts. ``num_workers=0`` verifies in-process with no time limit: for trusted
    debugging only. explorl's own bounded verifiers (``verifiers.in_process``: the lab tasks'
    checkers) are always scored in-process. Workers never re-import the caller's ``__main__``
    script, so a plain script without a main guard may create a pool. Not thread-safe: one
    caller at a time.
    """

    def __init__(
        self,
        num_workers: int,
        timeout_s: float,
        *,
        step_timeout_s: float | None = None,
        memory_limit_mb: int | None = 4096,
        startup_timeout_s: float = 60.0,
        quiet: bool = False,
    ):
        if num_workers < 0:
            raise ValueError(f"num_workers must be ≥ 0, got {num_workers}")
        if not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s}")
        if step_timeout_s is not None and not 0 < step_timeout_s < math.inf:
            raise ValueError(f"step_timeout_s must be a finite number > 0, got {step_timeout_s}")
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self._inline: dict[str | RewardSpec, bool] = {}  # spec -> scored in-process
        self.step_timeout_s = step_timeout_s
        self.memory_limit_mb, self.startup_timeout_s = memory_limit_mb, startup_timeout_s
        self.quiet = quiet  # workers' standard output and error go to /dev/null
        self._tokens: set[str] = set()  # every worker's MARK, swept at close
        # forkserver/spawn, never fork: forking a process that runs torch threads can deadlock.
        # forkserver makes replacing a killed worker cheap. (Not preloaded with this module:
        # Python 3.11's fork server imports its preloads from its own sys.path, not the
        # caller's, and a script that puts a source tree first would get another explorl.)
        method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        self._ctx = mp.get_context(method)
        self._workers = [self._start_worker() for _ in range(num_workers)]
        self._closed = False
        # The workers ignore SIGTERM (the trainer decides when a job's stop signal ends the run),
        # and multiprocessing's own exit hook stops daemonic children with SIGTERM and then waits
        # for them: a script that exits without closing its pool would wait forever. This hook,
        # registered after multiprocessing's (hooks run last-registered first), kills them first.
        self._at_exit = functools.partial(close_if_alive, weakref.ref(self))
        atexit.register(self._at_exit)

    @classmethod
    def from_config(cls, reward) -> VerifierPool:
        """The pool a recipe's ``reward`` section asks for (workers and both time limits)."""
        return cls(reward.num_workers, reward.timeout_s, step_timeout_s=reward.step_timeout_s)

    def _start_worker(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        token = uuid.uuid4().hex
        self._tokens.add(token)
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child, self.memory_limit_mb, scheme_modules(), token, self.quiet),
            daemon=True,
            name="explorl-verifier",
        )
        with main_hidden(), stop_signals_ignored():
            proc.start()
        child.close()  # so the parent sees EOF when the worker dies
        return _Worker(proc, parent, token)

    @staticmethod
    def _stop(w: _Worker, swept: bool = True) -> None:
        """Kill a worker with its whole tree (its group, the descendants it adopted); one that
        died by itself left its descendants to init: those are found by its mark."""
        died = not w.proc.is_alive()
        if w.proc.pid is not None:
            kill_tree(w.proc.pid)
        w.proc.join(timeout=5)
        w.conn.close()
        if died and swept:
            sweep({w.token})

    def _replace(self, w: _Worker) -> None:
        self._stop(w)
        self._workers[self._workers.index(w)] = self._start_worker()

    def score(
        self,
        verifier_name: str | RewardSpec,
        responses: list[str],
        ground_truths: list[str],
        contexts: list[Context] | None = None,
    ) -> ScoreResult:
        """Score each response against its ground truth with ``verifier_name``: a reward
        function's name or reference (``VERIFIERS`` key, ``"module:function"``,
        ``"file.py:function"``, ``lab:<task>``) or a ``RewardSpec``. ``contexts``: each response's
        ``(prompt, data_source, extra)``, which verl- and TRL-style functions receive."""
        if self._closed:
            raise RuntimeError("VerifierPool is closed")
        if len(responses) != len(ground_truths):
            raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
        if contexts is None:
            contexts = [None] * len(responses)
        elif len(contexts) != len(responses):
            raise ValueError(f"{len(responses)} responses but {len(contexts)} contexts")
        if self.num_workers == 0 or self._in_process(verifier_name):
            fn = resolve_spec(verifier_name)
            res = score_inline(fn, responses, ground_truths, contexts, verifier_name)
            problem = report_failures(verifier_name, len(responses), res.errors, 0, res.problem,
                                      None)
            return ScoreResult(res.scores, 0, res.errors, problem, res.failures)
        if not hasattr(verifier_name, "resolve"):
            # Unknown names fail here, in the caller. Resolving imports the reward modules but
            # runs none of them on a response. A job spec's code (tools, environments) is
            # imported in the workers only: one that does not load fails each of its items.
            resolve_spec(verifier_name)
        return self._score_workers(verifier_name, responses, ground_truths, contexts)

    def _in_process(self, spec: str | RewardSpec) -> bool:
        """Whether every function ``spec`` names is marked ``verifiers.in_process`` (bounded,
        pure): then the workers' isolation buys nothing and their round trips cost time."""
        if spec not in self._inline and hasattr(spec, "resolve"):
            self._inline[spec] = False  # user code: in the workers
        if spec not in self._inline:
            refs = [(spec, None)] if isinstance(spec, str) else [
                (t.ref, spec.dirs or None) for t in spec.terms]
            self._inline[spec] = all(
                getattr(load_reward(r, d), "explorl_in_process", False) for r, d in refs)
        return self._inline[spec]

    def _score_workers(self, spec, responses: list[str], gts: list[str], ctxs: list) -> ScoreResult:
        try:
            return self._run(spec, responses, gts, ctxs)
        except BaseException:
            # Interrupted (Ctrl-C, or workers that cannot start): answers still in flight would
            # be read as the next call's, so replace every worker that owes some.
            for w in list(self._workers):
                if w.items:
                    self._replace(w)
            raise

    def _run(self, spec, responses: list[str], gts: list[str], ctxs: list) -> ScoreResult:
        """Hand out chunks, wait, collect the answers and replace failed workers, until every
        response is answered, failed, or cut by the call's budget."""
        call = self._new_call(spec, responses, gts, ctxs)
        while call.left:
            self._hand_out(call)
            # Wait for answers, deaths, or the nearest deadline.
            busy = [w for w in self._workers if w.items]
            if not busy:  # the idle workers had died (replaced above): hand the work out again
                call.start_failures += 1
                if call.start_failures < _MAX_START_FAILURES:
                    continue
                raise RuntimeError(f"verifier workers died {call.start_failures} times before "
                                   f"{describe(spec)} could be sent to them")
            timeout = max(0.0, min(min(w.deadline for w in busy), call.deadline)
                          - time.monotonic())
            wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout)
            for w in busy:
                self._collect(call, w)
            if call.left and time.monotonic() >= call.deadline:
                self._cut_at_budget(call)
            if call.start_failures >= _MAX_START_FAILURES:
                # Not a bad response but a broken environment: training on all-zero rewards
                # would hide it.
                raise RuntimeError(
                    f"verifier workers failed to start {call.start_failures} times for "
                    f"{describe(spec)} "
                    f"(a worker must import and warm the verifier within "
                    f"{self.startup_timeout_s} s)"
                )
        # None expected: a response never scores a bare 0.0, without a reason.
        for i in set(range(call.n)) - call.answered - set(call.failures):
            call.failures[i] = "the worker died (crash or memory limit)"
            call.errors += 1
        problem = report_failures(spec, call.n, call.errors, call.timeouts, call.problem,
                                  self.timeout_s)
        return ScoreResult(call.scores, call.timeouts, call.errors, problem, call.failures)

    def _new_call(self, spec, responses: list[str], gts: list[str], ctxs: list) -> _Call:
        """The call's chunks and budget; the budget runs from the moment a worker can verify
        (a cold pool first imports)."""
        n = len(responses)
        size = max(1, min(_MAX_CHUNK, math.ceil(n / (self.num_workers * _CHUNKS_PER_WORKER))))
        budget = self.step_timeout_s or call_budget(self.timeout_s, n, self.num_workers)
        warm = any(spec in w.specs for w in self._workers)
        return _Call(
            spec, responses, gts, ctxs, budget=budget,
            deadline=time.monotonic() + budget if warm else math.inf,
            pending=deque(list(range(s, min(s + size, n))) for s in range(0, n, size)),
            scores=[0.0] * n, left=n,
        )

    def _hand_out(self, call: _Call) -> None:
        """Hand a chunk to every idle worker. Only idle workers: a busy one is not reading its
        pipe, so a large send could block us past a deadline."""
        for w in list(self._workers):
            if w.items or not call.pending:
                continue
            chunk = call.pending.popleft()
            try:
                w.conn.send((call.spec, [(i, call.responses[i], call.gts[i], call.ctxs[i])
                                         for i in chunk]))
            except (OSError, ValueError):  # died while idle
                call.pending.appendleft(chunk)
                self._replace(w)
                continue
            w.items.extend(chunk)
            w.warming = call.spec not in w.specs
            w.deadline = time.monotonic() + (
                self.startup_timeout_s if w.warming else self.timeout_s
            )

    def _collect(self, call: _Call, w: _Worker) -> None:
        """Collect ``w``'s answers; kill and replace it if it died or overran."""
        dead = False
        try:
            while w.items and w.conn.poll():
                self._take(call, w, w.conn.recv())
                # The worker starts its next item the moment it answers this one.
                w.deadline = time.monotonic() + self.timeout_s
        except (EOFError, OSError):
            dead = True
        if not w.items:
            return
        dead = dead or not w.proc.is_alive()
        overran = time.monotonic() >= w.deadline
        if dead or overran:
            self._retire(call, w, dead)

    def _take(self, call: _Call, w: _Worker, msg) -> None:
        """One message from ``w``: its warm-up finished (``"ready"``), or a response's score."""
        if msg[0] == "ready":
            w.warming = False
            w.specs.add(call.spec)
            call.deadline = min(call.deadline, time.monotonic() + call.budget)
            if msg[1] is not None:
                log.error("%s failed to load in a worker: %s", describe(call.spec), msg[1])
            return
        i, s, why = msg
        w.items.popleft()
        call.answered.add(i)
        call.scores[i], call.errors, call.left = s, call.errors + (why is not None), call.left - 1
        call.problem = call.problem or why
        if why is not None:
            call.failures[i] = why

    def _retire(self, call: _Call, w: _Worker, dead: bool) -> None:
        """Kill and replace a worker that died or overran. Warming, no response is to blame:
        its chunk is retried on a fresh worker; else the response it was on fails and the rest
        of its chunk is handed out again."""
        if w.warming:
            call.start_failures += 1
            log.warning(
                "verifier worker failed to start %s (%s)",
                describe(call.spec),
                "died" if dead else "timed out",
            )
            call.pending.appendleft(list(w.items))
        else:
            lost = w.items.popleft()  # the response it was working on
            call.failures[lost] = ("the worker died (crash or memory limit)" if dead else
                                   f"timed out after {self.timeout_s:g} s")
            # timeouts: reported by report_failures
            call.problem = call.problem or (call.failures[lost] if dead else None)
            call.left -= 1
            call.timeouts, call.errors = call.timeouts + (not dead), call.errors + dead
            if w.items:
                call.pending.appendleft(list(w.items))
        w.items.clear()
        self._replace(w)

    def _cut_at_budget(self, call: _Call) -> None:
        """Out of budget: what is still queued or in a worker scores 0 as a timeout."""
        cut = sum(len(c) for c in call.pending) + sum(len(w.items) for w in self._workers)
        log.warning(
            "%s: the call's budget of %.1f s ran out with %d of %d responses "
            "unverified (scored 0, counted as timeouts); raise reward.step_timeout_s or "
            "reward.num_workers", describe(call.spec), call.budget, cut, call.n,
        )
        for w in list(self._workers):
            if w.items:
                call.failures.update({i: "the call's time budget ran out" for i in w.items})
                w.items.clear()
                self._replace(w)
        call.failures.update({i: "the call's time budget ran out"
                              for c in call.pending for i in c})
        call.pending.clear()
        call.timeouts, call.left = call.timeouts + cut, 0

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        for w in self._workers:
            self._stop(w, swept=False)
        sweep(self._tokens)  # anything a worker's tree left behind
        self._workers = []

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown may have torn down multiprocessing already
            pass
