"""What a verifier's score must be, and how a failed verification is told: the checks and
reports the verifier pool (``rewards.pool``) applies in its workers and in-process."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field

from explorl.errors import RewardError
from explorl.rewards.functions import RewardSpec, resolve_scorer

log = logging.getLogger("explorl.rewards.pool")  # the pool's own log lines

SCORE_RANGE = (0.0, 1.0)
"""Every verifier score must be a finite number in this range; anything else (NaN, inf, 1e30,
the string "1.0", None) counts as an error of that response and scores 0.0. A weighted sum of
reward functions (``RewardSpec(bounded=False)``) only has to be finite."""

SCORE_TOLERANCE = 1e-9
"""Scores this close outside ``SCORE_RANGE`` are float round-off and are clamped into it: e.g.
reasoning-gym's spell_backward sums 1/len per matching letter, and 8 × (1/8) gives
1.0000000000000002 for a fully right 8-letter answer."""


def check_score(value: object, bounded: bool = True) -> float:
    """``value`` as a float score, or ``RewardError`` saying why it is not one."""
    if isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        raise RewardError(f"score {value!r:.60} is a {type(value).__name__}, not a number")
    score = float(value)
    lo, hi = SCORE_RANGE if bounded else (-math.inf, math.inf)
    if bounded and lo - SCORE_TOLERANCE <= score <= hi + SCORE_TOLERANCE:
        return min(max(score, lo), hi)
    if not lo <= score <= hi or not math.isfinite(score):  # also NaN
        raise RewardError(f"score {score!r} is outside [{lo:g}, {hi:g}]"
                          if bounded else f"reward {score!r} is not finite")
    return score


def bounded_spec(spec) -> bool:
    """Whether ``spec``'s scores must lie in ``SCORE_RANGE`` (a verifier) or only be finite."""
    return not isinstance(spec, RewardSpec) or spec.bounded


def resolve_spec(spec, warm: bool = False):
    """A reward spec's scorer, or a job spec's own ``resolve`` (``explorl.tools.ToolSpec``)."""
    own = getattr(spec, "resolve", None)
    return own(warm=warm) if own is not None else resolve_scorer(spec, warm=warm)


def checked(spec, value):  # a checked score, or the job spec's own check
    own = getattr(spec, "check", None)
    return own(value) if own is not None else check_score(value, bounded_spec(spec))


def call_budget(timeout_s: float, n: int, num_workers: int) -> float:
    """Default wall-clock budget of one ``score`` call of ``n`` responses
    (``reward.step_timeout_s: null``): room for four full per-response time limits plus a
    quarter of one for each response a worker has to verify."""
    return timeout_s * (4 + n / max(1, num_workers) / 4)


@dataclass(frozen=True)
class ScoreResult:
    """Scores of one ``VerifierPool.score`` call; failed verifications score 0.0 and are counted."""

    scores: list[float]
    timeouts: int = 0
    """Verifications cut off at the time limit (their worker was killed and replaced)."""
    errors: int = 0
    """Verifications that raised or killed their worker (crash, segfault, memory limit)."""
    problem: str | None = None
    """The first failure, in user terms: the function as the user named it and why."""
    failures: dict[int, str] = field(default_factory=dict)
    """Why each failed item failed (index -> reason; a tool call's error message)."""


def describe(spec) -> str:
    """A verifier or reward spec as the user wrote it (``my_rewards.py:f``, ``lab:addition``,
    ``a.py:f + b.py:g``), not its repr; files under the working directory are shown relative."""
    refs = ([spec] if isinstance(spec, str) else list(spec.refs) if hasattr(spec, "refs")
            else [t.ref for t in spec.terms])
    shown = []
    for ref in refs:
        target, sep, attr = ref.rpartition(":")
        if sep and os.path.isabs(target):
            rel = os.path.relpath(target)
            target = target if rel.startswith("..") else rel
            ref = f"{target}:{attr}"
        shown.append(ref)
    return " + ".join(shown)


def report_failures(spec, n: int, errors: int, timeouts: int, problem: str | None,
                    timeout_s: float | None) -> str | None:
    """Log one warning line for a call with failures; return its first failure's message."""
    if not (errors or timeouts):
        return None
    name = describe(spec)
    kind = getattr(spec, "kind", None) or (
        "reward function" if isinstance(spec, RewardSpec) and not spec.bounded else "verifier")
    parts = []
    if errors:
        parts.append(f"{errors} of {n} responses failed, e.g. {problem}")
    if timeouts:
        parts.append(f"{timeouts} of {n} responses timed out after "
                     f"reward.timeout_s={timeout_s:g} s")
    if kind != "tool":  # a tool's failures are the model's mistakes, counted in tools/errors
        log.warning("%s %s: %s (scored 0)", kind, name, "; ".join(parts))
    problem = problem or f"timed out after reward.timeout_s={timeout_s:g} s"
    return f"{kind} {name}: {problem}"


def score_inline(fn, responses: list[str], gts: list[str], ctxs: list,
                  spec=None) -> ScoreResult:
    """In-process scoring with the pool's failure accounting but no time limit."""
    scores, errors, problem, failures = [], 0, None, {}
    for i, (response, gt, ctx) in enumerate(zip(responses, gts, ctxs)):
        try:
            scores.append(checked(spec, fn(response, gt, ctx)))
        except Exception as e:
            log.debug("verifier raised", exc_info=True)
            scores.append(0.0)
            errors += 1
            failures[i] = f"{type(e).__name__}: {e}"[:200]
            problem = problem or failures[i]
    return ScoreResult(scores, 0, errors, problem, failures)
