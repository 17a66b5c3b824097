"""The ``watch`` section: when a run warns or stops on its own (docs/failures.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WatchConfig:
    collapse_entropy: float = 0.02
    """Collapse monitor: entropy floor in nats. When ``entropy/mean`` stays below it for
    ``collapse_steps`` steps in a row while ``reward/accuracy`` does not improve, the run warns
    once (and goes on). The lab's GRPO runs stay above 0.15 (docs/failures.md); 0 = off."""
    collapse_steps: int = 10
    """Collapse monitor: how many consecutive steps below ``collapse_entropy`` make a collapse."""
    collapse_min_gain: float = 0.02
    """Collapse monitor: accuracy improves when the mean ``reward/accuracy`` of the window's
    second half exceeds its first half's by more than this; then there is no warning."""
    reward_fail_steps: int = 3
    """Stop the run (exit 2, with the first error's message) after this many consecutive steps
    on which every verification failed or timed out: nothing can be learned from them."""
    reward_fail_frac: float = 0.5
    """Also stop when more than this fraction of the verifications of the last
    ``reward_fail_window`` steps failed or timed out. 1 = only the consecutive rule."""
    reward_fail_window: int = 10
    """Steps over which ``reward_fail_frac`` is measured (checked once that many have run)."""
    signal_steps: int = 3
    """No-signal check: over the run's first this many training steps, when at least
    ``signal_zero_frac`` of the prompt groups had advantages of 0 (every response the same
    reward: no gradient), the run warns once with what the responses lacked
    (docs/failures.md). 0 = off."""
    signal_zero_frac: float = 0.9
    """No-signal check: the share of groups with advantages of 0 over the first
    ``signal_steps`` steps (``adv/zero_group_frac``, with dynamic sampling's filtered groups
    counted as zero) at or above which the run warns."""
