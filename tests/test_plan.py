"""The device plan (training/plan.py): the CUDA micro-batch token budget worked out by hand for
Qwen2.5-0.5B's shape, the old-log-prob source, and what a run prints and records."""

from __future__ import annotations

import pytest
import torch

from explorl import config as C
from explorl import validation
from explorl.training import plan as P
from explorl.training.loop import Trainer

GIB = 2**30
# Qwen2.5-0.5B: hidden 896, 24 layers, 14 heads of 64 (2 key/value heads: kv width 128),
# MLP 4864, vocabulary 151,936; a round 494M parameters; packed rows of 1024 tokens.
QWEN05 = P.ModelShape(hidden=896, layers=24, vocab=151936, intermediate=4864, kv_dim=128,
                      params=494_000_000, trainable=494_000_000, pack_len=1024)
BF16 = dict(compute_bytes=2, master_bytes=4, logprob_chunk=512)
CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU


def test_budget_for_the_half_billion_shape_by_hand():
    # layer  = 2·(5·896 + 3·128 + 4·4864) + 4·896·4 = 2·24320 + 14336 = 62,976 B per token
    # outside = 4·896·4 + 1024·(4 + 1) = 19,456;  per token = 25·62,976 + 19,456 = 1,593,856 B
    # fixed  = 3·4·P (grads + AdamW) + 2·P (bf16 casts) + 512·151,936·(8 + 2) (log-prob chunk)
    #        = 5,928,000,000 + 988,000,000 + 777,912,320 = 7,693,912,320 B
    # 75 GiB free: reserve 10% = 8,053,063,680; usable = 64,783,660,800 B
    # 64,783,660,800 // 1,593,856 = 40,645 tokens -> 40,448 (158 × 256)
    b = P.token_budget(75 * GIB, QWEN05, checkpointing=False, **BF16)
    assert (b.per_token, b.fixed, b.usable, b.tokens) == (
        1_593_856, 7_693_912_320, 64_783_660_800, 40_448)
    assert b.note == ""


def test_checkpointing_keeps_one_layer_of_activations():
    # per token = 24·896·4 (layer inputs) + 2·62,976 + 19,456 = 231,424 B
    # 64,783,660,800 // 231,424 = 279,935 -> 279,808 (1093 × 256): ~6.9× the tokens
    b = P.token_budget(75 * GIB, QWEN05, checkpointing=True, **BF16)
    assert (b.per_token, b.tokens) == (231_424, 279_808)


def test_vocabulary_costs_a_fixed_workspace_not_per_token_bytes():
    big = P.token_budget(75 * GIB, QWEN05, checkpointing=False, **BF16)
    small = P.token_budget(75 * GIB, P.ModelShape(**{**QWEN05.__dict__, "vocab": 1000}),
                           checkpointing=False, **BF16)
    assert big.per_token == small.per_token
    assert big.fixed - small.fixed == 512 * (151936 - 1000) * 10


def test_without_the_fused_path_the_logits_count_per_token():
    # The full logits (bf16), their gradient at the response positions and at every position:
    # 3·2·151,936 = 911,616 B more per token: 1,593,856 + 911,616 = 2,505,472 B;
    # 64,783,660,800 // 2,505,472 = 25,856 tokens (101 × 256), against 40,448 fused.
    b = P.token_budget(75 * GIB, P.ModelShape(**{**QWEN05.__dict__, "fused": False}),
                       checkpointing=False, **BF16)
    assert (b.per_token, b.tokens) == (2_505_472, 25_856)


def test_logprob_path_says_which_path_and_why():
    from transformers import LlamaConfig, LlamaForCausalLM

    m = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, vocab_size=50))
    fused, why = P.logprob_path(_cfg(), m)
    assert fused and "llama head" in why and "never exist" in why
    off = validation.from_dict({"algorithm": {"fused_logprobs": False}}, env=False)
    assert P.logprob_path(off, m) == (
        False, "from the full logits, 512 tokens at a time (algorithm.fused_logprobs: false)")
    fused, why = P.logprob_path(_cfg(), torch.nn.Linear(1, 1))
    assert not fused and "not a transformers class" in why
    plan = P.make_plan(_cfg(), CUDA, shape=QWEN05, free=75 * GIB, engine_exact=False,
                       logprobs_why=why)
    assert plan.lines()[-1] == f"  log-probs {why}"


def test_a_model_that_barely_fits_gets_one_quantum_and_a_note():
    # 8 GiB free: reserve 1 GiB (10% is less), fixed 7.69e9 B: nothing left for activations
    b = P.token_budget(8 * GIB, QWEN05, checkpointing=False, **BF16)
    assert b.usable == 8 * GIB - GIB - 7_693_912_320 < 0
    assert b.tokens == P.TOKEN_QUANTUM and "gradient_checkpointing" in b.note


def test_fsdp_shards_divide_the_optimizer_state():
    one = P.token_budget(75 * GIB, QWEN05, checkpointing=False, **BF16)
    four = P.token_budget(75 * GIB, QWEN05, checkpointing=False, shards=4, **BF16)
    assert one.fixed - four.fixed == 3 * 4 * 494_000_000 - 3 * 4 * 494_000_000 // 4


def test_pure_bf16_weights_have_no_casts_and_half_the_state():
    b = P.token_budget(75 * GIB, QWEN05, checkpointing=False, compute_bytes=2, master_bytes=2,
                       logprob_chunk=512)
    assert b.fixed == 3 * 2 * 494_000_000 + 512 * 151936 * 10


def _cfg(**optim) -> C.RunConfig:
    return validation.from_dict({"model": {"dtype": "bfloat16"}, "optim": optim}, env=False)


def _cpu_cfg(max_response_len: int, **optim) -> C.RunConfig:
    return validation.from_dict({"model": {"dtype": "float32"}, "optim": optim,
                                 "rollout": {"max_response_len": max_response_len}}, env=False)


def test_plan_on_cuda_sizes_by_tokens_with_no_separate_row_limit():
    plan = P.make_plan(_cfg(), CUDA, shape=QWEN05, free=75 * GIB, engine_exact=False)
    assert (plan.micro_batch_tokens, plan.micro_batch_size) == (40_448, 40_448)
    assert plan.old_logp == "update" and plan.passes == 1
    cfg = P.apply(_cfg(), plan)
    assert (cfg.optim.micro_batch_size, cfg.optim.micro_batch_tokens) == (40_448, 40_448)
    text = "\n".join(plan.lines())
    assert "≤ 40,448 tokens" in text and "75.0 GiB free" in text and "1 pass " in text


def test_the_static_decode_buffers_come_out_of_the_budget():
    # 2 GiB kept for the sampler: the budget of 73 GiB free (reserve 10% of that), by hand:
    # 73 GiB = 78,383,153,152; reserve 7,838,315,315; fixed 7,693,912,320 (as above)
    # usable = 62,850,925,517; // 1,593,856 = 39,433 tokens -> 39,424 (154 × 256)
    plan = P.make_plan(_cfg(), CUDA, shape=QWEN05, free=75 * GIB, engine_exact=False,
                       resident=2 * GIB)
    assert plan.micro_batch_tokens == 39_424
    assert plan.micro_batch_tokens == P.token_budget(73 * GIB, QWEN05, checkpointing=False,
                                                     **BF16).tokens
    assert "75.0 GiB free (2.0 GiB of it kept for the sampler's static decode buffers)" in (
        "\n".join(plan.lines()))
    assert "kept for" not in "\n".join(
        P.make_plan(_cfg(), CUDA, shape=QWEN05, free=75 * GIB, engine_exact=False).lines())


@pytest.mark.parametrize("sets,models", [
    ({}, 1), ({"control": {"eepo": {"enabled": True}}}, 2),
    ({"rollout": {"async": {"enabled": True, "max_staleness": 1}}}, 2),
    ({"rollout": {"async": {"enabled": True, "max_staleness": 0}}}, 1)])
def test_sampling_models_counts_the_copies_that_sample(sets, models):
    assert P.sampling_models(validation.from_dict(sets, env=False)) == models


def test_plan_for_asks_the_engine_what_it_keeps(monkeypatch):
    """plan_for passes the compute dtype, the longest prompt, the response length and the
    sampling models to the engine, and its answer to make_plan."""
    seen = {}

    class Engine:
        def resident_bytes(self, model, device, dtype, prompt_len, out_len, models):
            seen.update(dtype=dtype, prompt_len=prompt_len, out_len=out_len, models=models)
            return 3 * GIB

    class Dist:
        strategy, world_size = "none", 1

        def gather(self, x):
            return [x]

    monkeypatch.setattr(P, "free_bytes", lambda device: 75 * GIB)
    monkeypatch.setattr(P.ModelShape, "of", classmethod(lambda cls, m, pack=0, fused=True: QWEN05))
    monkeypatch.setattr(P, "takes_custom_mask", lambda m: False)
    cfg = validation.from_dict({"model": {"dtype": "bfloat16"}, "rollout": {
        "max_response_len": 256}, "control": {"eepo": {"enabled": True}}}, env=False)
    plan = P.plan_for(cfg, CUDA, torch.nn.Linear(1, 1), Dist(), Engine(), prompt_len=40)
    assert seen == {"dtype": torch.bfloat16, "prompt_len": 40, "out_len": 256, "models": 2}
    assert plan.micro_batch_tokens == P.token_budget(
        72 * GIB, QWEN05, checkpointing=False, **BF16).tokens


def test_sizes_set_in_the_config_are_kept():
    plan = P.make_plan(_cfg(micro_batch_tokens=4096), CUDA, shape=QWEN05, free=75 * GIB,
                       engine_exact=False)
    assert (plan.micro_batch_size, plan.micro_batch_tokens) == (4096, 4096)
    plan = P.make_plan(_cfg(micro_batch_size=32), CUDA, shape=QWEN05, free=75 * GIB,
                       engine_exact=False)
    assert (plan.micro_batch_size, plan.micro_batch_tokens) == (32, 40_448)


# SmolLM2-135M: hidden 576, 30 layers, 9 heads of 64 (3 key/value heads: kv width 192), MLP
# 1536, vocabulary 49,152, 134,515,008 parameters (tied embeddings); padded rows.
SMOLLM2 = P.ModelShape(hidden=576, layers=30, vocab=49152, intermediate=1536, kv_dim=192,
                       params=134_515_008, trainable=134_515_008)
CPU = torch.device("cpu")


def test_off_cuda_the_lab_keeps_64_rows_and_no_token_limit():
    # A lab-sized model: 64 rows of 40 + 64 tokens fit many times over in a quarter of 16 GiB.
    lab = P.ModelShape(hidden=128, layers=4, vocab=40, intermediate=512, kv_dim=128,
                       params=900_000, trainable=900_000)
    cfg = _cpu_cfg(64)
    plan = P.make_plan(cfg, CPU, shape=lab, free=16 * GIB, engine_exact=True, prompt_len=40)
    assert (plan.micro_batch_size, plan.micro_batch_tokens) == (64, None)
    assert plan.old_logp == "sampler" and plan.budget is None
    assert plan.lines()[0] == ("device plan (cpu): micro-batches of ≤ 64 responses: "
                               "the default off CUDA")
    plan = P.make_plan(_cfg(micro_batch_tokens=24), CPU, shape=None, free=None,
                       engine_exact=True)
    assert (plan.micro_batch_size, plan.micro_batch_tokens) == (64, 24)
    unknown = P.make_plan(_cfg(), CPU, shape=None, free=None, engine_exact=True)
    assert (unknown.micro_batch_size, unknown.micro_batch_tokens) == (64, None)


def test_off_cuda_a_real_model_gets_a_token_budget_from_a_quarter_of_the_memory():
    # SmolLM2-135M in float32 (b = m = 4): layer = 4·(5·576 + 3·192 + 4·1536) + 4·576·4
    #   = 38,400 + 9,216 = 47,616 B; per token = 31·47,616 + 4·576·4 = 1,485,312 B
    # fixed = 3·4·134,515,008 (grads + AdamW) + 0 (no casts in float32) + 512·49,152·12
    #   = 1,614,180,096 + 301,989,888 = 1,916,169,984 B
    # 20 GiB available: a quarter is 5,368,709,120 B; reserve 1 GiB; usable 2,378,797,312 B
    # 2,378,797,312 // 1,485,312 = 1,601 tokens -> 1,536 (6 × 256), while 64 rows of
    # 52 + 48 tokens would take 6,400.
    cfg = _cpu_cfg(48)
    plan = P.make_plan(cfg, CPU, shape=SMOLLM2, free=20 * GIB, engine_exact=True, prompt_len=52)
    b = plan.budget
    assert (b.per_token, b.fixed, b.usable) == (1_485_312, 1_916_169_984, 2_378_797_312)
    assert (plan.micro_batch_size, plan.micro_batch_tokens) == (64, 1536)
    assert plan.lines()[0] == (
        "device plan (cpu): micro-batches of ≤ 64 responses and ≤ 1,536 tokens: 25% of 20.0 GiB "
        "available, 1.8 GiB fixed, 1.42 MiB of activations per token (30 layers × hidden 576); "
        "64 rows of up to 100 tokens would not fit")
    # With 160 GiB the 6,400 tokens fit: no limit, as on the lab.
    roomy = P.make_plan(cfg, CPU, shape=SMOLLM2, free=160 * GIB, engine_exact=True,
                        prompt_len=52)
    assert roomy.micro_batch_tokens is None
    # A size written in the config is kept, and nothing is planned.
    kept = P.make_plan(_cpu_cfg(48, micro_batch_size=16), CPU, shape=SMOLLM2,
                       free=20 * GIB, engine_exact=True, prompt_len=52)
    assert (kept.micro_batch_size, kept.micro_batch_tokens, kept.sizes_why) == (16, None, "as set")


def test_the_cpu_plan_reads_the_hosts_available_memory(monkeypatch):
    class Mem:
        available = 12 * GIB

    monkeypatch.setattr(P.psutil, "virtual_memory", lambda: Mem)
    assert P.free_bytes(CPU) == 12 * GIB
    assert P.free_bytes(torch.device("meta")) is None


@pytest.mark.parametrize(("sets", "source", "why"), [
    ({}, "update", "one update per rollout batch"),
    ({"optim": {"ppo_epochs": 2}}, "recompute", "optim.ppo_epochs=2"),
    ({"optim": {"mini_batches": 2}}, "recompute", "optim.mini_batches=2"),
    ({"control": {"eepo": {"enabled": True}}}, "recompute", "control.eepo"),
    ({"control": {"entropic": {"enabled": True}}}, "recompute", "control.entropic"),
    ({"algorithm": {"old_logp": "recompute"}}, "recompute", "algorithm.old_logp: recompute"),
    ({"algorithm": {"old_logp": "sampler"}}, "sampler", "algorithm.old_logp: sampler"),
    ({"algorithm": {"kl_in_reward": True, "kl_coef": 0.01}}, "recompute",
     "algorithm.kl_in_reward"),
    ({"rollout": {"engine": "vllm"}, "algorithm": {"rollout_correction": {"mode": "token-mask"}}},
     "recompute", "algorithm.rollout_correction"),
    ({"rollout": {"engine": "vllm"}}, "recompute", "algorithm.rollout_correction"),
])
def test_old_logp_source(sets, source, why):
    cfg = validation.from_dict(sets, env=False)
    got, reason = P.old_logp_source(cfg, engine_exact=False)
    assert got == source and why in reason
    if cfg.algorithm.old_logp == "auto":  # the fp32 HF engine's values are the trainer's own
        assert P.old_logp_source(cfg, engine_exact=True)[0] == "sampler"


def test_vllm_without_its_own_recompute_needs_the_trainers_pass():
    cfg = validation.from_dict({"rollout": {"engine": "vllm", "vllm": {"recompute": False}}},
                               env=False)
    assert P.old_logp_source(cfg, engine_exact=False)[0] == "recompute"


def test_model_shape_of_a_transformers_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    m = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=100))
    s = P.ModelShape.of(m, pack_len=128)
    assert (s.hidden, s.layers, s.vocab, s.intermediate, s.kv_dim, s.pack_len) == (
        32, 2, 100, 80, 2 * 8, 128)
    assert s.params == s.trainable == sum(p.numel() for p in m.parameters())


@pytest.mark.slow
def test_update_forward_as_old_logp_equals_the_recompute_under_bf16(make_config, tmp_path):
    """``auto`` in bf16 with one update per batch skips the old-log-prob pass; the update it
    makes is the one the recompute's values give (ratio exactly 1 on both)."""
    runs = {}
    for mode in ("auto", "recompute"):
        cfg = make_config({"max_steps": 1, "eval": {"every": 0}, "model": {"dtype": "bfloat16"},
                           "algorithm": {"old_logp": mode}, "optim": {"lr": 1e-3}})
        t = Trainer(cfg, tmp_path / mode)
        m = t.train_step()
        runs[mode] = (t, m, [p.detach().clone() for p in t.policy.parameters()])
        t.pool.close()
    (auto, m_auto, w_auto), (rec, m_rec, w_rec) = runs["auto"], runs["recompute"]
    assert auto.plan.old_logp == "update" and not auto.recompute
    assert rec.plan.old_logp == "recompute" and rec.recompute
    assert "time/old_logp_s" not in m_auto and "time/old_logp_s" in m_rec
    assert m_auto["loss/clip_frac"] == m_rec["loss/clip_frac"] == 0.0
    assert m_auto["loss/ratio_mean"] == 1.0
    for a, b in zip(w_auto, w_rec):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    text = (tmp_path / "auto" / "config.yaml").read_text()
    assert text.startswith("# device plan (cpu)") and "the update's own forward" in text
    again = validation.load(tmp_path / "auto" / "config.yaml", env=False)  # the comments load back
    assert again.optim.micro_batch_size == 64 and again.algorithm.old_logp == "auto"
