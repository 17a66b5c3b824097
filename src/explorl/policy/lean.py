"""A lean forward for sampling with Llama-family models (Llama, Qwen2, Qwen3): the decoder's own
ops, called directly on the model's weights, without transformers' per-call machinery.

At a decode step every matrix is small (one token per row) and transformers' model call spends
as much time around the ops as in them: building the 4-D mask, the rotary tables, output
capturing, kwargs plumbing, the cache object's bookkeeping. This module runs the same
arithmetic, in the same order and with the same kernels (``F.rms_norm`` is the same composite
as ``LlamaRMSNorm``; sdpa's CPU kernel gives the same values with an additive mask, a boolean
one or none), so its logits equal transformers' bit for bit on the models it accepts
(tests/test_rollout_lean.py); benchmarks/README.md has what it saves.

Used by the ``hf`` rollout engine when ``lean_sampling_supported(model)``; other architectures,
remote code, sliding-window or non-default RoPE, quantised or sharded (FSDP) weights take the
plain model call. The loss pass's packed layout runs the same layers with gradients
(``lean_hidden``) when ``lean_training_supported(model)``: DDP still sees the call (it wraps the
whole log-prob pass, ``dist.LogProbModule``); FSDP, activation checkpointing, ``model.compile``
and autocast take transformers' forward. Both calls give way to transformers' when a hook sits
on a module they bypass (``hooks_bypassed``), so every hook fires.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # transformers >= 4.56: caches made of per-layer objects, which ``lean_logits`` updates
    from transformers.cache_utils import DynamicLayer
except ImportError:
    DynamicLayer = None

_ARCHS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_GQA_KWARG = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


def lean_supported(model: torch.nn.Module) -> bool:
    """Whether ``lean_logits`` computes exactly what ``model(...)`` does for this model."""
    return _config_supported(model) and _scan(model)[0]


def _config_supported(model: torch.nn.Module) -> bool:
    """``lean_supported``'s checks that need no walk over the parameters."""
    cfg = getattr(model, "config", None)
    if cfg is None or type(model).__name__ not in _ARCHS:
        return False
    if not type(model).__module__.startswith("transformers.models."):
        return False
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return False
    if getattr(cfg, "hidden_act", "") != "silu":
        return False
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return False
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    if getattr(model, "hf_quantizer", None) is not None:
        return False
    if getattr(cfg, "quantization_config", None):
        return False
    body = getattr(model, "model", None)
    if body is None or not hasattr(body, "layers") or not hasattr(body, "rotary_emb"):
        return False
    if DynamicLayer is None:  # transformers < 4.56: caches without per-layer objects
        return False
    for layer in body.layers:  # the attributes this module reads (older transformers lack some)
        attn = layer.self_attn
        if not all(hasattr(attn, a) for a in ("scaling", "head_dim", "q_proj", "o_proj")):
            return False
        if not hasattr(layer.input_layernorm, "variance_epsilon"):
            return False
    return True


def lean_sampling_supported(model: torch.nn.Module) -> bool:
    """``lean_supported`` and no hook the lean call would skip (``hooks_bypassed``): whether the
    sampler may call ``lean_logits`` (one walk over the modules for both)."""
    return _config_supported(model) and _runs_plainly(model)


def _runs_plainly(model: torch.nn.Module) -> bool:
    """Plain parameters and no hook the lean calls would skip (``_scan``)."""
    params_ok, bypassed = _scan(model)
    return params_ok and not bypassed


def _scan(model: torch.nn.Module) -> tuple[bool, bool]:
    """One walk over the modules: (every parameter a plain ``Parameter`` off the meta device —
    sharded (DTensor) or offloaded weights need the module's own call —, a hook the lean calls
    would skip: on any module but the model itself, the rotary table, the projections and the
    embeddings, or a global module hook)."""
    called = (torch.nn.Linear, torch.nn.Embedding)  # called as modules: their hooks still fire
    rotary = model.model.rotary_emb
    params_ok = True
    bypassed = any(getattr(torch.nn.modules.module, g) for g in _GLOBAL_HOOKS)
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None and (type(p) is not torch.nn.Parameter or p.device.type == "meta"):
                params_ok = False
        if not bypassed and m is not model and m is not rotary and not isinstance(m, called):
            bypassed = _hooked(m)
    return params_ok, bypassed


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean "may attend" mask as an additive one: 0 where allowed, the dtype's minimum
    elsewhere (the minimum rather than −inf keeps a fully masked row, padding, finite in the
    softmax). Also the packed training layout's mask (``explorl.policy.forward``)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min)


def _norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' RMSNorm: in float32 ``F.rms_norm`` is the same composite, one call instead
    of eight; in lower precision the module itself (it rounds before the weight multiply)."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
    return norm(x)


@torch.no_grad()
def lean_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor, cache) -> torch.Tensor:
    """Logits (N, V) of the last position of ``input_ids`` (N, L), appending the keys and values
    to ``cache`` (a ``DynamicCache`` whose layers take ``update(k, v)``, as ``rollout.hf``'s).

    ``attention_mask`` (N, past + L) bool or 0/1: the rows' padding over every cached position
    and the new ones, or None when no row has padding (the caller knows; checking here would
    cost a device sync per token). Causality among the new positions is added here.
    """
    body = model.model
    N, L = input_ids.shape
    h = body.embed_tokens(input_ids)
    cos, sin = _rope_tables(*body.rotary_emb(h, position_ids))
    past = cache.get_seq_length()
    causal = L > 1 and attention_mask is None and past == 0  # sdpa's own causal mask
    if attention_mask is not None or (L > 1 and not causal):
        allowed = (attention_mask.bool() if attention_mask is not None
                   else torch.ones(N, past + L, dtype=torch.bool, device=h.device))
        allowed = allowed[:, None, None, :].expand(N, 1, L, past + L)
        if L > 1:
            allowed = allowed & torch.ones(L, past + L, dtype=torch.bool,
                                           device=h.device).tril_(past)
        mask = additive_mask(allowed, h.dtype)
    else:
        mask = None
    h = _decoder(model, h, cos, sin, mask, causal, cache)
    h = _norm(body.norm, h[:, -1:])
    return model.lm_head(h)[:, -1]


def lean_hidden(model, input_ids: torch.Tensor, mask: torch.Tensor,
                position_ids: torch.Tensor) -> torch.Tensor:
    """The body's last hidden states (N, L, D), after the final norm, for a prepared additive
    attention mask (N, 1, L, L): what ``model.model(input_ids, attention_mask=mask,
    position_ids=position_ids).last_hidden_state`` computes, with gradients, bit for bit (the
    same ops in the same order: their autograd graph is the same too; tests/test_rollout_lean.py).
    The loss pass's packed layout calls it where ``lean_training_supported`` (forward.py)."""
    body = model.model
    h = body.embed_tokens(input_ids)
    cos, sin = _rope_tables(*body.rotary_emb(h, position_ids))
    h = _decoder(model, h, cos, sin, mask, False, None)
    return _norm(body.norm, h)


def lean_training_supported(model) -> bool:
    """Whether ``lean_hidden`` may stand in for the body in a loss pass right now: a model
    ``lean_supported`` accepts, whose decoder layers run plainly (transformers' own classes, no
    hooks, no activation checkpointing, no ``model.compile`` call switched on, no wrapper such as
    FSDP's around them), without attention dropout in training, and no autocast (mixed
    precision takes transformers' forward)."""
    if not _config_supported(model):
        return False
    cfg, layers = model.config, model.model.layers
    if model.training and getattr(cfg, "attention_dropout", 0.0):
        return False
    device = model.model.embed_tokens.weight.device.type
    if torch.is_autocast_enabled(device):
        return False
    for m in (model.model, *layers):
        if not type(m).__module__.startswith("transformers.models."):
            return False
        if getattr(m, "gradient_checkpointing", False):
            return False
        if getattr(m, "_compiled_call_impl", None) is not None:
            return False
    return _runs_plainly(model)


def hooks_bypassed(model) -> bool:
    """Whether a hook would be skipped by the lean calls: one on a module whose call they bypass
    (the body, layers, attention, MLP, norms), or a global module hook (it would fire for some
    modules only). Hooks on the projections, embeddings and output layer fire as usual (a
    projection's input is (N·L, D) rows in the lean calls, (N, L, D) in transformers')."""
    return _scan(model)[1]


_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


def _hooked(m: torch.nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or m._backward_pre_hooks)


def _rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary tables (N, L, d) as ``_decoder`` applies them: (N, 1, L, d) each, the sine's
    first half negated. transformers rotates x as x·cos + rotate_half(x)·sin with rotate_half(x)
    = [−x₂, x₁]; [x₂, x₁] (``x.roll(d/2)``) times [−sin₁, sin₂] is the same products, a sign
    moved from one factor to the other (exact), in one op instead of four. Built once a call."""
    half = sin.shape[-1] // 2
    sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos[:, None], sin[:, None]


def _decoder(model, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             mask: torch.Tensor | None, causal: bool, cache) -> torch.Tensor:
    """The decoder layers over hidden states ``h`` (N, L, D); keys and values appended to
    ``cache`` when one is given (sampling), attending over the new positions only otherwise.
    ``cos``/``sin`` from ``_rope_tables``. The residual stream is kept as (N·L, D) rows, so each
    projection is one matrix product (transformers folds (N, L, D) into the same product)."""
    cfg = model.config
    N, L, D = h.shape
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    h = h.reshape(N * L, D)
    for i, layer in enumerate(model.model.layers[: cfg.num_hidden_layers]):
        attn = layer.self_attn
        d = attn.head_dim
        half = d // 2
        x = _norm(layer.input_layernorm, h)
        q = attn.q_proj(x).view(N, L, -1, d)
        k = attn.k_proj(x).view(N, L, -1, d)
        v = attn.v_proj(x).view(N, L, -1, d).transpose(1, 2)
        if hasattr(attn, "q_norm"):  # Qwen3: per-head RMSNorm of queries and keys
            q, k = _norm(attn.q_norm, q), _norm(attn.k_norm, k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q = q * cos + q.roll(half, -1) * sin
        k = k * cos + k.roll(half, -1) * sin
        if cache is not None:
            k, v = cache.layers[i].update(k, v)
        gqa, rep = {}, heads // kv_heads
        if rep > 1:  # grouped keys/values, handled as transformers' sdpa path does
            if _GQA_KWARG and mask is None:
                gqa = {"enable_gqa": True}
            elif L == 1:  # one query per row: the group's queries attend to their shared head
                q = q.reshape(N, kv_heads, rep, d)
            else:
                k = k[:, :, None].expand(N, kv_heads, rep, *k.shape[2:]).reshape(N, heads, -1, d)
                v = v[:, :, None].expand(N, kv_heads, rep, *v.shape[2:]).reshape(N, heads, -1, d)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling,
                                           is_causal=causal, **gqa)
        if o.shape[1] != heads:
            o = o.reshape(N, heads, L, d)
        h = h + attn.o_proj(o.transpose(1, 2).reshape(N * L, -1))
        x = _norm(layer.post_attention_layernorm, h)
        mlp = layer.mlp
        h = h + mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    return h.view(N, L, D)
