"""Live progress of the sampler, for displays: which decode step a sampling call is at.

A real model on a CPU takes minutes for one sampling call; a display that moves only when the
call returns looks hung. The decode loops call ``step`` once per decode step (a function call
and, when nobody listens, nothing more: no device sync, no allocation); a display listens with
``listening`` for the duration of its work and shows the step, the rows still in the batch and
the decode rate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

Listener = Callable[[int, int, int], None]
"""``listener(t, total, rows)``: decode step ``t`` of at most ``total`` is done, with ``rows``
rows in the batch (finished rows may still be counted until the batch is compacted)."""

_listeners: list[Listener] = []


@contextlib.contextmanager
def listening(fn: Listener) -> Iterator[None]:
    """Call ``fn`` at every decode step of every sampling call inside the ``with`` block."""
    _listeners.append(fn)
    try:
        yield
    finally:
        _listeners.remove(fn)


@dataclass(frozen=True, eq=False)
class Phase:
    """A named stretch of sampling work: ``responses`` it samples in all, when known."""

    name: str
    responses: int | None = None


_phases: list[Phase] = []


@contextlib.contextmanager
def phase(name: str, responses: int | None = None) -> Iterator[Phase]:
    """Name the sampling done inside the ``with`` block (``current_phase`` returns it)."""
    p = Phase(name, responses)
    _phases.append(p)
    try:
        yield p
    finally:
        _phases.remove(p)


def current_phase() -> Phase | None:
    """The innermost phase open now, or None."""
    return _phases[-1] if _phases else None


def step(t: int, total: int, rows: int) -> None:
    """Report decode step ``t`` of ``total`` with ``rows`` rows (called by the decode loops)."""
    for fn in _listeners:
        fn(t, total, rows)


class DecodeRate:
    """A listener that keeps the tokens decoded so far (rows summed over steps) and the current
    call's step, for a display's text (``text()``)."""

    def __init__(self, clock: Callable[[], float]):
        self.clock, self.t0 = clock, clock()
        self.tokens, self.t, self.total = 0, 0, 0

    def __call__(self, t: int, total: int, rows: int) -> None:
        self.tokens += rows
        self.t, self.total = t, total

    def text(self) -> str:
        """``"decode 12/64 · 35 tok/s"`` while a call runs; "" before the first step."""
        if not self.total:
            return ""
        rate = self.tokens / max(1e-9, self.clock() - self.t0)
        return f"decode {self.t}/{self.total} · {rate:,.0f} tok/s"
