"""Watching a run for trouble it cannot learn through (the recipe's ``watch`` section).

- ``NonFiniteGuard``: steps skipped for a non-finite loss, gradient or reward.
- ``CollapseMonitor``: entropy below a floor for several steps while accuracy does not improve:
  the policy has collapsed onto a few answers. Warns once, naming the knobs that usually help;
  the run goes on (a collapsed policy can still be the user's goal).
- ``RewardFailureGuard``: a verifier or reward function that fails or times out on every
  response for several steps in a row, or on most of them over a window, leaves nothing to learn
  from (all rewards 0): the run stops with the first error's message (exit 2). Each scoring
  pass counts alone (``reward/verify_failed_frac``): reward functions that fail on every
  response stop the run even when the verifier, which only measures accuracy, works.

A stop checkpoints the run's last finite weights first (``preemption.keep_last_weights``).

Each reads the step's global statistics, so every rank decides alike (docs/failures.md).
"""

from __future__ import annotations

import logging
import math
from collections import deque

import torch

from explorl.config import RunConfig
from explorl.config.watch_sections import WatchConfig
from explorl.control.base import StepStats
from explorl.errors import ExplorlError, RewardError
from explorl.training.no_signal import NoSignalMonitor

log = logging.getLogger(__name__)

COLLAPSE_ADVICE = (
    "knobs that usually help: a lower optim.lr; algorithm.eps_high 0.28 (clip-higher); an "
    "entropy bonus (algorithm.entropy_coef); rollout.temperature above 1; or an entropy "
    "controller (explorl recipes: lab/e3_ts, lab/es_constant, lab/clip_cov)")



class TrainingDiverged(ExplorlError):
    """Too many consecutive steps with a non-finite loss, gradient or reward."""


class RewardFailures(RewardError):
    """A verifier or reward function failed or timed out on too many responses."""


class NonFiniteGuard:
    """Counts steps whose update was skipped for non-finite values, says so on the console as
    each happens, and stops the run after ``max_bad`` in a row or once more than ``max_frac`` of
    ``max_steps`` were skipped, in a row or not (the skipped updates left the weights untouched).
    """

    def __init__(self, max_bad: int, max_frac: float = 1.0, max_steps: int = 0) -> None:
        self.max_bad, self.in_a_row, self.skipped = max_bad, 0, 0
        self.max_frac, self.max_steps = max_frac, max_steps

    def check(self, step: int, metrics: dict, rewards: torch.Tensor) -> None:
        reward_ok = bool(torch.isfinite(rewards).all())
        bad = metrics.get("train/nonfinite_updates", 0.0) > 0 or not reward_ok
        self.in_a_row = self.in_a_row + 1 if bad else 0
        self.skipped += int(bad)
        metrics["train/skipped_steps"] = float(self.skipped)
        if not bad:
            return
        what = ("reward" if not reward_ok else
                "loss" if not math.isfinite(metrics.get("loss/policy", 0.0)) else "gradient norm")
        log.warning("step %d skipped: non-finite %s (weights not updated; %d skipped so far)",
                    step, what, self.skipped)
        advice = ("the weights were not updated by them. Lower optim.lr or check the reward "
                  "function")
        if self.in_a_row >= self.max_bad:
            raise TrainingDiverged(
                f"step {step}: {self.in_a_row} consecutive steps with a non-finite loss, "
                f"gradient or reward (grad/norm={metrics.get('grad/norm')}, "
                f"reward/mean={float(rewards.mean())}); " + advice
            )
        if self.skipped > self.max_frac * self.max_steps:
            raise TrainingDiverged(
                f"step {step}: {self.skipped} step{'s' * (self.skipped != 1)} skipped for a "
                f"non-finite loss, gradient or "
                f"reward, more than optim.max_bad_frac={self.max_frac:g} of the run's "
                f"{self.max_steps} steps (the last: non-finite {what}); " + advice
            )

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row, self.skipped = int(state.get("in_a_row", 0)), int(state.get("skipped", 0))


class CollapseMonitor:
    """Warns once when the policy's entropy (the controllers' ``StepStats.entropy``, at the
    sampling temperature) < ``collapse_entropy`` for ``collapse_steps`` steps in a row and the
    mean accuracy of the step's samples over the window's second half is not more than
    ``collapse_min_gain`` above its first half's."""

    def __init__(self, cfg: WatchConfig) -> None:
        self.cfg = cfg
        self.low: deque[float] = deque(maxlen=cfg.collapse_steps)  # accuracy of the low steps
        self.warned = False

    def check(self, step: int, H: float, acc: float) -> str | None:
        """The warning, the one time it fires (it is also logged); else None. ``H``: the
        step's policy entropy; ``acc``: the fraction of its samples that were correct."""
        c = self.cfg
        if self.warned or c.collapse_entropy <= 0:
            return None
        if not H < c.collapse_entropy:  # also NaN: not a collapse, the guard handles it
            self.low.clear()
            return None
        self.low.append(float(acc))
        if len(self.low) < c.collapse_steps:
            return None
        half = c.collapse_steps // 2
        window = list(self.low)
        first, second = sum(window[:half]) / half, sum(window[-half:]) / half
        if second - first > c.collapse_min_gain:
            return None
        self.warned = True
        text = (f"step {step}: the policy looks collapsed: its entropy has stayed below "
                f"watch.collapse_entropy={c.collapse_entropy:g} for {c.collapse_steps} steps "
                f"(now {H:.4f}) while accuracy did not improve ({first:.3f} → "
                f"{second:.3f}); {COLLAPSE_ADVICE}")
        log.warning("warning: %s", text)
        return text

    def state_dict(self) -> dict:
        return {"low": list(self.low), "warned": self.warned}

    def load_state_dict(self, state: dict) -> None:
        self.low = deque(state.get("low", []), maxlen=self.cfg.collapse_steps)
        self.warned = bool(state.get("warned", False))


class RewardFailureGuard:
    """Stops the run (``RewardFailures``, exit 2) when ``reward/verify_failed_frac`` is 1 for
    ``reward_fail_steps`` steps in a row, or its mean over the last ``reward_fail_window`` steps
    exceeds ``reward_fail_frac``."""

    def __init__(self, cfg: WatchConfig) -> None:
        self.cfg = cfg
        self.recent: deque[float] = deque(maxlen=cfg.reward_fail_window)
        self.in_a_row = 0
        self.first: str | None = None  # the first failure of the current bad stretch

    def check(self, step: int, metrics: dict, problem: str | None) -> None:
        c = self.cfg
        frac = metrics.get("reward/verify_failed_frac")
        if frac is None:
            return
        self.recent.append(float(frac))
        self.in_a_row = self.in_a_row + 1 if frac >= 1.0 else 0
        if frac == 0:  # a clean step ends the stretch whose first error is reported
            self.first = None
        elif self.first is None:
            self.first = problem
        why = None
        if self.in_a_row >= c.reward_fail_steps:
            why = (f"every response's verification failed or timed out on {self.in_a_row} steps "
                   f"in a row (watch.reward_fail_steps={c.reward_fail_steps})")
        elif (len(self.recent) == c.reward_fail_window
              and sum(self.recent) / len(self.recent) > c.reward_fail_frac):
            share = sum(self.recent) / len(self.recent)
            why = (f"{share:.0%} of the verifications of the last {c.reward_fail_window} steps "
                   f"failed or timed out (more than watch.reward_fail_frac="
                   f"{c.reward_fail_frac:g})")
        if why is not None:
            raise RewardFailures(f"step {step}: {why}; nothing can be learned from all-zero "
                              f"rewards. First error: {self.first or problem or 'unknown'}")

    def state_dict(self) -> dict:
        return {"recent": list(self.recent), "in_a_row": self.in_a_row, "first": self.first}

    def load_state_dict(self, state: dict) -> None:
        self.recent = deque(state.get("recent", []), maxlen=self.cfg.reward_fail_window)
        self.in_a_row, self.first = int(state.get("in_a_row", 0)), state.get("first")


class RunWatch:
    """The three watchers, checked once per step right after its update (section 4), and the
    no-signal check of the first steps (``signal``, section 6: it reads the step's metrics)."""

    def __init__(self, cfg: RunConfig) -> None:
        o = cfg.optim
        self.guard = NonFiniteGuard(o.max_bad_steps, o.max_bad_frac, cfg.max_steps)
        self.collapse = CollapseMonitor(cfg.watch)
        self.rewards = RewardFailureGuard(cfg.watch)
        self.signal = NoSignalMonitor(cfg.watch)

    def check(self, step: int, metrics: dict, rewards, stats: StepStats,
              reward_problem: str | None) -> None:
        """``rewards``: the step's (N,) rewards; ``reward_problem``: the rewarder's latest
        failure message (``Rewarder.problem``)."""
        self.guard.check(step, metrics, rewards)
        self.rewards.check(step, metrics, reward_problem)
        samples = sum(stats.prompt_samples)
        self.collapse.check(step, stats.entropy, sum(stats.prompt_correct) / max(1, samples))

    def state_dict(self) -> dict:
        return {"collapse": self.collapse.state_dict(), "rewards": self.rewards.state_dict(),
                "signal": self.signal.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.collapse.load_state_dict(state.get("collapse", {}))
        self.rewards.load_state_dict(state.get("rewards", {}))
        self.signal.load_state_dict(state.get("signal", {}))
