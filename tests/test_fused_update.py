"""The update's log-probs from the hidden states (``algorithm.fused_logprobs``) and the packed
layouts give what the full-vocabulary logits and the padded layout give: values and gradients
to 1e-5 in float32, for every head ``fused_head`` accepts, and every statistic of a training step.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import transformers
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from explorl.policy.forward import (
    CAPPED_HEADS,
    PLAIN_HEADS,
    SCALED_HEADS,
    fused_head,
    response_logprobs,
    takes_custom_mask,
    takes_varlen,
)
from explorl.training.loop import Trainer

TOL = dict(rtol=1e-5, atol=1e-5)
SMALL = dict(vocab_size=61, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)


# 1. Which heads the fused pass reproduces, read from transformers' own source.

_HEAD_LINES = {"hidden_states = outputs.last_hidden_state",
               "slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) "
               "else logits_to_keep",
               "logits = self.lm_head(hidden_states[:, slice_indices, :])",
               "hidden_states = slice_logits_to_keep(hidden_states, logits_to_keep)",
               "logits = self.lm_head(hidden_states)"}
"""The plain head's statements (two spellings of the ``logits_to_keep`` slice)."""
_EXTRA = {
    "logit_scale": {"logits = logits * self.logit_scale"},
    "1/logits_scaling": {"logits = logits / self.config.logits_scaling"},
    "softcap": {"if self.config.final_logit_softcapping is not None:",
                "logits = logits / self.config.final_logit_softcapping",
                "logits = torch.tanh(logits)",
                "logits = logits * self.config.final_logit_softcapping"},
}


def _head_source(kind: str) -> set[str]:
    """The statements of ``kind``'s causal-LM forward from the body's output to the loss."""
    cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[kind])
    src = inspect.getsource(cls.forward)
    start = src.index("outputs.last_hidden_state") if "outputs.last_hidden_state" in src else None
    assert start is not None, f"{kind}: the body's output is not read as last_hidden_state"
    start = src.rindex("\n", 0, start) + 1
    end = src.index("loss = None", start)
    out = set()
    for line in src[start:end].splitlines():
        line = line.split("#")[0].strip()
        if line:
            out.add(line)
    return out


@pytest.mark.parametrize("kind", sorted(PLAIN_HEADS | set(SCALED_HEADS) | CAPPED_HEADS))
def test_every_listed_head_is_what_transformers_computes(kind):
    """A transformers upgrade that changes a listed head (a multiplier, a cap, a mask) fails
    here instead of silently giving other log-probs."""
    extra = (_EXTRA[SCALED_HEADS[kind]] if kind in SCALED_HEADS
             else _EXTRA["softcap"] if kind in CAPPED_HEADS else set())
    src = _head_source(kind)
    assert src - _HEAD_LINES == extra
    assert any(line.startswith("logits = self.lm_head(") for line in src)


def _llama(**kw):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**{**SMALL, "tie_word_embeddings": True, **kw})
    cfg._attn_implementation = kw.pop("attn", "sdpa")
    return transformers.LlamaForCausalLM(cfg).float()


class RemoteLlama(transformers.LlamaForCausalLM):
    """Stands for remote code: a class outside transformers, whose head nobody has read."""


def test_fused_head_accepts_known_heads_and_says_why_it_refuses_the_rest():
    model = _llama()
    head, why = fused_head(model)
    assert head is not None and head.scale == 1.0 and head.softcap is None
    assert head.head.weight is model.model.embed_tokens.weight  # tied: one tensor
    head, why = fused_head(RemoteLlama(model.config))
    assert head is None and "not a transformers class" in why
    import peft

    lora = peft.get_peft_model(_llama(), peft.LoraConfig(r=2, target_modules=["lm_head"]))
    head, why = fused_head(lora.get_base_model())
    assert head is None and "not a plain Linear" in why
    granite = transformers.GraniteForCausalLM(transformers.GraniteConfig(**SMALL,
                                                                         logits_scaling=4.0))
    assert fused_head(granite)[0].scale == 0.25
    cohere = transformers.CohereForCausalLM(transformers.CohereConfig(**SMALL, logit_scale=0.5))
    assert fused_head(cohere)[0].scale == 0.5
    gemma = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **SMALL, head_dim=8, final_logit_softcapping=2.0))
    assert fused_head(gemma)[0].softcap == 2.0


# 2. Fused against full logits, and packed against padded, through response_logprobs.

def _batch(vocab: int, seed: int = 0):
    """3 prompts × 2 responses, left-padded prompts of 2–5 tokens, responses of 1–7 tokens."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.tensor([5, 5, 2, 2, 4, 4])
    r_len = torch.tensor([7, 3, 1, 6, 4, 7])
    P, R = 5, 7
    prompt_mask = torch.arange(P)[None] >= P - p_len[:, None]
    response_mask = torch.arange(R)[None] < r_len[:, None]
    prompt_ids = torch.randint(3, vocab, (3, P), generator=g).repeat_interleave(2, 0)
    prompt_ids = prompt_ids.masked_fill(~prompt_mask, 0)
    response_ids = torch.randint(3, vocab, (6, R), generator=g).masked_fill(~response_mask, 0)
    return prompt_ids, prompt_mask, response_ids, response_mask


def _run(model, batch, **kw):
    """Log-probs, entropy and the gradient of a loss that reads both, for every parameter."""
    model.zero_grad(set_to_none=True)
    logp, ent = response_logprobs(model, *batch, 0.7, chunk_size=5, **kw)
    g = torch.Generator().manual_seed(1)
    w = torch.randn(logp.shape, generator=g)
    ((logp * w).sum() - 0.3 * ent.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), grads


def _same(a, b):
    torch.testing.assert_close(a[0], b[0], **TOL)
    torch.testing.assert_close(a[1], b[1], **TOL)
    assert a[2].keys() == b[2].keys() and a[2]
    for n in a[2]:
        torch.testing.assert_close(a[2][n], b[2][n], **TOL, msg=n)


def _qwen2():
    torch.manual_seed(1)
    q = transformers.Qwen2Config(**SMALL, tie_word_embeddings=False)
    q._attn_implementation = "sdpa"
    return transformers.Qwen2ForCausalLM(q)


def _granite():
    torch.manual_seed(2)
    return transformers.GraniteForCausalLM(transformers.GraniteConfig(
        **SMALL, logits_scaling=4.0, attn_implementation="sdpa"))


def _gemma2():
    torch.manual_seed(3)
    return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **SMALL, head_dim=8, final_logit_softcapping=0.5, attn_implementation="eager"))


def _llama_lora():
    import peft

    return peft.get_peft_model(_llama(), peft.LoraConfig(
        r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))


MODELS = {"llama tied": _llama, "qwen2 untied": _qwen2, "granite scaled": _granite,
          "gemma2 capped": _gemma2, "llama + LoRA on the body": _llama_lora}


@pytest.mark.parametrize("name", list(MODELS))
def test_fused_equals_full_logits_in_every_layout(name):
    model = MODELS[name]()
    batch = _batch(model.config.vocab_size)
    for pack in (False, None):  # padded; packed where the model takes it
        _same(_run(model, batch, fused=True, pack=pack), _run(model, batch, fused=False, pack=pack))
    if takes_custom_mask(model):  # the shared-prompt layout ran above; the varlen one too
        _same(_run(model, batch, pack=True, varlen=True), _run(model, batch, pack=False))


def test_varlen_layout_is_chosen_where_attention_reads_positions_only():
    def with_attention(impl, **kw):
        model = _llama(**kw)
        model.config._attn_implementation = impl  # flash-attn is not installed on a CPU box
        return model

    assert takes_varlen(with_attention("flash_attention_2"))
    assert takes_varlen(with_attention("flex_attention"))
    assert not takes_varlen(_llama()) and takes_custom_mask(_llama())  # sdpa: shared prompts
    assert not takes_varlen(with_attention("flash_attention_2", sliding_window=8))


def test_the_varlen_layout_is_one_row_of_whole_sequences():
    """Each response after its own prompt copy, positions restarting at 0, no mask, one row
    (transformers' flash path reads packed positions in a batch of one only)."""
    from explorl.policy.forward import _pack_plan

    pids, pmask, rids, rmask = _batch(61)
    plan = _pack_plan(pids, pmask, rmask, 1 << 62, share=False)
    lengths = (pmask.sum(-1) + rmask.sum(-1) - 1).tolist()  # the last response token: no input
    assert plan["allowed"] is None and plan["position_ids"].shape == (1, sum(lengths))
    expected = torch.cat([torch.arange(n) for n in lengths])
    assert torch.equal(plan["position_ids"][0], expected)


def test_packed_and_fused_entropy_by_hand():
    """Zero weights: uniform logits over V, so H = ln V and logp = −ln V at any temperature."""
    model = _llama()
    for p in model.parameters():
        torch.nn.init.zeros_(p)
    batch = _batch(model.config.vocab_size)
    logp, ent = response_logprobs(model, *batch, 0.7, chunk_size=3)
    mask = batch[3]
    V = model.config.vocab_size
    torch.testing.assert_close(ent[mask], torch.full((int(mask.sum()),), math.log(V)))
    torch.testing.assert_close(logp[mask], torch.full((int(mask.sum()),), -math.log(V)))
    assert (ent[~mask] == 0).all() and (logp[~mask] == 0).all()


# 3. A training step: every statistic and every weight the same with the knob on and off.

_SKIP = ("time/", "perf/", "memory/", "throughput/")


def _trainer(make_config, tmp_path, name, overrides):
    """A 1-step trainer whose scripted engine reports log-probs 0.2 below the trainer's (the
    rollout correction then weighs every token), sample 0 right and the others wrong."""
    import dataclasses

    from explorl import models
    from explorl.rollout.fake import FakeEngine

    cfg = make_config({"max_steps": 1, "eval": {"every": 0}, "rollout": {"engine": "vllm"},
                       **overrides})
    truths = {}

    class Mismatched(FakeEngine):
        def generate(self, *args, **kwargs):
            ro = super().generate(*args, **kwargs)
            return dataclasses.replace(ro, engine_logp=ro.old_logp - 0.2)

    tok = models.load_tokenizer(models.resolve_model_path(cfg.model.path, cfg.lab), cfg.model)
    engine = Mismatched(tok, lambda p, j: truths[tuple(p)] + ("" if j == 0 else "9" * j))
    t = Trainer(cfg, tmp_path / name, engine=engine)
    truths.update({tuple(t.prompts.ids_of(t.train_data, "train")(i)): r.ground_truth
                   for i, r in enumerate(t.train_data)})
    return t


_SKIP = ("time/", "perf/", "memory/", "throughput/")


@pytest.mark.parametrize("loss", ["kl_cov", "clip_cov"])
def test_a_step_is_the_same_with_and_without_the_fused_path(make_config, tmp_path, loss):
    """Entropy bonus, KL to the reference, the covariance selection, rollout correction and the
    adaptive entropy coefficient all read the fused pass: none is dropped or changed by it."""
    out = {}
    for fused in (True, False):
        t = _trainer(make_config, tmp_path, f"run-{fused}", {
            "optim": {"mini_batches": 2},
            "algorithm": {"loss": loss, "fused_logprobs": fused,
                          "kl_coef": 0.05, "old_logp": "recompute", "kl_cov_ratio": 0.5,
                          "clip_cov_ratio": 0.5, "rollout_correction": {"mode": "token-truncate"}},
            "control": {"entropy_coef": {"enabled": True, "target": 5.0, "init": 0.01,
                                          "delta": 0.001, "max": 0.05}},
        })
        assert t.scorer.fused is fused
        m = t.train_step()
        out[fused] = (m, {n: p.detach().clone() for n, p in t.policy.named_parameters()})
        t.pool.close()
    (m1, w1), (m0, w0) = out[True], out[False]
    keys = {k for k, v in m1.items() if isinstance(v, float) and not k.startswith(_SKIP)}
    assert keys == {k for k, v in m0.items() if isinstance(v, float) and not k.startswith(_SKIP)}
    for k in ("loss/entropy_bonus", "kl/ref_mean", "loss/cov_selected_frac", "entropy/mean",
              "rollout_corr/weight_mean", "control/entropy_coef"):
        assert k in keys, k
    assert m1["loss/entropy_bonus"] > 0 and m1["kl/ref_mean"] != 0
    for k in sorted(keys):
        assert m1[k] == pytest.approx(m0[k], rel=1e-5, abs=1e-6), k
    for n in w1:
        torch.testing.assert_close(w1[n], w0[n], **TOL, msg=n)
