"""# 1. sample and # 2. score one training step: generation rounds, DAPO's dynamic sampling,
rank sharding, and one all-gather per round that makes every response's statistics global.

With N data-parallel ranks each rank samples and scores a contiguous share of the step's prompts
(a prompt's group never splits); the gathered rows (``StepBatch``) let every rank compute the
same advantages, denominators, controller statistics and metrics as one process would.
Sampling draws depend on (seed, step, round, prompt position, sample) only
(``explorl.rollout.seeding``), so the responses do not depend on N.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from explorl.algorithms import informative_groups, overlong_penalty
from explorl.algorithms.filters import model_budgets
from explorl.config import RunConfig
from explorl.control import Knobs
from explorl.rollout.seeding import mix_seed
from explorl.rollout.two_stage import OneStage
from explorl.rollout.types import Rollouts
from explorl.training.batch import StepBatch, StepRows, response_stats, stage_entropy

TRAIN_STREAM = (
    0  # first component of the training sampling seeds after the run seed (validation: 1)
)


@dataclass
class Draw:
    """Phase 0 of one step: the knobs that sample it and the prompts it draws."""

    knobs: Knobs
    batch: tuple[list[int], int, bool]  # (dataset indices, epoch, epoch_end)
    data: list  # the dataset drawn from
    order: object  # its ``DataOrder`` (dynamic sampling draws refill rounds from it)
    tag: str  # "train" or "anneal"


@dataclass
class Collected:
    """This rank's kept responses and the step's global statistics."""

    rollouts: Rollouts  # this rank's kept rows, on the model's device (prompt_index = position
    # among the step's prompts)
    scores: torch.Tensor  # (n,) host: correctness (0/1) of those rows (``rewards.rewarder``)
    rewards: torch.Tensor  # (n,) host: shaped rewards of those rows
    batch: StepBatch  # host: every rank's rows, as one process sees them
    metrics: dict[str, float]


def score_rollouts(pool, rewarder, cfg: RunConfig, ro: Rollouts, records: list,
                   max_response_len: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Correctness and shaped rewards (N,) of the responses to ``records``, with the pool's
    timeout/error counts."""
    res = rewarder.score(pool, ro.texts, records, ro.environments)
    scores = torch.tensor(res.correct, dtype=torch.float32)  # host: StepRows' columns
    rc = cfg.reward
    rewards = torch.tensor(res.rewards, dtype=torch.float32)  # host
    if rc.overlong_buffer > 0:
        tools = None if ro.tool_mask is None else ro.tool_mask.sum(-1).cpu()  # (N,)
        rewards = rewards + overlong_penalty(ro.lengths.cpu(),
                                             model_budgets(max_response_len, tools),
                                             rc.overlong_buffer, rc.overlong_penalty)
    return scores, rewards, {"reward/verify_timeouts": float(res.timeouts),
                             "reward/verify_errors": float(res.errors),
                             "reward/verify_worst_failed": float(res.worst_failed),
                             "reward/verify_responses": float(len(res.rewards))}


def collect(*, cfg: RunConfig, step: int, knobs: Knobs, batch: tuple[list[int], int, bool],
            order, data, prompt_ids, sampler: OneStage, policy, version, pool, rewarder,
            dist) -> Collected:
    """Sample and score this rank's share of ``batch`` (more rounds under dynamic sampling).

    ``order`` draws the extra rounds' prompts; ``prompt_ids(i)`` gives dataset row i's token
    ids; ``policy``/``version`` are the weights to sample from and their version (engines that
    keep their own copy sync on a new version).
    """
    a = cfg.algorithm
    B = cfg.data.prompts_per_step
    max_rounds = a.max_gen_rounds if a.dynamic_sampling else 1
    kept = _Kept()
    metrics: dict[str, float] = {}
    round_sums: dict[str, float] = {}  # the sampler's metrics, averaged over rounds below
    n_kept_groups = rounds = epoch = 0
    epoch_end = False
    t_gen = t_score = 0.0
    while rounds < max_rounds and n_kept_groups < B:
        idx, e, end = batch if rounds == 0 else order.next_batch()
        epoch = e if rounds == 0 else epoch
        epoch_end |= end
        rounds += 1
        budgets = knobs.budgets_for(len(idx)) if rounds == 1 else [knobs.n_samples] * len(idx)
        mine = dist.shard(len(idx))  # budgets were allocated over the global batch
        seeds = [mix_seed(cfg.seed, TRAIN_STREAM, step, rounds, p) for p in range(len(idx))]
        unlearn = knobs.unlearn and any(n // 2 > 0 for n in budgets)  # decided for the global batch
        t0 = time.perf_counter()
        ro, m = sampler.sample(policy, version, [prompt_ids(i) for i in idx[mine]], budgets[mine],
                               knobs.temperature, knobs.max_response_len, seeds[mine],
                               unlearn=unlearn,
                               reduce=dist.all_reduce_ if dist.world_size > 1 else None)
        ro.prompt_index = ro.prompt_index + mine.start  # position in this round's global batch
        t_gen += time.perf_counter() - t0
        t0 = time.perf_counter()
        answered = [data[idx[i]] for i in ro.prompt_index.cpu().tolist()]
        scores, rewards, sm = score_rollouts(
            pool, rewarder, cfg, ro, answered, knobs.max_response_len
        )
        t_score += time.perf_counter() - t0
        rows, offset = _gather_round(dist, ro, scores, rewards, sm, m, metrics, round_sums)
        keep, n_groups = _kept_groups(a, rows, len(idx), B - n_kept_groups)  # (rows,) global
        n_kept_groups += n_groups
        kept.add(idx, ro, scores, rewards, rows, keep, offset)
    counts = torch.cat([c for c, _ in kept.counts])
    correct = torch.cat([c for _, c in kept.counts])
    _average_rounds(metrics, round_sums, rounds)
    metrics.update(
        {
            "rollout/gen_rounds": float(rounds),
            "rollout/filtered_frac": 1.0 - n_kept_groups / max(1, len(kept.prompts))
            if a.dynamic_sampling
            else 0.0,
            "rollout/all_wrong_frac": float((correct == 0).float().mean()),
            "rollout/all_correct_frac": float((correct == counts).float().mean()),
            "time/generate_s": t_gen,
            "time/score_s": t_score,
        }
    )
    sb = StepBatch(rows=StepRows.cat(kept.rows), local=torch.cat(kept.local),
                   prompt_indices=kept.prompts, prompt_correct=correct.tolist(),
                   prompt_samples=counts.tolist(), epoch=epoch, epoch_end=epoch_end)
    parts_ro = [k[0] for k in kept.parts if len(k[0])] or [kept.parts[0][0]]
    pad = getattr(sampler.engine, "pad_id", 0)
    ro = Rollouts.concat(parts_ro, pad) if len(parts_ro) > 1 else parts_ro[0]
    return Collected(ro, torch.cat([k[1] for k in kept.parts]),
                     torch.cat([k[2] for k in kept.parts]), sb, metrics)


@dataclass
class _Kept:
    """The kept responses of a step's generation rounds, one round at a time (``add``)."""

    parts: list = field(default_factory=list)  # per round: this rank's (rollouts, scores, rewards)
    rows: list = field(default_factory=list)  # per round: the kept global rows (``StepRows``)
    local: list = field(default_factory=list)  # per round: this rank's kept rollouts → rows
    prompts: list = field(default_factory=list)  # dataset index of every sampled prompt
    counts: list = field(default_factory=list)  # per round: (samples, correct) per prompt, host
    n_rows: int = 0  # kept global rows so far

    def add(self, idx: list[int], ro: Rollouts, scores: torch.Tensor, rewards: torch.Tensor,
            rows: StepRows, keep: torch.Tensor, offset: int) -> None:
        """Round prompts ``idx``: the global ``rows[keep]``, and this rank's rollouts ``ro``
        among them (its rows start at ``offset``)."""
        pi = rows.group
        counts = torch.bincount(pi, minlength=len(idx))
        correct = torch.zeros(len(idx), dtype=torch.float64)  # host, as rows (StepRows)
        correct = correct.index_add_(0, pi, rows.score)
        sel = keep[offset: offset + len(ro)].nonzero().squeeze(-1)
        ro_k = ro.select(sel)
        ro_k.prompt_index = ro_k.prompt_index + len(self.prompts)  # among all sampled prompts
        self.parts.append((ro_k, scores[sel], rewards[sel]))
        self.local.append(self.n_rows + (keep.long().cumsum(0) - 1)[offset: offset + len(ro)][sel])
        rows = rows.select(keep)
        rows.group = rows.group + len(self.prompts)
        self.rows.append(rows)
        self.n_rows += int(keep.sum())
        self.prompts += idx
        self.counts.append((counts, correct))


def _gather_round(dist, ro: Rollouts, scores: torch.Tensor, rewards: torch.Tensor,
                  sm: dict[str, float], m: dict[str, float], metrics: dict[str, float],
                  round_sums: dict[str, float]) -> tuple[StepRows, int]:
    """The round's one collective: every rank's per-response statistics and verifier counters
    ``sm`` (summed into ``metrics``; the sampler's metrics ``m`` and the stage entropies into
    ``round_sums``). Returns the round's global rows and this rank's first row among them."""
    own = not m.get("eepo/active")  # stage 2 came from the policy itself unless it unlearned
    parts = dist.gather(
        {"rows": response_stats(ro, scores, rewards, dist.rank, stage2_own=own), **sm}
    )
    rows = StepRows.cat([p["rows"] for p in parts])
    for k in sm:
        metrics[k] = metrics.get(k, 0.0) + sum(p[k] for p in parts)
    for k, v in {**m, **stage_entropy(rows, m)}.items():
        round_sums[k] = round_sums.get(k, 0.0) + v
    return rows, sum(len(p["rows"]) for p in parts[:dist.rank])


def _kept_groups(a, rows: StepRows, n_prompts: int, room: int) -> tuple[torch.Tensor, int]:
    """Which of the round's global rows are kept ((rows,) bool, host) and how many groups: under
    DAPO's dynamic sampling the first ``room`` informative groups, else all ``n_prompts``."""
    pi = rows.group
    if not a.dynamic_sampling:
        return torch.ones(len(pi), dtype=torch.bool, device=pi.device), n_prompts
    informative = informative_groups(getattr(rows, a.dynamic_sampling_metric), pi)
    keep_groups = sorted(set(pi[informative].tolist()))[:room]
    keep_t = torch.as_tensor(keep_groups, dtype=torch.long)  # host
    return torch.isin(pi, keep_t), len(keep_groups)


def _average_rounds(metrics: dict[str, float], round_sums: dict[str, float], rounds: int) -> None:
    """The sampler's metrics averaged over the rounds, and the reward guard's reading: the pass
    (verifier, reward functions) that failed most, per response."""
    metrics.update({k: v / rounds for k, v in round_sums.items()})
    worst = metrics.pop("reward/verify_worst_failed", 0.0)
    n = metrics.pop("reward/verify_responses", 0.0)
    metrics["reward/verify_failed_frac"] = worst / n if n else 0.0
