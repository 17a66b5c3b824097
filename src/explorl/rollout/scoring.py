"""Log-probs and entropy of given responses under a model (the loss's forward pass)."""

from __future__ import annotations

import torch

from explorl.algorithms.logprobs import logprobs_from_hidden, logprobs_from_logits
from explorl.rollout.hf import position_ids


def _backbone_and_head(model):
    """The transformer body and the output projection, when the model exposes them plainly.

    Going through hidden states lets the log-prob pass chunk the vocabulary projection; models
    that post-process logits (soft-capping, scaling) fall back to full logits.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    body = getattr(model, getattr(model, "base_model_prefix", ""), None)
    cfg = getattr(model, "config", None)
    plain = (getattr(cfg, "final_logit_softcapping", None) is None
             and getattr(cfg, "logit_scale", None) in (None, 1.0))
    if isinstance(head, torch.nn.Linear) and isinstance(body, torch.nn.Module) and plain:
        return body, head
    return None, None


def response_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,  # (N, P) left-padded
    prompt_mask: torch.Tensor,  # (N, P) bool
    response_ids: torch.Tensor,  # (N, R) right-padded
    response_mask: torch.Tensor,  # (N, R) bool
    temperature: float,
    *,
    chunk_size: int = 2048,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob (N, R) of each response token at ``temperature`` and its entropy (N, R).

    Uses the same temperature as the sampler (E3: the PPO ratio must compare like with like).
    """
    P = prompt_ids.shape[1]
    ids = torch.cat([prompt_ids, response_ids], dim=1)  # (N, P+R)
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    pos = position_ids(mask)
    T = 1.0 if temperature == 0 else temperature
    body, head = _backbone_and_head(model)
    if body is not None:
        hidden = body(input_ids=ids, attention_mask=mask.long(), position_ids=pos).last_hidden_state
        hidden = hidden[:, P - 1: -1]  # (N, R, D): states that predict the response tokens
        logp, ent = logprobs_from_hidden(hidden, head.weight, response_ids, temperature=T,
                                         chunk_size=chunk_size, with_entropy=with_entropy,
                                         lm_head_bias=head.bias)
    else:
        logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=pos).logits[:, P - 1: -1]
        logp, ent = logprobs_from_logits(logits, response_ids, temperature=T, chunk_size=chunk_size,
                                         with_entropy=with_entropy)
    logp = logp * response_mask
    if ent is not None:
        ent = ent * response_mask
    return logp, ent
