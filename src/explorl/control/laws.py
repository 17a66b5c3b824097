"""Pure control laws for the entropy controllers (docs/methods/wider-field.md §6f, §6g): a PI law,
EntroPIC's positive/negative sample-weight coefficient, and the Skywork-OR1/TRL adaptive entropy
coefficient.

Each law is a small dataclass: its parameters, its state (one float) with ``state_dict`` /
``load_state_dict``, and a ``step`` that maps this step's measured entropy to the knob value,
deterministically. They own no knob and read no batch: a ``Controller`` wraps a law, feeds it
the *global* entropy (identical on every rank) and writes the knob it owns (§5). No defaults
here: they live in the config; the papers' values are quoted in each docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PIGains:
    """u = clip(bias + kp·e + ki·I, u_min, u_max) with I the sum of the *earlier* errors.

    ``anti_windup`` (ours; EntroPIC has none): conditional integration — while the output is
    saturated, an error that pushes further into the bound is not added to I, so I cannot grow
    without limit while the knob is pinned and the loop recovers as soon as the error turns.
    """

    kp: float
    ki: float
    u_min: float
    u_max: float
    bias: float = 0.0
    anti_windup: bool = False

    def __post_init__(self) -> None:
        if not self.u_min <= self.u_max:
            raise ValueError(f"PI law: need u_min ≤ u_max, got {self.u_min}, {self.u_max}")


def pi_step(gains: PIGains, integral: float, error: float) -> tuple[float, float]:
    """One PI update: returns (output u for this step, integral for the next step).

    The output uses the integral *before* this error (EntroPIC's order: α from the error sum
    of the earlier steps, then I += e).
    """
    raw = gains.bias + gains.kp * error + gains.ki * integral
    u = min(gains.u_max, max(gains.u_min, raw))
    winding = (raw > gains.u_max and gains.ki * error > 0) or (
        raw < gains.u_min and gains.ki * error < 0
    )
    if not (gains.anti_windup and winding):
        integral += error
    return u, integral


@dataclass
class PILaw:
    """A PI law with its integral as state (``pi_step`` applied in place)."""

    gains: PIGains
    integral: float = 0.0

    def step(self, error: float) -> float:
        u, self.integral = pi_step(self.gains, self.integral, float(error))
        return u

    def state_dict(self) -> dict[str, Any]:
        return {"integral": self.integral}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.integral = float(state["integral"])


@dataclass
class EntroPICLaw:
    """EntroPIC's coefficient α of the confident-token term (arXiv 2511.15248;
    docs/methods/wider-field.md §6f): α = clip(Kp·e + Ki·I, −1, 1), e = H − H*, then I += e.

    α > 0 (entropy above target) sharpens, α < 0 raises entropy; the trainer adds
    ``α · algorithms.regularisers.entropic_confident_term(...)`` to the loss. **Ours**: one α
    per optimizer step from the global entropy and one I += e per step, with I in the
    checkpoint (the official code integrates per micro-batch and per rank, so ranks diverge).
    ``target`` < 0 switches it off (α = 0, I frozen), as the official script. Official
    defaults (``run_entropic.sh``): H* = 0.1, Kp = 1, Ki = 0.01 at T = 0.6.
    """

    target: float
    kp: float
    ki: float
    anti_windup: bool = False
    integral: float = 0.0

    def step(self, entropy: float) -> float:
        if self.target < 0:
            return 0.0
        gains = PIGains(self.kp, self.ki, -1.0, 1.0, anti_windup=self.anti_windup)
        alpha, self.integral = pi_step(gains, self.integral, float(entropy) - self.target)
        return alpha

    def state_dict(self) -> dict[str, Any]:
        return {"integral": self.integral}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.integral = float(state["integral"])


@dataclass
class EntropyCoefLaw:
    """Adaptive entropy-bonus coefficient (Skywork-OR1 2505.22312 ``EntController``; TRL #6140;
    docs/methods/wider-field.md §6g).

    At a step with entropy e: first c ← clip(c + Δ if e < H* else c − Δ, c_min, c_max), then the
    bonus uses ``applied = c · 1[e < H*]`` (``inclusive``: e ≤ H*, TRL): update, then apply, as
    Skywork-OR1's code (docs/methods/wider-field.md §6g: c = 0, e = 0.15 → c = 1e-4, applied 1e-4).
    The update always runs: TRL's first version gated it on ``coef != 0``, so with c_min = 0 the
    first step down to 0 killed the controller for good. Skywork scripts: c₀ = 0, H* = 0.2, Δ =
    1e-4, c ∈ [0, 5e-3]; TRL: Δ = 5e-3, c ∈ [0, 1].
    """

    target: float
    delta: float
    c_min: float
    c_max: float
    coef: float  # c for the coming step (starts at c₀)
    inclusive: bool = False

    def __post_init__(self) -> None:
        if not self.c_min <= self.coef <= self.c_max or self.delta < 0:
            raise ValueError(
                f"entropy coefficient law: need c_min ≤ c0 ≤ c_max and delta ≥ 0, got "
                f"{self.c_min}, {self.coef}, {self.c_max}, {self.delta}"
            )

    def below(self, entropy: float) -> bool:
        return entropy <= self.target if self.inclusive else entropy < self.target

    def step(self, entropy: float) -> tuple[float, float]:
        """Returns (coefficient applied this step, c after this step's update)."""
        below = self.below(float(entropy))
        moved = self.coef + self.delta if below else self.coef - self.delta
        self.coef = min(self.c_max, max(self.c_min, moved))
        return (self.coef if below else 0.0), self.coef

    def state_dict(self) -> dict[str, Any]:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.coef = float(state["coef"])
