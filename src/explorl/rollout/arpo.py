"""ARPO's entropy-based adaptive rollout (Dong et al. 2025, arXiv 2507.19849 §3.1): branch extra
partial rollouts where the policy is uncertain right after a tool result. docs/methods/arpo.md
has the rules and a worked example.

For a prompt with a budget of N responses (``rollout.n_samples``, or a budget controller's):

1. **Global sampling.** Turn 1 samples M = min(``initial_rollouts``, N) responses.
2. **Entropy after a tool result.** For every turn of a response, H = Σ of the token entropies
   (full vocabulary, at the sampling temperature) over the turn's first w = ``entropy_window``
   tokens, divided by log|V|. H_init is the response's first turn's. With ``entropy_at:
   after_result`` (the paper's rule), each response that just got a tool result first samples
   the first w tokens of its next turn (the look-ahead, kept as that turn's first tokens), and
   ΔH = H of those tokens − H_init. With ``call_turn`` (the authors' code), ΔH is that of the
   turn that just called the tool, whose first w tokens were sampled before the result: 0 at a
   response's first call.
3. **Branching.** Each response that just got a tool result (in order) may add up to
   ``beam_size − 1`` copies of itself while the prompt has fewer than N responses: for each,
   draw u ~ U[0, 1) and copy iff clip(u − α·ΔH, 0, 1) ≤ β (α ``entropy_weight``, β
   ``branch_probability``), i.e. with probability clip(β + α·ΔH, 0, 1). A copy starts from the
   response as it was right after the result (without the look-ahead) and samples its next turn
   with its own draws.
4. **Filling the budget.** A prompt with no response still going and fewer than N gets one new
   response from the prompt per round, until it has N (the partial sampling of N − M).

Advantages: the responses are one group of N (GRPO's baseline over all of them). A token that
a branch shares with its source is in both rows, each with its row's advantage: its total
policy-gradient weight is the sum of the advantages of the rows that share it (the paper's
"soft" attribution, which its code uses).
"""

from __future__ import annotations

import math

import torch

from explorl.rollout.base import sync_weights
from explorl.rollout.multiturn import _Row
from explorl.rollout.seeding import mix_seed

BRANCH_STREAM, FRESH_STREAM = 0xA290, 0xF7E5  # seed components of branch draws and new rows


def uniform(key: int) -> float:
    """A float in [0, 1) that depends only on ``key`` (53 bits of ``mix_seed(key)``)."""
    return (mix_seed(key) >> 10) / 2.0**53


def branch_probability(delta_h: float, beta: float, alpha: float) -> float:
    """P(copy) = P(clip(u − α·ΔH, 0, 1) ≤ β) for u ~ U[0, 1): clip(β + α·ΔH, 0, 1)."""
    return min(1.0, max(0.0, beta + alpha * delta_h))


def copies(u: float, delta_h: float, beta: float, alpha: float) -> bool:
    """The authors' rule for one draw u: copy iff clip(u − α·ΔH, 0, 1) ≤ β."""
    return min(1.0, max(0.0, u - alpha * delta_h)) <= beta


ENTROPY_AT = ("after_result", "call_turn")  # rollout.arpo.entropy_at: where ΔH is measured


class ARPOBranching:
    """The branching rules ``ToolEngine.generate`` applies (``rollout.arpo``)."""

    def __init__(self, initial_rollouts: int, beam_size: int, branch_probability: float,
                 entropy_weight: float, vocab_size: int, window: int = 20,
                 entropy_at: str = "after_result"):
        if entropy_at not in ENTROPY_AT:
            raise ValueError(f"entropy_at: {entropy_at!r} is not one of {ENTROPY_AT}")
        self.M, self.k, self.window = initial_rollouts, beam_size, window
        self.beta, self.alpha = branch_probability, entropy_weight
        self.look_ahead = entropy_at == "after_result"  # ToolEngine samples w tokens first
        self.log_v = math.log(vocab_size)
        self.branches = self.fresh = 0  # counted since the last ``pop``
        self.shared_calls = 0  # tool calls the branches copied with their source's tokens
        self.draws: list[tuple[float, float]] = []  # (ΔH, P(copy)) of each draw since ``pop``

    def first(self, n_samples: list[int]) -> list[int]:
        """Global sampling: min(M, N) responses per prompt in turn 1."""
        return [min(self.M, n) for n in n_samples]

    def delta_h(self, row: _Row) -> float:
        """ΔH = (H_last − H_init) / log|V|: the row's last turn (the look-ahead's after a result
        with ``after_result``; the turn that called with ``call_turn``) against its first."""
        return (row.window[-1] - row.window[0]) / self.log_v

    def probability(self, src: _Row) -> float:
        """P(copy) of one draw for ``src`` (ARPO's; AEPO's overrides it)."""
        return branch_probability(self.delta_h(src), self.beta, self.alpha)

    def copies(self, u: float, src: _Row) -> bool:
        """Whether draw ``u`` copies ``src`` (ARPO's rule; AEPO's overrides it)."""
        return copies(u, self.delta_h(src), self.beta, self.alpha)

    def expand(self, rows: list[_Row], live: list[int], budgets: list[int],
               seeds: list[int] | None, generator: torch.Generator | None) -> list[int]:
        """Add the round's branches and new rows to ``rows``; return their indices. ``live``:
        the rows that just got a tool result (a copy starts from ``fork`` where it has one)."""
        count = [0] * len(budgets)
        for r in rows:
            count[r.prompt] += 1
        added: list[int] = []
        active: dict[int, list[int]] = {}
        for r in live:  # the responses that just got a tool result, by prompt
            active.setdefault(rows[r].prompt, []).append(r)
        for p, sources in active.items():
            slots, made = budgets[p] - count[p], 0
            for s in sources:
                per = min(self.k - 1, slots - made)
                if per <= 0:
                    break
                src = rows[s]
                base = src.fork if src.fork is not None else src  # before any look-ahead
                for c in range(per):
                    key = None if src.key is None else mix_seed(src.key, BRANCH_STREAM,
                                                                base.turns, c)
                    u = (uniform(key) if key is not None  # host: one draw for Python
                         else float(torch.rand((), generator=generator)))  # host
                    self.draws.append((self.delta_h(src), self.probability(src)))
                    if not self.copies(u, src):
                        continue
                    rows.append(base.copy(None if key is None else mix_seed(key, 1), s))
                    added.append(len(rows) - 1)
                    made += 1
                    self.shared_calls += base.calls  # run once, counted in both rows
                if made >= slots:
                    break
            self.branches += made
        for p, n in enumerate(budgets):  # no response going: one more from the prompt
            if p not in active and count[p] < n:
                key = None if seeds is None else mix_seed(seeds[p], FRESH_STREAM, count[p])
                rows.append(_Row(p, key))
                added.append(len(rows) - 1)
                self.fresh += 1
        return added

    def pop(self) -> dict[str, float]:
        """The counts since the last call (docs/metrics.md); ΔH's and P's over the copy draws
        (0 without draws)."""
        d = len(self.draws)
        dh = [h for h, _ in self.draws]
        mean = sum(dh) / d if d else 0.0
        out = {"arpo/branches": float(self.branches), "arpo/fresh": float(self.fresh),
               "arpo/shared_calls": float(self.shared_calls), "arpo/draws": float(d),
               "arpo/branch_rate": self.branches / d if d else 0.0,
               "arpo/copy_prob_mean": sum(p for _, p in self.draws) / d if d else 0.0,
               "arpo/delta_h_mean": mean,
               "arpo/delta_h_std": (math.sqrt(sum((h - mean) ** 2 for h in dh) / d) if d
                                    else 0.0),
               "arpo/delta_h_zero_frac": sum(h == 0 for h in dh) / d if d else 0.0}
        self.branches = self.fresh = self.shared_calls = 0
        self.draws = []
        return out


class ARPOSampler:
    """Training samples with ARPO's branching (validation samples through the engine alone:
    pass@k needs independent samples). ``engine``: a ``ToolEngine``."""

    def __init__(self, engine, cfg, vocab_size: int) -> None:
        self.engine = engine
        self.branching = ARPOBranching(cfg.initial_rollouts, cfg.beam_size,
                                       cfg.branch_probability, cfg.entropy_weight, vocab_size,
                                       cfg.entropy_window, cfg.entropy_at)

    def sample(self, policy, version, prompt_ids, budgets, temperature, max_new_tokens, seeds,
               *, unlearn=False, reduce=None):
        sync_s = sync_weights(self.engine, policy, version)
        ro = self.engine.generate(policy, prompt_ids, budgets, temperature, max_new_tokens,
                                  seeds=seeds, branching=self.branching)
        m = self.branching.pop()
        m["arpo/branch_frac"] = m["arpo/branches"] / max(1, len(ro))
        m["tools/calls_run"] = float(self.engine.last_calls)
        return ro, {**m, **({"time/weight_sync_s": sync_s} if sync_s else {})}
