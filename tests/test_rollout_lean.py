"""The sampler's lean model call (``policy.lean``) against transformers' own forward.

It must be invisible: for every model it accepts, the engine samples the same tokens with the
same log-probs and entropies bit for bit, through left padding, prompt fan-out, finished-row
compaction, grouped keys/values, biases (Qwen2) and per-head norms (Qwen3); and it must refuse
what it does not reproduce. The loss pass's lean forward (``lean_hidden``) likewise: the same
log-probs, entropies and gradients, and transformers' forward wherever it could differ.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from explorl.policy.lean import lean_hidden, lean_logits, lean_supported, lean_training_supported
from explorl.rollout import hf
from explorl.rollout.hf import HFEngine

PROMPTS = ["3+4=", "12+7=", "5+5=", "987+10=", "1+2="]  # lengths differ: left padding


@pytest.fixture(scope="module")
def lab(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    return tok, model, [tok(p)["input_ids"] for p in PROMPTS]


def tiny(config_cls, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = config_cls(vocab_size=24, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=kw.pop("kv", 2), head_dim=16,
                     max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     attn_implementation=kw.pop("attn", "sdpa"), **kw)
    return AutoModelForCausalLM.from_config(cfg).eval()


def both(tok, model, ids, n, T=1.0, max_new=8, **kw):
    seeds = list(range(len(ids)))
    return [HFEngine(tok, lean=lean, **kw).generate(model, ids, [n] * len(ids), T, max_new,
                                                     seeds=seeds)
            for lean in (False, True)]


def assert_same(a, b):
    for f in ("response_ids", "response_mask", "old_logp", "entropy", "truncated"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert a.texts == b.texts


@pytest.mark.parametrize("T", [1.0, 0.6, 0.0])
def test_lab_model_samples_bit_for_bit_the_same(lab, T, monkeypatch):
    tok, model, ids = lab
    assert lean_supported(model)
    calls = []
    monkeypatch.setattr(hf, "lean_logits", lambda *a: calls.append(1) or lean_logits(*a))
    a, b = both(tok, model, ids, 8, T=T)
    assert len(calls) == b.response_mask.shape[1]  # the prefill and every decode step but the last
    assert_same(a, b)
    assert a.response_mask.sum(-1).min() < a.response_mask.shape[1]  # rows finished early


def test_compaction_and_chunks_bit_for_bit(lab):
    tok, model, ids = lab
    for kw in ({"compact_ratio": 1.0, "batch_size": 7}, {"compact_ratio": 0.0}):
        assert_same(*both(tok, model, ids, 6, **kw))


@pytest.mark.parametrize("cfg,kv", [(LlamaConfig, 2), (LlamaConfig, 4), (Qwen2Config, 2),
                                    (Qwen3Config, 1)])
def test_llama_family_bit_for_bit(lab, cfg, kv):
    # Random weights rarely say EOS: rows run to the limit, the cache grows past its first room.
    tok, _, ids = lab
    model = tiny(cfg, kv=kv)
    assert lean_supported(model)
    a, b = both(tok, model, ids, 3, max_new=12)
    assert_same(a, b)


@pytest.mark.parametrize("cfg,kv", [(LlamaConfig, 2), (Qwen3Config, 4)])
def test_prompts_without_padding_bit_for_bit(lab, cfg, kv):
    # No padding anywhere: transformers drops the mask (sdpa's own causal mask, grouped heads
    # in the kernel); the lean call must take the same kernels, not an all-zero mask.
    tok, lab_model, _ = lab
    ids = [tok(p)["input_ids"] for p in ("3+4=", "5+5=", "1+2=")]
    assert len({len(i) for i in ids}) == 1
    assert_same(*both(tok, lab_model, ids, 4))
    assert_same(*both(tok, tiny(cfg, kv=kv), ids, 3, max_new=10))


def test_lower_precision_bit_for_bit(lab):
    tok, _, ids = lab
    model = tiny(Qwen2Config).to(torch.bfloat16)
    assert_same(*both(tok, model, ids, 3))


def test_refuses_what_it_does_not_reproduce(lab):
    assert not lean_supported(tiny(LlamaConfig, attn="eager"))
    assert not lean_supported(tiny(MistralConfig))  # another architecture
    assert not lean_supported(tiny(Qwen2Config, use_sliding_window=True, sliding_window=4))
    assert not lean_supported(
        tiny(LlamaConfig, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                           "rope_theta": 10000.0}))
    model = tiny(LlamaConfig)
    model.model.embed_tokens.weight = torch.nn.Parameter(
        model.model.embed_tokens.weight.detach().to("meta"))
    assert not lean_supported(model)
    # Refused models still sample (transformers' own call).
    tok, _, ids = lab
    plain = tiny(LlamaConfig, attn="eager")
    ro = HFEngine(tok).generate(plain, ids, [2] * len(ids), 1.0, 4, seeds=list(range(len(ids))))
    assert ro.response_ids.shape == (2 * len(ids), 4)


def test_hooks_on_bypassed_modules_take_the_plain_call(lab, monkeypatch):
    # A hook on a module the lean call does not call (here a layer's MLP) must fire: such a
    # model samples through transformers' call, with the same tokens.
    tok, model, ids = lab
    calls, seen = [], []
    monkeypatch.setattr(hf, "lean_logits", lambda *a: calls.append(1) or lean_logits(*a))
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *a: seen.append(1))
    try:
        hooked = HFEngine(tok).generate(model, ids, [3] * len(ids), 1.0, 5, seeds=[0] * len(ids))
    finally:
        handle.remove()
    assert not calls and seen
    plain = HFEngine(tok).generate(model, ids, [3] * len(ids), 1.0, 5, seeds=[0] * len(ids))
    assert calls
    assert_same(hooked, plain)


def test_output_layer_hooks_still_apply(lab):
    # Hooks on the output layer (the benchmarks forbid EOS this way) see the lean call too.
    tok, model, ids = lab
    eos = tok.eos_token_id
    handle = model.get_output_embeddings().register_forward_hook(
        lambda m, i, out: out.index_fill(-1, torch.tensor([eos]), -1e4))
    try:
        ro = HFEngine(tok).generate(model, ids, [4] * len(ids), 1.0, 5, seeds=[0] * len(ids))
    finally:
        handle.remove()
    assert bool(ro.response_mask.all()) and eos not in ro.response_ids.tolist()


# ----------------------------------------------------------------------------- the loss pass


def packed_batch(vocab: int, seed: int = 0):
    """Three prompts of different lengths × three responses each, ending at different places:
    the loss pass's packed layout (prompts shared, positions restarting, a block mask)."""
    g = torch.Generator().manual_seed(seed)
    p_len, r_len = [3, 5, 4], [[4, 1, 6], [2, 6, 3], [5, 5, 2]]
    P, R = max(p_len), 6
    rows = [(i, r) for i in range(3) for r in r_len[i]]
    prompt_ids = torch.zeros(len(rows), P, dtype=torch.long)
    prompt_mask = torch.zeros(len(rows), P, dtype=torch.bool)
    response_ids = torch.zeros(len(rows), R, dtype=torch.long)
    response_mask = torch.zeros(len(rows), R, dtype=torch.bool)
    prompts = [torch.randint(3, vocab, (n,), generator=g) for n in p_len]
    for j, (i, r) in enumerate(rows):
        prompt_ids[j, P - p_len[i]:], prompt_mask[j, P - p_len[i]:] = prompts[i], True
        response_ids[j, :r], response_mask[j, :r] = torch.randint(3, vocab, (r,), generator=g), True
    return prompt_ids, prompt_mask, response_ids, response_mask


def loss_pass(model, batch, lean: bool, monkeypatch):
    """Log-probs, entropies and every parameter's gradient of one packed loss pass."""
    from explorl.policy import forward
    calls = []
    with monkeypatch.context() as m:
        if lean:
            m.setattr(forward, "lean_hidden", lambda *a: calls.append(1) or lean_hidden(*a))
        else:
            m.setattr(forward, "lean_training_supported", lambda model: False)
        model.zero_grad(set_to_none=True)
        logp, ent = forward.response_logprobs(model, *batch, temperature=0.7, pack=True)
        (logp.sum() + 0.3 * ent.sum()).backward()
    assert len(calls) == lean  # the lean forward ran exactly when asked
    return [logp.detach(), ent.detach()] + [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("cfg,kv", [(None, None), (LlamaConfig, 2), (Qwen2Config, 2),
                                    (Qwen3Config, 1)])
def test_loss_pass_bit_for_bit_with_gradients(lab, cfg, kv, monkeypatch):
    # The packed loss pass through lean_hidden: the same log-probs, entropies and gradients as
    # transformers' body, bit for bit (the lab model, grouped heads, biases, q/k norms).
    model = lab[1] if cfg is None else tiny(cfg, kv=kv)
    model.train()
    try:
        assert lean_training_supported(model)
        batch = packed_batch(model.config.vocab_size)
        a = loss_pass(model, batch, False, monkeypatch)
        b = loss_pass(model, batch, True, monkeypatch)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert a[2].abs().sum() > 0  # gradients flowed
    finally:
        model.eval()


def test_loss_pass_takes_transformers_forward_when_it_must():
    from explorl.models import enable_checkpointing

    model = tiny(LlamaConfig).train()
    assert lean_training_supported(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # mixed precision
        assert not lean_training_supported(model)
    layer = model.model.layers[1]
    for m in (layer, layer.mlp, layer.self_attn, model.model.norm):  # hooks that must fire
        handle = m.register_forward_pre_hook(lambda *a: None)
        assert not lean_training_supported(model)
        handle.remove()
    handle = layer.post_attention_layernorm.register_full_backward_hook(lambda *a: None)
    assert not lean_training_supported(model)
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)  # global
    assert not lean_training_supported(model)
    handle.remove()
    handle = layer.mlp.up_proj.register_forward_hook(lambda *a: None)  # fires in the lean call
    assert lean_training_supported(model)
    handle.remove()
    layer._compiled_call_impl = layer._call_impl  # model.compile's layers switched on
    assert not lean_training_supported(model)
    layer._compiled_call_impl = None
    model.config.attention_dropout = 0.1  # dropout in training; none in eval
    assert not lean_training_supported(model)
    assert lean_training_supported(model.eval())
    model.config.attention_dropout = 0.0
    enable_checkpointing(model.train(), "tiny")  # activation checkpointing
    assert not lean_training_supported(model)
    assert not lean_training_supported(tiny(LlamaConfig, attn="eager").train())
