"""The ``hf`` engine's static decode path (``rollout.hf.static``) against its eager loop.

The static path runs the same step on fixed-shape buffers (CUDA graphs on CUDA; here on CPU the
same code without graphs). Under the same seeds it must draw the same tokens as the eager loop,
through chunking, several batch sizes and compaction into smaller buckets as rows end at EOS.
Log-probs and entropy agree to 1e-5: the static step attends over the whole preallocated width
with the unwritten columns masked, so float32 sums run over more (zero) terms and can round
differently in the last bits (a few 1e-6 seen); greedy and seeded tokens are equal.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from explorl.rollout import static as static_mod
from explorl.rollout.hf import HFEngine
from explorl.rollout.static import StaticDecoder, bucket, static_supported

TOL = {"atol": 1e-5, "rtol": 1e-5}


class _Tok:
    """Ids ↔ letters, pad 0, eos 2."""

    pad_token_id, eos_token_id = 0, 2

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(ord("a") + t % 26) for t in row
                        if not (skip_special_tokens and t in (0, 1, 2))) for row in rows]


def small_model(arch: str, vocab: int, seed: int = 0):
    """An untrained model whose EOS is likely enough that rows end at different lengths."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cls, cfg = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen2": (Qwen2ForCausalLM, Qwen2Config),
                "qwen3": (Qwen3ForCausalLM, Qwen3Config)}[arch]
    model = cls(cfg(**kw)).eval()
    with torch.no_grad():
        model.lm_head.weight[2] += 0.3 if vocab < 100 else 0.8
    return model


PROMPTS = [[1, 5, 9], [1, 7], [1, 3, 3, 8], [1, 4, 4, 4, 4, 6], [1, 9]]  # padding exercised
BUDGETS, SEEDS = [3, 5, 4, 2, 1], [21, 22, 23, 24, 25]


def assert_same(ro, ref):
    assert torch.equal(ro.response_ids, ref.response_ids)
    assert torch.equal(ro.response_mask, ref.response_mask)
    assert torch.equal(ro.truncated, ref.truncated) and ro.texts == ref.texts
    assert torch.equal(ro.prompt_ids, ref.prompt_ids) and torch.equal(ro.prompt_index,
                                                                      ref.prompt_index)
    torch.testing.assert_close(ro.old_logp, ref.old_logp, **TOL)
    torch.testing.assert_close(ro.entropy, ref.entropy, **TOL)


@pytest.fixture
def compactions(monkeypatch):
    """Counts the static decoder's moves to a smaller bucket."""
    seen = []
    compact = StaticDecoder._compact

    def spy(self, b, n_alive, noise):
        nb = compact(self, b, n_alive, noise)
        seen.append((b, nb))
        return nb

    monkeypatch.setattr(StaticDecoder, "_compact", spy)
    return seen


@pytest.mark.parametrize("arch,vocab", [("llama", 24), ("llama", 400), ("qwen2", 400),
                                        ("qwen3", 400)])
@pytest.mark.parametrize("T", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("min_rows,batch_size", [(1, 256), (2, 4), (8, 256)])
def test_static_path_draws_the_eager_tokens(arch, vocab, T, min_rows, batch_size, compactions):
    # vocab 24: the CPU's Mersenne-Twister Gumbel draws; 400: inverse CDF (the CUDA draw).
    model = small_model(arch, vocab)
    ref = HFEngine(_Tok(), static=False).generate(model, PROMPTS, BUDGETS, T, 20, seeds=SEEDS)
    engine = HFEngine(_Tok(), static=True, batch_size=batch_size)
    engine.static_min_rows = min_rows
    ro = engine.generate(model, PROMPTS, BUDGETS, T, 20, seeds=SEEDS)
    assert engine._decoders, "the static path ran"
    assert_same(ro, ref)
    lengths = ref.response_mask.sum(-1)
    if T > 0:
        assert lengths.min() < lengths.max()  # rows end at different lengths
    if min_rows == 1 and T > 0:
        assert compactions and all(nb < b for b, nb in compactions)


def test_lab_model_static_equals_eager(tiny_model, compactions):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    ids = [tok(p)["input_ids"] for p in ["3+4=", "12+7=", "5+5=", "9+0="]]
    for T in (1.0, 0.0):
        ref = HFEngine(tok, static=False).generate(model, ids, [4, 3, 2, 5], T, 8,
                                                   seeds=[1, 2, 3, 4])
        engine = HFEngine(tok, static=True)
        engine.static_min_rows = 1
        assert_same(engine.generate(model, ids, [4, 3, 2, 5], T, 8, seeds=[1, 2, 3, 4]), ref)


def test_buffers_are_kept_between_calls_and_grow_when_needed():
    model = small_model("llama", 400)
    engine = HFEngine(_Tok(), static=True)
    engine.generate(model, PROMPTS, BUDGETS, 1.0, 6, seeds=SEEDS)
    dec = engine._decoders[id(model)]
    assert (dec.rows, dec.R) == (bucket(sum(BUDGETS), 8), 6) and dec.cols % 128 == 0
    again = engine.generate(model, PROMPTS[:2], [1, 1], 1.0, 5, seeds=[3, 4])  # fits: same buffers
    assert engine._decoders[id(model)] is dec
    ref = HFEngine(_Tok(), static=False).generate(model, PROMPTS[:2], [1, 1], 1.0, 5, seeds=[3, 4])
    assert_same(again, ref)
    engine.generate(model, PROMPTS, [9] * 5, 1.0, 9, seeds=SEEDS)  # more rows, longer: rebuilt
    grown = engine._decoders[id(model)]
    assert grown is not dec and grown.rows == 64 and grown.R == 9
    with torch.no_grad():  # weights replaced, not updated in place: new buffers (and graphs)
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.clone())
    engine.generate(model, PROMPTS, BUDGETS, 1.0, 6, seeds=SEEDS)
    assert engine._decoders[id(model)] is not grown


def test_setting_auto_leaves_cpu_on_the_eager_loop():
    model = small_model("llama", 400)
    for static in ("auto", False, "off"):
        engine = HFEngine(_Tok(), static=static)
        engine.generate(model, PROMPTS, BUDGETS, 1.0, 4, seeds=SEEDS)
        assert not engine._decoders
    with pytest.raises(ValueError, match="static"):
        HFEngine(_Tok(), static="sometimes")


def test_setting_flows_from_the_recipe():
    from explorl import validation

    assert validation.load(None, []).rollout.hf.static == "auto"
    for text, value in (("on", True), ("off", False), ("auto", "auto")):
        cfg = validation.load(None, [f"rollout.hf.static={text}"])
        assert HFEngine.from_config(cfg, _Tok(), "unused", torch.float32).static == value


def test_the_setting_is_refused_where_no_hf_engine_reads_it():
    from explorl import validation
    from explorl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"rollout\.hf\.static.*rollout\.engine is 'vllm'"):
        validation.load(None, ["rollout.engine=vllm", "rollout.hf.static=on"])
    assert validation.load(None, ["rollout.engine=vllm"]).rollout.hf.static == "auto"


def test_unsupported_models_and_unseeded_draws_take_the_eager_loop():
    model = small_model("llama", 400)
    handle = model.lm_head.register_forward_hook(lambda m, i, o: o)  # fires at every step
    assert not static_supported(model)
    engine = HFEngine(_Tok(), static=True)
    engine.generate(model, PROMPTS, BUDGETS, 1.0, 4, seeds=SEEDS)
    assert not engine._decoders
    handle.remove()
    assert static_supported(model)
    engine.generate(model, PROMPTS, BUDGETS, 1.0, 4, generator=torch.Generator().manual_seed(0))
    assert not engine._decoders  # torch.multinomial with a generator: no counter-based draw


def test_cpu_autocast_takes_the_eager_loop_with_a_warning():
    """Under CPU autocast the static step (weights cast once) would run attention in bfloat16
    where autocast keeps it in float32: rows parted from the eager loop's in ~1 of 8. It warns
    once and the eager loop samples: the same tokens and log-probs as without the setting."""
    model = small_model("qwen2", 400)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = HFEngine(_Tok(), static=False).generate(model, PROMPTS, BUDGETS, 1.0, 30,
                                                      seeds=SEEDS)
        engine = HFEngine(_Tok(), static=True)
        with pytest.warns(RuntimeWarning, match="CPU under autocast"):
            ro = engine.generate(model, PROMPTS, BUDGETS, 1.0, 30, seeds=SEEDS)
        assert not engine._decoders
        again = engine.generate(model, PROMPTS, BUDGETS, 1.0, 30, seeds=SEEDS)  # warned once
    assert torch.equal(ro.response_ids, ref.response_ids)
    assert torch.equal(ro.old_logp, ref.old_logp) and torch.equal(again.old_logp, ref.old_logp)


def test_failed_capture_warns_and_decodes_without_graphs():
    # On a CPU build every capture fails (no CUDA): the fallback a CUDA run takes when one does.
    model = small_model("qwen2", 400)
    ref = HFEngine(_Tok(), static=False).generate(model, PROMPTS, BUDGETS, 0.7, 12, seeds=SEEDS)
    engine = HFEngine(_Tok(), static=True)
    engine.generate(model, PROMPTS, BUDGETS, 0.7, 12, seeds=SEEDS)
    dec = engine._decoders[id(model)]
    dec.use_graphs = True
    with pytest.warns(RuntimeWarning, match="graph capture failed"):
        ro = engine.generate(model, PROMPTS, BUDGETS, 0.7, 12, seeds=SEEDS)
    assert not dec.use_graphs and not dec.graphs
    assert_same(ro, ref)


def test_a_failing_static_path_falls_back_to_the_eager_loop(monkeypatch):
    model = small_model("llama", 400)
    ref = HFEngine(_Tok(), static=False).generate(model, PROMPTS, BUDGETS, 1.0, 8, seeds=SEEDS)

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(static_mod.StaticDecoder, "decode", broken)
    engine = HFEngine(_Tok(), static=True)
    with pytest.warns(RuntimeWarning, match="static decode path failed"):
        ro = engine.generate(model, PROMPTS, BUDGETS, 1.0, 8, seeds=SEEDS)
    assert engine.static is False and not engine._decoders
    assert_same(ro, ref)


def test_buckets_are_powers_of_two_above_the_smallest():
    assert [bucket(n, 8) for n in (1, 8, 9, 16, 17, 500)] == [8, 8, 16, 16, 32, 512]
    assert [bucket(n, 1) for n in (1, 2, 3, 5)] == [1, 2, 4, 8]


def test_decoder_bytes_by_hand_and_as_allocated():
    # small_model: hidden 32, MLP 64, 2 layers, 4 heads of 8, 2 key/value heads, vocab 400,
    # float32 weights, no biases, untied head. Computing in bfloat16 (b = 2):
    # copies    = 2 · (2 · (32·32 + 32·16 + 32·16 + 32·32 + 3 · 32·64) + 400·32)
    #           = 2 · (2 · 9,216 + 12,800) = 62,464
    # keys/vals = 2 · 2 layers · 16 rows · 2 heads · 128 cols · 8 · 2 = 262,144
    # per row   = 16 · (128·2 + 25) = 4,496;  outputs = 17 · 10 · 25 = 4,250
    # workspace = 16 · 400 · (2 + 8) = 64,000;  total = 397,354
    model = small_model("llama", 400)
    total = static_mod.decoder_bytes(model, 16, 128, 10, torch.bfloat16)
    assert total == 397_354
    assert static_mod.decoder_bytes(model, 16, 128, 10, torch.float32) == (
        0 + 2 * 2 * 16 * 2 * 128 * 8 * 4 + 16 * (128 * 4 + 25) + 4_250 + 16 * 400 * 12)
    # What a decoder of those sizes allocates (the captured step's workspace aside): the same.
    dec = StaticDecoder(model, torch.device("cpu"), torch.bfloat16, 16, 128, 10,
                        torch.tensor([2]), 0, 8, graphs=False)
    tensors = [*dec.k, *dec.v, dec.mask, dec.tok, dec.pos, dec.row, dec.alive, dec.u,
               dec.out_tok, dec.out_logp, dec.out_ent, dec.out_mask,
               *(d for s, d in zip(dec.weights.src, dec.weights.dst)
                 if d is not None and d is not s)]
    assert sum(t.numel() * t.element_size() for t in tensors) == total - 64_000


def test_resident_bytes_is_what_the_static_path_will_keep():
    model = small_model("llama", 400)
    cpu = torch.device("cpu")
    per = static_mod.decoder_bytes(model, 128, 128, 10, torch.bfloat16)  # 100 rows -> bucket 128
    on = HFEngine(_Tok(), static=True, batch_size=100)
    assert on.resident_bytes(model, cpu, torch.bfloat16, 6, 10) == per
    assert on.resident_bytes(model, cpu, torch.bfloat16, 6, 10, models=2) == 2 * per
    assert on.resident_bytes(model, cpu, torch.bfloat16, 6, 0) == 0
    # auto: the static path runs on CUDA only; off: never
    assert HFEngine(_Tok(), static="auto").resident_bytes(model, cpu, torch.bfloat16, 6, 10) == 0
    assert HFEngine(_Tok(), static=False).resident_bytes(model, cpu, torch.bfloat16, 6, 10) == 0
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    try:  # a model the static path does not take samples on the eager loop: nothing kept
        assert on.resident_bytes(model, cpu, torch.bfloat16, 6, 10) == 0
    finally:
        handle.remove()
