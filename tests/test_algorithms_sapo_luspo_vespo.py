"""SAPO, LUSPO and VESPO against values worked out by hand from their formulas, and against
TRL 1.16's own loss computation (``GRPOTrainer._compute_loss``) on the same tensors: values and
gradients (skipped where TRL is not installed; ``make test`` installs it with the bench extra)."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from explorl.algorithms import aggregate
from explorl.algorithms.losses import (
    FOLDS_CORRECTION,
    LOSSES,
    REQUIRED_AGG,
    gspo_loss,
    luspo_loss,
    sapo_loss,
    take_correction,
    vespo_loss,
)
from explorl.algorithms.rollout_correction import (
    response_mean_weight,
    rollout_correction,
    sequence_log_weight,
)

E = math.exp


def sig(x):
    return 1.0 / (1.0 + E(-x))


def cfg(**kw):
    base = {
        "eps_low": 3e-4,  # LUSPO keeps GSPO's sequence-ratio clip (GSPO paper §5.1)
        "eps_high": 4e-4,
        "agg": "seq-mean-token-sum",
        "sapo_tau_pos": 1.0,  # the SAPO paper's and TRL's defaults
        "sapo_tau_neg": 1.05,
        "vespo_k_pos": 2.0,  # TRL's defaults
        "vespo_lambda_pos": 3.0,
        "vespo_k_neg": 3.0,
        "vespo_lambda_neg": 2.0,
    }
    return SimpleNamespace(**{**base, **kw})


def leaf(x):
    return torch.tensor(x, dtype=torch.float64, requires_grad=True)


def grad(x, wrt):
    (g,) = torch.autograd.grad(x, wrt)
    return g


ONE = torch.ones(1, 2, dtype=torch.bool)
ZERO = torch.zeros(1, 2, dtype=torch.float64)


def test_registry_and_required_aggregation():
    assert {"sapo", "luspo", "vespo"} <= set(LOSSES)
    assert REQUIRED_AGG["luspo"] == "seq-mean-token-sum" and "sapo" not in REQUIRED_AGG
    assert set(FOLDS_CORRECTION) == {"vespo"}


# --------------------------------------------------------------------------- SAPO


def test_sapo_on_policy_is_the_plain_policy_gradient():
    # ratio 1: σ(0) = ½, f = (4/τ)·½ = 2/τ; loss = −2A/τ; gate 4·½·½ = 1, so ∇ = −A·∇logp.
    logp = leaf([[-0.5, -1.2]])
    old = logp.detach().clone()
    for a, tau in ((2.0, 1.0), (-1.0, 1.05)):
        loss, m = sapo_loss(logp, old, torch.tensor([a], dtype=torch.float64), ONE, cfg())
        torch.testing.assert_close(loss, torch.full((1, 2), -2 * a / tau, dtype=torch.float64))
        torch.testing.assert_close(grad(loss.sum(), logp), torch.full((1, 2), -a,
                                                                       dtype=torch.float64))
        assert m["loss/sapo_gate_mean"].item() == pytest.approx(1.0)
        assert m["loss/clip_frac"].item() == 0.0 and m["loss/ratio_mean"].item() == 1.0


def test_sapo_worked_example_off_policy():
    # logp − old = 0.2 -> r = e^0.2 = 1.22140.
    # A = +1, τ = 1: σ(0.22140) = 0.55513, loss = −4·0.55513 = −2.22051,
    #   gate 4σ(1−σ) = 0.98785, ∂loss/∂logp = −A·gate·r = −1.20656.
    # A = −1, τ = 1.05: σ(1.05·0.22140) = 0.55786, loss = (4/1.05)·0.55786 = 2.12518,
    #   gate = 0.98661, ∂loss/∂logp = +0.98661·1.22140 = 1.20505.
    logp = leaf([[0.2, 0.2]])
    adv = torch.tensor([1.0], dtype=torch.float64)
    loss, m = sapo_loss(logp, ZERO, adv, ONE, cfg())
    assert loss[0, 0].item() == pytest.approx(-2.22051, abs=1e-5)
    assert grad(loss[0, 0], logp)[0, 0].item() == pytest.approx(-1.20656, abs=1e-5)
    assert m["loss/sapo_gate_mean"].item() == pytest.approx(0.98785, abs=1e-5)
    loss, m = sapo_loss(logp, ZERO, -adv, ONE, cfg())
    assert loss[0, 0].item() == pytest.approx(2.12518, abs=1e-5)
    assert grad(loss[0, 0], logp)[0, 0].item() == pytest.approx(1.20505, abs=1e-5)
    assert m["loss/sapo_gate_mean"].item() == pytest.approx(0.98661, abs=1e-5)
    # the closed forms the numbers above come from
    r = E(0.2)
    assert loss[0, 0].item() == pytest.approx(4 / 1.05 * sig(1.05 * (r - 1)))


def test_sapo_gate_fades_smoothly_and_never_cuts_a_gradient_to_zero():
    # PPO (eps 0.2) cuts the gradient of A > 0 at r = 2; SAPO keeps a small one, and it shrinks
    # monotonically as r leaves 1, faster for the larger negative temperature.
    logp = leaf([[math.log(2.0), math.log(4.0)]])
    for a in (1.0, -1.0):
        loss, m = sapo_loss(logp, ZERO, torch.tensor([a], dtype=torch.float64), ONE, cfg())
        g = grad(loss.sum(), logp)[0]
        assert (g.abs() > 0).all() and g.abs()[1] < g.abs()[0] * 2  # ×2 ratio, not ×2 gradient
        assert 0 < m["loss/sapo_gate_mean"].item() < 1
    r = 4.0
    gate = {tau: 4 * sig(tau * (r - 1)) * (1 - sig(tau * (r - 1))) for tau in (1.0, 1.05)}
    assert gate[1.05] < gate[1.0]


def test_sapo_ignores_padding_even_when_it_is_minus_inf():
    logp = leaf([[-0.3, -math.inf]])
    mask = torch.tensor([[True, False]])
    loss, m = sapo_loss(logp, ZERO, torch.tensor([1.0], dtype=torch.float64), mask, cfg())
    assert loss[0, 1].item() == 0.0 and torch.isfinite(grad(loss.sum(), logp)).all()
    assert math.isfinite(m["loss/ratio_mean"].item())


# --------------------------------------------------------------------------- LUSPO


def test_luspo_worked_example_scales_each_response_by_its_length():
    # Row 0: logp − old = [0.1, −0.3] -> s = e^−0.1 = 0.904837, A = +1 (inside the clip: GSPO's
    # upper bound only cuts s > 1 + 4e-4); row 1: one token, s = 1, A = −1.
    # seq-mean-token-sum: (2·(−0.904837) + 1·1)/2 = −0.404837; GSPO's seq-mean-token-mean on
    # the same per-token loss gives (−0.904837 + 1)/2 = 0.047582.
    logp = leaf([[0.1, -0.3], [0.0, 0.0]])
    old = torch.zeros(2, 2, dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, m = luspo_loss(logp, old, adv, mask, cfg())
    agg = aggregate(loss, mask, "seq-mean-token-sum")
    assert agg.item() == pytest.approx(-0.404837, abs=1e-6)
    # d/dlogp_t of |o|·(−s)/N with s = exp(mean_t Δ): −s/N per token of row 0
    g = grad(agg, logp)
    assert g[0].tolist() == pytest.approx([-E(-0.1) / 2] * 2)
    assert g[1, 0].item() == pytest.approx(1 / 2) and g[1, 1].item() == 0.0
    gspo, _ = gspo_loss(logp, old, adv, mask, cfg(agg="seq-mean-token-mean"))
    torch.testing.assert_close(loss, gspo)  # the same per-token loss ...
    assert aggregate(gspo, mask, "seq-mean-token-mean").item() == pytest.approx(0.047582,
                                                                                abs=1e-6)
    assert m["loss/seq_log_ratio_abs_mean"].item() == pytest.approx((0.1 * 2 + 0) / 3)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_luspo_rejects_other_aggregation_modes(agg):
    with pytest.raises(ValueError, match="scaled by its length"):
        luspo_loss(leaf([[0.0]]), torch.zeros(1, 1), torch.ones(1),
                   torch.ones(1, 1, dtype=torch.bool), cfg(agg=agg))


# --------------------------------------------------------------------------- VESPO


def test_vespo_worked_example():
    # logp − old = [0.1, −0.3]: log W = Σ = −0.2 (a sum: no length normalisation), W = 0.818731.
    # A = +1 (k 2, λ 3): φ = W²·e^{3(1−W)} = 0.670320·1.722553 = 1.154662.
    # A = −1 (k 3, λ 2): φ = W³·e^{2(1−W)} = 0.548812·1.436973 = 0.788627.
    # loss_t = −φ·A·logp_t; ∂loss_t/∂logp_t = −φ·A (φ is a stop-gradient weight).
    logp = leaf([[0.1, -0.3]])
    w = E(-0.2)
    for a, k, lam in ((1.0, 2.0, 3.0), (-1.0, 3.0, 2.0)):
        phi = w**k * E(lam * (1 - w))
        loss, m = vespo_loss(logp, ZERO, torch.tensor([a], dtype=torch.float64), ONE, cfg())
        assert loss[0].tolist() == pytest.approx([-phi * a * 0.1, phi * a * 0.3])
        assert grad(loss.sum(), logp)[0].tolist() == pytest.approx([-phi * a] * 2)
        assert m["loss/vespo_phi_mean"].item() == pytest.approx(phi)
        assert m["loss/ratio_mean"].item() == pytest.approx(w)
        assert m["loss/clip_frac"].item() == 0.0
    assert 1.154662 == pytest.approx(w**2 * E(3 * (1 - w)), abs=1e-6)
    assert 0.788627 == pytest.approx(w**3 * E(2 * (1 - w)), abs=1e-6)


def test_vespo_on_policy_weight_is_one_and_vanishes_far_off_policy():
    logp = leaf([[-0.7, -1.1]])
    adv = torch.tensor([1.0], dtype=torch.float64)
    _, m = vespo_loss(logp, logp.detach(), adv, ONE, cfg())
    assert m["loss/vespo_phi_mean"].item() == pytest.approx(1.0)
    # W = e^6 (a response the policy now likes far more): φ = e^{12}·e^{3(1−e^6)} ≈ 0
    _, m = vespo_loss(logp, logp.detach() - 3.0, adv, ONE, cfg())
    assert m["loss/vespo_phi_mean"].item() < 1e-300 or m["loss/vespo_phi_mean"].item() == 0.0
    # W = e^{-40} is clamped to 1e-8: φ = 1e-16·e^{3} ≈ 2e-15, finite
    _, m = vespo_loss(logp, logp.detach() + 20.0, adv, ONE, cfg())
    assert m["loss/vespo_phi_mean"].item() == pytest.approx(1e-16 * E(3 * (1 - 1e-8)), rel=1e-6)


def test_vespo_folds_the_behaviour_weight_into_w():
    # π_θ/π_old: Δ = [0.1, −0.3]; π_old/μ: ℓ = [0.5, 0.4], token-truncate at C = 1.5 ->
    # w = [1.5, e^0.4], log Π w = ln 1.5 + 0.4 = 0.805465; log W = −0.2 + 0.805465 = 0.605465.
    logp = leaf([[0.1, -0.3]])
    old = ZERO
    engine = old - torch.tensor([[0.5, 0.4]], dtype=torch.float64)
    c = rollout_correction(old, engine, ONE, "token-truncate", upper=1.5)
    beh = sequence_log_weight(c.weight, c.keep)
    assert beh.tolist() == pytest.approx([math.log(1.5) + 0.4])
    adv = torch.tensor([1.0], dtype=torch.float64)
    _, m = vespo_loss(logp, old, adv, ONE, cfg(), behaviour_log_weight=beh)
    w = E(0.605465)
    assert m["loss/ratio_mean"].item() == pytest.approx(w, abs=1e-5)
    assert m["loss/vespo_phi_mean"].item() == pytest.approx(w**2 * E(3 * (1 - w)), abs=1e-5)
    # untruncated, the fold is the same as measuring W against μ directly: π_θ/π_old·π_old/μ
    c = rollout_correction(old, engine, ONE, "token-truncate", upper=10.0)
    folded, _ = vespo_loss(logp, old, adv, ONE, cfg(),
                           behaviour_log_weight=sequence_log_weight(c.weight, c.keep))
    direct, _ = vespo_loss(logp, engine, adv, ONE, cfg())
    torch.testing.assert_close(folded, direct)


def test_sequence_log_weight_counts_dropped_tokens_as_one():
    weight = torch.tensor([[2.0, 0.0, 0.5]])
    keep = torch.tensor([[True, False, True]])
    assert sequence_log_weight(weight, keep).tolist() == pytest.approx([0.0])


# ------------------------------------------------------------ TRL 1.16's own loss, same tensors


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x

    def gather_for_metrics(self, x):
        return x


def trl_loss(loss_type, logp, old, adv, mask, c, is_ratio=None, level="token"):
    """TRL's ``GRPOTrainer._compute_loss`` on these log-probs: the model's forward is replaced by
    ``logp``; one process, no accumulation, no KL, no entropy bonus."""
    trl = pytest.importorskip("trl")
    from trl import GRPOTrainer

    assert trl.__version__ == "1.16.0"
    n, t = logp.shape
    args = SimpleNamespace(delta=None, sapo_temperature_pos=c.sapo_tau_pos,
                           sapo_temperature_neg=c.sapo_tau_neg, vespo_k_pos=c.vespo_k_pos,
                           vespo_lambda_pos=c.vespo_lambda_pos, vespo_k_neg=c.vespo_k_neg,
                           vespo_lambda_neg=c.vespo_lambda_neg, steps_per_generation=1)
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, beta=0.0,
        importance_sampling_level=level, loss_type=loss_type, epsilon_low=c.eps_low,
        epsilon_high=c.eps_high, args=args, get_gamma_weights=GRPOTrainer.get_gamma_weights,
        use_vllm=is_ratio is not None, vllm_importance_sampling_correction=is_ratio is not None,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        accelerator=_Accelerator(), _entropy_bonus_enabled=False, aux_loss_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)))
    inputs = {"prompt_ids": torch.zeros(n, 1, dtype=torch.long),
              "prompt_mask": torch.ones(n, 1, dtype=torch.long),
              "completion_ids": torch.zeros(n, t, dtype=torch.long),
              "completion_mask": mask.long(), "advantages": adv, "old_per_token_logps": old,
              "num_items_in_batch": mask.sum()}
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    return GRPOTrainer._compute_loss(stub, None, inputs), stub._metrics["train"]


def random_batch(seed, n=6, t=7, spread=0.6):
    """Random log-probs, uneven lengths (every row ≥ 1 valid token), finite padding (TRL
    computes log-probs there too), advantages of both signs."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]  # (N, T)
    logp = (-torch.rand(n, t, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    delta = (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5) * spread
    old = logp.detach() - delta
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    return logp, old, adv, mask


# (TRL's loss_type, explorl's aggregation as TRL normalises it, TRL's importance_sampling_level)
TRL_SETTINGS = {"sapo": ("seq-mean-token-mean", "token"),
                "luspo": ("seq-mean-token-sum", "sequence"),
                "vespo": ("token-mean", "token")}


@pytest.mark.parametrize("seed", [0, 2])
@pytest.mark.parametrize("loss", sorted(TRL_SETTINGS))
def test_equals_trls_loss_in_value_and_gradient(loss, seed):
    agg, level = TRL_SETTINGS[loss]
    # eps 0.02/0.03 on LUSPO's sequence ratio clips some responses and not others
    c = cfg(agg=agg, eps_low=0.02, eps_high=0.03, sapo_tau_pos=1.3, sapo_tau_neg=1.7,
            vespo_k_pos=1.5, vespo_lambda_pos=2.5, vespo_k_neg=2.5, vespo_lambda_neg=1.5)
    logp, old, adv, mask = random_batch(seed)
    expected, metrics = trl_loss(loss, logp, old, adv, mask, c, level=level)
    g_trl = grad(expected, logp) * mask
    per_tok, m = LOSSES[loss](logp, old, adv, mask, c)
    got = aggregate(per_tok, mask, agg)
    torch.testing.assert_close(got, expected.detach())
    torch.testing.assert_close(grad(got, logp), g_trl)
    if loss == "luspo":
        assert 0 < m["loss/clip_frac"].item() < 1
    if loss == "vespo":  # TRL: a mean over responses; ours: over tokens (each response × length)
        from trl import GRPOTrainer

        phi = GRPOTrainer.get_gamma_weights(adv[:, None], logp.detach() - old, mask, None,
                                            1.5, 2.5, 2.5, 1.5)[:, 0]  # (N,)
        assert metrics["vespo/phi_seq_mean"][0] == pytest.approx(phi.mean().item())
        lengths = mask.sum(-1)
        assert m["loss/vespo_phi_mean"].item() == pytest.approx(
            ((phi * lengths).sum() / lengths.sum()).item())


def test_vespo_with_the_truncated_behaviour_weight_equals_trls():
    """TRL folds its vLLM token-truncate weight into VESPO's W; so does explorl's update
    (``sequence_log_weight`` of the §7a correction)."""
    c = cfg()
    logp, old, adv, mask = random_batch(3)
    gen = torch.Generator().manual_seed(7)
    ell = (torch.rand(old.shape, generator=gen, dtype=torch.float64) - 0.3) * 0.8
    engine = old - ell
    corr = rollout_correction(old, engine, mask, "token-truncate", upper=1.3)
    assert (corr.weight[mask] == 1.3).any() and (corr.weight[mask] < 1.3).any()
    is_ratio = torch.where(mask, corr.weight, torch.ones_like(corr.weight))  # TRL: 1 on padding
    expected, _ = trl_loss("vespo", logp, old, adv, mask, c, is_ratio=is_ratio)
    g_trl = grad(expected, logp) * mask
    per_tok, _ = vespo_loss(logp, old, adv, mask, c,
                            behaviour_log_weight=sequence_log_weight(corr.weight, corr.keep))
    got = aggregate(per_tok, mask, "token-mean")
    torch.testing.assert_close(got, expected.detach())
    torch.testing.assert_close(grad(got, logp), g_trl)


def test_their_metrics_are_documented():
    import re

    from test_trainer import _documented_metric_patterns

    patterns = [re.compile(p + "$") for p in _documented_metric_patterns()]
    logp, old, adv, mask = random_batch(4)
    for name in ("sapo", "luspo", "vespo"):
        _, m = LOSSES[name](logp, old, adv, mask, cfg(agg=REQUIRED_AGG.get(name, "token-mean")))
        assert all(any(p.match(k) for p in patterns) for k in m), (name, sorted(m))


def _token_correction(seed, old, mask, upper=1.3):
    gen = torch.Generator().manual_seed(seed)
    ell = (torch.rand(old.shape, generator=gen, dtype=torch.float64) - 0.3) * 0.8
    return rollout_correction(old, old - ell, mask, "token-truncate", upper=upper)


@pytest.mark.parametrize("seed", [3, 5])
def test_luspo_with_a_token_level_correction_takes_trls_response_mean_weight(seed):
    """TRL multiplies LUSPO's (B, 1) sequence loss by its (B, T) vLLM token ratio: each response's
    loss is Σ_t w_t·ℓ_i, and every token's gradient is weighted by mean_t w_t. explorl takes the
    correction the same way (``take_correction``: ``response_mean_weight``); weighting each
    token by its own w_t would give the same value but another gradient."""
    c = cfg(eps_low=0.02, eps_high=0.03)
    logp, old, adv, mask = random_batch(seed)
    corr = _token_correction(seed, old, mask)
    assert (corr.weight[mask] == 1.3).any() and (corr.weight[mask] < 1.3).any()
    is_ratio = torch.where(mask, corr.weight, torch.ones_like(corr.weight))  # TRL: 1 on padding
    expected, _ = trl_loss("luspo", logp, old, adv, mask, c, is_ratio=is_ratio, level="sequence")
    g_trl = grad(expected, logp) * mask
    w, keep, extra = take_correction("luspo", corr.weight, corr.keep, mask)
    assert extra == {}
    per_tok, m = luspo_loss(logp, old, adv, mask, c)
    assert 0 < m["loss/clip_frac"].item() < 1
    got = aggregate(per_tok * w, mask & keep, "seq-mean-token-sum")
    torch.testing.assert_close(got, expected.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad(got, logp), g_trl, rtol=1e-12, atol=1e-12)
    # the per-token form: the same value, a different gradient
    per_tok, _ = luspo_loss(logp, old, adv, mask, c)
    naive = aggregate(per_tok * corr.weight, mask & corr.keep, "seq-mean-token-sum")
    torch.testing.assert_close(naive, expected.detach(), rtol=1e-12, atol=1e-12)
    assert (grad(naive, logp) - g_trl).abs().max() > 1e-2


def test_response_mean_weight_by_hand():
    # w = [1.5, 0 (masked), 0.5 | padding]: w̄ = (1.5 + 0.5)/3 on all three valid tokens, which
    # all stay; a response that keeps no token leaves with weight 0.
    weight = torch.tensor([[1.5, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    keep = torch.tensor([[True, False, True, False], [False, False, False, False]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    w, k = response_mean_weight(weight, keep, mask)
    torch.testing.assert_close(w, torch.tensor([[2 / 3, 2 / 3, 2 / 3, 0.0], [0.0] * 4],
                                               dtype=torch.float64))
    assert k.tolist() == [[True, True, True, False], [False] * 4]


def test_take_correction_forms():
    logp, old, adv, mask = random_batch(1)
    corr = _token_correction(1, old, mask)
    for loss in ("ppo", "sapo", "gspo", "cispo"):  # per token (GSPO: verl's GSPO-token form)
        w, keep, extra = take_correction(loss, corr.weight, corr.keep, mask)
        assert w is corr.weight and keep is corr.keep and extra == {}
    w, keep, extra = take_correction("vespo", corr.weight, corr.keep, mask)
    assert w is None and keep is corr.keep
    torch.testing.assert_close(extra["behaviour_log_weight"],
                               sequence_log_weight(corr.weight, corr.keep))


def test_gspo_with_a_token_level_correction_keeps_verls_per_token_form():
    """GSPO follows verl's ``compute_policy_loss_gspo`` (each token's loss times its own w_t);
    TRL's ``importance_sampling_level="sequence"`` weights the response by its mean w. Same
    value, different gradient: the documented difference."""
    c = cfg(agg="seq-mean-token-mean", eps_low=0.02, eps_high=0.03)
    logp, old, adv, mask = random_batch(3)
    corr = _token_correction(3, old, mask)
    is_ratio = torch.where(mask, corr.weight, torch.ones_like(corr.weight))
    expected, _ = trl_loss("grpo", logp, old, adv, mask, c, is_ratio=is_ratio, level="sequence")
    g_trl = grad(expected, logp) * mask
    per_tok, _ = gspo_loss(logp, old, adv, mask, c)
    got = aggregate(per_tok * corr.weight, mask, "seq-mean-token-mean")
    torch.testing.assert_close(got, expected.detach(), rtol=1e-12, atol=1e-12)
    g = grad(got, logp)
    assert (g - g_trl).abs().max() > 1e-4
    # verl's form by hand: token t of response i gets −A_i·s_i·w_t/|o_i| (unclipped responses)
    s = torch.exp(((logp.detach() - old) * mask).sum(-1) / mask.sum(-1))
    inside = ((s > 1 - 0.02) & (s < 1 + 0.03)) | ((s <= 1 - 0.02) & (adv > 0)) | (
        (s >= 1 + 0.03) & (adv < 0))
    want = -adv[:, None] * s[:, None] * corr.weight / mask.sum(-1, keepdim=True) / mask.shape[0]
    want = torch.where(mask & inside[:, None], want, torch.zeros_like(want))
    torch.testing.assert_close(g, want, rtol=1e-12, atol=1e-12)


def test_vespo_lower_clamp_matches_trls_where_it_decides_the_weight(monkeypatch):
    """Responses the policy has all but abandoned, log W ≈ −30 < log 1e-8: φ is
    e^λ·(1e-8)^k ≈ 1e-15 only because of the clamp (e^{−57} without it). The values are ~1e-15,
    far below pytest's absolute tolerance, so the comparison is relative (atol = 0)."""
    logp, old, adv, mask = random_batch(6)
    mask = torch.ones_like(mask)  # every row 7 tokens
    old = logp.detach() + 30.0 / 7 + (torch.rand(old.shape, dtype=torch.float64) - 0.5) * 0.1
    c = cfg()
    expected, _ = trl_loss("vespo", logp, old, adv, mask, c)
    g_trl = grad(expected, logp)

    def ours():
        per_tok, m = vespo_loss(logp, old, adv, mask, c)
        got = aggregate(per_tok, mask, "token-mean")
        return got, grad(got, logp), m

    got, g, m = ours()
    assert 1e-17 < m["loss/vespo_phi_mean"].item() < 1e-12
    torch.testing.assert_close(got, expected.detach(), rtol=1e-9, atol=0)
    torch.testing.assert_close(g, g_trl, rtol=1e-9, atol=0)
    import explorl.algorithms.sequence_losses as L

    monkeypatch.setattr(L, "VESPO_LOG_W_MIN", -math.inf)  # the clamp removed: the test fails
    got, g, _ = ours()
    with pytest.raises(AssertionError):
        torch.testing.assert_close(g, g_trl, rtol=1e-9, atol=0)
    assert (g.abs().max() / g_trl.abs().max()).item() < 1e-6


def test_luspos_entropy_bonus_is_the_token_mean(make_config, tmp_path):
    """The entropy bonus under LUSPO is TRL's token mean of H over the mini-batch, not the
    per-response token sum of its policy term (which would multiply α by the mean length); under
    a loss with agg seq-mean-token-sum that names it itself (ppo), it follows that agg (verl)."""
    from explorl.training.loop import Trainer

    out = {}
    for loss in ("luspo", "ppo"):
        cfg = make_config({"max_steps": 1, "eval": {"every": 0}, "optim": {"mini_batches": 1},
                           "algorithm": {"loss": loss, "entropy_coef": 0.01,
                                         "agg": "seq-mean-token-sum"}})
        out[loss] = Trainer(cfg, tmp_path / loss).train_step()
    m = out["luspo"]
    # one mini-batch, on policy: the update's entropies are the sampling pass's
    assert m["loss/entropy_bonus"] == pytest.approx(m["entropy/mean"], rel=1e-4)
    p = out["ppo"]
    assert p["response/length_mean"] > 1.5
    assert p["loss/entropy_bonus"] == pytest.approx(
        p["entropy/mean"] * p["response/length_mean"], rel=1e-4)


@pytest.mark.parametrize("loss", sorted(TRL_SETTINGS))
def test_an_empty_row_leaves_explorls_response_denominator_and_stays_in_trls(loss):
    """A row with no valid token (overlong filtering, a dropped response): explorl divides the
    per-response modes by the responses that have a token (verl), TRL's ``.mean()`` by every
    row, so explorl's loss is TRL's × N / N_nonempty; token-mean (VESPO) divides by tokens in
    both and is equal."""
    agg, level = TRL_SETTINGS[loss]
    c = cfg(agg=agg, eps_low=0.02, eps_high=0.03)
    logp, old, adv, mask = random_batch(2)
    mask = mask.clone()
    mask[1] = False  # 6 rows, 5 with a token
    expected, _ = trl_loss(loss, logp, old, adv, mask, c, level=level)
    g_trl = grad(expected, logp) * mask
    per_tok, _ = LOSSES[loss](logp, old, adv, mask, c)
    got = aggregate(per_tok, mask, agg)
    scale = 1.0 if agg == "token-mean" else 6 / 5
    torch.testing.assert_close(got, expected.detach() * scale, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(grad(got, logp), g_trl * scale, rtol=1e-6, atol=1e-12)
