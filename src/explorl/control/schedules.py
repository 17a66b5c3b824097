"""Target-entropy schedules for the adaptive controller (Entropy Scheduling §4b,
docs/methods/entropy-scheduling.md §4b).

A schedule maps a 1-based training step to the entropy (nats) the controller should hold:

- ``constant(target)``: H* at every step.
- ``cosine(start → end)``: a half cosine over the whole run, ``start`` at step 1 and ``end``
  at ``max_steps``.
- ``wsd(target, end, anneal_ratio)``: warm-up-stable-decay. H* until the annealing phase, then
  a decay (``decay="cosine"`` or ``"linear"``) that reaches ``end`` at ``max_steps``. With
  ``release=True`` the annealing phase instead *releases* the controller: it stops tracking
  and its knob returns to its floor (eps_high → 0.2), letting entropy fall on its own — the
  paper's "revert to the lower clip value". The decayed target is still reported for
  reference, but nothing tracks it.

The annealing phase is shared with E3's annealing (docs/methods/e3.md §1b) and the curriculum (4c):
``anneal_start = max_steps − floor(max_steps · ratio)``, the phase is every step ≥
``anneal_start``, and ``progress = (step − anneal_start)/(max_steps − anneal_start)`` runs
from 0 at ``anneal_start`` to 1 at ``max_steps``. When ``floor(max_steps · ratio) = 0`` there
is no annealing phase at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


def anneal_start(max_steps: int, ratio: float) -> int | None:
    """First step of the annealing phase (E3 Eq. 5), or ``None`` when the phase is empty."""
    # + 1e-9: max_steps·ratio such as 100·0.29 = 28.999999999999996 should floor to 29,
    # as the recipe author meant, not to 28.
    n_anneal = math.floor(max_steps * ratio + 1e-9)
    if n_anneal <= 0:
        return None
    return max_steps - n_anneal


def anneal_progress(step: int, max_steps: int, ratio: float) -> float | None:
    """Progress in [0, 1] through the annealing phase at ``step``; ``None`` before it."""
    start = anneal_start(max_steps, ratio)
    if start is None or step < start:
        return None
    return min(1.0, (step - start) / (max_steps - start))


def _half_cosine(progress: float) -> float:
    """½(1 + cos(π·progress)): 1 at progress 0, 0 at progress 1."""
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class Schedule:
    """A target-entropy schedule: ``schedule(step, max_steps) -> float`` (step is 1-based)."""

    def __call__(self, step: int, max_steps: int) -> float:
        raise NotImplementedError

    def released(self, step: int, max_steps: int) -> bool:
        """True when the controller must stop tracking at ``step`` (WSD with ``release``)."""
        return False


@dataclass(frozen=True)
class Constant(Schedule):
    """H(step) = target."""

    target: float

    def __call__(self, step: int, max_steps: int) -> float:
        return self.target


@dataclass(frozen=True)
class Cosine(Schedule):
    """H(step) = end + (start − end)·½(1 + cos(π·(step − 1)/(max_steps − 1)))."""

    start: float
    end: float

    def __call__(self, step: int, max_steps: int) -> float:
        # step 1 → start, max_steps → end; a one-step run stays at start.
        progress = 0.0 if max_steps <= 1 else min(1.0, max(0.0, (step - 1) / (max_steps - 1)))
        return self.end + (self.start - self.end) * _half_cosine(progress)


@dataclass(frozen=True)
class WSD(Schedule):
    """H* until ``anneal_start``, then a cosine/linear decay to ``end`` at ``max_steps``."""

    target: float
    end: float
    anneal_ratio: float = 0.1
    release: bool = False
    decay: Literal["cosine", "linear"] = "cosine"

    def __post_init__(self) -> None:
        if self.decay not in ("cosine", "linear"):
            raise ValueError(f"wsd decay must be 'cosine' or 'linear', got {self.decay!r}")

    def __call__(self, step: int, max_steps: int) -> float:
        p = anneal_progress(step, max_steps, self.anneal_ratio)
        if p is None:
            return self.target
        if self.decay == "cosine":
            return self.end + (self.target - self.end) * _half_cosine(p)
        return self.target + (self.end - self.target) * p

    def released(self, step: int, max_steps: int) -> bool:
        return self.release and anneal_progress(step, max_steps, self.anneal_ratio) is not None


def constant(target: float) -> Constant:
    return Constant(target)


def cosine(start: float, end: float) -> Cosine:
    return Cosine(start, end)


def wsd(
    target: float,
    end: float,
    anneal_ratio: float = 0.1,
    release: bool = False,
    decay: Literal["cosine", "linear"] = "cosine",
) -> WSD:
    return WSD(target, end, anneal_ratio, release, decay)


SCHEDULES = {"constant": constant, "cosine": cosine, "wsd": wsd}

# Which of the (flat, ScheduleConfig-shaped) parameters each kind reads.
_PARAMS = {
    "constant": ("target",),
    "cosine": ("start", "end"),
    "wsd": ("target", "end", "anneal_ratio", "release", "decay"),
}
_ALL_PARAMS = frozenset(p for ps in _PARAMS.values() for p in ps)


def make_schedule(kind: str, **params) -> Schedule:
    """Build a schedule by name from ScheduleConfig-shaped parameters.

    ``params`` may hold the parameters of every kind (``target``, ``start``, ``end``,
    ``anneal_ratio``, ``release``, ``decay``) so a whole config section can be passed; each
    kind reads only its own. A name that no kind knows is an error.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}; valid: {', '.join(SCHEDULES)}")
    unknown = set(params) - _ALL_PARAMS
    if unknown:
        raise ValueError(
            f"unknown schedule parameter(s) {', '.join(sorted(unknown))}; "
            f"valid: {', '.join(sorted(_ALL_PARAMS))}"
        )
    used = {k: v for k, v in params.items() if k in _PARAMS[kind]}
    return SCHEDULES[kind](**used)
