"""AEPO's dynamic entropy-balanced rollout (Dong et al. 2025, arXiv 2510.14545 §4.1; the authors'
``AEPO/.../vllm_rollout_with_tools.py``): ARPO's branching (``rollout/arpo.py``) with a branch
rule that a prompt's run of branching rounds penalises, and optionally a global-sampling count M
set per prompt by entropy pre-monitoring. docs/methods/aepo.md has the rules and an example.

1. **Branch rule with penalty.** For a candidate copy of a response that just got a tool result,
   draw u ~ U[0, 1); copy iff clip((u + α·ΔH)·f, 0, 1) ≥ β, f = max(0, 1 − λ·c), c the prompt's
   number of consecutive rounds that added responses to it (λ ``branch_penalty``). So
   P(copy) = clip(1 − β/f + α·ΔH, 0, 1): at c = 0 and β = 0.5 ARPO's 0.5 + α·ΔH, lower with
   every consecutive round that branched.
2. **Entropy pre-monitoring** (``dynamic_initial``). Before sampling, one probe response per
   prompt runs the whole tool loop; H_root is its first turn's H, H̄_tool the mean H of its turns
   (each H as ARPO's: the window's entropy sum / log|V|). The prompt's global sampling is
   M = min(N, ⌊N·σ(s·(H_root − H̄_tool))⌋ + 1) (s ``budget_sharpness``): more responses from the
   prompt where the question is more uncertain than the tool results, more branches otherwise.
   The probe is not trained on; its tool calls run, and ``tools/calls_run`` counts them.

ΔH is measured as ``rollout.arpo.entropy_at`` says (``rollout/arpo.py``), for both rules.
"""

from __future__ import annotations

import math

from explorl.rollout.arpo import ARPOBranching, ARPOSampler
from explorl.rollout.base import sync_weights
from explorl.rollout.multiturn import _Row
from explorl.rollout.seeding import mix_seed

PROBE_STREAM = 0x9B0E  # seed component of the pre-monitoring probes


def penalty_factor(streak: int, penalty: float) -> float:
    """f = max(0, 1 − λ·c): the factor on a prompt's branch score after c branching rounds."""
    return max(0.0, 1.0 - penalty * streak)


def aepo_copies(u: float, delta_h: float, beta: float, alpha: float, streak: int,
                penalty: float) -> bool:
    """The authors' rule for one draw u: copy iff clip((u + α·ΔH)·f, 0, 1) ≥ β."""
    return min(1.0, max(0.0, (u + alpha * delta_h) * penalty_factor(streak, penalty))) >= beta


def aepo_branch_probability(delta_h: float, beta: float, alpha: float, streak: int,
                            penalty: float) -> float:
    """P(copy) for u ~ U[0, 1): clip(1 − β/f + α·ΔH, 0, 1) (β ≤ 0: 1; f = 0 < β: 0)."""
    if beta <= 0:
        return 1.0
    f = penalty_factor(streak, penalty)
    return 0.0 if f == 0 else min(1.0, max(0.0, 1.0 - beta / f + alpha * delta_h))


def initial_rollouts(n: int, h_root: float, h_tool: float, sharpness: float) -> int:
    """Entropy pre-monitoring's M = min(N, max(1, ⌊N·σ(s·(H_root − H̄_tool))⌋ + 1))."""
    sig = 1.0 / (1.0 + math.exp(-sharpness * (h_root - h_tool)))
    return min(n, max(1, int(n * sig) + 1))


class AEPOBranching(ARPOBranching):
    """ARPO's branching with AEPO's penalised rule; ``initial`` (per prompt, from
    ``AEPOSampler``'s pre-monitoring) replaces M for the next call."""

    def __init__(self, *args, branch_penalty: float = 0.05, **kwargs):
        super().__init__(*args, **kwargs)
        self.penalty = branch_penalty
        self.initial: list[int] | None = None
        self.streak: list[int] = []  # per prompt: consecutive rounds that added responses
        self.penalised = 0  # draws made under a penalty (c > 0), since the last ``pop``

    def first(self, n_samples: list[int]) -> list[int]:
        self.streak = [0] * len(n_samples)
        if self.initial is None:
            return super().first(n_samples)
        m, self.initial = [min(i, n) for i, n in zip(self.initial, n_samples)], None
        return m

    def probability(self, src: _Row) -> float:
        return aepo_branch_probability(self.delta_h(src), self.beta, self.alpha,
                                       self.streak[src.prompt], self.penalty)

    def copies(self, u: float, src: _Row) -> bool:
        c = self.streak[src.prompt]
        self.penalised += c > 0
        return aepo_copies(u, self.delta_h(src), self.beta, self.alpha, c, self.penalty)

    def expand(self, rows, live, budgets, seeds, generator) -> list[int]:
        added = super().expand(rows, live, budgets, seeds, generator)
        grew = {rows[r].prompt for r in added}  # branches and new responses, as the authors
        self.streak = [c + 1 if p in grew else 0 for p, c in enumerate(self.streak)]
        return added

    def pop(self) -> dict[str, float]:
        out = {**super().pop(), "aepo/penalised_draws": float(self.penalised)}
        self.penalised = 0
        return out


class _Probe:
    """A ``branching`` that samples one response per prompt and never branches (the probe)."""

    def __init__(self, window: int) -> None:
        self.window = window

    def first(self, n_samples: list[int]) -> list[int]:
        return [1] * len(n_samples)

    def expand(self, rows, live, budgets, seeds, generator) -> list[int]:
        return []


class AEPOSampler(ARPOSampler):
    """Training samples with AEPO's branching (``rollout.arpo.mode: aepo``), after entropy
    pre-monitoring with ``rollout.arpo.dynamic_initial``. ``engine``: a ``ToolEngine``."""

    def __init__(self, engine, cfg, vocab_size: int) -> None:
        self.engine, self.cfg = engine, cfg
        self.branching = AEPOBranching(cfg.initial_rollouts, cfg.beam_size,
                                       cfg.branch_probability, cfg.entropy_weight, vocab_size,
                                       cfg.entropy_window, cfg.entropy_at,
                                       branch_penalty=cfg.branch_penalty)

    def monitor(self, policy, prompt_ids, budgets, temperature, max_new_tokens, seeds) -> list:
        """Per prompt M from one probe response each (its turns' H; see the module doc)."""
        probe_seeds = None if seeds is None else [mix_seed(s, PROBE_STREAM) for s in seeds]
        self.engine.generate(policy, prompt_ids, [1] * len(prompt_ids), temperature,
                             max_new_tokens, seeds=probe_seeds,
                             branching=_Probe(self.cfg.entropy_window))
        log_v = self.branching.log_v
        out = []
        for row, n in zip(self.engine.last_rows, budgets):  # one row per prompt, in order
            h = [w / log_v for w in row.window] or [0.0]
            out.append(initial_rollouts(n, h[0], sum(h) / len(h), self.cfg.budget_sharpness))
        return out

    def sample(self, policy, version, prompt_ids, budgets, temperature, max_new_tokens, seeds,
               *, unlearn=False, reduce=None):
        sync_s = sync_weights(self.engine, policy, version)
        extra, probe_calls = {}, 0
        if self.cfg.dynamic_initial:
            m = self.monitor(policy, prompt_ids, budgets, temperature, max_new_tokens, seeds)
            self.branching.initial = m
            probe_calls = self.engine.last_calls  # run, though the probes are not trained on
            extra["aepo/initial_mean"] = sum(m) / max(1, len(m))
            extra["aepo/probe_calls"] = float(probe_calls)
        ro = self.engine.generate(policy, prompt_ids, budgets, temperature, max_new_tokens,
                                  seeds=seeds, branching=self.branching)
        m = self.branching.pop()
        m["arpo/branch_frac"] = m["arpo/branches"] / max(1, len(ro))
        m["tools/calls_run"] = float(self.engine.last_calls + probe_calls)
        return ro, {**m, **extra, **({"time/weight_sync_s": sync_s} if sync_s else {})}
