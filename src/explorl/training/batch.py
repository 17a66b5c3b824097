"""The step's per-response statistics, gathered from every rank: the batch as one process sees it.

With several data-parallel ranks each rank holds only its share of the responses. What the
trainer needs from the others (advantages of whole groups and batch-level estimators, loss
denominators, controller statistics, rollout metrics, covariance diagnostics) is a function of a
few numbers per response, so each rank contributes ``response_stats`` of its rows and one
all-gather per generation round assembles the ``StepBatch`` every rank then computes from.
"""

from __future__ import annotations

import dataclasses

import torch

from explorl.algorithms import covariance_by_difficulty
from explorl.control.base import StepStats
from explorl.rollout.types import Rollouts


@dataclasses.dataclass(slots=True)
class StepRows:
    """The step's per-response statistics: one (N,) column per field, one row per response, in
    the order one process would have them (prompt by prompt).

    **Host.** Every column lives on the CPU, whatever device the model is on: the columns cross
    ranks through ``dist.gather`` and feed Python-side statistics; ``response_stats`` takes
    ``.cpu()`` copies of the ``Rollouts`` fields it reads (which live on the model's device).

    ``slots``: a misspelt column is an ``AttributeError`` on read and on write, never a new
    column or a silent default. Each rank builds its share with ``response_stats``; ``cat``
    joins the ranks' shares (in rank order) and the generation rounds.
    """

    group: torch.Tensor  # (N,) int64: the prompt's position among the step's sampled prompts
    reward: torch.Tensor  # (N,) float64: the shaped reward (verifier + overlong penalty)
    score: torch.Tensor  # (N,) float64: the verifier's correctness (0/1)
    length: torch.Tensor  # (N,) int64: valid response tokens
    prompt_length: torch.Tensor  # (N,) int64: valid prompt tokens
    # (N,) float64: Σ_t entropy at the sampling temperature (the trainer's after ``recompute``)
    entropy_sum: torch.Tensor
    logp_sum: torch.Tensor  # (N,) float64: Σ_t old log-prob (the trainer's after ``recompute``)
    truncated: torch.Tensor  # (N,) bool: stopped by the length limit, not by EOS
    stage: torch.Tensor  # (N,) int64: EEPO's sampling stage (1 or 2); 0 without EEPO
    own: torch.Tensor  # (N,) bool: sampled by the policy itself, not EEPO's unlearned copy
    rank: torch.Tensor  # (N,) int64: the data-parallel rank holding the response
    # (N,) float64: Σ_t kl_t to the reference; set on the global rows by
    # ``reward_kl.reference_kl_sums`` with ``algorithm.kl_in_reward``, None otherwise
    kl_sum: torch.Tensor | None = None
    # Multi-turn rollouts (``rollout.tools``); None without tools. (N,) int64 each: model turns,
    # tool calls answered, calls answered by an error message, tool-result tokens.
    turns: torch.Tensor | None = None
    tool_calls: torch.Tensor | None = None
    tool_errors: torch.Tensor | None = None
    tool_tokens: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.group)

    def columns(self) -> dict[str, torch.Tensor | None]:
        """The columns by name, in field order (None for an optional column not set)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def select(self, idx: torch.Tensor) -> StepRows:
        """The rows ``idx`` (indices or a (N,) bool mask), in that order, as new tensors."""
        return StepRows(**{k: None if v is None else v[idx] for k, v in self.columns().items()})

    @staticmethod
    def cat(parts: list[StepRows]) -> StepRows:
        """``parts``' rows one after the other (e.g. the ranks' shares in rank order)."""
        out = {}
        for f in dataclasses.fields(StepRows):
            cols = [getattr(p, f.name) for p in parts]
            if all(c is None for c in cols):
                out[f.name] = None
            elif any(c is None for c in cols):
                raise ValueError(f"StepRows.cat: column {f.name!r} is set on some parts only")
            else:
                out[f.name] = torch.cat(cols)
        return StepRows(**out)


@dataclasses.dataclass
class StepBatch:
    """The step's responses as every rank sees them: ``rows`` (``StepRows``) holds one row per
    response of the global batch; ``local`` (n,) maps this rank's kept rollouts to their rows.
    """

    rows: StepRows
    local: torch.Tensor  # (n,) int64 on the host: this rank's kept rollouts → global rows
    prompt_indices: list[int]  # dataset index of every prompt sampled this step (all rounds)
    prompt_correct: list[float]
    prompt_samples: list[int]
    epoch: int
    epoch_end: bool


def response_stats(ro: Rollouts, scores: torch.Tensor, rewards: torch.Tensor, rank: int, *,
                   stage2_own: bool = True) -> StepRows:
    """This rank's rows of ``StepBatch.rows``. ``own`` marks responses the policy itself sampled
    (all but EEPO's stage 2 after an unlearning step, which an unlearned copy sampled)."""
    mask = ro.response_mask.cpu()
    n = len(ro)
    stage = (ro.stage.cpu().long() if ro.stage is not None
             else torch.zeros(n, dtype=torch.long))  # host
    tools = {} if ro.tool_mask is None else {
        "turns": ro.turns.cpu().long(), "tool_calls": ro.tool_calls.cpu().long(),
        "tool_errors": ro.tool_errors.cpu().long(),
        "tool_tokens": ro.tool_mask.cpu().sum(-1).long()}
    return StepRows(
        group=ro.prompt_index.cpu().long(),
        reward=rewards.double(),
        score=scores.double(),
        length=mask.sum(-1).long(),
        prompt_length=ro.prompt_mask.cpu().sum(-1).long(),
        entropy_sum=(ro.entropy.cpu() * mask).sum(-1).double(),
        logp_sum=(ro.old_logp.cpu() * mask).sum(-1).double(),
        truncated=ro.truncated.cpu().bool()
        if ro.truncated is not None
        else torch.zeros(n, dtype=torch.bool),  # host
        stage=stage,
        own=(stage != 2) | stage2_own,
        rank=torch.full((n,), rank, dtype=torch.long),  # host
        **tools,
    )


def covariance_metrics(rows: StepRows, adv: torch.Tensor) -> dict[str, float]:
    """``cov/mean`` and ``cov/by_difficulty/*`` of the global batch from per-response sums.

    A is constant along a response, so the token covariance of Entropy Mechanism Eq. 10 summed
    over response i is (A_i − Ā)·(Σ_t logp_it − |o_i|·l̄), with Ā and l̄ the token means of the
    batch: no token tensor has to cross ranks. The bucket means spread each response's sum
    evenly over its tokens, which leaves every token-weighted mean unchanged.
    """
    n = rows.length.double()  # (N,)
    a = adv.double()
    n_tok = n.sum().clamp_min(1)
    l_bar = rows.logp_sum.sum() / n_tok
    a_bar = (a * n).sum() / n_tok
    cov = (a - a_bar) * (
        rows.logp_sum - n * l_bar
    )  # (N,) per-response sums of the token covariance
    out = {"cov/mean": float(cov.sum() / n_tok)}
    group = rows.group
    size = torch.bincount(group).clamp_min(1) if len(group) else torch.ones(0)  # host
    acc = torch.zeros(len(size), dtype=torch.float64)  # host, as every StepRows column
    acc = (acc.index_add_(0, group, rows.score) / size)[group]
    width = int(n.max()) if len(n) else 0
    mask = torch.arange(width)[None, :] < rows.length[:, None]  # host: (N, T)
    spread = (cov / n.clamp_min(1))[:, None].expand(-1, width)  # (N, T)
    out.update({k: float(v) for k, v in covariance_by_difficulty(spread, mask, acc).items()})
    return out


def stage_entropy(rows: StepRows, sample_metrics: dict) -> dict[str, float]:
    """EEPO's per-stage entropies of the round's global batch (replacing the rank-local ones)."""
    out = {}
    for s in (1, 2):
        if f"entropy/stage{s}" in sample_metrics:
            sel = rows.stage == s
            n = rows.length[sel].sum()
            out[f"entropy/stage{s}"] = float(rows.entropy_sum[sel].sum() / n) if n > 0 else 0.0
    return out


def policy_entropy(rows: StepRows) -> float:
    """Mean token entropy of the responses the policy itself sampled (what controllers read)."""
    own = rows.own
    n = rows.length[own].sum()
    return float(rows.entropy_sum[own].sum() / n) if n > 0 else 0.0


def step_stats(step: int, max_steps: int, sb: StepBatch):
    """The controllers' view of a finished step (``control.StepStats``), from its global batch."""
    return StepStats(step=step, max_steps=max_steps, entropy=policy_entropy(sb.rows),
                     prompt_indices=sb.prompt_indices, prompt_correct=sb.prompt_correct,
                     prompt_samples=sb.prompt_samples, epoch=sb.epoch, epoch_end=sb.epoch_end)
