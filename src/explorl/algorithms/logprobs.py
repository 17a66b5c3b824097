"""Token log-probs and entropy in chunks, so |V| ~ 150k logits never sit in memory at once.

H = logsumexp(z) − Σ softmax(z)·z on the temperature-scaled logits z = logits / T
(docs/methods/baseline.md §0). Both public functions are custom ``autograd.Function``s: the forward
keeps only its inputs, and the backward recomputes one chunk at a time and writes its
gradient straight into the result. Forward and backward hold at most two float32
chunk × |V| work buffers (the scaled logits z and softmax p; one without entropy) beyond
the unavoidable inputs and their gradients. ``benchmarks/logprob_memory.py`` measures it.

Gradients, per token, with p = softmax(z) and one-hot y of the label:
    ∂logp/∂z = y − p,        ∂H/∂z = p · (E_p[z] − z),        ∂/∂logits = ∂/∂z / T.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK = 2048
"""Tokens per chunk when the caller does not say (the trainer passes
``algorithm.logprob_chunk``). At |V| = 152k one float32 chunk buffer is 1.2 GB."""


def naive_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: full-vocabulary log_softmax and entropy in float32 (docs/methods/baseline.md
    §0)."""
    z = logits.float() / temperature  # (N, T, V)
    logp = torch.log_softmax(z, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (N, T)
    entropy = torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)  # (N, T)
    return logp, entropy


def _softmax_lse(z: torch.Tensor, inplace: bool = False):
    """softmax(z) (M, V) and logsumexp(z) (M,) with one exp pass and no other (M, V) temporary.

    torch.logsumexp materialises both z − max and its exp; at |V| = 152k that third
    chunk-sized buffer is ~40% of this module's peak. ``inplace`` overwrites z with p.
    """
    m = z.amax(-1, keepdim=True)  # (M, 1)
    p = z.sub_(m) if inplace else torch.sub(z, m)
    p.exp_()  # (M, V) unnormalised
    s = p.sum(-1, keepdim=True)  # (M, 1)
    return p.div_(s), (m + s.log()).squeeze(-1)


def _forward_chunk(z: torch.Tensor, labels: torch.Tensor, with_entropy: bool):
    """logp (M,) and entropy (M,) or None of scaled float32 logits z (M, V)."""
    z_label = z.gather(-1, labels[:, None]).squeeze(-1)  # (M,)
    p, lse = _softmax_lse(z, inplace=not with_entropy)
    if not with_entropy:
        return z_label - lse, None
    # Σ p·z as a batched dot product: no third (M, V) buffer, and faster than (p * z).sum.
    mean_z = torch.bmm(p[:, None, :], z[:, :, None]).view(-1)  # (M,)
    return z_label - lse, lse - mean_z


def _grad_chunk(z, labels, g_logp, g_ent, temperature):
    """∂(Σ g_logp·logp + g_ent·H)/∂logits for one chunk; reuses z's buffer."""
    if g_ent is None:
        p, _ = _softmax_lse(z, inplace=True)
        grad = p.mul_(-g_logp[:, None])  # (M, V)
    else:
        p, _ = _softmax_lse(z)  # (M, V)
        mean_z = torch.bmm(p[:, None, :], z[:, :, None]).view(-1)  # (M,)
        # g_ent·p·(E[z] − z) − g_logp·p, computed in z's buffer.
        grad = z.neg_().add_(mean_z[:, None]).mul_(g_ent[:, None]).sub_(g_logp[:, None])
        grad.mul_(p)
        del p
    grad.scatter_add_(-1, labels[:, None], g_logp[:, None])
    return grad.div_(temperature)


def _blocks(N: int, T: int, chunk_size: int):
    """(n0, n1, t0, t1) views of ≤ chunk_size tokens: whole rows, or pieces of one row.

    Slicing by rows/pieces (not a flat N·T index) keeps every block a view even when the
    caller passes a column slice like ``logits[:, P - 1 : -1]``.
    """
    if chunk_size >= T:
        rows = chunk_size // T
        for n0 in range(0, N, rows):
            yield n0, min(n0 + rows, N), 0, T
    else:
        for n in range(N):
            for t0 in range(0, T, chunk_size):
                yield n, n + 1, t0, min(t0 + chunk_size, T)


class _LogprobsFromLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, temperature, chunk_size, with_entropy):
        N, T, V = logits.shape
        logp = logits.new_empty((N, T), dtype=torch.float32)
        entropy = logits.new_empty((N, T), dtype=torch.float32) if with_entropy else None
        for n0, n1, t0, t1 in _blocks(N, T, chunk_size):
            z = logits[n0:n1, t0:t1].reshape(-1, V).float().div(temperature)  # (M, V)
            lp, h = _forward_chunk(z, labels[n0:n1, t0:t1].reshape(-1), with_entropy)
            logp[n0:n1, t0:t1] = lp.view(n1 - n0, t1 - t0)
            if with_entropy:
                entropy[n0:n1, t0:t1] = h.view(n1 - n0, t1 - t0)
            del z  # else it lives on while the next chunk is allocated: 2 chunks, not 1
        ctx.save_for_backward(logits, labels)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        return (logp, entropy) if with_entropy else logp

    @staticmethod
    def backward(ctx, g_logp, g_ent=None):
        logits, labels = ctx.saved_tensors
        N, T, V = logits.shape
        grad = torch.empty_like(logits, memory_format=torch.contiguous_format)  # (N, T, V)
        for n0, n1, t0, t1 in _blocks(N, T, ctx.chunk_size):
            z = logits[n0:n1, t0:t1].reshape(-1, V).float().div(ctx.temperature)  # (M, V)
            g_e = g_ent[n0:n1, t0:t1].reshape(-1).float() if g_ent is not None else None
            g = _grad_chunk(
                z,
                labels[n0:n1, t0:t1].reshape(-1),
                g_logp[n0:n1, t0:t1].reshape(-1).float(),
                g_e,
                ctx.temperature,
            )
            grad[n0:n1, t0:t1] = g.view(n1 - n0, t1 - t0, V)
            del z, g  # free this chunk before the next one is allocated
        return grad, None, None, None, None


def logprobs_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked log π(label) and entropy H of temperature-scaled logits (docs/methods/baseline.md
    §0).

    logits (N, T, V) any float dtype, labels (N, T) long in [0, V). Returns float32 logp
    (N, T) and entropy (N, T) (None if ``with_entropy`` is False). Equal to
    ``naive_logprobs`` in value and gradient; at most two float32 (chunk_size, V) work
    buffers exist at any time, forward or backward.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    out = _LogprobsFromLogits.apply(logits, labels, float(temperature), chunk_size, with_entropy)
    return out if with_entropy else (out, None)


def _head_chunk(h, weight, bias, scale: float, softcap: float | None, temperature: float):
    """z = softcap(scale · (h Wᵀ + b)) / T (M, V) float32, and tanh's output (M, V) when capped.

    The projection runs in the model's dtype (as its lm_head would), the rest in float32.
    softcap(u) = c·tanh(u / c) (Gemma 2/3's ``final_logit_softcapping``).
    """
    u = torch.nn.functional.linear(h, weight, bias).float()  # (M, V)
    if scale != 1.0:
        u.mul_(scale)
    if softcap is None:
        return u.div_(temperature), None
    t = u.div_(softcap).tanh_()  # (M, V) in u's buffer
    return t.mul(softcap / temperature), t


class _LogprobsFromHidden(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, chunk_size, with_entropy,
                scale=1.0, softcap=None):
        M = hidden.shape[0]
        logp = hidden.new_empty(M, dtype=torch.float32)
        entropy = hidden.new_empty(M, dtype=torch.float32) if with_entropy else None
        for s in range(0, M, chunk_size):
            e = min(s + chunk_size, M)
            z, t = _head_chunk(hidden[s:e], weight, bias, scale, softcap, temperature)
            del t
            lp, h = _forward_chunk(z, labels[s:e], with_entropy)
            logp[s:e] = lp
            if with_entropy:
                entropy[s:e] = h
            del z  # else it lives on while the next chunk is allocated: 2 chunks, not 1
        ctx.save_for_backward(hidden, weight, bias, labels)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        ctx.scale, ctx.softcap = scale, softcap
        return (logp, entropy) if with_entropy else logp

    @staticmethod
    def backward(ctx, g_logp, g_ent=None):
        hidden, weight, bias, labels = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        M = hidden.shape[0]
        grad_h = torch.empty_like(hidden) if need_h else None  # (M, D)
        # Accumulate in float32: chunked bf16 sums would lose what one big matmul keeps.
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None  # (V, D)
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None  # (V,)
        for s in range(0, M, ctx.chunk_size):
            e = min(s + ctx.chunk_size, M)
            h = hidden[s:e]  # (M_c, D)
            z, t = _head_chunk(h, weight, bias, ctx.scale, ctx.softcap, ctx.temperature)
            g_e = g_ent[s:e].float() if g_ent is not None else None
            g = _grad_chunk(z, labels[s:e], g_logp[s:e].float(), g_e, ctx.temperature)
            del z  # g now owns z's buffer  # (M_c, V) float32: ∂/∂(capped, scaled logits)
            if t is not None:  # d softcap(u)/du = 1 − tanh²(u / c)
                g.mul_(t.square_().neg_().add_(1.0))
                del t
            if ctx.scale != 1.0:
                g.mul_(ctx.scale)
            if need_h:
                # cast to the logits' dtype first, as autograd would through the lm_head
                grad_h[s:e] = g.to(hidden.dtype) @ weight
            if need_w:
                grad_w.addmm_(g.t(), h.float())
            if need_b:
                grad_b += g.sum(0)
            del g  # free this chunk before the next one is allocated
        grad_w = grad_w.to(weight.dtype) if need_w else None
        grad_b = grad_b.to(bias.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def logprobs_from_hidden(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    with_entropy: bool = True,
    lm_head_bias: torch.Tensor | None = None,
    logit_scale: float = 1.0,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked logp and entropy from final hidden states; full logits are never built.

    hidden (N, T, D), lm_head_weight (V, D), optional lm_head_bias (V,), labels (N, T).
    Per chunk: logits = softcap(logit_scale · (hidden @ Wᵀ + b)), then as
    ``logprobs_from_logits``; ``logit_scale`` is a head's constant factor (Cohere's
    ``logit_scale``, 1 / Granite's ``logits_scaling``), ``softcap`` c a head's
    c·tanh(logits / c) (Gemma 2/3), None for none. The backward recomputes each chunk's
    logits, so memory stays at one chunk (two with ``softcap``); gradients flow to hidden,
    weight and bias (and through the entropy, for the entropy bonus).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0 or None, got {softcap}")
    N, T, D = hidden.shape
    flat_h = hidden.reshape(N * T, D)  # (M, D) small: a copy here costs D, not V, per token
    out = _LogprobsFromHidden.apply(
        flat_h,
        lm_head_weight,
        lm_head_bias,
        labels.reshape(N * T),
        float(temperature),
        chunk_size,
        with_entropy,
        float(logit_scale),
        None if softcap is None else float(softcap),
    )
    if with_entropy:
        logp, entropy = out
        return logp.view(N, T), entropy.view(N, T)
    return out.view(N, T), None
