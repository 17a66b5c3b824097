"""Progress as plain lines, for output that is not a terminal (``nohup``, a cluster job's log).

A live bar redraws one line in place and draws nothing into a file: a real model's first
validation and step on a CPU then leave the log silent for half an hour. ``ProgressLines``
writes a line per finished item (a training step, a batch of ``explorl eval``) and, while one
runs, a line at least every ``log.progress_every_s`` seconds saying where it is: the sampling
phase (``rollout.progress.phase``), its responses done, the decode step, the decode rate and, when
the phase knows its size, its ETA. A daemon thread wakes it between decode steps, so phases that
decode nothing (the update, scoring) still get their line.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from explorl.rollout.progress import Phase, current_phase, listening

clock: Callable[[], float] = time.monotonic
"""The clock of every line (tests replace it)."""

TICK_S = 1.0
"""How often the thread looks whether a line is due; 0 = no thread (lines come only from decode
steps and finished items)."""


def duration(seconds: float) -> str:
    """``"45s"``, ``"3m05s"``, ``"2h07m"``."""
    s = int(max(0.0, seconds) + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class PhaseCount:
    """What one phase has sampled so far, from the decode steps (``rollout.progress``): tokens,
    responses of finished sampling calls (a call's first step decodes all its rows; a new call
    starts at step 1), the current call's step."""

    def __init__(self, phase: Phase | None, now: float) -> None:
        self.phase, self.t0 = phase, now
        self.tokens = self.done = self.rows = self.t = self.total = 0

    def __call__(self, t: int, total: int, rows: int) -> None:
        if t == 1:  # a new sampling call (or batch): the previous one finished its rows
            self.done += self.rows
            self.rows = rows
        self.tokens += rows
        self.t, self.total = t, total

    def text(self, now: float) -> str:
        """``"validation at step 0: 384/1024 responses, decode 12/48, 52 tok/s, ETA 3m"``."""
        p = self.phase
        parts = []
        if p is not None and p.responses:
            parts.append(f"{self.done}/{p.responses} responses")
        if self.total:
            parts.append(f"decode {self.t}/{self.total}")
        secs = now - self.t0
        if self.tokens and secs >= 1:
            parts.append(f"{self.tokens / secs:,.0f} tok/s")
        if p is not None and p.responses and self.total and secs >= 1:
            # the running call counts as done in proportion to its decode steps out of the
            # most it may take: it ends earlier when every row has stopped, so before any call
            # has finished the ETA is a bound ("≤")
            frac = min(1.0, (self.done + self.rows * self.t / self.total) / p.responses)
            if frac > 0:
                bound = "≤" if not self.done else ""
                parts.append(f"ETA {bound}{duration(secs * (1 - frac) / frac)}")
        parts.append(f"{duration(secs)} so far")
        return f"{p.name if p is not None else 'sampling'}: " + ", ".join(parts)


class ProgressLines:
    """Plain progress lines for ``total`` items called ``label`` (module docstring).

    ``done(n, fields)`` ends item ``n`` with a line ``"<label> n/total  <fields>  elapsed …
    ETA …"``; between two such lines, a line at most every ``every_s`` seconds tells the running
    item's phase (``PhaseCount.text``), or, outside a named phase, how long the item has run.
    """

    def __init__(self, label: str, total: int, start: int = 0, *, every_s: float,
                 item: str | None = None, write: Callable[[str], None] | None = None):
        self.label, self.total, self.every_s, self.item = label, total, every_s, item
        self.write_fn = write or (lambda text: print(text, file=sys.stderr, flush=True))
        self.lock = threading.RLock()
        now = clock()
        self.t_start = self.t_item = self.t_line = self.t_first = now
        self.n, self.first, self.count = start, start, PhaseCount(None, now)
        self.tokens = 0  # decoded since the start (rows summed over decode steps)
        self._listening = listening(self._on_decode)
        self._listening.__enter__()
        self._stop = threading.Event()
        self._thread = None
        if TICK_S > 0:
            self._thread = threading.Thread(target=self._tick_loop, name="explorl-progress",
                                            daemon=True)
            self._thread.start()

    def write(self, text: str, now: float) -> None:
        """Write ``text`` as the line of time ``now``."""
        with self.lock:
            self.t_line = now
            self.write_fn(text)

    def _on_decode(self, t: int, total: int, rows: int) -> None:
        with self.lock:
            now = clock()
            p = current_phase()
            if p is not self.count.phase:
                self.count = PhaseCount(p, now)
            self.count(t, total, rows)
            self.tokens += rows
            self.tick(now)

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK_S):
            self.tick()

    def tick(self, now: float | None = None) -> None:
        """Write the running item's line if none was written for ``every_s`` seconds."""
        with self.lock:
            now = clock() if now is None else now
            p = current_phase()
            if p is not None and p is not self.count.phase:  # its clock starts when first seen:
                self.count = PhaseCount(p, now)  # within TICK_S of its start (or at a decode step)
            if now - self.t_line < self.every_s:
                return
            where = f"{self.label} {self.n}/{self.total} done"
            if p is None:
                nxt = ("finishing for" if self.n >= self.total else
                       f"{self.item} {self.n + 1} running for" if self.item else
                       "the next running for")
                self.write(f"{where}; {nxt} {duration(now - self.t_item)}", now)
            else:
                self.write(f"{where}; {self.count.text(now)}", now)

    def done(self, n: int, fields: list[str]) -> None:
        """Item ``n`` finished: its line (``fields`` first), with the elapsed time and the ETA
        from the mean time of the items finished since the start (or since ``restart``)."""
        with self.lock:
            now = clock()
            self.n = n
            parts = [f"{self.label} {n}/{self.total}", *fields,
                     f"elapsed {duration(now - self.t_start)}"]
            if n > self.first and n < self.total:
                per = (now - self.t_first) / (n - self.first)
                parts.append(f"ETA {duration(per * (self.total - n))}")
            self.write("  ".join(parts), now)
            self.t_item = now
            self.count = PhaseCount(None, now)

    def restart(self) -> None:
        """Measure the ETA from now (after work that is not one of the items: a validation
        before the first training step)."""
        with self.lock:
            self.t_first = self.t_item = clock()
            self.first = self.n

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._listening is not None:
            self._listening.__exit__(None, None, None)
            self._listening = None
