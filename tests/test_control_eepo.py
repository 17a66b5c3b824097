"""EEPO (docs/methods/eepo.md §3): the entropy gate, the unlearning step and the two-stage
rollout."""

import copy

import pytest
import torch
from control_helpers import make_bank, make_ctx, make_knobs, make_stats

from explorl.config import EEPOControlConfig
from explorl.control import ControlBank, EEPOGate
from explorl.rollout.seeding import mix_seed
from explorl.rollout.two_stage import TwoStage, unlearn_step
from explorl.rollout.types import Rollouts
from explorl.training.batch import policy_entropy, response_stats

# ----------------------------------------------------------------------------- the gate


def knobs():
    return make_knobs()


def stats(step, entropy):
    return make_stats(step, entropy=entropy, max_steps=20, prompt_indices=[0], prompt_correct=[1.0],
                      prompt_samples=[8])


def gate(**kw):
    return EEPOGate(EEPOControlConfig(enabled=True, **kw))


def run_gate(bank, entropies, first=1):
    """Drive the bank like the trainer; per step (unlearn knob used, metrics of the step)."""
    logs = []
    for t, h in enumerate(entropies, first):
        m = bank.before_batch(t) | bank.before_step(t, [0])
        logs.append((bank.knobs.unlearn, m | bank.after_step(stats(t, h))))
    return logs


def test_gate_sequence_by_hand():
    bank = make_bank(gate(window=3, alpha=0.3), make_ctx(max_steps=20, prompts_per_step=1), knobs())
    H = [0.5, 0.2, 0.1, 0.1, 0.6, 0.6, 0.6, 0.6]
    logs = run_gate(bank, H)
    # moving averages before each step: none, .5, .35, .2667, .1333, .2667, .4333, .6
    assert [on for on, _ in logs] == [False, False, False, True, True, True, False, False]
    assert "eepo/entropy_ma" not in logs[0][1]  # no history at step 1
    expected_ma = [0.5, 0.35, 0.8 / 3, 0.4 / 3, 0.8 / 3, 1.3 / 3, 0.6]
    assert [m["eepo/entropy_ma"] for _, m in logs[1:]] == pytest.approx(expected_ma, abs=1e-12)
    # whether the unlearning step ran is the sampler's eepo/active, not the gate's
    assert all("eepo/active" not in m for _, m in logs)


def test_gate_state_round_trip():
    H = [0.5, 0.2, 0.1, 0.1, 0.6, 0.6, 0.25, 0.2]
    full = run_gate(make_bank(gate(), make_ctx(), knobs()), H)
    assert len({on for on, _ in full}) == 2  # the gate opened and shut: the equality is not trivial
    for cut in range(1, len(H)):
        a = gate()
        first = run_gate(make_bank(a, make_ctx(), knobs()), H[:cut])
        b = gate()
        b.load_state_dict(a.state_dict())
        rest = run_gate(ControlBank([b], knobs()), H[cut:], cut + 1)  # fresh knobs
        assert first + rest == full


def test_gate_held_below_alpha_opens_on_every_step_after_the_first():
    # issue 13: the policy's own entropy held at 0.25 < α = 0.3 must keep the gate open
    logs = run_gate(make_bank(gate(window=3, alpha=0.3), make_ctx(), knobs()), [0.25] * 20)
    assert [on for on, _ in logs] == [False] + [True] * 19
    assert [m["eepo/entropy_ma"] for _, m in logs[1:]] == [0.25] * 19


def step_rows(unlearned: bool) -> dict[str, torch.Tensor]:
    """The trainer's per-response rows of one EEPO step (2 prompts × 4 responses of 3 tokens):
    stage 1 sampled by the policy (entropy 0.25); stage 2 by the unlearned copy (0.40) when
    the unlearning step ran, else by the policy (0.25)."""
    stage = torch.tensor([1, 1, 2, 2] * 2)
    n = len(stage)
    entropy = torch.where((stage == 2) & unlearned, 0.40, 0.25)[:, None].expand(n, 3).contiguous()
    ro = Rollouts(prompt_ids=torch.ones(n, 1, dtype=torch.long),
                  prompt_mask=torch.ones(n, 1, dtype=torch.bool),
                  response_ids=torch.ones(n, 3, dtype=torch.long),
                  response_mask=torch.ones(n, 3, dtype=torch.bool),
                  old_logp=torch.zeros(n, 3), entropy=entropy,
                  prompt_index=torch.tensor([0] * 4 + [1] * 4), texts=[""] * n, stage=stage)
    return response_stats(ro, torch.zeros(n), torch.zeros(n), 0, stage2_own=not unlearned)


def test_gate_fed_the_policy_entropy_stays_open_and_the_mixed_one_would_not():
    """Closed loop: the gate decides the step, the step's rows come back. Fed the policy's own
    entropy (``policy_entropy``, what the trainer passes) the gate stays open; fed the mean
    over all responses, the copy's raised stage-2 entropy shuts it every other pair of steps."""

    def loop(entropy_of):
        bank, opened = make_bank(gate(window=3, alpha=0.3), make_ctx(max_steps=20), knobs()), []
        for t in range(1, 21):
            bank.before_step(t, [0, 1])
            opened.append(bank.knobs.unlearn)
            bank.after_step(stats(t, entropy_of(step_rows(bank.knobs.unlearn))))
        return opened

    assert loop(policy_entropy) == [False] + [True] * 19
    mixed = loop(lambda rows: float(rows.entropy_sum.sum() / rows.length.sum()))
    assert mixed == [False, True, True, False] * 5 and sum(mixed) == 10  # the pattern


# ----------------------------------------------------------------------------- model side

PAD, EOS, VOCAB = 0, 1, 16
EPS = {"eps_l": 1e-3, "eps_r": 1e-2}  # EEPO's clip of p in log(1 − p)


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
    """A minimal RolloutEngine: one unpadded forward per token, rows grouped by prompt.
    Response j of prompt i is drawn from its own generator seeded by (seeds[i], j)."""

    pad_id = PAD

    @torch.no_grad()
    def generate(self, model, prompt_ids, n_samples, temperature, max_new_tokens, generator=None,
                 seeds=None):
        assert generator is None and seeds is not None and len(seeds) == len(prompt_ids)
        rows = []
        for i, (prompt, n) in enumerate(zip(prompt_ids, n_samples)):
            for j in range(n):
                g = torch.Generator().manual_seed(mix_seed(seeds[i], j))
                ids, toks, logps, ents = list(prompt), [], [], []
                for _ in range(max_new_tokens):
                    z = model(torch.tensor([ids])).logits[0, -1].float() / temperature
                    logp = torch.log_softmax(z, -1)
                    tok = int(torch.multinomial(logp.exp(), 1, generator=g))
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
SEEDS = [101, 102, 103]
T_SAMPLE = 1.3


def two_stage(engine=None, lr=3e-3, **kw):
    return TwoStage(engine or LoopEngine(), EEPOControlConfig(enabled=True, lr=lr, **EPS), **kw)


@pytest.fixture(scope="module")
def policy():
    return tiny_llama()


@pytest.fixture(scope="module")
def r1(policy):
    """Stage-1-like rollouts: 3 samples of each prompt from the policy."""
    return LoopEngine().generate(policy, PROMPTS, [3, 3, 3], T_SAMPLE, 6, seeds=SEEDS)


def test_engine_logp_matches_the_padded_forward(policy, r1):
    # guards the helper (left padding + position ids) the other checks rely on
    r = r1
    assert torch.allclose(token_logp(policy, r, T_SAMPLE), r.old_logp, atol=1e-5)


def test_unlearn_step_lowers_the_probability_of_the_sampled_tokens(policy, r1):
    r = r1
    theta = copy.deepcopy(policy)
    p_before = token_logp(theta, r, T_SAMPLE).exp()[r.response_mask]
    L_before = comp_loss(theta, r, T_SAMPLE)
    L = unlearn_step(theta, r, lr=0.5, temperature=T_SAMPLE, **EPS)
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
    unlearn_step(theta, r, lr=3e-3, temperature=T_SAMPLE, **EPS)
    for (name, a), b in zip(ref.named_parameters(), theta.parameters()):
        expected = a.detach() - 3e-3 * a.grad
        assert torch.allclose(b, expected, atol=1e-6), name


def test_unlearn_step_micro_batches_match_one_batch(policy, r1):
    r = r1
    a, b = copy.deepcopy(policy), copy.deepcopy(policy)
    La = unlearn_step(a, r, lr=0.1, temperature=T_SAMPLE, **EPS)
    Lb = unlearn_step(b, r, lr=0.1, temperature=T_SAMPLE, micro_batch_size=2, **EPS)
    assert La == pytest.approx(Lb, abs=1e-6)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.allclose(x, y, atol=1e-6)


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def unchanged(model, before) -> bool:
    after = model.state_dict()
    return before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def by_stage(out, k):
    return out.select(torch.nonzero(out.stage == k).flatten())


def test_two_stage_with_unlearning(policy):
    before = snapshot(policy)
    n = [3, 4, 1]
    out, metrics = two_stage(lr=0.5).sample(policy, 0, PROMPTS, n, T_SAMPLE, 6, SEEDS, unlearn=True)
    # the policy's weights are bit-identical
    assert unchanged(policy, before)
    # grouped by prompt, stage 1 (n − n//2 rows) before stage 2 (n//2 rows)
    assert out.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 1, 2]
    assert out.stage.tolist() == [1, 1, 2, 1, 1, 2, 2, 1]
    s1, s2 = by_stage(out, 1), by_stage(out, 2)
    # stage-1 old_logp: the synced rollout model = the policy
    assert torch.allclose(s1.old_logp, token_logp(policy, s1, T_SAMPLE), atol=1e-5)
    # stage-2 old_logp: the unlearned copy (rebuilt here from the stage-1 rows), not the policy
    theta = copy.deepcopy(policy)
    L = unlearn_step(theta, s1, lr=0.5, temperature=T_SAMPLE, **EPS)
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


def test_two_stage_without_unlearning_samples_the_policy(policy):
    out, metrics = two_stage().sample(policy, 0, PROMPTS, [2, 2, 2], T_SAMPLE, 6, SEEDS,
                                      unlearn=False)
    assert torch.allclose(out.old_logp, token_logp(policy, out, T_SAMPLE), atol=1e-5)
    assert metrics["eepo/active"] == 0.0 and metrics["eepo/unlearn_loss"] == 0.0
    assert out.stage.tolist() == [1, 2, 1, 2, 1, 2]


def test_the_rollout_copy_is_kept_and_refreshed_from_the_policy(policy):
    """θ′ is allocated once and reset to the current θ in place before every unlearning step:
    each gate-open call gives what a fresh TwoStage gives, and never touches the policy."""
    pol = copy.deepcopy(policy)  # this test moves the policy between calls
    ts = two_stage(lr=0.5)
    args = (PROMPTS, [2, 3, 2], T_SAMPLE, 5, SEEDS)

    def call(sampler):
        before = snapshot(pol)
        out, m = sampler.sample(pol, 0, *args, unlearn=True)
        assert unchanged(pol, before)  # the policy's weights are never modified
        return out, m

    def same(a, b):
        (oa, ma), (ob, mb) = a, b
        return (torch.equal(oa.response_ids, ob.response_ids)
                and torch.equal(oa.old_logp, ob.old_logp)
                and torch.equal(oa.stage, ob.stage) and ma == mb)

    first = call(ts)
    theta_prime = ts.rollout_copy(pol)
    second = call(ts)  # θ′ had been unlearned by the first call: it must be reset to θ
    assert same(second, first) and same(second, call(two_stage(lr=0.5)))
    assert ts.rollout_copy(pol) is theta_prime  # one module for the run, no per-step copy
    with torch.no_grad():  # an optimizer step on the policy
        g = torch.Generator().manual_seed(7)
        for p in pol.parameters():
            p += 0.05 * torch.randn(p.shape, generator=g)
    third = call(ts)
    assert same(third, call(two_stage(lr=0.5)))
    assert not torch.equal(by_stage(third[0], 2).old_logp, by_stage(first[0], 2).old_logp)
    assert ts.rollout_copy(pol) is theta_prime


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
    out, metrics = two_stage(shut).sample(policy, 0, PROMPTS, [3, 4, 1], T_SAMPLE, 6, SEEDS,
                                          unlearn=False)
    assert shut.calls == [[3, 4, 1]]
    assert out.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 1, 2]
    assert out.stage.tolist() == [1, 1, 2, 1, 1, 2, 2, 1]
    for k, name in ((1, "entropy/stage1"), (2, "entropy/stage2")):
        rows = out.stage == k
        expected = float(out.entropy[rows][out.response_mask[rows]].mean())
        assert metrics[name] == pytest.approx(expected, abs=1e-6)
    opened_out, _ = two_stage(opened).sample(policy, 0, PROMPTS, [3, 4, 1], T_SAMPLE, 6, SEEDS,
                                             unlearn=True)
    assert opened.calls == [[2, 2, 1], [1, 2]]  # stage 2 skips the prompt with n = 1
    # with per-prompt seeds the merged call's stage 1 is the two-call stage 1
    a, b = by_stage(out, 1), by_stage(opened_out, 1)
    assert torch.equal(a.response_mask.sum(-1), b.response_mask.sum(-1))
    width = min(a.response_ids.shape[1], b.response_ids.shape[1])
    assert torch.equal(a.response_ids[:, :width] * a.response_mask[:, :width],
                       b.response_ids[:, :width] * b.response_mask[:, :width])


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
    out, _ = two_stage(engine).sample(model, 0, prompts, [4, 3, 2], 1.0, 4, seeds, unlearn=False)
    stage1 = engine.generate(model, prompts, [2, 2, 1], 1.0, 4, seeds=seeds)
    s1 = by_stage(out, 1)
    width = min(s1.response_ids.shape[1], stage1.response_ids.shape[1])
    assert torch.equal(s1.response_mask.sum(-1), stage1.response_mask.sum(-1))
    assert torch.equal(s1.response_ids[:, :width] * s1.response_mask[:, :width],
                       stage1.response_ids[:, :width] * stage1.response_mask[:, :width])


def test_two_stage_is_deterministic_given_the_seeds(policy):
    outs = [two_stage().sample(policy, 0, PROMPTS, [2, 3, 2], T_SAMPLE, 5, SEEDS, unlearn=True)[0]
            for _ in range(2)]
    assert torch.equal(outs[0].response_ids, outs[1].response_ids)
    assert torch.equal(outs[0].old_logp, outs[1].old_logp)
    other, _ = two_stage().sample(policy, 0, PROMPTS, [2, 3, 2], T_SAMPLE, 5, [7, 8, 9],
                                  unlearn=True)
    assert not torch.equal(other.old_logp, outs[0].old_logp)  # the seeds decide the draws


def test_single_sample_prompts_skip_stage_two(policy):
    out, metrics = two_stage().sample(policy, 0, PROMPTS, [1, 1, 1], T_SAMPLE, 4, SEEDS,
                                      unlearn=True)
    assert out.stage.tolist() == [1, 1, 1]
    assert metrics["eepo/active"] == 0.0 and metrics["entropy/stage2"] == 0.0
