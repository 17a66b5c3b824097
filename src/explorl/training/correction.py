"""Rollout correction for one step (``algorithm.rollout_correction``, docs/methods/baseline.md §7a):
the weights of this rank's rows, and the global counts of kept tokens and responses per row that the
policy loss's denominators need (one gather, every rank joins)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from explorl.algorithms.rollout_correction import (
    correction_metrics,
    merge_sums,
    rollout_correction,
)
from explorl.errors import ConfigError
from explorl.rollout.types import Rollouts


@dataclass
class StepCorrection:
    weight: torch.Tensor  # (n, T) this rank's rows: the policy-gradient term's weight
    keep: torch.Tensor  # (n, T) bool: tokens that stay in the policy loss
    kept_tokens: torch.Tensor  # (N,) per global row: valid tokens kept
    kept_seq: torch.Tensor  # (N,) bool per global row: the response keeps a token
    metrics: dict[str, float]  # rollout_corr/*, global

    def denominators(self, mb: torch.Tensor) -> dict:
        """The policy loss's token and sequence denominators of mini-batch ``mb`` (global rows):
        dropped tokens and responses leave them."""
        return {"token_denom": self.kept_tokens[mb].sum().clamp_min(1),
                "seq_denom": int(self.kept_seq[mb].sum())}


def resolve_mode(mode: str, ro: Rollouts) -> str:
    """``auto``: ``token-truncate`` when the engine reported its own log-probs (vLLM), else off."""
    if mode == "auto":
        return "token-truncate" if ro.engine_logp is not None else "off"
    if mode != "off" and ro.engine_logp is None:
        raise ConfigError(f"algorithm.rollout_correction.mode: {mode!r} needs the rollout "
                          "engine's own log-probs, and this engine gives none; use auto or off")
    return mode


def step_correction(rc, ro: Rollouts, local: torch.Tensor, n_rows: int,
                    dist) -> StepCorrection | None:
    """The step's correction (``rc``: the config section) for this rank's rows ``ro`` at global
    positions ``local``; None when off. Every rank must call it (one gather)."""
    mode = resolve_mode(rc.mode, ro)
    if mode == "off":
        return None
    c = rollout_correction(ro.old_logp, ro.engine_logp, ro.response_mask, mode, rc.upper,
                           lower=rc.lower, veto=rc.veto)
    parts = dist.gather({"local": local.cpu(), "kept": c.keep.sum(-1).float().cpu(),
                         "sums": c.sums})
    kept = torch.zeros(n_rows)  # host: gathered per-row counts
    for p in parts:
        kept[p["local"]] = p["kept"]
    metrics = correction_metrics(merge_sums([p["sums"] for p in parts]))
    return StepCorrection(c.weight, c.keep, kept, kept > 0, metrics)
