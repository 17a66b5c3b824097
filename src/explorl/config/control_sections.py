"""The ``control`` section: one dataclass per exploration controller.

Each section's ``RANGES`` gives the interval of its numeric fields (keys relative to the
section; ``config.ranges.RANGES`` gathers them under ``control.<name>.``). The controller itself
(class, checks, knobs, metrics) is in ``explorl.control.<name>``, registered in
``explorl.control.registry``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional

from explorl.config.intervals import SAMPLES, TEMPERATURE, TOKENS


@dataclass
class TemperatureControlConfig:
    enabled: bool = False
    """E3 temperature scheduler (docs/methods/e3.md §1a): hold entropy at its first-step level
    H0."""
    t_min: float = 0.5
    """Lower clamp of the temperature."""
    t_max: float = 2.0
    """Upper clamp of the temperature."""
    anneal: bool = False
    """E3 annealing (1b): cosine-decay the target entropy to β·H0 over the last steps."""
    annealing_ratio: float = 0.4
    """Fraction of steps at the end of the run that anneal."""
    beta: float = 0.9
    """Final target as a fraction of H0."""

    RANGES: ClassVar[dict[str, str]] = {
        "t_min": TEMPERATURE, "t_max": TEMPERATURE, "annealing_ratio": "[0, 1)", "beta": "(0, 1]",
    }


@dataclass
class BudgetControlConfig:
    enabled: bool = False
    """E3 dynamic rollout budgets (1c): more samples for harder prompts, same batch total."""
    n_min_limit: int = 4
    """Smallest per-prompt budget once fully widened."""
    n_max_limit: int = 12
    """Largest per-prompt budget once fully widened."""
    widen: int = 2
    """How much [n_min, n_max] widens per epoch (starts at [n_samples, n_samples])."""
    allocator: Literal["e3", "knapsack"] = "e3"
    """How counts are allocated within [n_min, n_max] at the same batch total: ``e3`` (E3's linear
    allocation by cumulative accuracy rank) or ``knapsack`` (Knapsack RL, §6h: maximise the
    expected value of non-zero-gradient groups from each prompt's last success rate; unseen
    prompts get n_samples)."""
    knapsack_alpha: float | None = 0.9
    """knapsack: a valued prompt needs only ln(1 − α)/ln max(p, 1 − p) samples and the excess goes
    to unsolved prompts (the code's fallback, 0.9). None = off (all to valued prompts)."""

    RANGES: ClassVar[dict[str, str]] = {
        "n_min_limit": SAMPLES, "n_max_limit": SAMPLES, "widen": "[0, 4096]",
        "knapsack_alpha": "(0, 1)",
    }


@dataclass
class EEPOControlConfig:
    enabled: bool = False
    """EEPO sample-then-forget (section 3)."""
    window: int = 3
    """m: moving-average window of entropy for the gate."""
    alpha: float = 0.3
    """Gate: unlearn when the moving-average entropy is below alpha."""
    lr: float = 3e-3
    """Learning rate of the single unlearning gradient step on the rollout copy."""
    eps_l: float = 1e-3
    """Lower clip of the sampled token's probability in log(1 − p)."""
    eps_r: float = 1e-2
    """Upper clip margin: p ≤ 1 − eps_r."""

    RANGES: ClassVar[dict[str, str]] = {
        "window": "[1, 100000]", "alpha": "[0, inf)", "lr": "(0, inf)", "eps_l": "[0, 1)",
        "eps_r": "(0, 1)",  # 0 lets p reach 1: log(1 − p) = −inf
    }


@dataclass
class ScheduleConfig:
    kind: str = "constant"
    """Target entropy schedule: constant, cosine (start→end over the run), wsd (stable then
    anneal)."""
    target: float = 0.4
    """constant/wsd: the held target entropy (nats)."""
    start: float = 0.6
    """cosine: target at the first step."""
    end: float = 0.2
    """cosine/wsd: target at the last step."""
    anneal_ratio: float = 0.1
    """wsd: fraction of steps at the end that anneal."""
    release: bool = False
    """wsd: in the anneal phase release the controller (knob returns to its floor) instead of
    decaying the target."""

    RANGES: ClassVar[dict[str, str]] = {
        "target": "[0, inf)", "start": "[0, inf)", "end": "[0, inf)", "anneal_ratio": "[0, 1)",
    }


@dataclass
class AdaptiveControlConfig:
    enabled: bool = False
    """Entropy Scheduling adaptive controller (4a) tracking a target entropy schedule."""
    actuator: str = "eps_high"
    """Knob it drives: eps_high (the paper), entropy_coef, kl_coef or temperature. The loss must
    read it (refused otherwise: CISPO and KL-Cov have no eps_high clip)."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Target entropy schedule."""
    warmup: int = 5
    """Steps holding the initial knob value before control starts."""
    window: int = 3
    """Steps averaged for the current and scheduled entropy."""
    delta: Optional[float] = None
    """Step size of the knob per step. None = the actuator's default (eps_high: 0.01)."""
    init: Optional[float] = None
    """Initial knob value. None = the actuator's default (eps_high: 0.28). The controller owns
    the knob from the first step, so this replaces the recipe's value (algorithm.eps_high, ...),
    which must lie in [min, max]: a loss on another scale (GSPO's eps_high 4e-4, Clip-Cov's 1.0)
    is refused until init, min and max are set on its scale."""
    min: Optional[float] = None
    """Lower clamp. None = the actuator's default (eps_high: 0.2)."""
    max: Optional[float] = None
    """Upper clamp. None = the actuator's default (eps_high: 0.4)."""
    deadband: float = 0.02
    """No change while |target − entropy| ≤ deadband × target (bang_bang only)."""
    law: Literal["bang_bang", "pi"] = "bang_bang"
    """Control law. ``bang_bang``: ±delta per step (the paper's Algorithm 1). ``pi``: knob =
    clip(init + kp·e + ki·Σ earlier e, min, max) with e = sign·(target − entropy) over the
    window (§6f's PI law; sign +1 when raising the knob raises entropy)."""
    kp: float | None = None
    """pi: proportional gain, knob units per nat. None = 10·delta (a 0.1-nat error moves the knob
    by δ)."""
    ki: float | None = None
    """pi: integral gain, knob units per nat·step. None = delta."""
    anti_windup: bool = True
    """pi: stop integrating an error that pushes further into a bound the knob is pinned at."""

    RANGES: ClassVar[dict[str, str]] = {
        "warmup": "[0, 100000000]", "window": "[1, 100000]", "delta": "[0, inf)",
        "init": "(-inf, inf)",  # and inside the actuator's own range (control.adaptive's check)
        "min": "(-inf, inf)", "max": "(-inf, inf)", "deadband": "[0, inf)", "kp": "[0, inf)",
        "ki": "[0, inf)",
    }


@dataclass
class EntroPICControlConfig:
    enabled: bool = False
    """EntroPIC (arXiv 2511.15248, §6f): a PI controller on the weight of positive vs negative
    samples among confident tokens (owns the ``pos_neg_weight`` knob α; loss += α·mean over
    tokens with π_old > p_min of −ratio·|A|). α > 0 sharpens, α < 0 raises entropy."""
    target: float = 0.1
    """Target entropy H* (nats; the official script's 0.1 at T = 0.6). < 0 = off (α = 0)."""
    kp: float = 1.0
    """Proportional gain (official: 1)."""
    ki: float = 0.01
    """Integral gain on the sum of earlier errors (official: 0.01)."""
    anti_windup: bool = False
    """Conditional integration while α is pinned at ±1 (ours; off as in the official code)."""
    p_min: float = 0.95
    """A token is confident when its probability under the sampling policy exceeds this
    (official: 0.95)."""

    RANGES: ClassVar[dict[str, str]] = {
        "target": "(-inf, inf)",  # < 0 = off
        "kp": "[0, inf)", "ki": "[0, inf)", "p_min": "(0, 1)",
    }


@dataclass
class EntropyCoefControlConfig:
    enabled: bool = False
    """Adaptive entropy coefficient (Skywork-OR1 ``EntController``; TRL #6140; §6g): each step
    c ← clip(c ± delta) (+ while H < target), then the bonus uses c·1[H < target] (update, then
    apply, as Skywork's code). Owns ``entropy_coef``."""
    target: float = 0.2
    """Target entropy H* (nats; Skywork scripts: 0.2)."""
    delta: float = 1e-4
    """Step of c per training step (Skywork: 1e-4; TRL: 5e-3)."""
    init: float = 0.0
    """c₀ (Skywork: 0)."""
    min: float = 0.0
    """Lower bound of c. At 0 the controller keeps running (TRL's first version died there)."""
    max: float = 5e-3
    """Upper bound of c (Skywork: 5e-3; TRL: 1)."""
    inclusive: bool = False
    """Count H = target as below it (TRL's ≤); Skywork uses <."""

    RANGES: ClassVar[dict[str, str]] = {
        "target": "(-inf, inf)", "delta": "[0, inf)", "init": "[0, inf)", "min": "[0, inf)",
        "max": "[0, inf)",
    }


@dataclass
class CurriculumControlConfig:
    enabled: bool = False
    """Staged curriculum (4c): at the annealing phase switch data, samples and length limit."""
    start_ratio: float = 0.1
    """The last fraction of steps that form the annealing phase."""
    n_samples: Optional[int] = None
    """Samples per prompt in the annealing phase (paper: 8 → 32). None = unchanged."""
    max_response_len: Optional[int] = None
    """Length limit in the annealing phase (paper: 4k → 16k). None = unchanged."""

    RANGES: ClassVar[dict[str, str]] = {
        "start_ratio": "(0, 1)", "n_samples": SAMPLES, "max_response_len": TOKENS,
    }


@dataclass
class ControlConfig:
    temperature: TemperatureControlConfig = field(default_factory=TemperatureControlConfig)
    """E3 temperature scheduler."""
    budget: BudgetControlConfig = field(default_factory=BudgetControlConfig)
    """E3 dynamic rollout budgets."""
    eepo: EEPOControlConfig = field(default_factory=EEPOControlConfig)
    """EEPO sample-then-forget."""
    adaptive: AdaptiveControlConfig = field(default_factory=AdaptiveControlConfig)
    """Entropy Scheduling adaptive controller."""
    curriculum: CurriculumControlConfig = field(default_factory=CurriculumControlConfig)
    """Staged curriculum."""
    entropic: EntroPICControlConfig = field(default_factory=EntroPICControlConfig)
    """EntroPIC positive/negative sample weights."""
    entropy_coef: EntropyCoefControlConfig = field(default_factory=EntropyCoefControlConfig)
    """Adaptive entropy coefficient (Skywork-OR1 / TRL)."""


