"""Chunked log-probs/entropy equal the naive full-vocabulary computation (docs/methods/baseline.md
§0)."""

import math

import pytest
import torch
import torch.nn.functional as F

from explorl.algorithms import logprobs_from_hidden, logprobs_from_logits, naive_logprobs

N, T, V, D = 3, 7, 11, 5
CHUNKS = [1, 3, 5, 7, 10, 15, 21, 100]  # sub-row pieces (incl. not dividing T), whole rows, all


def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "logits": torch.randn(N, T + 2, V, generator=g) * 3,
        "labels": torch.randint(0, V, (N, T), generator=g),
        "hidden": torch.randn(N, T, D, generator=g),
        "weight": torch.randn(V, D, generator=g),
        "bias": torch.randn(V, generator=g),
        "w_logp": torch.randn(N, T, generator=g),
        "w_ent": torch.randn(N, T, generator=g),
    }


def test_entropy_and_logp_by_hand():
    # logits [0, ln 3] -> p = [1/4, 3/4]; at T = 2: p ∝ [1, √3].
    logits = torch.tensor([[[0.0, math.log(3)]]])
    labels = torch.tensor([[1]])
    logp, ent = logprobs_from_logits(logits, labels)
    assert logp.item() == pytest.approx(math.log(0.75))
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    p = [1 / (1 + math.sqrt(3)), math.sqrt(3) / (1 + math.sqrt(3))]
    logp, ent = logprobs_from_logits(logits, labels, temperature=2.0)
    assert logp.item() == pytest.approx(math.log(p[1]), rel=1e-6)
    assert ent.item() == pytest.approx(-sum(q * math.log(q) for q in p), rel=1e-6)
    # uniform logits: H = ln V, logp = -ln V
    logp, ent = logprobs_from_logits(torch.full((1, 2, 7), 4.2), torch.tensor([[0, 6]]))
    torch.testing.assert_close(ent, torch.full((1, 2), math.log(7)))
    torch.testing.assert_close(logp, torch.full((1, 2), -math.log(7)))


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logits_path_values_and_gradients(chunk, temperature):
    d = data()
    # A column slice, as the trainer takes response positions: non-contiguous input.
    full = d["logits"].clone().requires_grad_(True)
    logits = full[:, 1:-1]
    logp, ent = logprobs_from_logits(logits, d["labels"], temperature, chunk_size=chunk)
    (g_chunk,) = torch.autograd.grad((logp * d["w_logp"]).sum() + (ent * d["w_ent"]).sum(), full)
    ref_lp, ref_ent = naive_logprobs(logits, d["labels"], temperature)
    (g_ref,) = torch.autograd.grad(
        (ref_lp * d["w_logp"]).sum() + (ref_ent * d["w_ent"]).sum(), full
    )
    torch.testing.assert_close(logp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    torch.testing.assert_close(g_chunk, g_ref)
    assert logp.dtype == torch.float32 and logp.shape == (N, T)


@pytest.mark.parametrize("chunk", [1, 4, 21, 64])
@pytest.mark.parametrize("temperature", [1.0, 1.3])
@pytest.mark.parametrize("with_bias", [False, True])
def test_hidden_path_values_and_gradients(chunk, temperature, with_bias):
    d = data(1)
    h = d["hidden"].clone().requires_grad_(True)
    w = d["weight"].clone().requires_grad_(True)
    b = d["bias"].clone().requires_grad_(True) if with_bias else None
    params = [h, w] + ([b] if with_bias else [])
    logp, ent = logprobs_from_hidden(
        h, w, d["labels"], temperature, chunk_size=chunk, lm_head_bias=b
    )
    g_chunk = torch.autograd.grad((logp * d["w_logp"]).sum() + (ent * d["w_ent"]).sum(), params)
    ref_lp, ref_ent = naive_logprobs(F.linear(h, w, b), d["labels"], temperature)
    g_ref = torch.autograd.grad((ref_lp * d["w_logp"]).sum() + (ref_ent * d["w_ent"]).sum(), params)
    torch.testing.assert_close(logp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    for a, r in zip(g_chunk, g_ref, strict=True):
        torch.testing.assert_close(a, r)


@pytest.mark.parametrize("chunk", [1, 4, 64])
@pytest.mark.parametrize(("scale", "softcap"), [(0.25, None), (1.0, 2.0), (3.0, 1.5)])
def test_hidden_path_with_scaled_or_capped_head(chunk, scale, softcap):
    """A head that scales (Cohere, Granite) or soft-caps (Gemma 2/3) its logits: the fused
    path equals the full logits softcap(scale · hWᵀ) at T = 0.8, values and gradients."""
    d = data(5)
    h = d["hidden"].clone().requires_grad_(True)
    w = d["weight"].clone().requires_grad_(True)
    logp, ent = logprobs_from_hidden(h, w, d["labels"], 0.8, chunk_size=chunk,
                                     logit_scale=scale, softcap=softcap)
    g = torch.autograd.grad((logp * d["w_logp"]).sum() + (ent * d["w_ent"]).sum(), [h, w])
    u = F.linear(h, w) * scale
    full = u if softcap is None else softcap * torch.tanh(u / softcap)
    ref_lp, ref_ent = naive_logprobs(full, d["labels"], 0.8)
    g_ref = torch.autograd.grad((ref_lp * d["w_logp"]).sum() + (ref_ent * d["w_ent"]).sum(),
                                [h, w])
    torch.testing.assert_close(logp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    for a, r in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)


def test_softcap_by_hand():
    # logits [0, 10] capped at c = 1: [0, tanh 10] ≈ [0, 1]; p(1) = e^t / (1 + e^t).
    w = torch.tensor([[0.0], [10.0]])
    logp, _ = logprobs_from_hidden(torch.ones(1, 1, 1), w, torch.tensor([[1]]), softcap=1.0)
    t = math.tanh(10.0)
    assert logp.item() == pytest.approx(t - math.log(1 + math.exp(t)), rel=1e-6)
    # a scale of 1/2 on logits [0, ln 9] gives [0, ln 3]: p(1) = 3/4
    w = torch.tensor([[0.0], [math.log(9)]])
    logp, _ = logprobs_from_hidden(torch.ones(1, 1, 1), w, torch.tensor([[1]]), logit_scale=0.5)
    assert logp.item() == pytest.approx(math.log(0.75), rel=1e-6)
    with pytest.raises(ValueError, match="softcap"):
        logprobs_from_hidden(torch.ones(1, 1, 1), w, torch.tensor([[1]]), softcap=0.0)


def test_entropy_only_gradient_matches():
    # The entropy bonus differentiates H alone.
    d = data(2)
    x = d["logits"][:, :T].clone().requires_grad_(True)
    _, ent = logprobs_from_logits(x, d["labels"], 0.8, chunk_size=4)
    (g,) = torch.autograd.grad(ent.sum(), x)
    (g_ref,) = torch.autograd.grad(naive_logprobs(x, d["labels"], 0.8)[1].sum(), x)
    torch.testing.assert_close(g, g_ref)


def test_without_entropy():
    d = data(3)
    x = d["logits"][:, :T].clone().requires_grad_(True)
    h = d["hidden"].clone().requires_grad_(True)
    logp, ent = logprobs_from_logits(x, d["labels"], chunk_size=4, with_entropy=False)
    assert ent is None
    (g,) = torch.autograd.grad((logp * d["w_logp"]).sum(), x)
    ref = naive_logprobs(x, d["labels"])[0]
    (g_ref,) = torch.autograd.grad((ref * d["w_logp"]).sum(), x)
    torch.testing.assert_close(logp, ref)
    torch.testing.assert_close(g, g_ref)
    logp_h, ent_h = logprobs_from_hidden(
        h, d["weight"], d["labels"], chunk_size=4, with_entropy=False
    )
    assert ent_h is None
    torch.testing.assert_close(logp_h, naive_logprobs(F.linear(h, d["weight"]), d["labels"])[0])


def test_bfloat16_inputs_give_float32_outputs_and_input_dtype_grads():
    d = data(4)
    x = d["logits"][:, :T].to(torch.bfloat16).requires_grad_(True)
    logp, ent = logprobs_from_logits(x, d["labels"], chunk_size=5)
    assert logp.dtype == ent.dtype == torch.float32
    ref_lp, ref_ent = naive_logprobs(x, d["labels"])
    torch.testing.assert_close(logp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    (ent.sum() + logp.sum()).backward()
    assert x.grad.dtype == torch.bfloat16


def test_bfloat16_hidden_path_matches_naive():
    d = data(6)
    h = d["hidden"].to(torch.bfloat16).requires_grad_(True)
    w = d["weight"].to(torch.bfloat16).requires_grad_(True)
    logp, ent = logprobs_from_hidden(h, w, d["labels"], 0.9, chunk_size=4)
    g = torch.autograd.grad(logp.sum() + ent.sum(), [h, w])
    ref_lp, ref_ent = naive_logprobs(F.linear(h, w), d["labels"], 0.9)
    g_ref = torch.autograd.grad(ref_lp.sum() + ref_ent.sum(), [h, w])
    torch.testing.assert_close(logp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    # The weight gradient is summed over chunks in float32, the naive one in one bf16
    # matmul: equal up to bf16 rounding.
    for a, r in zip(g, g_ref, strict=True):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(
            a.float(), r.float(), rtol=2e-2, atol=2e-2 * r.abs().max().item()
        )


def test_no_grad_inputs_work():
    # old log-probs are computed under no_grad with plain tensors
    d = data(5)
    with torch.no_grad():
        logp, _ent = logprobs_from_hidden(d["hidden"], d["weight"], d["labels"], chunk_size=3)
    torch.testing.assert_close(
        logp, naive_logprobs(F.linear(d["hidden"], d["weight"]), d["labels"])[0]
    )


def test_bad_chunk_size():
    d = data()
    with pytest.raises(ValueError):
        logprobs_from_logits(d["logits"], d["labels"], chunk_size=0)
