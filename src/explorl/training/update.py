"""# 4. update: PPO epochs × mini-batches of the global batch, gradient accumulation over
micro-batches, and idle passes that keep ranks in step. Each micro-batch's loss is
``loss_pass.LossPass.micro_loss``; what a mini-batch needs before it (Clip-Cov/KL-Cov token
selection, the forking mask, EntroPIC's counts, a recompute of old log-probs) is
``before_update.BeforeUpdate``.

One shared generator permutes the global batch, so every rank cuts the same mini-batches and
takes the rows it holds. Every micro-batch's loss is divided by its mini-batch's *global* token
and sequence counts, so the ranks' gradients sum to the one-process gradient (DDP averages,
hence the loss × N).

Token masks and terms that act on any loss: the forking-token mask (``algorithm.
entropy_mask_ratio``, §6c) keeps the policy loss of the mini-batch's top-ρ entropy tokens, its
threshold taken over every rank's valid tokens (one gather per mini-batch, every rank joins);
the entropies are the rollouts' (the policy's at the sampling temperature from the pass that
gave old_logp: recomputed by the trainer with ``algorithm.old_logp``; EEPO's stage-2 rows after
an unlearning step carry the unlearned copy's, the model that sampled them). EntroPIC's term
(``control.entropic``, §6f) adds α · mean over confident tokens of −ratio·|A|; confident =
π_old > p_min (ours: the sampling policy's probability, so the global count — its denominator —
is known before the update; on the on-policy pass it is the current policy's, as in the code).
Rollout correction (``algorithm.rollout_correction``, §7a; ``training.correction``) weights the
policy-gradient term per token and takes dropped tokens out of its denominators.
Every loss parameter and knob reaches the loss through one ``LossParams`` (built once per step).
``algorithm.mask_truncated`` takes truncated responses out of the loss and its denominators.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from explorl.algorithms import LOSSES
from explorl.algorithms.contract import LossParams
from explorl.config import RunConfig
from explorl.control import Knobs
from explorl.models import resolve_dtype
from explorl.rollout.types import Rollouts
from explorl.training.batch import StepBatch, StepRows
from explorl.training.before_update import BeforeUpdate
from explorl.training.correction import step_correction
from explorl.training.loss_pass import LossPass
from explorl.training.memory import OOM_ERRORS, MemoryGuard
from explorl.training.optim import micro_batch_sizes
from explorl.training.reward_kl import reference_kl_sums


@dataclasses.dataclass
class _Tally:
    """What one update's optimizer steps and forking masks add up to."""

    grad_norm_sum: torch.Tensor
    """Σ of the finite steps' gradient norms (on the device: no host sync per step)."""
    n_opt: int = 0
    """Optimizer steps taken."""
    n_bad: int = 0
    """Steps skipped for a non-finite gradient (not counting fp16's overflow steps)."""
    masks: int = 0
    """Forking masks taken (one per mini-batch with ``algorithm.entropy_mask_ratio``)."""


class PolicyUpdate:
    """The optimizer side of a step: the wrapped policy forward, AdamW, its schedule, the
    reference."""

    def __init__(self, cfg: RunConfig, scorer: torch.nn.Module, optimizer, scheduler, ref, dist,
                 loss_generator: torch.Generator, shuffle_generator: torch.Generator, pad_id: int,
                 amp=contextlib.nullcontext, old_logp_from_forward: bool = False) -> None:
        self.cfg, self.scorer, self.ref = cfg, scorer, ref
        self.optimizer, self.scheduler = optimizer, scheduler
        self.dist, self.pad_id, self.amp = dist, pad_id, amp
        self.loss_gen, self.shuffle_gen = loss_generator, shuffle_generator
        self.device = dist.device
        # The forward passes (training/loss_pass.py) and what precedes a mini-batch's update.
        self.passes = LossPass(cfg, scorer, ref, dist, loss_generator, pad_id, amp,
                               old_logp_from_forward)
        self.before = BeforeUpdate(self.passes)
        # float16 compute over float32 master weights needs loss scaling (bf16 does not).
        fp16 = (
            resolve_dtype(cfg.model.dtype, self.device) == torch.float16
            and not cfg.model.pure_low_precision
        )
        self.scaler = torch.amp.GradScaler(self.device.type) if fp16 else None
        self.memory = MemoryGuard(cfg.optim, dist.world_size)  # one retry on out-of-memory
        self._first: dict | None = None  # recompute(): the first mini-batch's forward, for run()
        self.step = 0  # the training step being updated (the loop sets it; for messages)

    def _micro_plan(self, rows: StepRows, idx: torch.Tensor) -> tuple[list[int], int]:
        """This rank's micro-batch sizes over its rows among the global rows ``idx`` (in that
        order), and the most micro-batches any rank has (every rank runs that many passes)."""
        max_rows, max_tokens = self.memory.limits()  # optim.micro_batch_*, halved on an OOM
        tokens = rows.length[idx] + rows.prompt_length[idx]
        rank = rows.rank[idx]
        plans = [micro_batch_sizes(tokens[rank == r].tolist(), max_rows, max_tokens)
                 for r in range(self.dist.world_size)]
        return plans[self.dist.rank], max(len(p) for p in plans)

    def recompute(self, ro: Rollouts, sb: StepBatch,
                  temperature: float) -> tuple[Rollouts, dict[str, float]]:
        """Old log-probs and entropy from the trainer's own forward (``algorithm.old_logp``):
        ``BeforeUpdate.recompute`` in this run's micro-batches.

        The first mini-batch's rows are not passed twice when its update is one micro-batch:
        its forward, with gradients, runs here, gives those rows' old log-probs and entropy
        (detached: the weights are the update's starting ones, so they are what a no-grad pass
        would give, up to the rounding of another packing), and is kept for the update, which
        takes it instead of running it again (``_first``); the no-grad pass covers the other
        rows. The mini-batch order is drawn here for that (``shuffle_gen``, as ``run`` would).
        """
        every_row = torch.arange(len(sb.rows.rank))  # host: StepRows indices
        self._first = None
        fold = self._fold(ro, sb)
        if fold is None:
            sizes, n_micro = self._micro_plan(sb.rows, every_row)
            return self.before.recompute(ro, sb, temperature, sizes, n_micro)
        order, mb, rows1 = fold
        self.scorer.train()
        kept = {}

        def first():  # the update's forward of mini-batch 1, after the no-grad passes (its
            with torch.enable_grad():  # graph is then held only until the update's backward)
                kept["logp"], kept["ent"] = self.passes.forward(ro.select(rows1), temperature,
                                                                True)
            return kept["logp"], kept["ent"]

        rest = torch.ones(len(ro), dtype=torch.bool)  # host
        rest[rows1] = False
        others = rest.nonzero().squeeze(-1)  # this rank's rows
        glob = sb.local.cpu()[others]  # their global rows, for the micro plan
        sizes, n_micro = self._micro_plan(sb.rows, glob)
        out, m = self.before.recompute(ro, sb, temperature, sizes, n_micro, rows=others,
                                       first=(rows1, first))
        self._first = {"order": order, "mb": mb, "temperature": temperature, **kept}
        return out, m

    def _fold(self, ro: Rollouts, sb: StepBatch):
        """(the first epoch's row order, its first mini-batch's global rows, this rank's rows of
        it) when the recompute can reuse that mini-batch's forward; else None: one process, its
        update one micro-batch, no dropout (its forward then runs once, here), rows to pass."""
        o = self.cfg.optim
        N = len(sb.rows.reward)
        if self.dist.world_size != 1 or N == 0 or len(ro) != N or self.cfg.algorithm.mask_truncated:
            return None  # mask_truncated: the update's forward sees another response mask
        if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in self.scorer.modules()):
            return None
        cfg = getattr(getattr(self.scorer, "policy", self.scorer), "config", None)
        if getattr(cfg, "attention_dropout", 0.0):
            return None
        n_mb = min(o.mini_batches, N)
        state = self.shuffle_gen.get_state()
        order = self._row_order(N, n_mb)  # host: what run() would draw
        mb = order.tensor_split(n_mb)[0]
        if self._micro_plan(sb.rows, mb)[1] != 1:
            self.shuffle_gen.set_state(state)  # not folded: run() draws the order itself
            return None
        local_row = torch.full((N,), -1, dtype=torch.long)  # host
        local_row[sb.local] = torch.arange(len(sb.local))  # host
        return order, mb, local_row[mb]

    def reward_kl(self, ro: Rollouts, sb: StepBatch, temperature: float) -> None:
        """``sb.rows.kl_sum``: Σ_t kl_t to the reference per response, with
        ``algorithm.kl_in_reward`` (otherwise nothing)."""
        a = self.cfg.algorithm
        if not a.kl_in_reward:
            return
        o = self.cfg.optim
        tokens = (ro.token_mask.sum(-1) + ro.prompt_mask.sum(-1)).tolist()
        reference_kl_sums(self.ref, ro, sb, self.dist, kind=a.kl_estimator,
                          temperature=temperature, chunk_size=a.logprob_chunk, amp=self.amp,
                          fused=a.fused_logprobs,
                          sizes=micro_batch_sizes(tokens, o.micro_batch_size,
                                                  o.micro_batch_tokens))

    def _accumulate(self, ro, adv, mb, mine, rows, agg, lcfg, loss_fn, corr, confident, sums,
                    mask_sums, pre=None) -> int:
        """One mini-batch's gradients, accumulated over its micro-batches (no optimizer step);
        adds to ``sums`` and ``mask_sums`` and returns the forking masks it took (0 or 1).
        ``pre``: (log-probs, entropy) of the mini-batch's forward, run by ``recompute`` (one
        micro-batch)."""
        a, W = self.cfg.algorithm, self.dist.world_size
        # Every rank runs as many forward/backward passes as the busiest one: only the last
        # synchronises gradients (DDP), and FSDP gathers weights in every pass.
        sizes, n_micro = self._micro_plan(rows, mb)
        micros = list(mine[mine >= 0].split(sizes)) if sizes else []
        selections = self.before.select_tokens(ro, adv, micros, n_micro, lcfg)
        weights, n_masks = [None] * len(micros), 0
        if a.entropy_mask_ratio:
            weights, n_masks = self.before.forking_weights(ro, micros, mask_sums), 1
        pg_agg = dict(agg, **corr.denominators(mb)) if corr is not None else None
        if confident is not None:  # EntroPIC's denominator: its confident tokens
            agg["confident_denom"] = confident[mb].sum().clamp_min(1)
        self.optimizer.zero_grad(set_to_none=True)
        for k in range(n_micro):
            sync = k == n_micro - 1
            with contextlib.nullcontext() if sync else self.dist.no_sync(self.scorer):
                if k < len(micros):
                    loss = self.passes.micro_loss(
                        ro.select(micros[k]), adv[micros[k]], loss_fn, lcfg, agg, sums,
                        selection=selections[k], weight=weights[k],
                        correction=None if corr is None else (
                            corr.weight[micros[k]], corr.keep[micros[k]], pg_agg),
                        forward=pre if n_micro == 1 else None,
                    )
                else:
                    loss = self.passes.idle()
                loss = loss * W
                (self.scaler.scale(loss) if self.scaler else loss).backward()
        return n_masks

    def run(
        self, ro: Rollouts, adv: torch.Tensor, knobs: Knobs, sb: StepBatch
    ) -> tuple[dict, dict]:
        """Returns metrics that are the same on every rank, and this rank's sums for
        ``loss_metrics``
        (added over ranks by the caller)."""
        cfg, a, o = self.cfg, self.cfg.algorithm, self.cfg.optim
        rows = sb.rows
        N = len(rows.reward)  # global
        if N == 0:
            return {
                "loss/policy": 0.0,
                "loss/clip_frac": 0.0,
                "grad/norm": 0.0,
                "train/optimizer_steps": 0.0,
            }, {}
        loss_fn = LOSSES[a.loss]
        lcfg = LossParams.build(a, knobs)  # the one record of what the loss reads (§7d)
        ro, lengths = self._mask_truncated(ro, sb)
        max_len = a.agg_max_len or cfg.rollout.max_response_len
        n_mb = min(o.mini_batches, N)
        # host: global row -> this rank's row, or -1
        local_row = torch.full((N,), -1, dtype=torch.long)  # host
        local_row[sb.local] = torch.arange(len(sb.local))  # host
        sums: dict[str, torch.Tensor] = {}
        tally = _Tally(grad_norm_sum=torch.zeros((), device=self.device))
        adv = adv.to(self.device)
        entropic = cfg.control.entropic.enabled
        confident = self.before.confident_counts(ro, sb, N) if entropic else None
        corr = step_correction(a.rollout_correction, ro, sb.local, N, self.dist)  # §7a, or None
        mask_sums: dict[str, float] = {}  # forking-mask metrics (global), summed over mini-batches
        self.scorer.train()
        first, self._first = self._first, None  # the recompute's forward of mini-batch 1
        for epoch in range(o.ppo_epochs):
            if epoch == 0 and first is not None:
                order = first["order"]  # drawn by the recompute
            else:
                order = self._row_order(N, n_mb)
            for k_mb, mb in enumerate(order.tensor_split(n_mb)):
                pre = None
                if epoch == 0 and k_mb == 0 and first is not None:
                    if first["temperature"] == lcfg.temperature:
                        pre = (first["logp"], first["ent"])
                    first = None
                agg = dict(
                    token_denom=lengths[mb].sum().clamp_min(1),
                    seq_denom=(lengths[mb] > 0).sum(),
                    max_len=max_len,
                )
                tally.masks += self._accumulate_retrying(
                    ro, adv, mb, local_row[mb], rows, agg, lcfg, loss_fn, corr, confident, sums,
                    mask_sums, pre)
                self._optimizer_step(tally)
        self.optimizer.zero_grad(set_to_none=True)
        return self._metrics(tally, mask_sums, corr), {k: float(v) for k, v in sums.items()}

    def _mask_truncated(self, ro: Rollouts, sb: StepBatch) -> tuple[Rollouts, torch.Tensor]:
        """The rollouts and the global rows' response lengths, with ``algorithm.mask_truncated``
        (overlong filtering) the truncated responses out of the loss and its denominators."""
        rows, lengths = sb.rows, sb.rows.length
        if self.cfg.algorithm.mask_truncated:
            keep = ~rows.truncated[sb.local].to(ro.response_mask.device)  # (n,)
            ro = dataclasses.replace(ro, response_mask=ro.response_mask & keep[:, None])
            if ro.tool_mask is not None:  # the whole row leaves the forward too
                ro = dataclasses.replace(ro, tool_mask=ro.tool_mask & keep[:, None])
            lengths = lengths * ~rows.truncated
        return ro, lengths

    def _row_order(self, N: int, n_mb: int) -> torch.Tensor:
        """An epoch's order of the N global rows (host): drawn from ``shuffle_gen`` when there
        is more than one mini-batch or epoch, else as they are."""
        return (torch.randperm(N, generator=self.shuffle_gen)  # host: global row order
                if n_mb > 1 or self.cfg.optim.ppo_epochs > 1 else torch.arange(N))  # host

    def _accumulate_retrying(self, ro, adv, mb, mine, rows, agg, lcfg, loss_fn, corr, confident,
                             sums, mask_sums, pre) -> int:
        """``_accumulate``, run again in smaller micro-batches after an out-of-memory error
        (``MemoryGuard``), with the mini-batch's partial gradients and sums dropped first."""
        for _attempt in range(MemoryGuard.MAX_RETRIES + 2):  # the last OOM raises
            saved = ({k: v.clone() for k, v in sums.items()}, dict(mask_sums))
            try:
                return self._accumulate(ro, adv, mb, mine, rows, agg, lcfg, loss_fn, corr,
                                        confident, sums, mask_sums, pre)
            except OOM_ERRORS as e:  # drop the mini-batch's partial gradients and sums
                pre = None  # the retry runs its forward again, in smaller pieces
                self.optimizer.zero_grad(set_to_none=True)
                for d, old in zip((sums, mask_sums), saved):
                    d.clear()
                    d.update(old)
                self.memory.on_oom(e, self.step)  # halves, or raises OutOfMemory
        return 0

    def _optimizer_step(self, tally: _Tally) -> None:
        """Clip the gradients and step, when their global norm is finite."""
        o = self.cfg.optim
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        gn = self.dist.clip_grad_norm_(self.scorer, o.max_grad_norm).detach().float()
        # A non-finite loss or gradient never reaches the weights (one host sync per
        # optimizer step; the norm is global, so every rank skips together). Under fp16 the
        # scaler's own overflow steps lower its scale and are not counted as bad.
        if bool(torch.isfinite(gn)):
            if self.scaler:
                self.scaler.step(self.optimizer)
            else:
                self.optimizer.step()
            self.scheduler.step()
            tally.n_opt += 1
            tally.grad_norm_sum += gn
        elif not self.scaler:
            tally.n_bad += 1
        if self.scaler:
            self.scaler.update()

    def _metrics(self, tally: _Tally, mask_sums: dict[str, float], corr) -> dict:
        """The update's metrics, the same on every rank."""
        n_opt = tally.n_opt
        out = {"grad/norm": float(tally.grad_norm_sum) / max(1, n_opt) if n_opt else float("nan"),
               "train/optimizer_steps": float(n_opt), "train/nonfinite_updates": float(tally.n_bad),
               "train/lr": float(self.scheduler.get_last_lr()[0])}
        out.update(self.memory.metrics())
        out.update({k: v / tally.masks for k, v in mask_sums.items()})  # means over mini-batches
        out.update(corr.metrics if corr is not None else {})
        return out
