"""The knob contract (docs/methods/combining.md §7d): every knob a controller moves reaches the
loss.

The matrix runs every controller actuator × every loss × the advantage settings that take a
knob (the KL in the reward): either the config is refused, or moving the knob changes the
update's gradient on one fixed batch, through the trainer's own ``PolicyUpdate.run`` (and
``step_advantages`` for the reward side). It would have caught Entropy Scheduling's eps_high
steering CISPO, which never reads it.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from test_control_eepo import tiny_llama

from explorl import config as C
from explorl import validation
from explorl.algorithms import LOSSES, LossParams
from explorl.algorithms.contract import LOSS_KNOBS, UPDATE_READS, knobs_read
from explorl.algorithms.losses import READS, REQUIRED_AGG, SELECTORS
from explorl.control import Knobs
from explorl.control.contract import controller_writes
from explorl.rollout.types import Rollouts
from explorl.training.advantages import step_advantages
from explorl.training.batch import StepBatch, response_stats
from explorl.training.distributed import LogProbModule, Single
from explorl.training.update import PolicyUpdate

N, P, T, VOCAB = 4, 2, 4, 16  # responses, prompt and response tokens, the tiny model's vocab

# (controller, actuator) pairs: every knob a controller can write that acts on the update.
WRITERS = [("adaptive", "eps_high"), ("adaptive", "entropy_coef"), ("adaptive", "kl_coef"),
           ("adaptive", "temperature"), ("entropy_coef", "entropy_coef"),
           ("entropic", "pos_neg_weight"), ("temperature", "temperature")]
# Advantage settings; the KL in the reward makes kl_coef an advantage-side knob.
ADVANTAGES = [{"advantage": "grpo"}, {"advantage": "grpo", "kl_in_reward": True},
              {"advantage": "reinforce_plus_plus", "kl_in_reward": True},
              {"advantage": "passk_training", "passk_k": 2, "kl_in_reward": True}]
# Two values of each knob, far enough apart to matter on the batch below.
VALUES = {"eps_high": (0.05, 0.5), "entropy_coef": (0.0, 0.1), "kl_coef": (0.0, 0.5),
          "temperature": (1.0, 0.7), "pos_neg_weight": (0.0, 0.5)}


def _config(controller: str, actuator: str, loss: str, adv: dict) -> C.RunConfig:
    algorithm = {"loss": loss, **adv}
    if loss in REQUIRED_AGG:
        algorithm["agg"] = REQUIRED_AGG[loss]
    if adv.get("kl_in_reward") and actuator != "kl_coef":
        algorithm["kl_coef"] = 0.1  # the KL in the reward needs a coefficient
    section = {"enabled": True}
    if controller == "adaptive":
        section["actuator"] = actuator
    if controller == "entropic":
        section["p_min"] = 0.05  # the random tiny model's tokens have p ≈ 1/16
    data = {"rollout": {"n_samples": N, "max_response_len": T}, "algorithm": algorithm,
            "optim": {"max_grad_norm": 0.0, "mini_batches": 1},
            "control": {controller: section}}
    return validation.from_dict(data, env=False)



@pytest.fixture(scope="module")
def batch():
    """Fixed rollouts: one prompt × 4 responses (a group of 2 would make GRPO's advantages ±1/√2
    whatever the KL penalty in the reward); old_logp = the policy's logp shifted per row so
    the ratios sit inside and outside every clip the matrix tries; rewards [1, 0, 1, 0]."""
    policy, ref = tiny_llama(0), tiny_llama(1)
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, VOCAB, (N, P), generator=g)
    response_ids = torch.randint(3, VOCAB, (N, T), generator=g)
    mask = torch.ones(N, T, dtype=torch.bool)
    mask[3, 3] = False
    with torch.no_grad():
        logp, ent = LogProbModule(policy)(prompt_ids, torch.ones(N, P, dtype=torch.bool),
                                          response_ids, mask, 1.0)
    shift = torch.tensor([[-0.2], [0.15], [-0.35], [0.3]])  # ratio e^{−shift}: 1.22, .86, 1.42, .74
    jitter = torch.linspace(-0.1, 0.1, T)[None, :]
    ro = Rollouts(prompt_ids=prompt_ids, prompt_mask=torch.ones(N, P, dtype=torch.bool),
                  response_ids=response_ids, response_mask=mask,
                  old_logp=torch.where(mask, logp + shift + jitter, 0.0),
                  entropy=ent, prompt_index=torch.zeros(N, dtype=torch.long), texts=[""] * N,
                  truncated=torch.tensor([False, False, False, True]))
    score = torch.tensor([1.0, 0.0, 1.0, 0.0])
    return policy, ref, ro, score


def _step_batch(ro: Rollouts, score: torch.Tensor) -> StepBatch:
    rows = response_stats(ro, score, score.clone(), 0)
    return StepBatch(rows=rows, local=torch.arange(N), prompt_indices=[0], prompt_correct=[2.0],
                     prompt_samples=[N], epoch=0, epoch_end=False)


def update_delta(cfg: C.RunConfig, batch, knobs: Knobs) -> torch.Tensor:
    """One trainer update (advantages, then ``PolicyUpdate.run``) with plain SGD at lr 1 on a copy
    of the policy: returns the parameter change, i.e. −(the update's gradient)."""
    policy, ref, ro, score = batch
    policy = copy.deepcopy(policy)
    before = torch.cat([p.detach().flatten().clone() for p in policy.parameters()])
    dist = Single("cpu")
    scorer = dist.wrap(LogProbModule(policy))
    opt = torch.optim.SGD(scorer.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    upd = PolicyUpdate(cfg, scorer, opt, sched, ref, dist, torch.Generator().manual_seed(1),
                       torch.Generator().manual_seed(2), pad_id=0)
    sb = _step_batch(ro, score)
    upd.reward_kl(ro, sb, knobs.temperature)  # as the loop: only with kl_in_reward
    adv, _ = step_advantages(cfg.algorithm, sb, ro, dist, knobs.kl_coef)
    upd.run(ro, adv, knobs, sb)
    return torch.cat([p.detach().flatten() for p in policy.parameters()]) - before


def base_knobs(cfg: C.RunConfig) -> Knobs:
    a = cfg.algorithm
    return Knobs(temperature=1.0, eps_high=a.eps_high, entropy_coef=a.entropy_coef,
                 kl_coef=a.kl_coef, n_samples=N, max_response_len=T)


CASES = [(c, k, loss, i) for c, k in WRITERS for loss in LOSSES for i in range(len(ADVANTAGES))]


@pytest.mark.parametrize("controller, knob, loss, adv_i", CASES)
def test_every_knob_a_controller_moves_reaches_the_loss(batch, controller, knob, loss, adv_i):
    try:
        cfg = _config(controller, knob, loss, ADVANTAGES[adv_i])
    except C.ConfigError as e:  # refused: the message names the controller or the dead setting
        assert f"control.{controller}" in str(e) or "algorithm.kl_in_reward" in str(e)
        return
    lo, hi = VALUES[knob]
    base = base_knobs(cfg)
    d_lo = update_delta(cfg, batch, dataclasses.replace(base, **{knob: lo}))
    d_hi = update_delta(cfg, batch, dataclasses.replace(base, **{knob: hi}))
    assert torch.isfinite(d_lo).all() and torch.isfinite(d_hi).all()
    assert (d_lo - d_hi).abs().max() > 1e-6, (
        f"control.{controller} moves {knob} but the update of loss {loss!r} with "
        f"{ADVANTAGES[adv_i]} does not change: the config should have refused it")


def _accepted(controller, knob, loss, adv):
    try:
        _config(controller, knob, loss, adv)
        return True
    except C.ConfigError:
        return False


def test_the_matrix_is_not_vacuous_and_refuses_exactly_the_dead_combinations():
    accepted = {(c, k, loss, i) for c, k, loss, i in CASES
                if _accepted(c, k, loss, ADVANTAGES[i])}
    refused = set(CASES) - accepted
    assert len(accepted) > len(refused)
    dead = {(c, k, loss, i) for c, k, loss, i in CASES
            if (k == "eps_high" and loss in ("cispo", "kl_cov", "sapo", "vespo"))
            or (k == "kl_coef" and ADVANTAGES[i]["advantage"] == "passk_training")
            or ADVANTAGES[i]["advantage"] == "passk_training"}  # KL in the reward never reaches it
    assert refused == dead


def test_losses_without_eps_high_refuse_adaptive_clip_higher_in_one_line():
    for loss, why in (("cispo", "cispo_w_max"), ("kl_cov", "no PPO clip"),
                      ("sapo", "no clip bounds.*sapo_tau_pos/neg"),
                      ("vespo", "no clip bounds.*vespo_k_")):
        pattern = (rf"control\.adaptive.*eps_high.*{loss}.*{why}"
                   r".*would work: entropy_coef, kl_coef, temperature")
        with pytest.raises(C.ConfigError, match=pattern):
            _config("adaptive", "eps_high", loss, {"advantage": "grpo"})


@pytest.mark.parametrize("loss, eps", [("gspo", (3e-4, 4e-4)), ("luspo", (3e-4, 4e-4)),
                                       ("clip_cov", (1.0, 1.0))])
def test_adaptive_eps_high_cannot_replace_the_losss_own_scale(loss, eps):
    """GSPO's and LUSPO's 4e-4 and Clip-Cov's 1.0 would become 0.28 silently: refused; on the
    loss's scale (init/min/max set) the controller is accepted and starts from its init."""
    algorithm = {"loss": loss, "eps_low": eps[0], "eps_high": eps[1]}
    if loss in REQUIRED_AGG:
        algorithm["agg"] = REQUIRED_AGG[loss]
    data = {"algorithm": algorithm, "control": {"adaptive": {"enabled": True}}}
    with pytest.raises(C.ConfigError, match=rf"replace algorithm.eps_high = {eps[1]}"):
        validation.from_dict(copy.deepcopy(data), env=False)
    data["control"]["adaptive"].update(init=eps[1], min=eps[1] / 2, max=eps[1] * 2,
                                       delta=eps[1] / 10)
    validation.from_dict(data, env=False)


def test_entropy_coef_controller_cannot_replace_the_recipes_bonus():
    with pytest.raises(C.ConfigError, match="control.entropy_coef.*algorithm.entropy_coef = 0.01"):
        validation.from_dict({"algorithm": {"entropy_coef": 0.01},
                     "control": {"entropy_coef": {"enabled": True}}}, env=False)


def test_kl_settings_nothing_reads_are_refused():
    with pytest.raises(C.ConfigError, match="algorithm.kl_in_reward.*kl_coef is 0"):
        validation.from_dict({"algorithm": {"kl_in_reward": True}}, env=False)
    with pytest.raises(C.ConfigError, match="algorithm.kl_estimator.*zero expected gradient"):
        validation.from_dict({"algorithm": {"kl_coef": 0.1, "kl_estimator": "k1"}}, env=False)
    with pytest.raises(C.ConfigError, match="algorithm.kl_estimator"):  # a controller on kl_coef
        validation.from_dict({"algorithm": {"kl_estimator": "k1"},
                     "control": {"adaptive": {"enabled": True, "actuator": "kl_coef"}}},
                    env=False)
    # k1 in the reward is the usual PPO-RLHF penalty: accepted
    validation.from_dict(
        {"algorithm": {"kl_coef": 0.1, "kl_estimator": "k1", "kl_in_reward": True}}, env=False)


# ------------------------------------------------------------ the declarations match the code


class _Recorder:
    """A LossParams stand-in that records every field a loss reads."""

    def __init__(self, params: LossParams) -> None:
        object.__setattr__(self, "_p", params)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._p, name)


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_reads_declares_exactly_what_each_loss_touches(loss):
    a = C.AlgorithmConfig(loss=loss, cispo_mask=True, clip_c=3.0 if loss == "ppo" else None,
                          agg=REQUIRED_AGG.get(loss, "token-mean"))
    knobs = Knobs(temperature=1.0, eps_high=0.3, entropy_coef=0.0, kl_coef=0.0, n_samples=2,
                  max_response_len=4)
    rec = _Recorder(LossParams.build(a, knobs))
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 5, generator=g) - 0.1
    old = logp + 0.3 * torch.randn(3, 5, generator=g)
    adv, mask = torch.tensor([1.0, -1.0, 0.5]), torch.ones(3, 5, dtype=torch.bool)
    LOSSES[loss](logp, old, adv, mask, rec, generator=torch.Generator().manual_seed(0))
    if loss in SELECTORS:
        SELECTORS[loss](logp, old, adv, mask, rec, generator=torch.Generator().manual_seed(0))
    assert rec.read == READS[loss]


def test_loss_params_are_built_from_the_config_and_the_knobs():
    a = C.AlgorithmConfig(eps_high=0.2, entropy_coef=0.0, kl_coef=0.3, cispo_w_max=5.0)
    knobs = Knobs(temperature=0.7, eps_high=0.33, entropy_coef=0.01, kl_coef=0.05, n_samples=2,
                  max_response_len=4, pos_neg_weight=-0.2)
    p = LossParams.build(a, knobs)
    assert (p.eps_high, p.entropy_coef, p.kl_coef, p.temperature, p.pos_neg_weight) == (
        0.33, 0.01, 0.05, 0.7, -0.2)  # the knobs win: they are what controllers move
    assert (p.cispo_w_max, p.eps_low, p.agg) == (5.0, a.eps_low, "token-mean")  # ppo's own agg
    for loss, agg in (("sapo", "seq-mean-token-mean"), ("luspo", "seq-mean-token-sum"),
                      ("gspo", "seq-mean-token-mean"), ("vespo", "token-mean")):
        assert LossParams.build(dataclasses.replace(a, loss=loss), knobs).agg == agg
    assert LossParams.build(dataclasses.replace(a, loss="sapo", agg="token-mean"),
                            knobs).agg == "token-mean"  # the recipe's, when it sets one
    assert LossParams.build(dataclasses.replace(a, kl_in_reward=True), knobs).kl_coef == 0.0
    assert set(LOSS_KNOBS) <= {f.name for f in dataclasses.fields(LossParams)}
    assert UPDATE_READS <= {f.name for f in dataclasses.fields(LossParams)}


def test_knobs_read_and_controller_writes():
    a = C.AlgorithmConfig(loss="cispo")
    assert "eps_high" not in knobs_read(a) and "entropy_coef" in knobs_read(a)
    assert "eps_high" in knobs_read(C.AlgorithmConfig(loss="gspo"))
    assert "eps_high" in knobs_read(C.AlgorithmConfig(loss="luspo"))
    for loss in ("sapo", "vespo"):  # no clip bounds; every other knob reaches them
        assert knobs_read(C.AlgorithmConfig(loss=loss)) == set(LOSS_KNOBS) - {"eps_high"}
    passk = C.AlgorithmConfig(advantage="passk_training", kl_in_reward=True)
    assert "kl_coef" not in knobs_read(passk)
    assert "kl_coef" in knobs_read(dataclasses.replace(passk, advantage="grpo"))
    cfg = C.RunConfig()
    cfg.control.adaptive.enabled, cfg.control.adaptive.actuator = True, "temperature"
    cfg.control.budget.enabled = True
    assert controller_writes(cfg) == {"budget": ("budgets",), "adaptive": ("temperature",)}


# ---------------------------------------------- corrections in the update path (§7c), by hand


def _on_policy(batch):
    """The fixed batch with old_logp = the policy's own logp (ratio exactly 1, so PPO's
    per-token loss is −A) and lengths [4, 4, 4, 3]; row 3 is truncated."""
    policy, ref, ro, score = batch
    with torch.no_grad():
        logp, _ = LogProbModule(policy)(ro.prompt_ids, ro.prompt_mask, ro.response_ids,
                                        ro.response_mask, 1.0, with_entropy=False)
    return dataclasses.replace(ro, old_logp=torch.where(ro.response_mask, logp, 0.0))


def _policy_loss(batch, ro, algorithm: dict, adv: torch.Tensor) -> float:
    policy, ref, _, score = batch
    cfg = validation.from_dict({"rollout": {"n_samples": N, "max_response_len": T},
                       "algorithm": algorithm}, env=False)
    dist = Single("cpu")
    scorer = dist.wrap(LogProbModule(copy.deepcopy(policy)))
    opt = torch.optim.SGD(scorer.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    upd = PolicyUpdate(cfg, scorer, opt, sched, None, dist, torch.Generator(), torch.Generator(),
                       pad_id=0)
    _, sums = upd.run(ro, adv, base_knobs(cfg), _step_batch(ro, score))
    return float(sums["loss/policy"])


def test_mask_truncated_leaves_the_loss_and_its_denominators(batch):
    ro = _on_policy(batch)
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])  # lengths [4, 4, 4, 3], row 3 truncated
    # token-mean: −Σ A_i·L_i / Σ L_i. All rows: −(4 − 4 + 2 + 6)/15; kept: −(4 − 4 + 2)/12
    assert _policy_loss(batch, ro, {}, adv) == pytest.approx(-8 / 15, abs=1e-6)
    assert _policy_loss(batch, ro, {"mask_truncated": True}, adv) == pytest.approx(-2 / 12,
                                                                                   abs=1e-6)
    # seq-mean-token-mean: mean over kept responses of −A: −(1 − 1 + .5)/3 (not /4)
    got = _policy_loss(batch, ro, {"mask_truncated": True, "agg": "seq-mean-token-mean"}, adv)
    assert got == pytest.approx(-0.5 / 3, abs=1e-6)
    # seq-mean-token-sum: Σ_i Σ_t (−A_i) / N_seq over kept ones: −(4 − 4 + 2)/3
    got = _policy_loss(batch, ro, {"mask_truncated": True, "agg": "seq-mean-token-sum"}, adv)
    assert got == pytest.approx(-2 / 3, abs=1e-6)


def test_mask_truncated_keeps_truncated_responses_in_the_advantages(batch):
    _, _, ro, score = batch
    a = C.AlgorithmConfig(mask_truncated=True)
    adv, _ = step_advantages(a, _step_batch(ro, score), ro, Single("cpu"))
    plain, _ = step_advantages(C.AlgorithmConfig(), _step_batch(ro, score), ro, Single("cpu"))
    torch.testing.assert_close(adv, plain)  # the group's statistics still count row 3
    assert adv[3] != 0


def test_kl_in_reward_by_hand(batch):
    """R − β·Σ_t kl_t: rewards [1, 0, 1, 0], Σ kl [2, .5, 0, 1], β = .1 → [.8, −.05, 1, −.1];
    kl_sum is Σ over valid tokens of k(old_logp, ref_logp) from the reference's forward."""
    policy, ref, ro, score = batch
    a = C.AlgorithmConfig(kl_in_reward=True, kl_coef=0.1, advantage="dr_grpo")
    sb = _step_batch(ro, score)
    sb.rows.kl_sum = torch.tensor([2.0, 0.5, 0.0, 1.0], dtype=torch.float64)
    adv, m = step_advantages(a, sb, ro, Single("cpu"), kl_coef=0.1)
    r = torch.tensor([0.8, -0.05, 1.0, -0.1])
    torch.testing.assert_close(adv, r - r.mean())  # dr_grpo: one group, r − mean
    assert m["kl/reward_penalty_mean"] == pytest.approx(3.5 / 4)
    # the sums from the reference's forward, per response over its valid tokens
    cfg = validation.from_dict({"rollout": {"n_samples": N, "max_response_len": T},
                       "algorithm": {"kl_in_reward": True, "kl_coef": 0.1,
                                     "kl_estimator": "k1"}}, env=False)
    dist = Single("cpu")
    upd = PolicyUpdate(cfg, dist.wrap(LogProbModule(policy)), None, None, ref, dist,
                       torch.Generator(), torch.Generator(), pad_id=0)
    sb = _step_batch(ro, score)
    upd.reward_kl(ro, sb, 1.0)
    with torch.no_grad():
        ref_logp, _ = LogProbModule(ref)(ro.prompt_ids, ro.prompt_mask, ro.response_ids,
                                         ro.response_mask, 1.0, with_entropy=False)
    k1 = ((ro.old_logp - ref_logp) * ro.response_mask).sum(-1).double()
    torch.testing.assert_close(sb.rows.kl_sum, k1)


# ------------------- SAPO, LUSPO, VESPO with the rollout correction / decoupled PPO (§7a, §8)
# old_logp is π_prox (the trainer's weights before the update), engine_logp μ (the weights or
# engine that sampled); the correction's token weight is w = π_prox/μ.

ELL = torch.tensor([0.1, -0.2, 0.3, 0.0])  # log π_prox/μ per row, the same on each token


def _behaviour(ro, ell=ELL):
    return dataclasses.replace(ro, engine_logp=torch.where(ro.response_mask,
                                                           ro.old_logp - ell[:, None], 0.0))


def _truncate():
    """``auto``: token-truncate at 2 when the rollouts carry the sampler's log-probs (ℓ ≤ 0.3
    here, so nothing is truncated)."""
    return {"rollout_correction": {"mode": "auto"}}


def test_sapo_and_luspo_loss_is_weighted_by_the_behaviour_weight_per_token(batch):
    """On policy (ratio π_θ/π_prox = 1) SAPO's per-token loss is −2A/τ; the update multiplies
    it by w = e^ℓ. seq-mean-token-mean over rows A = [1, −1, .5, 2]:
    mean(−2·e^.1, +2/1.05·e^−.2, −1·e^.3, −4·1). LUSPO on policy: s = 1, loss −A per token,
    seq-mean-token-sum: Σ_i −A_i·L_i·w_i / 4 with lengths [4, 4, 4, 3] (LUSPO takes each
    response's mean weight, here its one w_i; tests/test_algorithms_sapo_luspo_vespo.py has
    tokens of one response with different weights)."""
    ro = _behaviour(_on_policy(batch))
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])
    e = math.exp
    sapo = _policy_loss(batch, ro, {"loss": "sapo", "agg": "seq-mean-token-mean", **_truncate()},
                        adv)
    assert sapo == pytest.approx((-2 * e(0.1) + 2 / 1.05 * e(-0.2) - e(0.3) - 4) / 4, abs=1e-5)
    luspo = _policy_loss(batch, ro, {"loss": "luspo", "agg": "seq-mean-token-sum", **_truncate()},
                         adv)
    assert luspo == pytest.approx((-4 * e(0.1) + 4 * e(-0.2) - 2 * e(0.3) - 6) / 4, abs=1e-5)


def test_vespo_folds_the_behaviour_weight_into_w_instead(batch):
    """VESPO on policy: W_i = Π_t w_t = e^{L_i·ℓ_i} (lengths [4, 4, 4, 3]), φ_i = W^k·e^{λ(1−W)},
    per-token loss −φ_i·A_i·logp_t, token-mean over 15 tokens; its loss is *not* multiplied by
    w again."""
    ro = _behaviour(_on_policy(batch))
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])
    got = _policy_loss(batch, ro, {"loss": "vespo", **_truncate()}, adv)
    lengths = ro.response_mask.sum(-1).tolist()
    assert lengths == [4, 4, 4, 3]
    total = 0.0
    for i, a in enumerate(adv.tolist()):
        w = math.exp(lengths[i] * float(ELL[i]))
        k, lam = (2.0, 3.0) if a >= 0 else (3.0, 2.0)
        phi = w**k * math.exp(lam * (1 - w))
        total += -phi * a * float(ro.old_logp[i][ro.response_mask[i]].sum())
    assert got == pytest.approx(total / 15, rel=1e-5)


def test_vespo_folded_equals_w_measured_against_the_sampler(batch):
    """Untruncated, VESPO's W = π_θ/π_prox · π_prox/μ = π_θ/μ: the same update as old_logp = μ
    with no correction (PPO's clip would differ: it acts on π_θ/π_prox only)."""
    _, _, ro, _ = batch  # off-policy: ratios 0.74–1.42 around each row
    ro = _behaviour(ro, ELL)
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])
    folded = _policy_loss(batch, ro, {"loss": "vespo", **_truncate()}, adv)
    as_old = dataclasses.replace(ro, old_logp=ro.engine_logp, engine_logp=None)
    direct = _policy_loss(batch, as_old, {"loss": "vespo"}, adv)
    assert folded == pytest.approx(direct, rel=1e-5)
    ppo = _policy_loss(batch, ro, {"loss": "ppo", **_truncate()}, adv)
    assert ppo != pytest.approx(_policy_loss(batch, as_old, {"loss": "ppo"}, adv), rel=1e-3)


def test_vespo_refuses_sequence_level_corrections_in_one_line():
    for mode in ("sequence-truncate", "geometric-mask"):
        with pytest.raises(C.ConfigError, match=r"^algorithm\.rollout_correction\.mode: loss "
                           r"'vespo' folds.*token-truncate or token-mask"):
            validation.from_dict({"rollout": {"engine": "vllm"}, "algorithm": {
                "loss": "vespo", "rollout_correction": {"mode": mode}}}, env=False)
    for mode in ("auto", "off", "token-truncate", "token-mask"):
        validation.from_dict({"rollout": {"engine": "vllm"}, "algorithm": {
            "loss": "vespo", "rollout_correction": {"mode": mode}}}, env=False)
    # the other losses take the sequence levels as before
    validation.from_dict({"rollout": {"engine": "vllm"}, "algorithm": {
        "loss": "sapo", "rollout_correction": {"mode": "sequence-truncate"}}}, env=False)
