"""Verification in worker processes with a wall-clock limit per response."""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from explorl.rewards.functions import Context, RewardSpec, resolve_scorer

log = logging.getLogger(__name__)

# Chunks of this many responses at most; smaller chunks balance load, larger ones save
# round trips. Four chunks per worker per call keeps both small.
_MAX_CHUNK = 64
_CHUNKS_PER_WORKER = 4
# Raise after this many workers failed to start/warm up within one call.
_MAX_START_FAILURES = 3

IN_WORKER = False
"""True inside a pool worker process: scorers that must never run in the trainer's own process
(reasoning-gym's ``eval()`` scorers, when allowed at all) check it."""


@dataclass(frozen=True)
class ScoreResult:
    """Scores of one ``VerifierPool.score`` call; failed verifications score 0.0 and are counted."""

    scores: list[float]
    timeouts: int = 0
    """Verifications cut off at the time limit (their worker was killed and replaced)."""
    errors: int = 0
    """Verifications that raised or killed their worker (crash, segfault, memory limit)."""


def _worker_main(conn: Connection, memory_limit_mb: int | None) -> None:
    """Worker loop: receive ``(spec, [(i, response, gt, ctx), ...])``, send ``(i, score, ok)`` per
    item (``ctx``: the record's ``(prompt, data_source, extra)``, see ``rewards.functions``).

    When a spec is new to this worker it first resolves and warms the scorer and sends
    ``"ready"``, so imports do not eat into the first response's time limit.
    """
    global IN_WORKER
    IN_WORKER = True
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Die with our parent (the forkserver, which exits with the pool's process), so a worker
    # stuck in a verification never outlives a killed trainer.
    if sys.platform == "linux":
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:
            pass
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
                verifiers[spec], problem = resolve_scorer(spec, warm=True), None
            except BaseException as e:  # every item of this spec then counts as an error
                verifiers[spec], problem = None, f"{type(e).__name__}: {e}"
            conn.send(("ready", problem))
        fn = verifiers[spec]
        for i, response, ground_truth, ctx in items:
            try:
                score, ok = fn(response, ground_truth, ctx), True
            except BaseException:  # includes SystemExit and MemoryError from the verifier
                score, ok = 0.0, False
            conn.send((i, score, ok))


@dataclass
class _Worker:
    proc: mp.process.BaseProcess
    conn: Connection
    specs: set = field(default_factory=set)
    """Verifier specs this worker has resolved and warmed."""
    items: deque[int] = field(default_factory=deque)
    """Indices sent and not yet answered, in the order the worker processes them."""
    warming: bool = False
    deadline: float = math.inf
    """When the first of ``items`` (or the warm-up) must have answered."""


class VerifierPool:
    """Scores responses in ``num_workers`` persistent processes, ``timeout_s`` per response.

    A verification that hangs, raises or kills its worker (``os._exit``, segfault, the
    ``memory_limit_mb`` address-space cap) scores 0.0 and is counted in ``ScoreResult``; a stuck
    or dead worker is killed and replaced, and ``score`` neither stalls nor raises for it. Work is
    sent in chunks and answered per response, so the deadline is enforced here, in the parent,
    per response. ``num_workers=0`` verifies in-process with no time limit: for trusted
    debugging only. Not thread-safe: one caller at a time.
    """

    def __init__(
        self,
        num_workers: int,
        timeout_s: float,
        *,
        memory_limit_mb: int | None = 4096,
        startup_timeout_s: float = 60.0,
    ):
        if num_workers < 0:
            raise ValueError(f"num_workers must be ≥ 0, got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self.memory_limit_mb, self.startup_timeout_s = memory_limit_mb, startup_timeout_s
        # forkserver/spawn, never fork: forking a process that runs torch threads can deadlock.
        # forkserver makes replacing a killed worker cost milliseconds.
        method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        self._ctx = mp.get_context(method)
        self._workers = [self._start_worker() for _ in range(num_workers)]
        self._closed = False

    def _start_worker(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child, self.memory_limit_mb),
            daemon=True,
            name="explorl-verifier",
        )
        proc.start()
        child.close()  # so the parent sees EOF when the worker dies
        return _Worker(proc, parent)

    def _replace(self, w: _Worker) -> None:
        w.proc.kill()
        w.proc.join(timeout=5)
        w.conn.close()
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
        # Unknown names fail here, in the caller. Resolving imports the reward modules but runs
        # none of them on a response.
        fn = resolve_scorer(verifier_name)
        if self.num_workers == 0:
            return _score_inline(fn, responses, ground_truths, contexts)
        return self._score_workers(verifier_name, responses, ground_truths, contexts)

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
        n = len(responses)
        scores, timeouts, errors = [0.0] * n, 0, 0
        size = max(1, min(_MAX_CHUNK, math.ceil(n / (self.num_workers * _CHUNKS_PER_WORKER))))
        pending = deque(list(range(s, min(s + size, n))) for s in range(0, n, size))
        left, start_failures = n, 0

        while left:
            # 1. Hand a chunk to every idle worker. Only idle workers: a busy one is not reading
            # its pipe, so a large send could block us past a deadline.
            for w in list(self._workers):
                if w.items or not pending:
                    continue
                chunk = pending.popleft()
                try:
                    w.conn.send((spec, [(i, responses[i], gts[i], ctxs[i]) for i in chunk]))
                except (OSError, ValueError):  # died while idle
                    pending.appendleft(chunk)
                    self._replace(w)
                    continue
                w.items.extend(chunk)
                w.warming = spec not in w.specs
                w.deadline = time.monotonic() + (
                    self.startup_timeout_s if w.warming else self.timeout_s
                )

            # 2. Wait for answers, deaths, or the nearest deadline.
            busy = [w for w in self._workers if w.items]
            if not busy:  # unreachable: pending work always finds an idle worker
                break
            timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout)

            # 3. Collect answers; kill and replace workers that died or overran.
            for w in busy:
                dead = False
                try:
                    while w.items and w.conn.poll():
                        msg = w.conn.recv()
                        if msg[0] == "ready":
                            w.warming = False
                            w.specs.add(spec)
                            if msg[1] is not None:
                                log.error(
                                    "verifier %r failed to load in a worker: %s", spec, msg[1]
                                )
                        else:
                            i, s, ok = msg
                            w.items.popleft()
                            scores[i], errors, left = s, errors + (not ok), left - 1
                        # The worker starts its next item the moment it answers this one.
                        w.deadline = time.monotonic() + self.timeout_s
                except (EOFError, OSError):
                    dead = True
                if not w.items:
                    continue
                dead = dead or not w.proc.is_alive()
                overran = time.monotonic() >= w.deadline
                if not (dead or overran):
                    continue
                if w.warming:  # no response is to blame; retry the chunk on a fresh worker
                    start_failures += 1
                    log.warning(
                        "verifier worker failed to start %r (%s)",
                        spec,
                        "died" if dead else "timed out",
                    )
                    pending.appendleft(list(w.items))
                else:
                    w.items.popleft()  # the response it was working on
                    left -= 1
                    timeouts, errors = timeouts + (not dead), errors + dead
                    if w.items:
                        pending.appendleft(list(w.items))
                w.items.clear()
                self._replace(w)

            if start_failures >= _MAX_START_FAILURES:
                # Not a bad response but a broken environment: training on all-zero rewards
                # would hide it.
                raise RuntimeError(
                    f"verifier workers failed to start {start_failures} times for {spec!r}. A "
                    "script that creates a VerifierPool needs an `if __name__ == '__main__':` "
                    "guard (workers are started with forkserver/spawn)"
                )

        return ScoreResult(scores, timeouts, errors)

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for w in self._workers:
            w.proc.kill()
        for w in self._workers:
            w.proc.join(timeout=5)
            w.conn.close()
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


def _score_inline(fn, responses: list[str], gts: list[str], ctxs: list) -> ScoreResult:
    """In-process scoring with the pool's failure accounting but no time limit."""
    scores, errors = [], 0
    for response, gt, ctx in zip(responses, gts, ctxs):
        try:
            scores.append(fn(response, gt, ctx))
        except Exception:
            log.debug("verifier raised", exc_info=True)
            scores.append(0.0)
            errors += 1
    return ScoreResult(scores, 0, errors)
