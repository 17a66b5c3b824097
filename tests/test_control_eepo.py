"""EEPO (ALGORITHMS §3): the entropy gate, the unlearning step and the two-stage rollout."""

import copy

import pytest
import torch
from control_helpers import make_knobs, make_stats

from explorl.control import (
    ControlContext,
    EEPOGate,
    sample_then_forget,
    unlearn_step,
)
from explorl.rollout.types import Rollouts

# ----------------------------------------------------------------------------- the gate


def knobs():
    return make_knobs()


def stats(step, entropy):
    return make_stats(step, entropy=entropy, max_steps=20, prompt_indices=[0], prompt_correct=[1.0],
                      prompt_samples=[8])


def run_gate(gate, entropies):
    k, logs = knobs(), []
    for t, h in enumerate(entropies, 1):
        m = gate.before_step(t, k, [0])
        logs.append((k.unlearn, m))
        gate.after_step(stats(t, h), k)
    return logs


def test_gate_sequence_by_hand():
    gate = EEPOGate(window=3, alpha=0.3)
    gate.setup(ControlContext(16, 4, 20, 1, 8), knobs())
    H = [0.5, 0.2, 0.1, 0.1, 0.6, 0.6, 0.6, 0.6]
    logs = run_gate(gate, H)
    # moving averages before each step: none, .5, .35, .2667, .1333, .2667, .4333, .6
    assert [on for on, _ in logs] == [False, False, False, True, True, True, False, False]
    assert [m["eepo/active"] for _, m in logs] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert "eepo/entropy_ma" not in logs[0][1]  # no history at step 1
    expected_ma = [0.5, 0.35, 0.8 / 3, 0.4 / 3, 0.8 / 3, 1.3 / 3, 0.6]
    assert [m["eepo/entropy_ma"] for _, m in logs[1:]] == pytest.approx(expected_ma, abs=1e-12)


def test_gate_state_round_trip():
    H = [0.5, 0.2, 0.1, 0.1, 0.6, 0.6, 0.25, 0.2]
    full = run_gate(EEPOGate(), H)
    for cut in range(1, len(H)):
        a = EEPOGate()
        first = run_gate(a, H[:cut])
        b = EEPOGate()
        b.load_state_dict(a.state_dict())
        k, rest = knobs(), []
        for t, h in enumerate(H[cut:], cut + 1):
            m = b.before_step(t, k, [0])
            rest.append((k.unlearn, m))
            b.after_step(stats(t, h), k)
        assert first + rest == full


# ----------------------------------------------------------------------------- model side

PAD, EOS, VOCAB = 0, 1, 16


def tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=2,
    )
    return LlamaForCausalLM(cfg).eval()


class LoopEngine:
    """A minimal RolloutEngine: one unpadded forward per token, rows grouped by prompt."""

    pad_id = PAD

    @torch.no_grad()
    def generate(self, model, prompt_ids, n_samples, temperature, max_new_tokens, generator=None):
        rows = []
        for i, (prompt, n) in enumerate(zip(prompt_ids, n_samples)):
            for _ in range(n):
                ids, toks, logps, ents = list(prompt), [], [], []
                for _ in range(max_new_tokens):
                    z = model(torch.tensor([ids])).logits[0, -1].float() / temperature
                    logp = torch.log_softmax(z, -1)
                    tok = int(torch.multinomial(logp.exp(), 1, generator=generator))
                    toks.append(tok)
                    logps.append(float(logp[tok]))
                    ents.append(float(-(logp.exp() * logp).sum()))
                    ids.append(tok)
                    if tok == EOS:
                        break
                rows.append((i, prompt, toks, logps, ents))
        N = len(rows)
        P = max(len(r[1]) for r in rows)
        R = max(len(r[2]) for r in rows)
        out = {
            "prompt_ids": torch.full((N, P), PAD),
            "prompt_mask": torch.zeros(N, P, dtype=torch.bool),
            "response_ids": torch.full((N, R), PAD),
            "response_mask": torch.zeros(N, R, dtype=torch.bool),
            "old_logp": torch.zeros(N, R),
            "entropy": torch.zeros(N, R),
        }
        for n, (_, prompt, toks, logps, ents) in enumerate(rows):
            out["prompt_ids"][n, P - len(prompt) :] = torch.tensor(prompt)
            out["prompt_mask"][n, P - len(prompt) :] = True
            out["response_ids"][n, : len(toks)] = torch.tensor(toks)
            out["response_mask"][n, : len(toks)] = True
            out["old_logp"][n, : len(toks)] = torch.tensor(logps)
            out["entropy"][n, : len(toks)] = torch.tensor(ents)
        return Rollouts(
            **out,
            prompt_index=torch.tensor([r[0] for r in rows]),
            texts=[str(r[2]) for r in rows],
            temperature=temperature,
            truncated=torch.tensor([r[2][-1] != EOS for r in rows]),
        )


def token_logp(model, r: Rollouts, T: float) -> torch.Tensor:
    """log π(o_t) of every response token, (N, R), from one padded forward (independent helper)."""
    P = r.prompt_ids.shape[1]
    ids = torch.cat([r.prompt_ids, r.response_ids], 1)
    att = torch.cat([r.prompt_mask, r.response_mask], 1).long()
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = (
            model(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, P - 1 : -1].float()
            / T
        )
    return (
        torch.log_softmax(logits, -1).gather(-1, r.response_ids[..., None])[..., 0]
        * r.response_mask
    )


def comp_loss(model, r, T, eps_l=1e-3, eps_r=1e-2) -> float:
    """L = mean over sequences of the token mean of log(1 − clip(p))."""
    p = token_logp(model, r, T).exp().clamp(eps_l, 1 - eps_r)
    m = r.response_mask.float()
    return float(((torch.log1p(-p) * m).sum(-1) / m.sum(-1)).mean())


PROMPTS = [[2, 5, 7], [2, 9], [2, 3, 4, 11]]
T_SAMPLE = 1.3


@pytest.fixture(scope="module")
def policy():
    return tiny_llama()


@pytest.fixture(scope="module")
def r1(policy):
    """Stage-1-like rollouts: 3 samples of each prompt from the policy."""
    g = torch.Generator().manual_seed(0)
    return LoopEngine().generate(policy, PROMPTS, [3, 3, 3], T_SAMPLE, 6, g)


def test_engine_logp_matches_the_padded_forward(policy, r1):
    # guards the helper (left padding + position ids) the other checks rely on
    r = r1
    assert torch.allclose(token_logp(policy, r, T_SAMPLE), r.old_logp, atol=1e-5)


def test_unlearn_step_lowers_the_probability_of_the_sampled_tokens(policy, r1):
    r = r1
    theta = copy.deepcopy(policy)
    p_before = token_logp(theta, r, T_SAMPLE).exp()[r.response_mask]
    L_before = comp_loss(theta, r, T_SAMPLE)
    L = unlearn_step(theta, r, lr=0.5, temperature=T_SAMPLE)
    p_after = token_logp(theta, r, T_SAMPLE).exp()[r.response_mask]
    assert L == pytest.approx(L_before, abs=1e-6)  # returns L before the step
    assert L < 0  # log(1 − p) of a probability
    assert p_after.mean() < p_before.mean()
    assert comp_loss(theta, r, T_SAMPLE) > L_before  # gradient ascent on L
    assert all(p.grad is None for p in theta.parameters())  # grads freed
    assert theta.training is False  # mode restored


def test_unlearn_step_is_one_plain_sgd_step(policy, r1):
    r = r1
    theta = copy.deepcopy(policy)
    # the update is exactly −lr·∇(−L); recompute ∇(−L) by hand on a second copy
    ref = copy.deepcopy(policy)
    P = r.prompt_ids.shape[1]
    ids = torch.cat([r.prompt_ids, r.response_ids], 1)
    att = torch.cat([r.prompt_mask, r.response_mask], 1).long()
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    logits = (
        ref(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, P - 1 : -1].float()
        / T_SAMPLE
    )
    p = (
        torch.log_softmax(logits, -1)
        .gather(-1, r.response_ids[..., None])[..., 0]
        .exp()
        .clamp(1e-3, 1 - 1e-2)
    )
    m = r.response_mask.float()
    (-((torch.log1p(-p) * m).sum(-1) / m.sum(-1)).mean()).backward()
    unlearn_step(theta, r, lr=3e-3, temperature=T_SAMPLE)
    for (name, a), b in zip(ref.named_parameters(), theta.parameters()):
        expected = a.detach() - 3e-3 * a.grad
        assert torch.allclose(b, expected, atol=1e-6), name


def test_unlearn_step_micro_batches_match_one_batch(policy, r1):
    r = r1
    a, b = copy.deepcopy(policy), copy.deepcopy(policy)
    La = unlearn_step(a, r, lr=0.1, temperature=T_SAMPLE)
    Lb = unlearn_step(b, r, lr=0.1, temperature=T_SAMPLE, micro_batch_size=2)
    assert La == pytest.approx(Lb, abs=1e-6)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.allclose(x, y, atol=1e-6)


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_sample_then_forget_with_unlearning(policy):
    before = snapshot(policy)
    n = [3, 4, 1]
    g = torch.Generator().manual_seed(1)
    out, metrics = sample_then_forget(
        LoopEngine(),
        policy,
        PROMPTS,
        n,
        T_SAMPLE,
        6,
        g,
        unlearn=True,
        lr=0.5,
        eps_l=1e-3,
        eps_r=1e-2,
    )
    # the policy's weights are bit-identical
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    # grouped by prompt, stage 1 (n − n//2 rows) before stage 2 (n//2 rows)
    assert out.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 1, 2]
    assert out.stage.tolist() == [1, 1, 2, 1, 1, 2, 2, 1]
    s1, s2 = (
        out.select(torch.nonzero(out.stage == 1).flatten()),
        out.select(torch.nonzero(out.stage == 2).flatten()),
    )
    # stage-1 old_logp: the synced rollout model = the policy
    assert torch.allclose(s1.old_logp, token_logp(policy, s1, T_SAMPLE), atol=1e-5)
    # stage-2 old_logp: the unlearned copy (rebuilt here from the stage-1 rows), not the policy
    theta = copy.deepcopy(policy)
    L = unlearn_step(theta, s1, lr=0.5, temperature=T_SAMPLE)
    assert torch.allclose(s2.old_logp, token_logp(theta, s2, T_SAMPLE), atol=1e-5)
    assert not torch.allclose(s2.old_logp, token_logp(policy, s2, T_SAMPLE), atol=1e-3)
    # metrics
    assert metrics["eepo/active"] == 1.0
    assert metrics["eepo/unlearn_loss"] == pytest.approx(L, abs=1e-6)
    for name, part in (("entropy/stage1", s1), ("entropy/stage2", s2)):
        assert metrics[name] == pytest.approx(
            float(part.entropy[part.response_mask].mean()), abs=1e-6
        )
    assert set(metrics) == {"entropy/stage1", "entropy/stage2", "eepo/unlearn_loss", "eepo/active"}


def test_sample_then_forget_without_unlearning_samples_the_policy(policy):
    g = torch.Generator().manual_seed(2)
    out, metrics = sample_then_forget(
        LoopEngine(), policy, PROMPTS, [2, 2, 2], T_SAMPLE, 6, g, unlearn=False
    )
    assert torch.allclose(out.old_logp, token_logp(policy, out, T_SAMPLE), atol=1e-5)
    assert metrics["eepo/active"] == 0.0 and metrics["eepo/unlearn_loss"] == 0.0
    assert out.stage.tolist() == [1, 2, 1, 2, 1, 2]


class CountingEngine(LoopEngine):
    def __init__(self):
        self.calls = []

    def generate(self, model, prompt_ids, n_samples, *args, **kw):
        self.calls.append(list(n_samples))
        return super().generate(model, prompt_ids, n_samples, *args, **kw)


def test_gate_shut_samples_both_stages_in_one_call(policy):
    """θ′ = θ with the gate shut, so one call draws n_i responses per prompt; the first
    n_i − n_i//2 of each prompt are stage 1. With the gate open: two calls (n1, then n2)."""
    shut, opened = CountingEngine(), CountingEngine()
    out, metrics = sample_then_forget(shut, policy, PROMPTS, [3, 4, 1], T_SAMPLE, 6, torch.Generator().manual_seed(5),
                                      unlearn=False)
    assert shut.calls == [[3, 4, 1]]
    assert out.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 1, 2]
    assert out.stage.tolist() == [1, 1, 2, 1, 1, 2, 2, 1]
    for k, name in ((1, "entropy/stage1"), (2, "entropy/stage2")):
        rows = out.stage == k
        assert metrics[name] == pytest.approx(float(out.entropy[rows][out.response_mask[rows]].mean()), abs=1e-6)
    sample_then_forget(opened, policy, PROMPTS, [3, 4, 1], T_SAMPLE, 6, torch.Generator().manual_seed(5),
                       unlearn=True)
    assert opened.calls == [[2, 2, 1], [1, 2]]  # stage 2 skips the prompt with n = 1


def test_gate_shut_stage_one_equals_the_two_call_stage_one(tiny_model):
    """With per-prompt seeds, response j of a prompt depends only on (seed, j): merging the
    calls when the gate is shut leaves the stage-1 responses exactly as two calls draw them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from explorl.rollout.hf import HFEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    engine = HFEngine(tok)
    prompts = [tok(p)["input_ids"] for p in ["3+4=", "9+1=", "2+2="]]
    seeds = [11, 12, 13]
    out, _ = sample_then_forget(engine, model, prompts, [4, 3, 2], 1.0, 4, None, unlearn=False, seeds=seeds)
    stage1 = engine.generate(model, prompts, [2, 2, 1], 1.0, 4, None, seeds=seeds)
    s1 = out.select(torch.nonzero(out.stage == 1).flatten())
    width = min(s1.response_ids.shape[1], stage1.response_ids.shape[1])
    assert torch.equal(s1.response_mask.sum(-1), stage1.response_mask.sum(-1))
    assert torch.equal(s1.response_ids[:, :width] * s1.response_mask[:, :width],
                       stage1.response_ids[:, :width] * stage1.response_mask[:, :width])


def test_sample_then_forget_is_deterministic_given_the_generator(policy):
    outs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(3)
        outs.append(
            sample_then_forget(
                LoopEngine(), policy, PROMPTS, [2, 3, 2], T_SAMPLE, 5, g, unlearn=True
            )[0]
        )
    assert torch.equal(outs[0].response_ids, outs[1].response_ids)
    assert torch.equal(outs[0].old_logp, outs[1].old_logp)


def test_single_sample_prompts_skip_stage_two(policy):
    g = torch.Generator().manual_seed(4)
    out, metrics = sample_then_forget(
        LoopEngine(), policy, PROMPTS, [1, 1, 1], T_SAMPLE, 4, g, unlearn=True
    )
    assert out.stage.tolist() == [1, 1, 1]
    assert metrics["eepo/active"] == 0.0 and metrics["entropy/stage2"] == 0.0
