"""The HF sampling engine and the loss's log-prob pass against plain references.

The engine's speed-ups (prompts encoded once per group, finished rows dropped from the batch,
several chunks per call) and the packed log-prob layout must not change what is sampled or
scored: every test here compares with a straightforward computation (``model.generate``, a
full forward per sequence, the padded layout).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
)

from explorl.algorithms import naive_logprobs
from explorl.policy.forward import (
    _pack_plan,
    _prompt_groups,
    response_logprobs,
    takes_custom_mask,
)
from explorl.rollout.hf import HFEngine, decode_cache, left_pad
from explorl.rollout.seeding import (
    MT_VOCAB_MAX,
    NoiseStream,
    _generator_uniform,
    gumbel_sample,
    inverse_cdf_sample,
    mix_seed,
    mix_seed_grid,
    mt_uniform,
    row_keys,
    row_uniform,
    row_uniforms,
)

PROMPTS = [
    "3+4=",
    "12+7=",
    "5+5=",
    "9+0=",
    "1+2=",
]  # tokenised lengths differ: left padding is exercised


@pytest.fixture(scope="module")
def lab(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    assert len({len(i) for i in ids}) > 1
    return tok, model, ids


def random_llama(attn: str = "sdpa", seed: int = 0) -> LlamaForCausalLM:
    """An untrained model: it rarely says EOS, so rows run to the length limit (truncation)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=24, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation=attn)
    return LlamaForCausalLM(cfg).eval()


def reference_sample(model, prompt: list[int], key: torch.Tensor, T: float, max_new: int, eos: int):
    """One response the slow way: a full forward over the whole sequence for every token."""
    seq, toks, logps, ents = list(prompt), [], [], []
    with torch.no_grad():
        for t in range(max_new):
            z = model(input_ids=torch.tensor([seq])).logits[0, -1].float() / T
            logp = torch.log_softmax(z, -1)
            tok = int(gumbel_sample(logp[None], key[None], t)[0])
            toks.append(tok)
            logps.append(float(logp[tok]))
            ents.append(float(-(logp.exp() * logp).sum()))
            seq.append(tok)
            if tok == eos:
                break
    return toks, logps, ents


def rows_of(ro, i):
    n = int(ro.response_mask[i].sum())
    return ro.response_ids[i, :n].tolist(), ro.old_logp[i, :n], ro.entropy[i, :n]


# ---------------------------------------------------------------------------- sampling


def test_greedy_equals_model_generate(lab):
    tok, model, ids = lab
    ro = HFEngine(tok).generate(model, ids, [1] * len(ids), 0.0, 6)
    for i, p in enumerate(ids):
        ref = model.generate(
            input_ids=torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            do_sample=False,
            max_new_tokens=6,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )[0, len(p) :].tolist()
        if tok.eos_token_id in ref:
            ref = ref[: ref.index(tok.eos_token_id) + 1]
        assert rows_of(ro, i)[0] == ref
        assert ro.texts[i] == tok.decode(ref, skip_special_tokens=True)
        assert bool(ro.truncated[i]) == (tok.eos_token_id not in ref)


@pytest.mark.parametrize("T", [1.0, 0.7])
def test_seeded_samples_match_a_no_cache_reference(lab, T):
    # Counter-based noise makes each response a function of (prompt, key) alone, so the batched,
    # prefix-shared, compacting engine must reproduce a one-sequence-at-a-time loop exactly.
    tok, model, ids = lab
    budgets, seeds = [3, 0, 2, 4, 1], [11, 12, 13, 14, 15]
    ro = HFEngine(tok).generate(model, ids, budgets, T, 6, seeds=seeds)
    keys = row_keys(seeds, budgets)
    rows = [i for i, n in enumerate(budgets) for _ in range(n)]
    assert ro.prompt_index.tolist() == rows
    for r, i in enumerate(rows):
        toks, logps, ents = reference_sample(model, ids[i], keys[r], T, 6, tok.eos_token_id)
        got, got_logp, got_ent = rows_of(ro, r)
        assert got == toks
        torch.testing.assert_close(got_logp, torch.tensor(logps), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_ent, torch.tensor(ents), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "engine_kw",
    [
        {"compact_ratio": 0.0},
        {"compact_ratio": 1.0},
        {"batch_size": 3},
        {"batch_size": 1, "compact_ratio": 1.0},
    ],
)
def test_early_stopping_and_chunking_do_not_change_results(lab, engine_kw):
    tok, model, ids = lab
    budgets, seeds = [4, 2, 3, 1, 2], [5, 6, 7, 8, 9]
    ref = HFEngine(tok).generate(model, ids, budgets, 1.0, 8, seeds=seeds)
    ro = HFEngine(tok, **engine_kw).generate(model, ids, budgets, 1.0, 8, seeds=seeds)
    R = ref.response_ids.shape[1]
    assert ro.response_ids.shape[1] <= R  # a chunk stops at its own longest row
    pad = R - ro.response_ids.shape[1]
    torch.testing.assert_close(
        torch.nn.functional.pad(ro.response_ids, (0, pad), value=tok.pad_token_id), ref.response_ids
    )
    torch.testing.assert_close(
        torch.nn.functional.pad(ro.old_logp, (0, pad)), ref.old_logp, atol=1e-6, rtol=1e-5
    )
    assert ro.texts == ref.texts and torch.equal(ro.truncated, ref.truncated)
    assert torch.equal(ro.prompt_index, ref.prompt_index)


def test_large_vocabulary_draws_ignore_batching_and_follow_a_one_row_reference():
    # Beyond MT_VOCAB_MAX the engine draws by inverse CDF; a response must still depend only on
    # its prompt and key: the same through chunking and compaction, and equal to a one-row loop.
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight[2] += 0.4  # EOS likely enough that rows finish at different lengths
    tok = _FakeTokenizer()
    prompts = [[1, 5, 9], [1, 7], [1, 3, 3, 8]]
    budgets, seeds = [3, 2, 4], [21, 22, 23]
    ref = HFEngine(tok).generate(model, prompts, budgets, 0.8, 7, seeds=seeds)
    lengths = ref.response_mask.sum(-1)
    assert lengths.min() < lengths.max()
    for kw in ({"batch_size": 2, "compact_ratio": 1.0}, {"compact_ratio": 0.0}):
        ro = HFEngine(tok, **kw).generate(model, prompts, budgets, 0.8, 7, seeds=seeds)
        for r in range(len(ref)):
            assert rows_of(ro, r)[0] == rows_of(ref, r)[0]
    keys = row_keys(seeds, budgets)
    rows = [i for i, n in enumerate(budgets) for _ in range(n)]
    for r, i in enumerate(rows):
        seq, toks = list(prompts[i]), []
        with torch.no_grad():
            for t in range(7):
                z = model(input_ids=torch.tensor([seq])).logits[0, -1] / 0.8
                logp = torch.log_softmax(z, -1)
                u = torch.tensor([row_uniform(int(keys[r]), t)], dtype=torch.float64)
                toks.append(int(inverse_cdf_sample(logp.exp()[None], u)[0]))
                seq.append(toks[-1])
                if toks[-1] == 2:
                    break
        assert rows_of(ref, r)[0] == toks


def test_rows_grouped_by_prompt_with_their_prompt_and_masks(lab):
    tok, model, ids = lab
    budgets = [2, 0, 3, 1, 0]
    ro = HFEngine(tok).generate(
        model, ids, budgets, 1.0, 5, generator=torch.Generator().manual_seed(0)
    )
    assert ro.prompt_index.tolist() == [0, 0, 2, 2, 2, 3]
    P = ro.prompt_ids.shape[1]
    for r, i in enumerate(ro.prompt_index.tolist()):
        n = len(ids[i])
        assert ro.prompt_ids[r, P - n:].tolist() == ids[i]  # left-padded
        assert ro.prompt_mask[r].tolist() == [False] * (P - n) + [True] * n
        assert (ro.prompt_ids[r, : P - n] == tok.pad_token_id).all()
    mask = ro.response_mask
    lengths = mask.sum(-1)
    assert torch.equal(
        mask, torch.arange(mask.shape[1])[None] < lengths[:, None]
    )  # a prefix of each row
    assert (ro.response_ids[~mask] == tok.pad_token_id).all()
    assert (ro.old_logp[~mask] == 0).all() and (ro.entropy[~mask] == 0).all()
    assert (ro.old_logp[mask] < 0).all() and (ro.entropy[mask] > 0).all()
    for r in range(len(ro)):
        toks = ro.response_ids[r, : lengths[r]].tolist()
        assert (tok.eos_token_id in toks) == (not ro.truncated[r])
        assert tok.eos_token_id not in toks[:-1]  # EOS can only be the last token
        assert ro.texts[r] == tok.decode(toks, skip_special_tokens=True)


def test_rollouts_leave_inference_mode_as_normal_tensors(lab):
    # The engine samples in torch.inference_mode; what it returns must be usable by the loss:
    # saved for backward (torch.where saves its mask) and changed in place.
    tok, model, ids = lab
    ro = HFEngine(tok).generate(model, ids, [2] * len(ids), 1.0, 4, seeds=list(range(len(ids))))
    tensors = [v for v in vars(ro).values() if isinstance(v, torch.Tensor)]
    assert len(tensors) >= 8 and not any(t.is_inference() for t in tensors)
    logp = torch.zeros_like(ro.old_logp, requires_grad=True)
    torch.where(ro.response_mask, logp - ro.old_logp, 0.0).exp().sum().backward()
    assert torch.equal(logp.grad != 0, ro.response_mask)
    ro.old_logp.zero_()


def test_left_pad_right_aligns_prompts_with_a_mask():
    ids, mask = left_pad([[5, 6, 7], [8], [], [9, 4]], 0, torch.device("cpu"))
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0], [0, 9, 4]]
    assert mask.dtype == torch.bool and mask.sum(-1).tolist() == [3, 1, 0, 2]
    assert (ids[~mask] == 0).all()
    ids, mask = left_pad([[]], 3, torch.device("cpu"))
    assert ids.shape == mask.shape == (1, 0) and mask.dtype == torch.bool


def test_truncation_and_custom_eos_ids():
    model = random_llama()
    tok = _FakeTokenizer()
    prompts = [[1, 5, 6], [1, 7]]
    ro = HFEngine(tok, eos_ids=[2, 3]).generate(model, prompts, [3, 3], 1.0, 7, seeds=[1, 2])
    for r in range(len(ro)):
        toks = rows_of(ro, r)[0]
        ends = [t in (2, 3) for t in toks]
        assert not any(ends[:-1])
        assert bool(ro.truncated[r]) == (not ends[-1])
        assert len(toks) == 7 or ends[-1]
    assert ro.truncated.any()  # the untrained model runs some rows to the limit


def test_sampled_logprobs_equal_recomputation(lab):
    tok, model, ids = lab
    ro = HFEngine(tok).generate(model, ids, [3, 2, 2, 1, 2], 1.3, 6, seeds=[1, 2, 3, 4, 5])
    for pack in (False, True):
        logp, ent = response_logprobs(
            model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask, 1.3, pack=pack
        )
        torch.testing.assert_close(logp, ro.old_logp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent, ro.entropy, atol=1e-5, rtol=1e-5)


def test_vectorised_mersenne_twister_draws_what_torch_draws():
    # mt_uniform must be bit for bit torch.rand from a generator seeded per (key, position): the
    # committed CPU runs were sampled that way. Seeds with the high bits set, vocabularies up to
    # the one-twist limit.
    keys = row_keys([0, 2**62 + 5, 123456789], [2, 1, 3])
    grid = mix_seed_grid(keys.numpy(), np.arange(3, 6))  # (6, 3)
    assert grid[4, 1] == mix_seed(int(keys[4]), 4)
    for V in (1, 24, MT_VOCAB_MAX):
        for t in (3, 4, 5):
            u = mt_uniform(grid[:, t - 3], V).clamp_(min=2.0**-60)
            assert torch.equal(u, _generator_uniform(keys, t, V))
    with pytest.raises(ValueError):
        mt_uniform(grid[:, 0], MT_VOCAB_MAX + 1)


@pytest.mark.parametrize("V", [24, MT_VOCAB_MAX + 1, 2000])  # blocked MT noise; inverse CDF
def test_noise_stream_draws_what_its_reference_draws_while_rows_leave(V):
    keys = row_keys([7, 8], [3, 2])
    stream = NoiseStream(keys, V, max_len=6)
    assert stream.blocked == (V <= MT_VOCAB_MAX)
    live = torch.arange(5)
    g = torch.Generator().manual_seed(0)
    for t in range(6):
        logp = torch.randn(len(live), V, generator=g).mul(3).log_softmax(-1)
        if stream.blocked:
            ref = gumbel_sample(logp, keys[live], t)
        else:  # the token whose cumulative-probability interval holds u(key, t)
            u = torch.tensor([row_uniform(int(k), t) for k in keys[live]], dtype=torch.float64)
            cum = logp.exp().double().cumsum(-1)
            ref = torch.searchsorted(cum, (u * cum[:, -1])[:, None], right=True).squeeze(-1)
        assert torch.equal(stream.sample(logp, t), ref)
        if t in (1, 3):  # rows finish: keep every other one
            keep = torch.arange(0, len(live), 2)
            stream.keep(keep)
            live = live[keep]


@pytest.mark.parametrize("V", [1, 7, 512, 513, 5000])
def test_inverse_cdf_sample_is_the_brute_force_inverse_cdf(V):
    # Two levels (block sums, then one block) must pick what one full cumulative sum picks, and
    # never a token without mass, including u at the ends of [0, 1) and at interval boundaries.
    g = torch.Generator().manual_seed(V)
    p = torch.rand(64, V, generator=g) ** 6
    if V > 2:
        p[:, ::3] = 0
    u = torch.rand(64, generator=g, dtype=torch.float64)
    u[:3] = torch.tensor([0.0, 1 - 2**-53, 0.5], dtype=torch.float64)
    cum = p.double().cumsum(-1)
    ref = torch.searchsorted(cum, (u * cum[:, -1])[:, None], right=True).squeeze(-1)
    got = inverse_cdf_sample(p, u)
    assert torch.equal(got, ref)
    assert bool((p.gather(1, got[:, None]) > 0).all())
    bad = torch.full((2, V), float("nan"))  # a row without finite mass still gets a token id
    tok = inverse_cdf_sample(bad, u[:2])
    assert bool(((tok >= 0) & (tok < V)).all())
    edge = torch.tensor([[0.25, 0.0, 0.75, 0.0]])
    for uu, tok in ((0.0, 0), (0.25, 2), (1 - 2**-53, 2)):
        assert inverse_cdf_sample(edge, torch.tensor([uu], dtype=torch.float64)).item() == tok


def test_row_uniforms_are_uniform_and_independent():
    keys = row_keys([5], [4000])
    u = row_uniforms(keys.numpy(), np.arange(3))  # (4000, 3)
    assert u.dtype == np.float64 and 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.05
    assert u[17, 2] == row_uniform(int(keys[17]), 2)
    # not the Mersenne-Twister seed's bits: the two draws of a row are unrelated
    mt = mt_uniform(mix_seed_grid(keys.numpy(), np.arange(1)).reshape(-1), 1)[:, 0].numpy()
    assert abs(np.corrcoef(u[:, 0], mt)[0, 1]) < 0.05


def test_buffered_cache_gives_the_dynamic_cache_numbers():
    # Views into buffers instead of one concatenation per token: bit for bit the same logits,
    # through growth of the buffers and the compaction / fan-out reorders the engine does.
    model = random_llama()
    ids = torch.randint(3, 24, (3, 4), generator=torch.Generator().manual_seed(0))
    outs = []
    for cache in (DynamicCache(config=model.config), decode_cache(model.config, 4 + 9)):
        with torch.no_grad():
            logits = [model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]]
            cache.reorder_cache(torch.tensor([0, 0, 1, 2, 2]))  # prompts fanned out to rows
            tok = logits[0].argmax(-1)[[0, 0, 1, 2, 2]]
            for t in range(8):
                if t == 5:
                    cache.reorder_cache(torch.tensor([1, 3, 4]))  # rows finished
                    tok = tok[[1, 3, 4]]
                logits.append(
                    model(input_ids=tok[:, None], past_key_values=cache, use_cache=True).logits[
                        :, -1
                    ]
                )
                tok = logits[-1].argmax(-1)
        outs.append(logits)
    assert cache.get_seq_length() == 4 + 8
    assert all(type(layer).__name__ == "_BufferedLayer" for layer in cache.layers)
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------- log-prob pass


def naive_response_logprobs(model, ro_like, T):
    """Full-vocabulary log-probs and entropy from one plain forward per row."""
    pids, pmask, rids, rmask = ro_like
    logp, ent = torch.zeros(rids.shape), torch.zeros(rids.shape)
    for i in range(len(rids)):
        p = pids[i][pmask[i]]
        n = int(rmask[i].sum())
        seq = torch.cat([p, rids[i, :n]])[None]
        logits = model(input_ids=seq).logits[:, len(p) - 1: len(p) - 1 + n]
        lp, h = naive_logprobs(logits, rids[i: i + 1, :n], T)
        logp[i, :n], ent[i, :n] = lp[0], h[0]
    return logp, ent


def sample_batch(model, budgets, seed=0, max_new=7):
    tok = _FakeTokenizer()
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 6, (len(budgets),), generator=g).tolist()
    prompts = [[1] + torch.randint(3, 24, (n,), generator=g).tolist() for n in lengths]
    ro = HFEngine(tok).generate(
        model, prompts, budgets, 1.0, max_new, seeds=list(range(seed, seed + len(budgets)))
    )
    perm = torch.randperm(len(ro), generator=g)  # micro-batches of a shuffled mini-batch
    ro = ro.select(perm)
    return ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("pack_tokens", [None, 4, 12, 1000])
def test_packed_equals_naive_values_and_gradients(attn, pack_tokens):
    model = random_llama(attn)
    batch = sample_batch(model, [3, 1, 4, 2], seed=3)
    w_logp, w_ent = torch.randn(batch[2].shape), torch.randn(batch[2].shape)

    def grads(logp, ent):
        model.zero_grad()
        ((logp * w_logp).sum() + (ent * w_ent).sum()).backward()
        return [p.grad.clone() for p in model.parameters()]

    ref = naive_response_logprobs(model, batch, 0.9)
    g_ref = grads(*ref)
    for pack in (True, False):
        logp, ent = response_logprobs(
            model, *batch, 0.9, pack=pack, pack_tokens=pack_tokens, chunk_size=5
        )
        torch.testing.assert_close(logp, ref[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent, ref[1], atol=1e-5, rtol=1e-5)
        for a, b in zip(grads(logp, ent), g_ref, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_packing_shares_prompts_and_drops_padding():
    model = random_llama()
    batch = sample_batch(model, [8, 8, 8], seed=1, max_new=6)
    plan = _pack_plan(batch[0], batch[1], batch[3], pack_tokens=10_000)
    # One packed row: each distinct prompt once, then every response without its last token.
    distinct = {tuple(p[m].tolist()) for p, m in zip(batch[0], batch[1])}
    expected = sum(len(p) for p in distinct) + int((batch[3].sum(-1) - 1).clamp_min(0).sum())
    assert len(distinct) == 3 and len(batch[0]) == 24
    assert plan["token_src"].shape == (1, expected)
    assert expected < plan["padded_tokens"] / 2


def test_prompt_groups_number_prompts_as_torch_unique_does():
    # The packed layout orders prompts by this numbering: it must stay torch.unique(dim=0)'s
    # (lexicographic over ids, -1 for padding), or every packed run's rounding would change.
    g = torch.Generator().manual_seed(0)
    for n, width in ((1, 1), (7, 3), (40, 6)):
        keys = torch.randint(-1, 4, (n, width), generator=g)
        keys[n // 2:] = keys[: n - n // 2].clone()  # repeated prompts
        _, expected = torch.unique(keys, dim=0, return_inverse=True)
        assert _prompt_groups(keys.tolist()) == expected.tolist()


def test_large_prompt_tables_pack_as_small_ones(monkeypatch):
    # Past forward._HOST_GROUPING_MAX ids the groups come from torch.unique: the same plan.
    from explorl.policy import forward
    batch = sample_batch(random_llama(), [3, 2, 4], seed=2)
    small = _pack_plan(batch[0], batch[1], batch[3], pack_tokens=12)
    monkeypatch.setattr(forward, "_HOST_GROUPING_MAX", 0)
    large = _pack_plan(batch[0], batch[1], batch[3], pack_tokens=12)
    assert small.keys() == large.keys()
    assert all(torch.equal(small[k], large[k]) if isinstance(small[k], torch.Tensor)
               else small[k] == large[k] for k in small)


def test_packed_handles_empty_rows_and_long_responses():
    model = random_llama()
    pids, pmask, rids, rmask = sample_batch(model, [2, 3], seed=4)
    rmask = rmask.clone()
    rmask[1] = False  # a row with nothing to score
    ref = naive_response_logprobs(model, (pids, pmask, rids, rmask), 1.0)
    logp, ent = response_logprobs(model, pids, pmask, rids, rmask, 1.0, pack=True, pack_tokens=2)
    assert (logp[1] == 0).all() and (ent[1] == 0).all()
    torch.testing.assert_close(logp, ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref[1], atol=1e-5, rtol=1e-5)


def test_unusual_masks_fall_back_to_padded_layout():
    model = random_llama()
    pids, pmask, rids, rmask = sample_batch(model, [2, 2], seed=5)
    holed = rmask.clone()
    holed[0, 0] = False  # not a prefix: no packed layout
    assert _pack_plan(pids, pmask, holed, 100) is None
    logp, _ = response_logprobs(model, pids, pmask, rids, holed, 1.0, pack=True)
    ref, _ = response_logprobs(model, pids, pmask, rids, holed, 1.0, pack=False)
    torch.testing.assert_close(logp, ref)


def test_which_models_take_a_custom_mask():
    assert takes_custom_mask(random_llama("sdpa")) and takes_custom_mask(random_llama("eager"))
    sliding = random_llama()
    sliding.config.layer_types = ["sliding_attention", "full_attention"]
    assert not takes_custom_mask(sliding)
    assert not takes_custom_mask(torch.nn.Linear(2, 2))


class _FakeTokenizer:
    """Enough of a tokenizer for the engine: ids ↔ letters, pad 0, eos 2."""

    pad_token_id, eos_token_id = 0, 2

    def batch_decode(self, rows, skip_special_tokens=True):
        return [
            "".join(chr(ord("a") + t) for t in row if not (skip_special_tokens and t in (0, 1, 2)))
            for row in rows
        ]
