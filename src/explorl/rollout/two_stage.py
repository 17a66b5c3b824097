"""Sampling strategies around any rollout engine: one stage, or EEPO's sample-then-forget.

The trainer samples through a strategy (``make_sampler``), never through an engine directly,
so it has no EEPO branch (httpx's transports: one class per way of sending).

EEPO (EEPO §3.2, Algorithm 1; docs/methods/eepo.md §3): stage 1 samples about half of each prompt's
responses from the policy θ; if the gate (``control/eepo.py``, the ``unlearn`` knob) is open,
one plain gradient step on a rollout copy θ′ lowers the probability of the stage-1 tokens;
stage 2 samples the rest from θ′. The policy is trained on both stages; stage-2 old log-probs
come from θ′, the model that sampled them. θ′ is one module kept for the whole run and
refreshed from θ in place before each unlearning step (no per-step deep copy), and its loss
runs through the trainer's packed forward (``explorl.policy.forward``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable

import torch

from explorl.adapters import refresh_copy_, rollout_copy
from explorl.config import EEPOControlConfig
from explorl.policy.forward import response_logprobs
from explorl.rollout.aepo import AEPOSampler
from explorl.rollout.arpo import ARPOSampler
from explorl.rollout.base import RolloutEngine
from explorl.rollout.seeding import mix_seed
from explorl.rollout.types import Rollouts

Reduce = Callable[[torch.Tensor], torch.Tensor]


def _sync(engine, model: torch.nn.Module, version: Hashable) -> float:
    """Push ``model``'s weights to an engine that keeps its own copy (vLLM); seconds spent."""
    sync = getattr(engine, "sync_weights", None)
    return float(sync(model, version)) if sync is not None else 0.0


class OneStage:
    """Plain sampling: every response of the step from the policy, in one engine call."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine

    def sample(self, policy, version: Hashable, prompt_ids: list[list[int]], budgets: list[int],
               temperature: float, max_new_tokens: int, seeds: list[int], *, unlearn: bool = False,
               reduce: Reduce | None = None) -> tuple[Rollouts, dict[str, float]]:
        sync_s = _sync(self.engine, policy, version)
        ro = self.engine.generate(
            policy, prompt_ids, budgets, temperature, max_new_tokens, seeds=seeds
        )
        out = {"time/weight_sync_s": sync_s} if sync_s else {}
        calls = getattr(self.engine, "last_calls", None)  # a ToolEngine: the calls it ran
        if calls is not None:
            out["tools/calls_run"] = float(calls)
        return ro, out


def unlearn_step(
    rollout_model: torch.nn.Module,
    rollouts_stage1: Rollouts | None,
    *,
    lr: float,
    eps_l: float,
    eps_r: float,
    temperature: float | None = None,
    micro_batch_size: int | None = None,
    reduce: Reduce | None = None,
    chunk_size: int = 512,
) -> float:
    """One momentum-free gradient step that lowers π_θ′ of the stage-1 tokens (EEPO Eq. 8–11).

    L = mean over stage-1 sequences k of (1/T_k) Σ_t log(1 − p_clip(o_{k,t})), with
    p_clip = clip(π_θ′(o_{k,t}), eps_l, 1 − eps_r). L falls as p rises, so lowering the
    sampled tokens' probabilities is gradient *ascent* on L: θ′ ← θ′ + lr·∇L (Eq. 11; the
    paper's Algorithm 1 writes the step with a minus sign, which would reinforce them).

    π_θ′ is taken at the sampling ``temperature`` (default: the rollouts'): it is the
    distribution stage 2 samples from. Tokens with p outside [eps_l, 1 − eps_r] are clipped
    and get no gradient, so only the forking tokens are pushed. Empty responses are skipped.
    The parameters are updated in place (eval mode: no dropout noise) and their gradients
    freed. Returns L before the step.

    ``reduce`` (an in-place sum over data-parallel ranks) makes the step global: each rank
    passes its share of the stage-1 sequences (possibly ``None``); every rank must call it.
    """
    T = (
        (rollouts_stage1.temperature if rollouts_stage1 is not None else 1.0)
        if temperature is None
        else temperature
    )
    if T <= 0:
        raise ValueError(f"unlearning needs a sampling temperature > 0, got {T}")
    params = [p for p in rollout_model.parameters() if p.requires_grad]
    device = params[0].device
    r = None
    if rollouts_stage1 is not None:
        r = rollouts_stage1.select(
            torch.nonzero(rollouts_stage1.response_mask.sum(-1) > 0).flatten()
        )
    n_local = len(r) if r is not None else 0
    n_seq = n_local
    if reduce is not None:
        n_seq = int(reduce(torch.tensor([float(n_local)], device=device)).item())
    if n_seq == 0:
        return 0.0
    mb = max(1, n_local if micro_batch_size is None else micro_batch_size)
    for p in params:
        p.grad = None
    was_training = rollout_model.training
    rollout_model.eval()
    L = 0.0
    try:
        with torch.enable_grad():
            for start in range(0, n_local, mb):
                part = r.select(torch.arange(start, min(start + mb, n_local)))  # host: indices
                L += _unlearn_backward(rollout_model, part, T, eps_l, eps_r, n_seq, chunk_size)
        if reduce is not None:  # one all-reduce of every gradient and L
            L = _reduce_grads(params, L, reduce, device)
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p -= lr * p.grad  # p.grad = ∇(−L): a plain SGD step, no optimizer state
    finally:
        for p in params:
            p.grad = None
        rollout_model.train(was_training)
    return L


def _unlearn_backward(rollout_model: torch.nn.Module, part: Rollouts, T: float, eps_l: float,
                      eps_r: float, n_seq: int, chunk_size: int) -> float:
    """Backpropagate −(``part``'s share of L) (``unlearn_step``) into the parameters' gradients;
    returns that share."""
    mask = part.response_mask.float()  # (n, R)
    logp, _ = response_logprobs(
        rollout_model,
        part.prompt_ids,
        part.prompt_mask,
        part.response_ids,
        part.token_mask,
        T,
        chunk_size=chunk_size,
        with_entropy=False,
    )
    p_clip = logp.float().exp().clamp(eps_l, 1 - eps_r)  # (n, R)
    per_seq = (torch.log1p(-p_clip) * mask).sum(-1) / mask.sum(-1)  # (n,) token mean
    L_part = per_seq.sum() / n_seq  # this chunk's share of the mean over sequences
    (-L_part).backward()  # ascent on L = descent on −L
    return L_part.item()


def _reduce_grads(params: list[torch.nn.Parameter], L: float, reduce: Reduce,
                  device: torch.device) -> float:
    """One all-reduce of every gradient and of L (returned): the step is global."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = reduce(
        torch.cat([g.flatten().float() for g in grads] + [torch.tensor([L], device=device)])
    )
    for p, g in zip(params, flat[:-1].split([p.numel() for p in params])):
        p.grad = g.view_as(p).to(p.dtype)
    return float(flat[-1])


def _subset(
    engine, model, prompt_ids, counts, stage, temperature, max_new_tokens, seeds
) -> Rollouts | None:
    """Sample ``counts[i]`` responses for prompt i (skipping 0s); prompt_index maps to the batch."""
    idx = [i for i, n in enumerate(counts) if n > 0]
    if not idx:
        return None
    out = engine.generate(
        model,
        [prompt_ids[i] for i in idx],
        [counts[i] for i in idx],
        temperature,
        max_new_tokens,
        seeds=[seeds[i] for i in idx],
    )
    device = out.device  # the record's one device (``Rollouts``): indices built there too
    to_batch = torch.as_tensor(idx, dtype=torch.long, device=device)
    return dataclasses.replace(out, prompt_index=to_batch[out.prompt_index],
                               stage=torch.full((len(out),), stage, dtype=torch.long,
                                                device=device))


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = mask.sum()
    return float((x * mask).sum() / n) if n > 0 else 0.0


class TwoStage(OneStage):
    """EEPO sample-then-forget around ``engine`` (EEPO Algorithm 1).

    Prompt i gets ``n_i − n_i // 2`` stage-1 responses (the larger half, so a prompt with one
    sample is all stage 1) and ``n_i // 2`` stage-2 ones. With the gate shut θ′ = θ for both
    stages and one engine call draws everything (response j of prompt i is stage 1 for j < n1_i):
    with per-prompt seeds the same stage-1 responses as two calls. Rows come back grouped by
    prompt, stage 1 before stage 2, with ``stage`` ∈ {1, 2}.

    Metrics: ``entropy/stage1``, ``entropy/stage2`` (mean token entropy of each stage, 0.0 for
    an empty one); ``eepo/unlearn_loss`` (L before the step, ≤ 0; 0.0 without a step);
    ``eepo/active`` (1.0 when the unlearning step ran).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        cfg: EEPOControlConfig,
        *,
        micro_batch_size: int | None = None,
        chunk_size: int = 512,
        pad_id: int = 0,
    ) -> None:
        super().__init__(engine)
        self.cfg, self.micro_batch_size, self.chunk_size, self.pad_id = (
            cfg,
            micro_batch_size,
            chunk_size,
            pad_id,
        )
        self._copy: torch.nn.Module | None = None  # θ′, allocated at the first open gate

    def rollout_copy(self, policy: torch.nn.Module) -> torch.nn.Module:
        """θ′ = θ, refreshed in place (allocated once per run); with LoRA the adapters only,
        over the policy's own frozen base."""
        if self._copy is None:
            self._copy = rollout_copy(policy)
        else:
            refresh_copy_(self._copy, policy)
        return self._copy

    def sample(self, policy, version, prompt_ids, budgets, temperature, max_new_tokens, seeds, *,
               unlearn=False, reduce=None):
        n2 = [n // 2 for n in budgets]
        n1 = [n - m for n, m in zip(budgets, n2)]
        metrics = {"eepo/unlearn_loss": 0.0, "eepo/active": 0.0}
        sync_s = _sync(self.engine, policy, version)
        # A data-parallel caller decided `unlearn` for the global batch: every rank joins the
        # collective of the step, rows or not.
        if not (unlearn and (reduce is not None or sum(n2) > 0)):
            out = _subset(
                self.engine, policy, prompt_ids, budgets, 1, temperature, max_new_tokens, seeds
            )
            if out is None:
                raise ValueError("no responses requested (all n_samples are 0)")
            first = torch.searchsorted(out.prompt_index, out.prompt_index, side="left")
            within = torch.arange(len(out), device=out.device) - first  # j: index within prompt
            n1_rows = torch.as_tensor(n1, dtype=torch.long, device=out.device)[out.prompt_index]
            stage = torch.where(within < n1_rows, 1, 2)
            out = dataclasses.replace(out, stage=stage)
        else:
            stage1 = _subset(
                self.engine, policy, prompt_ids, n1, 1, temperature, max_new_tokens, seeds
            )
            sampler = self.rollout_copy(policy)
            metrics["eepo/unlearn_loss"] = unlearn_step(
                sampler, stage1, lr=self.cfg.lr, eps_l=self.cfg.eps_l, eps_r=self.cfg.eps_r,
                temperature=temperature, micro_batch_size=self.micro_batch_size, reduce=reduce,
                chunk_size=self.chunk_size)
            metrics["eepo/active"] = 1.0
            sync_s += _sync(self.engine, sampler, ("eepo", version))
            seeds2 = [mix_seed(s, 2) for s in seeds]
            stage2 = _subset(
                self.engine, sampler, prompt_ids, n2, 2, temperature, max_new_tokens, seeds2
            )
            parts = [p for p in (stage1, stage2) if p is not None]
            if not parts:
                raise ValueError("no responses requested (all n_samples are 0)")
            out = Rollouts.concat(parts, pad_id=getattr(self.engine, "pad_id", self.pad_id))
            # Group by prompt; a stable sort keeps stage 1 before stage 2 and the engine's order.
            out = out.select(torch.sort(out.prompt_index, stable=True).indices)
        mask = out.response_mask.float()
        for k in (1, 2):
            rows = out.stage == k
            metrics[f"entropy/stage{k}"] = (
                _masked_mean(out.entropy[rows], mask[rows]) if bool(rows.any()) else 0.0
            )
        if sync_s:
            metrics["time/weight_sync_s"] = sync_s
        return out, metrics


def make_sampler(engine: RolloutEngine, cfg, *, pad_id: int = 0, vocab_size: int = 0):
    """The step's sampling strategy for a ``RunConfig``: ``TwoStage`` when EEPO is enabled,
    ``ARPOSampler`` with ``rollout.arpo`` (``AEPOSampler`` in its mode ``aepo``), else
    ``OneStage``."""
    if cfg.rollout.arpo.enabled:
        sampler = AEPOSampler if cfg.rollout.arpo.mode == "aepo" else ARPOSampler
        return sampler(engine, cfg.rollout.arpo, vocab_size)
    if cfg.control.eepo.enabled:
        return TwoStage(engine, cfg.control.eepo, micro_batch_size=cfg.optim.micro_batch_size,
                        chunk_size=cfg.algorithm.logprob_chunk, pad_id=pad_id)
    return OneStage(engine)
