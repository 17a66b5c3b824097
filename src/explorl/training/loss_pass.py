"""One forward/backward of the update: a micro-batch's loss (policy loss, rollout correction,
EntroPIC's term, entropy bonus, reference KL) and its metric sums; the idle pass of a rank with no
rows; the passes before the update that need the policy's forward (old log-probs, Clip-Cov/KL-Cov
token selection over a whole mini-batch) or every rank's rows (the forking-token mask, EntroPIC's
confident-token counts). ``PolicyUpdate`` (``update.py``) drives them.
"""

from __future__ import annotations

import contextlib

import torch

from explorl.adapters import disabled
from explorl.algorithms import aggregate, entropic_confident_term, kl_estimate
from explorl.algorithms.contract import LossParams
from explorl.algorithms.losses import entropy_agg, take_correction
from explorl.config import RunConfig
from explorl.policy.forward import response_logprobs
from explorl.rollout.types import Rollouts


def _add(sums: dict, key: str, value: torch.Tensor) -> None:
    sums[key] = sums.get(key, 0) + value


class LossPass:
    """The policy forward as the update uses it: ``scorer`` (the wrapped policy), the frozen
    reference, the loss's generator, and whether old log-probs come from the update's own forward
    (``training/plan.py``: ``update``)."""

    def __init__(self, cfg: RunConfig, scorer: torch.nn.Module, ref, dist,
                 loss_generator: torch.Generator, pad_id: int, amp=contextlib.nullcontext,
                 old_logp_from_forward: bool = False) -> None:
        self.cfg, self.scorer, self.ref, self.dist = cfg, scorer, ref, dist
        self.loss_gen, self.pad_id, self.amp = loss_generator, pad_id, amp
        # One optimizer step per batch: the update's own forward, detached, is what a recompute
        # would have given.
        self.old_from_forward = old_logp_from_forward
        self.device = dist.device

    def forward(self, sub: Rollouts, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The policy's log-probs (n, T) of ``sub``'s responses at ``temperature``, with
        gradients, and their entropy when asked: the loss's forward."""
        return self.scorer(sub.prompt_ids, sub.prompt_mask, sub.response_ids, sub.token_mask,
                           temperature, chunk_size=self.cfg.algorithm.logprob_chunk,
                           with_entropy=with_entropy)

    def micro_loss(self, sub: Rollouts, adv: torch.Tensor, loss_fn, lcfg: LossParams, agg: dict,
                    sums: dict, selection=None, weight: torch.Tensor | None = None,
                    correction: tuple | None = None, forward: tuple | None = None) -> torch.Tensor:
        """This micro-batch's share of the mini-batch loss; adds its metric sums to ``sums``.
        ``weight`` (n, T): the forking mask's per-token weight of the policy loss. Every knob
        and setting comes from ``lcfg`` (``LossParams``). ``correction``: the rollout
        correction's (weight, keep, denominators) of these rows."""
        a = self.cfg.algorithm
        agg = dict(agg)
        confident_denom = agg.pop("confident_denom", None)
        mask = sub.response_mask
        need_entropy = lcfg.entropy_coef > 0
        # ``forward``: (log-probs, entropy) of this forward, already run by the old-log-prob
        # recompute (``PolicyUpdate.recompute``), with its graph
        logp, ent = forward or self.forward(sub, lcfg.temperature, need_entropy)
        old_logp = logp.detach() if self.old_from_forward else sub.old_logp
        pg_mask, pg_agg, w, extra = mask, agg, None, {}
        if correction is not None:  # §7a: weighted, and dropped tokens leave the denominators
            # the loss's own form: per token, folded into VESPO's W, LUSPO's response mean
            w, keep, pg_agg = correction
            w, keep, extra = take_correction(a.loss, w.to(mask.device), keep.to(mask.device),
                                             mask)
            pg_mask = mask & keep
        per_tok, m = loss_fn(
            logp, old_logp, adv, mask, lcfg, generator=self.loss_gen, selection=selection, **extra
        )
        if weight is not None:
            per_tok = per_tok * weight.to(per_tok.device)
        if w is not None:
            per_tok = per_tok * w.to(per_tok.device)
        pg = aggregate(per_tok, pg_mask, lcfg.agg, **pg_agg)
        loss = pg
        if confident_denom is not None:  # EntroPIC: α · token-mean of −ratio·|A| on confident ones
            confident = old_logp.exp() > self.cfg.control.entropic.p_min
            term, em = entropic_confident_term(logp, old_logp, adv, mask,
                                               token_denom=confident_denom, confident=confident)
            loss = loss + lcfg.pos_neg_weight * term
            m = {**m, **em}
        if need_entropy:
            bonus = aggregate(ent, mask, entropy_agg(a.loss, lcfg.agg), **agg)
            loss = loss - lcfg.entropy_coef * bonus
            _add(sums, "loss/entropy_bonus", bonus.detach() * agg["seq_denom"])
        if lcfg.kl_coef > 0 and self.ref is not None:
            with torch.no_grad(), self.amp(), disabled(self.ref) as ref:  # LoRA: adapters off
                ref_logp, _ = response_logprobs(
                    ref,
                    sub.prompt_ids,
                    sub.prompt_mask,
                    sub.response_ids,
                    sub.token_mask,
                    lcfg.temperature,
                    chunk_size=a.logprob_chunk,
                    with_entropy=False,
                    fused=a.fused_logprobs,
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

    def idle(self) -> torch.Tensor:
        """A zero loss through the wrapped model for a rank with no rows left in this pass: its
        forward/backward still has to join the gradient collectives of DDP/FSDP."""
        tok = torch.full((1, 1), self.pad_id, dtype=torch.long, device=self.device)
        yes = torch.ones((1, 1), dtype=torch.bool, device=self.device)
        logp, _ = self.scorer(tok, yes, tok, yes, 1.0, with_entropy=False)
        return logp.sum() * 0.0
