"""# 4. update: PPO epochs × mini-batches of the global batch, gradient accumulation over
micro-batches, Clip-Cov/KL-Cov token selection, and idle passes that keep ranks in step.

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
import logging

import torch

from explorl.adapters import disabled
from explorl.algorithms import (
    LOSSES,
    aggregate,
    entropic_confident_term,
    forking_token_mask,
    kl_estimate,
)
from explorl.algorithms.contract import LossParams
from explorl.algorithms.losses import SELECTORS
from explorl.config import RunConfig
from explorl.control import Knobs
from explorl.models import resolve_dtype
from explorl.rollout.types import Rollouts
from explorl.training.batch import StepBatch, StepRows
from explorl.training.correction import step_correction
from explorl.training.forward import response_logprobs
from explorl.training.optim import micro_batch_sizes
from explorl.training.reward_kl import reference_kl_sums

log = logging.getLogger(__name__)


def _add(sums: dict, key: str, value: torch.Tensor) -> None:
    sums[key] = sums.get(key, 0) + value


class PolicyUpdate:
    """The optimizer side of a step: the wrapped policy forward, AdamW, its schedule, the
    reference."""

    def __init__(self, cfg: RunConfig, scorer: torch.nn.Module, optimizer, scheduler, ref, dist,
                 loss_generator: torch.Generator, shuffle_generator: torch.Generator, pad_id: int,
                 amp=contextlib.nullcontext, old_logp_from_forward: bool = False) -> None:
        self.cfg, self.scorer, self.optimizer, self.scheduler, self.ref = (
            cfg,
            scorer,
            optimizer,
            scheduler,
            ref,
        )
        self.dist, self.pad_id, self.amp = dist, pad_id, amp
        self.loss_gen, self.shuffle_gen = loss_generator, shuffle_generator
        # ``algorithm.old_logp`` resolved to ``update`` (training/plan.py): one optimizer step per
        # batch, so the update's own forward, detached, is what a recompute would have given.
        self.old_from_forward = old_logp_from_forward
        self.device = dist.device
        # float16 compute over float32 master weights needs loss scaling (bf16 does not).
        fp16 = (
            resolve_dtype(cfg.model.dtype, self.device) == torch.float16
            and not cfg.model.pure_low_precision
        )
        self.scaler = torch.amp.GradScaler(self.device.type) if fp16 else None

    def _micro_plan(self, rows: StepRows, idx: torch.Tensor) -> tuple[list[int], int]:
        """This rank's micro-batch sizes over its rows among the global rows ``idx`` (in that
        order), and the most micro-batches any rank has (every rank runs that many passes)."""
        o = self.cfg.optim
        tokens = rows.length[idx] + rows.prompt_length[idx]
        rank = rows.rank[idx]
        plans = [micro_batch_sizes(tokens[rank == r].tolist(), o.micro_batch_size,
                                   o.micro_batch_tokens) for r in range(self.dist.world_size)]
        return plans[self.dist.rank], max(len(p) for p in plans)

    @torch.no_grad()
    def recompute(
        self, ro: Rollouts, sb: StepBatch, temperature: float
    ) -> tuple[Rollouts, dict[str, float]]:
        """Old log-probs and entropy from the trainer's own forward (``algorithm.old_logp``).

        One no-grad pass of the policy over this rank's rows, in micro-batches (every rank runs as
        many passes as the busiest, for FSDP), replaces the sampler's values, so the first PPO
        ratio is exactly 1 and KL-Cov's |logp − old_logp| is exactly 0 on the on-policy pass.
        Rows sampled by EEPO's unlearned copy keep the copy's values. ``sb.rows``' entropy and
        log-prob sums are updated with one gather. Returns the sampler-vs-trainer gap
        (``rollout/logp_diff_max``, ``rollout/logp_diff_mean`` over valid tokens).
        """
        a = self.cfg.algorithm
        sizes, n_micro = self._micro_plan(sb.rows, torch.arange(len(sb.rows.rank)))
        chunks = torch.arange(len(ro)).split(sizes) if len(ro) else ()
        logps, ents = [], []
        for k in range(n_micro):
            if k < len(chunks):
                sub = ro.select(chunks[k])
                lp, ent = self.scorer(
                    sub.prompt_ids,
                    sub.prompt_mask,
                    sub.response_ids,
                    sub.response_mask,
                    temperature,
                    chunk_size=a.logprob_chunk,
                    with_entropy=True,
                )
                logps.append(lp.float())
                ents.append(ent.float())
            else:
                self._idle_loss()
        mask = ro.response_mask
        own = sb.rows.own[sb.local].to(mask.device)  # (n,) sampled by the policy itself
        new_logp = torch.cat(logps) if logps else ro.old_logp
        new_ent = torch.cat(ents) if ents else ro.entropy
        new_logp = torch.where(own[:, None], new_logp.to(ro.old_logp.dtype), ro.old_logp)
        new_ent = torch.where(own[:, None], new_ent.to(ro.entropy.dtype), ro.entropy)
        diff = ((new_logp - ro.old_logp).abs() * mask)[own]
        out = dataclasses.replace(ro, old_logp=new_logp, entropy=new_ent)
        m = mask.float()
        parts = self.dist.gather(
            {
                "local": sb.local.cpu(),
                "ent": (new_ent.cpu() * m.cpu()).sum(-1).double(),
                "logp": (new_logp.cpu() * m.cpu()).sum(-1).double(),
                "diff_sum": float(diff.sum()),
                "diff_n": float(mask[own].sum()),
                "diff_max": float(diff.max()) if diff.numel() else 0.0,
            }
        )
        for p in parts:
            sb.rows.entropy_sum[p["local"]] = p["ent"]
            sb.rows.logp_sum[p["local"]] = p["logp"]
        n = sum(p["diff_n"] for p in parts)
        return out, {"rollout/logp_diff_max": max(p["diff_max"] for p in parts),
                     "rollout/logp_diff_mean": sum(p["diff_sum"] for p in parts) / n if n else 0.0}

    def reward_kl(self, ro: Rollouts, sb: StepBatch, temperature: float) -> None:
        """``sb.rows.kl_sum``: Σ_t kl_t to the reference per response, with
        ``algorithm.kl_in_reward`` (otherwise nothing)."""
        a = self.cfg.algorithm
        if not a.kl_in_reward:
            return
        o = self.cfg.optim
        tokens = (ro.response_mask.sum(-1) + ro.prompt_mask.sum(-1)).tolist()
        reference_kl_sums(self.ref, ro, sb, self.dist, kind=a.kl_estimator,
                          temperature=temperature, chunk_size=a.logprob_chunk, amp=self.amp,
                          sizes=micro_batch_sizes(tokens, o.micro_batch_size,
                                                  o.micro_batch_tokens))

    def run(
        self, ro: Rollouts, adv: torch.Tensor, knobs: Knobs, sb: StepBatch
    ) -> tuple[dict, dict]:
        """Returns metrics that are the same on every rank, and this rank's sums for
        ``loss_metrics``
        (added over ranks by the caller)."""
        cfg, a, o = self.cfg, self.cfg.algorithm, self.cfg.optim
        rows, W = sb.rows, self.dist.world_size
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
        lengths = rows.length
        if a.mask_truncated:  # overlong filtering: out of the loss and its denominators
            keep = ~rows.truncated[sb.local].to(ro.response_mask.device)  # (n,)
            ro = dataclasses.replace(ro, response_mask=ro.response_mask & keep[:, None])
            lengths = lengths * ~rows.truncated
        max_len = a.agg_max_len or cfg.rollout.max_response_len
        n_mb = min(o.mini_batches, N)
        local_row = torch.full((N,), -1, dtype=torch.long)
        local_row[sb.local] = torch.arange(len(sb.local))  # global row -> this rank's row, or -1
        sums: dict[str, torch.Tensor] = {}
        n_opt, n_bad, grad_norm_sum = 0, 0, torch.zeros((), device=self.device)
        adv = adv.to(self.device)
        confident = self._confident_counts(ro, sb, N) if cfg.control.entropic.enabled else None
        corr = step_correction(a.rollout_correction, ro, sb.local, N, self.dist)  # §7a, or None
        mask_sums: dict[str, float] = {}  # forking-mask metrics (global), summed over mini-batches
        n_masks = 0
        self.scorer.train()
        for _ in range(o.ppo_epochs):
            order = (torch.randperm(N, generator=self.shuffle_gen) if n_mb > 1 or o.ppo_epochs > 1
                     else torch.arange(N))
            for mb in order.tensor_split(n_mb):
                agg = dict(
                    token_denom=lengths[mb].sum().clamp_min(1),
                    seq_denom=(lengths[mb] > 0).sum(),
                    max_len=max_len,
                )
                mine = local_row[mb]
                # Every rank runs as many forward/backward passes as the busiest one: only the last
                # synchronises gradients (DDP), and FSDP gathers weights in every pass.
                sizes, n_micro = self._micro_plan(rows, mb)
                micros = list(mine[mine >= 0].split(sizes)) if sizes else []
                selections = self._select_tokens(ro, adv, micros, n_micro, lcfg)
                weights = [None] * len(micros)
                if a.entropy_mask_ratio:
                    weights = self._forking_weights(ro, micros, mask_sums)
                    n_masks += 1
                pg_agg = dict(agg, **corr.denominators(mb)) if corr is not None else None
                if confident is not None:  # EntroPIC's denominator: its confident tokens
                    agg["confident_denom"] = confident[mb].sum().clamp_min(1)
                self.optimizer.zero_grad(set_to_none=True)
                for k in range(n_micro):
                    sync = k == n_micro - 1
                    with contextlib.nullcontext() if sync else self.dist.no_sync(self.scorer):
                        if k < len(micros):
                            loss = self._micro_loss(
                                ro.select(micros[k]),
                                adv[micros[k]],
                                loss_fn,
                                lcfg,
                                agg,
                                sums,
                                selection=selections[k],
                                weight=weights[k],
                                correction=None if corr is None else (
                                    corr.weight[micros[k]], corr.keep[micros[k]], pg_agg),
                            )
                        else:
                            loss = self._idle_loss()
                        loss = loss * W
                        (self.scaler.scale(loss) if self.scaler else loss).backward()
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
                    n_opt += 1
                    grad_norm_sum += gn
                elif not self.scaler:
                    n_bad += 1
                if self.scaler:
                    self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        out = {"grad/norm": float(grad_norm_sum) / max(1, n_opt) if n_opt else float("nan"),
               "train/optimizer_steps": float(n_opt), "train/nonfinite_updates": float(n_bad),
               "train/lr": float(self.scheduler.get_last_lr()[0])}
        out.update({k: v / n_masks for k, v in mask_sums.items()})  # means over the mini-batches
        out.update(corr.metrics if corr is not None else {})
        return out, {k: float(v) for k, v in sums.items()}

    def _confident_counts(self, ro: Rollouts, sb: StepBatch, N: int) -> torch.Tensor:
        """(N,) per global row: valid tokens with π_old > p_min (EntroPIC's confident tokens); one
        gather, so every rank can form each mini-batch's global count."""
        p_min = self.cfg.control.entropic.p_min
        n = (ro.response_mask & (ro.old_logp.exp() > p_min)).sum(-1).float().cpu()  # (n,)
        out = torch.zeros(N)
        for part in self.dist.gather({"local": sb.local.cpu(), "n": n}):
            out[part["local"]] = part["n"]
        return out

    @torch.no_grad()
    def _forking_weights(self, ro: Rollouts, micros: list[torch.Tensor], mask_sums: dict) -> list:
        """The forking-token mask over this mini-batch's valid tokens on every rank (§6c): one
        per-token weight (n_micro_rows, T) per micro-batch. Every rank calls the gather, also one
        holding no rows of the mini-batch. Adds the mask's (global) metrics to ``mask_sums``."""
        a = self.cfg.algorithm
        rows = torch.cat(micros) if micros else torch.zeros(0, dtype=torch.long)
        rows = rows.to(ro.entropy.device)
        tm = forking_token_mask(ro.entropy[rows], ro.response_mask[rows], a.entropy_mask_ratio,
                                renorm_kept=a.entropy_mask_renorm, gather=self.dist.gather,
                                rank=self.dist.rank)
        for k, v in tm.metrics.items():
            mask_sums[k] = mask_sums.get(k, 0.0) + float(v)
        return list(tm.weight.split([len(m) for m in micros])) if micros else []

    @torch.no_grad()
    def _select_tokens(
        self,
        ro: Rollouts,
        adv: torch.Tensor,
        micros: list[torch.Tensor],
        n_micro: int,
        lcfg: LossParams,
    ) -> list:
        """Clip-Cov/KL-Cov token selection over this rank's whole mini-batch (ALGORITHMS §2d: per
        mini-batch, not per micro-batch). A mini-batch in one micro-batch selects inside its loss;
        split into several, each costs one extra no-grad forward, whose detached logp is what the
        loss would select on. Every rank runs ``n_micro`` forwards (idle ones where it has no rows)
        so DDP/FSDP collectives stay matched. Returns one (selected, cov) per micro-batch, or None
        each (the loss selects itself)."""
        select = SELECTORS.get(self.cfg.algorithm.loss)
        if select is None or n_micro <= 1:
            return [None] * len(micros)
        a = self.cfg.algorithm
        parts = [ro.select(idx) for idx in micros]
        logps = [
            self.scorer(
                p.prompt_ids,
                p.prompt_mask,
                p.response_ids,
                p.response_mask,
                lcfg.temperature,
                chunk_size=a.logprob_chunk,
                with_entropy=False,
            )[0]
            for p in parts
        ]
        for _ in range(n_micro - len(parts)):
            self._idle_loss()
        if not parts:
            return []
        mask = torch.cat([p.response_mask for p in parts])
        old = torch.cat(logps if self.old_from_forward else [p.old_logp for p in parts])
        selected, cov = select(
            torch.cat(logps), old, adv[torch.cat(micros)], mask, lcfg, generator=self.loss_gen
        )
        sizes = [len(idx) for idx in micros]
        return list(zip(selected.split(sizes), cov.split(sizes)))

    def _micro_loss(self, sub: Rollouts, adv: torch.Tensor, loss_fn, lcfg: LossParams, agg: dict,
                    sums: dict, selection=None, weight: torch.Tensor | None = None,
                    correction: tuple | None = None) -> torch.Tensor:
        """This micro-batch's share of the mini-batch loss; adds its metric sums to ``sums``.
        ``weight`` (n, T): the forking mask's per-token weight of the policy loss. Every knob
        and setting comes from ``lcfg`` (``LossParams``). ``correction``: the rollout
        correction's (weight, keep, denominators) of these rows."""
        a = self.cfg.algorithm
        agg = dict(agg)
        confident_denom = agg.pop("confident_denom", None)
        mask = sub.response_mask
        need_entropy = lcfg.entropy_coef > 0
        logp, ent = self.scorer(
            sub.prompt_ids,
            sub.prompt_mask,
            sub.response_ids,
            mask,
            lcfg.temperature,
            chunk_size=a.logprob_chunk,
            with_entropy=need_entropy,
        )
        old_logp = logp.detach() if self.old_from_forward else sub.old_logp
        per_tok, m = loss_fn(
            logp, old_logp, adv, mask, lcfg, generator=self.loss_gen, selection=selection
        )
        if weight is not None:
            per_tok = per_tok * weight.to(per_tok.device)
        pg_mask, pg_agg = mask, agg
        if correction is not None:  # §7a: weighted, and dropped tokens leave the denominators
            w, keep, pg_agg = correction
            per_tok, pg_mask = per_tok * w.to(per_tok.device), mask & keep.to(mask.device)
        pg = aggregate(per_tok, pg_mask, lcfg.agg, **pg_agg)
        loss = pg
        if confident_denom is not None:  # EntroPIC: α · token-mean of −ratio·|A| on confident ones
            confident = old_logp.exp() > self.cfg.control.entropic.p_min
            term, em = entropic_confident_term(logp, old_logp, adv, mask,
                                               token_denom=confident_denom, confident=confident)
            loss = loss + lcfg.pos_neg_weight * term
            m = {**m, **em}
        if need_entropy:
            bonus = aggregate(ent, mask, lcfg.agg, **agg)
            loss = loss - lcfg.entropy_coef * bonus
            _add(sums, "loss/entropy_bonus", bonus.detach() * agg["seq_denom"])
        if lcfg.kl_coef > 0 and self.ref is not None:
            with torch.no_grad(), self.amp(), disabled(self.ref) as ref:  # LoRA: adapters off
                ref_logp, _ = response_logprobs(
                    ref,
                    sub.prompt_ids,
                    sub.prompt_mask,
                    sub.response_ids,
                    mask,
                    lcfg.temperature,
                    chunk_size=a.logprob_chunk,
                    with_entropy=False,
                )
            kl = kl_estimate(logp, ref_logp, lcfg.kl_estimator) * mask
            loss = loss + lcfg.kl_coef * aggregate(kl, mask, lcfg.agg, **agg)
            _add(sums, "kl/ref_mean", kl.detach().sum())
        n_tok = mask.sum()
        _add(sums, "tokens", n_tok)
        for k, v in m.items():
            if k == "cov/selected_mean":  # a mean over the selected tokens, not over all of them
                n_sel = m["loss/cov_selected_frac"].detach().float() * n_tok
                _add(sums, "cov/selected_sum", v.detach().float() * n_sel)
                _add(sums, "cov/selected_n", n_sel)
            elif k != "cov/mean":  # logged once per step from the whole batch instead
                _add(sums, k, v.detach().float() * n_tok)
        _add(sums, "loss/policy", pg.detach())
        return loss

    def _idle_loss(self) -> torch.Tensor:
        """A zero loss through the wrapped model for a rank with no rows left in this pass: its
        forward/backward still has to join the gradient collectives of DDP/FSDP."""
        tok = torch.full((1, 1), self.pad_id, dtype=torch.long, device=self.device)
        yes = torch.ones((1, 1), dtype=torch.bool, device=self.device)
        logp, _ = self.scorer(tok, yes, tok, yes, 1.0, with_entropy=False)
        return logp.sum() * 0.0
