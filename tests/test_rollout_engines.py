"""Choosing a rollout engine from the config, and the parts of the vLLM engine that need no vLLM.

The vLLM engine itself is tested in tests/test_rollout_vllm.py (``make test-vllm``).
"""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from explorl import config as C
from explorl import validation
from explorl.rollout import vllm as V
from explorl.rollout.base import build_engine, pop_metrics, sync_weights
from explorl.rollout.hf import HFEngine

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def tiny_llama(tie: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=24, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                      tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg)


def test_the_vllm_section_parses_and_rejects_impossible_settings():
    cfg = validation.load(None, ["rollout.engine=vllm", "rollout.vllm.kv_cache_gib=0.5",
                        "rollout.vllm.llm_kwargs={enforce_eager: false, max_num_seqs: 64}"])
    assert cfg.rollout.engine == "vllm" and cfg.rollout.vllm.kv_cache_gib == 0.5
    assert cfg.rollout.vllm.llm_kwargs == {"enforce_eager": False, "max_num_seqs": 64}
    assert validation.load(None).rollout.engine == "hf"  # the default stays the HF engine
    with pytest.raises(C.ConfigError, match="rollout.vllm.llm_kwargs: expected a mapping"):
        validation.load(None, ["rollout.vllm.llm_kwargs=3"])
    with pytest.raises(C.ConfigError, match="rollout.engine"):
        validation.load(None, ["rollout.engine=sglang"])
    # Without the engine's recompute nothing gives entropy unless the trainer recomputes.
    off = ["rollout.engine=vllm", "rollout.vllm.recompute=false"]
    assert not validation.load(None, off).rollout.vllm.recompute  # old_logp: auto recomputes
    with pytest.raises(C.ConfigError, match="rollout.vllm.recompute"):
        validation.load(None, off + ["algorithm.old_logp=sampler"])
    with pytest.raises(C.ConfigError, match="rollout.vllm.recompute"):
        validation.load(None, off + ["control.eepo.enabled=true"])
    # hf: irrelevant
    validation.load(None, ["rollout.vllm.recompute=false", "algorithm.old_logp=sampler"])


def test_build_engine_picks_the_configured_engine(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    cfg = validation.load(None, ["rollout.batch_size=7"])
    eng = build_engine(cfg, tok, tiny_model, torch.float32)
    assert isinstance(eng, HFEngine) and eng.batch_size == 7
    if not HAS_VLLM:
        with pytest.raises(ImportError, match="make setup-vllm"):
            cfg = validation.load(None, ["rollout.engine=vllm"])
            build_engine(cfg, tok, tiny_model, torch.float32)


def test_optional_engine_methods_are_called_where_they_exist():
    class Plain:
        pass

    class Synced:
        def __init__(self):
            self.calls = []

        def sync_weights(self, model, version):
            self.calls.append(version)
            return 0.25

        def pop_metrics(self):
            return {"rollout/weight_pushes": 1.0}

    assert sync_weights(Plain(), None, 3) == 0.0 and pop_metrics(Plain()) == {}
    s = Synced()
    assert sync_weights(s, None, 3) == 0.25 and s.calls == [3]
    assert pop_metrics(s) == {"rollout/weight_pushes": 1.0}


def test_pushed_weights_include_the_tied_output_head():
    model = tiny_llama(tie=True)
    names = dict(V.weights_of(model))
    assert "lm_head.weight" not in dict(model.named_parameters())  # listed once, as the embedding
    assert names["lm_head.weight"] is not None
    assert torch.equal(names["lm_head.weight"], names["model.embed_tokens.weight"])
    untied = dict(V.weights_of(tiny_llama(tie=False)))
    assert len(untied) == len(list(tiny_llama(tie=False).parameters()))


def test_the_weights_checksum_sees_any_change():
    model = tiny_llama()
    base = V.weights_checksum(model)
    assert torch.equal(V.weights_checksum(model), base)
    p = model.model.layers[0].mlp.down_proj.weight
    with torch.no_grad():
        p[3, 5] += 1e-6  # one weight, by a tiny step
    assert not torch.equal(V.weights_checksum(model), base)
    with torch.no_grad():
        p[3, 5] -= 1e-6
    assert torch.allclose(
        V.weights_checksum(model), base, rtol=0, atol=1e-12
    )  # back (up to rounding)
    model.lm_head.weight.data.mul_(-1)  # a sign flip keeps the sum of squares, not the sum
    assert not torch.equal(V.weights_checksum(model), base)


def test_process_state_is_restored_after_an_engine_start():
    random.seed(1)
    torch.manual_seed(1)
    expect = (random.random(), float(torch.rand(1)))
    random.seed(1)
    torch.manual_seed(1)
    threads, real = torch.get_num_threads(), torch.set_num_threads
    with V.preserved_process_state():  # what vLLM's in-process start does to the process
        random.seed(0)
        torch.manual_seed(0)
        torch.set_num_threads(max(1, threads + 1))
        torch.set_num_threads = lambda n: None
    assert torch.set_num_threads is real and torch.get_num_threads() == threads
    assert (random.random(), float(torch.rand(1))) == expect
