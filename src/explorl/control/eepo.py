"""EEPO sample-then-forget: two-stage rollouts with entropy-gated unlearning (EEPO §3.2, Alg. 1).

Per step: stage 1 samples about half of each prompt's responses; if the gate is open, one plain
gradient step on a *copy* of the policy lowers the probability of the stage-1 tokens; stage 2
samples the rest from that copy. The policy is trained on both stages with GRPO; stage-2
old log-probs come from the copy, the model that sampled them. The copy is discarded after
the step, so nothing accumulates.

- ``EEPOGate``: the controller owning ``knobs.unlearn`` (Eq. 4–5).
- ``unlearn_step``: the complementary unlearning loss and its single step (Eq. 7–11).
- ``sample_then_forget``: the two-stage rollout the trainer calls when EEPO is enabled.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from explorl.control.base import ControlContext, ControlError, Controller, Knobs, StepStats
from explorl.rollout.base import RolloutEngine
from explorl.rollout.seeding import mix_seed
from explorl.rollout.types import Rollouts


class EEPOGate(Controller):
    """Open the unlearning gate when the m-step moving-average entropy is below α (EEPO Eq. 4–5).

    ``knobs.unlearn`` for step t is True iff the mean of ``stats.entropy`` over the last
    min(m, t−1) finished steps is < α. At step 1 there is no history and the gate is closed.
    The paper's H̄_t includes step t; here step t's entropy is known only after step t, so the
    average ends at t−1 (verl likewise measures entropy during the previous update).
    ``stats.entropy`` mixes both stages, as the paper's entropy of the rollouts does.

    Args:
        window: m (EEPO: 3).
        alpha: α, the entropy threshold (EEPO: 0.3).
        lr, eps_l, eps_r: unlearning step size and probability clip, stored for the trainer's
            ``sample_then_forget`` call (EEPO: lr 3e-3; eps_l/eps_r ours: 1e-3/1e-2).

    Metrics (before_step):
        ``eepo/active``: 1.0 when the gate is open for step t, else 0.0.
        ``eepo/entropy_ma``: the moving average the gate compared with α (absent at step 1).
    """

    name = "eepo"
    actuators = ("unlearn",)

    def __init__(
        self,
        window: int = 3,
        alpha: float = 0.3,
        lr: float = 3e-3,
        eps_l: float = 1e-3,
        eps_r: float = 1e-2,
    ) -> None:
        if window < 1:
            raise ControlError(f"eepo: window must be ≥ 1, got {window}")
        if not 0 <= eps_l < 1 - eps_r <= 1:
            raise ControlError(
                f"eepo: need 0 ≤ eps_l < 1 − eps_r, got eps_l={eps_l}, eps_r={eps_r}"
            )
        self.window, self.alpha = window, alpha
        self.lr, self.eps_l, self.eps_r = lr, eps_l, eps_r
        self.history: list[float] = []  # entropies of the last `window` finished steps

    def setup(self, ctx: ControlContext, knobs: Knobs) -> None:
        self.history = []

    def before_step(self, step: int, knobs: Knobs, prompt_indices: list[int]) -> dict[str, float]:
        if not self.history:
            knobs.unlearn = False
            return {"eepo/active": 0.0}
        ma = sum(self.history) / len(self.history)
        knobs.unlearn = ma < self.alpha
        return {"eepo/active": float(knobs.unlearn), "eepo/entropy_ma": ma}

    def after_step(self, stats: StepStats, knobs: Knobs) -> dict[str, float]:
        self.history = (self.history + [float(stats.entropy)])[-self.window :]
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = [float(h) for h in state["history"]]


def _response_logits(model: torch.nn.Module, r: Rollouts) -> torch.Tensor:
    """Logits predicting each response token, (N, R, V), from one forward of prompt ++ response."""
    P = r.prompt_ids.shape[1]
    R = r.response_ids.shape[1]
    input_ids = torch.cat([r.prompt_ids, r.response_ids], dim=1)  # (N, P+R)
    attention_mask = torch.cat([r.prompt_mask, r.response_mask], dim=1).long()  # (N, P+R)
    # Left padding: the first real token must sit at position 0, as it did when sampling.
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (N, P+R)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    ).logits
    return logits[:, P - 1 : P + R - 1]  # position j predicts token j+1; (N, R, V)


def unlearn_step(
    rollout_model: torch.nn.Module,
    rollouts_stage1: Rollouts,
    *,
    lr: float = 3e-3,
    eps_l: float = 1e-3,
    eps_r: float = 1e-2,
    temperature: float | None = None,
    micro_batch_size: int | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> float:
    """One momentum-free gradient step that lowers π_θ′ of the stage-1 tokens (EEPO Eq. 8–11).

    L = mean over stage-1 sequences k of (1/T_k) Σ_t log(1 − p_clip(o_{k,t})), with
    p_clip = clip(π_θ′(o_{k,t}), eps_l, 1 − eps_r). L falls as p rises, so lowering the
    sampled tokens' probabilities is gradient *ascent* on L: θ′ ← θ′ + lr·∇L (Eq. 11; the
    paper's Algorithm 1 writes the step with a minus sign, which would reinforce them).

    π_θ′ is taken at the sampling ``temperature`` (default: ``rollouts_stage1.temperature``):
    it is the distribution stage 2 samples from, so that is the one to flatten. Tokens with
    p outside [eps_l, 1 − eps_r] are clipped and get no gradient: near-deterministic tokens
    (p > 0.99 with the default eps_r) are left alone, only the forking tokens are pushed.
    Empty responses are skipped. The model's parameters are updated in place and their
    gradients freed; the forward runs in eval mode so no dropout noise enters. Returns L
    (before the step).

    ``reduce`` (an in-place sum over data-parallel ranks) makes the step global: each rank
    passes its share of the stage-1 sequences (possibly ``None``), the mean is over all ranks'
    sequences and the summed gradient moves every rank's copy identically. Every rank must
    call it then, as with any collective.
    """
    T = (rollouts_stage1.temperature if rollouts_stage1 is not None else 1.0) if temperature is None else temperature
    if T <= 0:
        raise ValueError(f"unlearning needs a sampling temperature > 0, got {T}")
    params = [p for p in rollout_model.parameters() if p.requires_grad]
    device = params[0].device
    if rollouts_stage1 is not None:
        lengths = rollouts_stage1.response_mask.sum(-1)  # (N,)
        r = rollouts_stage1.select(torch.nonzero(lengths > 0).flatten())
    n_local = len(r) if rollouts_stage1 is not None else 0
    n_seq = n_local
    if reduce is not None:
        n_seq = int(reduce(torch.tensor([float(n_local)], device=device)).item())
    if n_seq == 0:
        return 0.0
    mb = max(1, n_local if micro_batch_size is None else micro_batch_size)
    for p in params:
        p.grad = None  # a deep copy carries the policy's stale .grad, if any
    was_training = rollout_model.training
    rollout_model.eval()
    L = 0.0
    try:
        with torch.enable_grad():
            for start in range(0, n_local, mb):
                part = r.select(torch.arange(start, min(start + mb, n_local)))
                mask = part.response_mask.float()  # (n, R)
                logits = _response_logits(rollout_model, part).float() / T  # (n, R, V)
                logp = torch.log_softmax(logits, dim=-1)
                p_tok = logp.gather(-1, part.response_ids.unsqueeze(-1)).squeeze(-1).exp()  # (n, R)
                p_clip = p_tok.clamp(eps_l, 1 - eps_r)
                per_seq = (torch.log1p(-p_clip) * mask).sum(-1) / mask.sum(-1)  # (n,) token mean
                L_part = per_seq.sum() / n_seq  # this chunk's share of the mean over sequences
                (-L_part).backward()  # ascent on L = descent on −L
                L += L_part.item()
        if reduce is not None:  # one all-reduce of every gradient and L
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = reduce(torch.cat([g.flatten().float() for g in grads] + [torch.tensor([L], device=device)]))
            L = float(flat[-1])
            for p, g in zip(params, flat[:-1].split([p.numel() for p in params])):
                p.grad = g.view_as(p).to(p.dtype)
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p -= lr * p.grad  # p.grad = ∇(−L): a plain SGD step, no optimizer state
    finally:
        for p in params:
            p.grad = None
        rollout_model.train(was_training)
    return L


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = mask.sum()
    return float((x * mask).sum() / n) if n > 0 else 0.0


def _subset(
    engine: RolloutEngine,
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    counts: list[int],
    stage: int,
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator | None,
    seeds: list[int] | None = None,
) -> Rollouts | None:
    """Sample ``counts[i]`` responses for prompt i, skipping prompts with count 0.

    The engine numbers prompts by their position in the list it receives, so prompt_index
    is mapped back to the full batch.
    """
    idx = [i for i, n in enumerate(counts) if n > 0]
    if not idx:
        return None
    extra = {"seeds": [seeds[i] for i in idx]} if seeds is not None else {}
    out = engine.generate(
        model,
        [prompt_ids[i] for i in idx],
        [counts[i] for i in idx],
        temperature,
        max_new_tokens,
        generator,
        **extra,
    )
    to_batch = torch.as_tensor(idx, dtype=torch.long)
    return dataclasses.replace(
        out,
        prompt_index=to_batch[out.prompt_index],
        stage=torch.full((len(out),), stage, dtype=torch.long),
    )


def _one_pass(engine, policy, prompt_ids, n_samples, n1, temperature, max_new_tokens, generator, seeds,
              metrics) -> tuple[Rollouts, dict[str, float]]:
    """The gate is shut: θ′ = θ for both stages, so one sampling call draws all n_i responses
    (one prefill and one decode loop instead of two back to back). Response j of prompt i is
    labelled stage 1 for j < n1[i], else stage 2: the same layout, the same distribution, and
    with per-prompt ``seeds`` the same stage-1 responses as two calls."""
    out = _subset(engine, policy, prompt_ids, n_samples, 1, temperature, max_new_tokens, generator, seeds)
    if out is None:
        raise ValueError("no responses requested (all n_samples are 0)")
    idx = out.prompt_index.tolist()
    if idx != sorted(idx):
        raise RuntimeError("the rollout engine must return each prompt's responses together, in order")
    seen: dict[int, int] = {}
    stage = []
    for i in idx:
        j = seen.get(i, 0)
        seen[i] = j + 1
        stage.append(1 if j < n1[i] else 2)
    out = dataclasses.replace(out, stage=torch.as_tensor(stage, dtype=torch.long))
    mask = out.response_mask.float()
    for k, name in ((1, "entropy/stage1"), (2, "entropy/stage2")):
        rows = out.stage == k
        metrics[name] = _masked_mean(out.entropy[rows], mask[rows]) if bool(rows.any()) else 0.0
    return out, metrics


def sample_then_forget(
    engine: RolloutEngine,
    policy: torch.nn.Module,
    prompt_ids: list[list[int]],
    n_samples: list[int],
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator | None,
    unlearn: bool,
    lr: float = 3e-3,
    eps_l: float = 1e-3,
    eps_r: float = 1e-2,
    *,
    pad_id: int | None = None,
    micro_batch_size: int | None = None,
    seeds: list[int] | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[Rollouts, dict[str, float]]:
    """EEPO two-stage rollout (EEPO Algorithm 1): sample, optionally forget, sample again.

    Prompt i gets ``n_i − n_i // 2`` stage-1 responses (the larger half for odd n_i, so a
    prompt with one sample is all stage 1) and ``n_i // 2`` stage-2 responses.

    The rollout model θ′ is synced from the policy at every call. Until the unlearning step
    θ′ equals θ, so stage 1 samples from the policy itself. With the gate shut θ′ = θ for
    both stages, and one sampling call draws all the responses (``_one_pass``). Only when
    ``unlearn`` is True is a
    ``copy.deepcopy(policy)`` made (one extra set of weights, no optimizer state), stepped by
    ``unlearn_step`` and used for stage 2, then dropped. The policy's weights are never
    touched. Stage-2 ``old_logp``/``entropy`` are those of the model that sampled them, as the
    engine returns them.

    Returns the rows grouped by prompt (stage 1 before stage 2 within a prompt), with
    ``stage`` ∈ {1, 2} and ``prompt_index`` pointing into ``prompt_ids``, and metrics:
        ``entropy/stage1``, ``entropy/stage2``: mean token entropy over the valid tokens of
        each stage (0.0 for a stage without tokens).
        ``eepo/unlearn_loss``: L of ``unlearn_step`` (≤ 0), 0.0 when no step was taken.
        ``eepo/active``: 1.0 when the unlearning step ran. It equals the gate's
        ``eepo/active`` except when no prompt has a stage-2 sample (all n_i = 1), where
        there is nothing to unlearn for and the step is skipped.
    ``pad_id``: padding for concatenation; ``None`` = ``engine.pad_id`` if it exists, else 0
    (masks, not pad values, mark the valid cells).
    ``seeds``: per-prompt sampling seeds passed to the engine (stage 2 derives its own from
    them). ``reduce``: data-parallel sum (see ``unlearn_step``); with it the caller decides
    ``unlearn`` for the global batch and every rank takes the same step, so ``eepo/unlearn_loss``
    is global too.
    """
    if len(n_samples) != len(prompt_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(n_samples)} sample counts")
    n2 = [n // 2 for n in n_samples]
    n1 = [n - m for n, m in zip(n_samples, n2)]
    metrics = {"eepo/unlearn_loss": 0.0, "eepo/active": 0.0}
    # The step unlearns if the gate is open and there is a stage 2 to sample (a data-parallel
    # caller decided `unlearn` globally: every rank must join the collective, rows or not).
    if not (unlearn and (reduce is not None or sum(n2) > 0)):
        return _one_pass(engine, policy, prompt_ids, n_samples, n1, temperature, max_new_tokens, generator,
                         seeds, metrics)
    seeds2 = [mix_seed(s, 2) for s in seeds] if seeds is not None else None
    stage1 = _subset(engine, policy, prompt_ids, n1, 1, temperature, max_new_tokens, generator, seeds)
    sampler = copy.deepcopy(policy)
    metrics["eepo/unlearn_loss"] = unlearn_step(
        sampler,
        stage1,
        lr=lr,
        eps_l=eps_l,
        eps_r=eps_r,
        temperature=temperature,
        micro_batch_size=micro_batch_size,
        reduce=reduce,
    )
    metrics["eepo/active"] = 1.0
    stage2 = _subset(engine, sampler, prompt_ids, n2, 2, temperature, max_new_tokens, generator, seeds2)
    del sampler  # drop the copy before the policy update allocates activations
    parts = [p for p in (stage1, stage2) if p is not None]
    if not parts:
        raise ValueError("no responses requested (all n_samples are 0)")
    for name, part in (("entropy/stage1", stage1), ("entropy/stage2", stage2)):
        metrics[name] = (
            0.0 if part is None else _masked_mean(part.entropy, part.response_mask.float())
        )
    pad = pad_id if pad_id is not None else getattr(engine, "pad_id", 0)
    out = Rollouts.concat(parts, pad_id=pad)
    # Group by prompt; a stable sort keeps stage 1 before stage 2 and the engine's row order.
    order = torch.sort(out.prompt_index, stable=True).indices
    return out.select(order), metrics
