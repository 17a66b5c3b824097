"""The ``algorithm`` section: advantages, the policy loss and its parameters, KL, rollout
correction (plain data; ``explorl.validation`` checks the names against the registries)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass
class RolloutCorrectionConfig:
    mode: Literal["auto", "off", "token-truncate", "token-mask", "sequence-truncate",
                  "sequence-mask", "geometric-truncate", "geometric-mask"] = "auto"
    """Importance weights for the engine-vs-trainer gap (docs/methods/baseline.md §7a, TIS/MIS): w =
    exp(old_logp − engine log-prob) per token, per sequence (sum of the log-ratios) or geometric
    (their mean); ``truncate`` caps w at ``upper``, ``mask`` drops tokens/sequences with w outside
    [lower, upper] from the policy loss and its denominator. It weights the policy-gradient term of
    every loss (not the entropy bonus or KL). ``auto``: ``token-truncate`` with ``rollout.engine:
    vllm`` or with ``rollout.async`` above staleness 0 (then w = π_prox/μ against the sampler's
    log-probs, docs/rollout-engines.md §8), ``off`` with ``hf`` (one distribution, nothing to
    correct)."""
    upper: float = 2.0
    """C_hi: largest weight kept (truncate) or allowed (mask). Usual: token 1.5–5, sequence 2–10,
    geometric 1.0002–1.001."""
    lower: Optional[float] = None
    """C_lo of the mask modes: smallest weight allowed. None: 1 / upper."""
    veto: Optional[float] = None
    """Veto: a response with any token weight below this (e.g. 1e-4) leaves the loss whatever the
    mode. None: off."""


@dataclass
class AlgorithmConfig:
    advantage: str = "grpo"
    """Advantage estimator: ``grpo``, ``dr_grpo``, ``rloo``, ``grpo_batch_std`` (GRPO with the
    std of the whole batch, TRL's ``scale_rewards="batch"``), ``reinforce_plus_plus`` (plain
    REINFORCE++: rewards whitened over the batch's tokens, no group baseline, verl),
    ``reinforce_plus_plus_baseline`` (group mean first, then token whitening, verl),
    ``reinforce_pp`` (the baseline variant whitened per response); pass@k objectives
    (docs/methods/wider-field.md §6d) ``passk_training`` (Pass@k Training), ``pkpo``, ``pkpo_loo``,
    ``pkpo_loo_minus_one`` (PKPO; the paper recommends the last), ``grpo_passk`` (verl). The pass@k
    ones read the verifier's correctness (``reward.accuracy``'s rule), not the shaped reward."""
    passk_k: int | None = None
    """k of the pass@k estimators that take one (``passk_training``, ``pkpo``, ``pkpo_loo``,
    ``pkpo_loo_minus_one``; required there, unused otherwise). Must be ≤ every group's size
    (rollout.n_samples, and the smallest budget or curriculum count when those change it);
    ``pkpo_loo`` needs k < n. No shared default: pick k below n (e.g. 4 of 8)."""
    adv_eps: float = 1e-6
    """Added to the group std in GRPO normalisation."""
    loss: str = "ppo"
    """Policy loss: ``ppo``, ``clip_cov`` (Clip-Cov), ``kl_cov`` (KL-Cov), ``gspo`` (GSPO; only
    ``agg: seq-mean-token-mean``), ``cispo`` (CISPO), ``sapo`` (SAPO's soft gate), ``luspo``
    (LUSPO: GSPO scaled by length; only ``agg: seq-mean-token-sum``), ``vespo`` (VESPO's
    Gamma-shaped sequence weight), ``aepo`` (PPO whose upper clip keeps a rescaled gradient,
    AEPO's entropy-balanced clipping)."""
    eps_low: float = 0.2
    """PPO lower clip: ratio ≥ 1 − eps_low."""
    eps_high: float = 0.2
    """PPO upper clip: ratio ≤ 1 + eps_high. DAPO's clip-higher uses 0.28."""
    clip_c: Optional[float] = None
    """Dual-clip constant c for negative advantages (3.0 in the dual-clip paper); None = off. Not
    with ``loss: clip_cov`` (rejected: Clip-Cov as published has no dual clip)."""
    clip_cov_ratio: float = 2e-4
    """Clip-Cov: fraction of a mini-batch's valid tokens whose gradient is detached (selected over
    the whole mini-batch, however it is split into micro-batches)."""
    clip_cov_lb: float = 1.0
    """Clip-Cov: lower covariance bound of candidate tokens."""
    clip_cov_ub: float = 5.0
    """Clip-Cov: upper covariance bound of candidate tokens."""
    kl_cov_ratio: float = 2e-3
    """KL-Cov: fraction of a mini-batch's valid tokens (top covariance) that get the KL penalty."""
    kl_cov_coef: float = 1.0
    """KL-Cov: coefficient λ of |logp − old_logp| on the selected tokens."""
    kl_cov_tol: float = 1e-4
    """KL-Cov: |logp − old_logp| up to this counts as 0. The sampler's and the trainer's log-probs
    of one policy differ by float noise (~1e-6 in float32, up to ~1e-2 in bf16), and the gradient
    ±λ of |·| would turn that noise into a push on the first, on-policy update. Raise it for
    bf16."""
    cispo_w_max: float = 1.2
    """CISPO: absolute cap of the stop-gradient importance weight, w = sg(min(ratio, w_max)) (verl's
    example: clip_ratio_high 0.2 → 1.2; TRL recommends 5.0). eps_high is never used by CISPO."""
    cispo_mask: bool = False
    """CISPO: MiniMax-M1 Eq. 6 token mask (drop A > 0 ∧ ratio > w_max and A < 0 ∧ ratio <
    1 − eps_low). Off, as in the paper's main runs."""
    sapo_tau_pos: float = 1.0
    """SAPO: temperature τ of the soft gate (4/τ)·σ(τ(ratio − 1)) for tokens with A > 0 (TRL's
    ``sapo_temperature_pos``; the paper's 1.0). Larger τ: the gradient fades faster off-policy."""
    sapo_tau_neg: float = 1.05
    """SAPO: τ for tokens with A ≤ 0 (TRL's ``sapo_temperature_neg``; the paper's 1.05, above
    τ_pos: negative updates spread over the whole vocabulary, so they fade faster)."""
    vespo_k_pos: float = 2.0
    """VESPO: exponent k of the sequence weight φ(W) = W^k·exp(λ(1 − W)) for responses with
    A ≥ 0 (TRL's default): how hard responses the policy now finds unlikely (W < 1) are damped."""
    vespo_lambda_pos: float = 3.0
    """VESPO: decay λ of φ(W) for responses with A ≥ 0 (TRL's default): how hard W > 1 is damped."""
    vespo_k_neg: float = 3.0
    """VESPO: exponent k of φ(W) for responses with A < 0 (TRL's default)."""
    vespo_lambda_neg: float = 2.0
    """VESPO: decay λ of φ(W) for responses with A < 0 (TRL's default)."""
    entropy_mask_ratio: float | None = None
    """Forking-token mask (Beyond the 80/20 Rule, §6c): keep the policy gradient only on the top ρ
    of a mini-batch's valid tokens by entropy (paper: 0.2), threshold global over every rank; the
    entropy bonus and KL stay unmasked. Entropy: the policy's at the sampling temperature from
    the pass that gave old_logp. None or 0 = off."""
    entropy_mask_renorm: bool = False
    """Forking-token mask: divide by the kept tokens instead of all valid ones (the official code's
    token-mean over kept tokens, ≈ 1/ρ larger steps). Off: denominators unchanged (TRL)."""
    entropy_shaping_alpha: float = 0.0
    """Entropy advantage shaping (Cheng et al. 2025, §6e): A_t += min(α·H_t, |A_t|/κ) after the
    estimator; quoted α = 0.4 with GRPO (0.1 with PPO). 0 = off."""
    entropy_shaping_kappa: float = 2.0
    """Entropy advantage shaping: κ, the cap |A_t|/κ (κ ≥ 1 keeps the sign of A)."""
    aepo_adv_weight: float = 0.0
    """AEPO's entropy-aware advantage (docs/methods/aepo.md): A_t ← A·(1 + w·(H_t − μ)/σ), μ and
    σ over the step's valid tokens, H the policy's entropy at the sampling temperature from the
    pass that gave old_logp; the authors' w = 0.2. 0 = off."""
    agg: Optional[str] = None
    """Loss aggregation over tokens and sequences: ``token-mean``, ``seq-mean-token-mean``,
    ``seq-mean-token-sum`` (verl: each response's token sum, mean over responses) or
    ``seq-mean-token-sum-norm`` (``algorithms.AGG_MODES``). None: the loss's own
    (``seq-mean-token-mean`` for gspo and sapo, ``seq-mean-token-sum`` for luspo, ``token-mean``
    for the others); gspo and luspo refuse any other."""
    mask_truncated: bool = False
    """Overlong filtering (DAPO §3.4, TRL ``mask_truncated_completions``): responses that hit
    the length limit without EOS keep their place in the group's reward statistics (advantages)
    but leave the loss and its denominators."""
    agg_max_len: Optional[int] = None
    """Constant length for ``seq-mean-token-sum-norm`` (Dr.GRPO). None =
    rollout.max_response_len."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient α: loss −= α · agg(H), aggregated as the policy term (``agg``)
    except under luspo: the token mean (docs/methods/wider-field.md)."""
    kl_coef: float = 0.0
    """Coefficient β of the KL to a frozen reference policy (loaded only when > 0 or controlled)."""
    kl_estimator: str = "k3"
    """KL estimator for the reference penalty: ``k2`` (its gradient follows the reverse
    KL(π‖ref)), ``k3`` (GRPO's; the gradient follows the forward KL(ref‖π)), ``low_var_kl``
    (verl: k3 clamped to [−10, 10]), ``k1`` (in the reward only: as a loss its expected
    gradient is 0, so it is refused there)."""
    kl_in_reward: bool = False
    """KL in the reward (verl ``use_kl_in_reward``): instead of a loss term, each response's
    reward becomes R − kl_coef · Σ_t kl_t (kl_t by ``kl_estimator`` between the sampling pass's
    log-probs and the reference's, no gradient) before the advantages. Needs kl_coef > 0 or a
    controller on it; not with the pass@k estimators (they read correctness)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups with identical rewards, regenerate to refill the batch."""
    dynamic_sampling_metric: Literal["score", "reward"] = "score"
    """DAPO dynamic sampling: what must vary within a kept group. ``score`` (the verifier's
    accuracy, as DAPO and verl's ``filter_groups.metric: acc``) or ``reward`` (the shaped reward:
    with an overlong penalty an all-wrong group then survives on length alone)."""
    max_gen_rounds: int = 3
    """DAPO dynamic sampling: most generation rounds per step."""
    old_logp: Literal["auto", "sampler", "recompute"] = "auto"
    """Where the PPO ratio's old log-probs (and the step's entropy) come from. ``sampler``: the
    rollout engine's own values. ``recompute``: one no-grad forward of the policy before the
    update, in the trainer's precision and layout (verl's way), so the on-policy ratio is exactly
    1. ``auto``: sampler for the HF engine in float32; otherwise (bf16/fp16, other engines) the
    update's own forward, detached, when that is exactly what the recompute would give (one
    optimizer step per rollout batch, no EEPO, EntroPIC, rollout correction or KL in the reward,
    entropy known: no extra pass), else
    recompute; always recompute under ``rollout.async`` above staleness 0 (π_prox,
    docs/rollout-engines.md §8). The run prints which, and why (docs/gpu.md)."""
    logprob_chunk: int = 512
    """Tokens per chunk when computing log-probs and entropy (bounds the logits memory)."""
    fused_logprobs: bool = True
    """Take the update's log-probs, entropy and KL from the model's last hidden states, one
    ``logprob_chunk`` of tokens at a time through the output layer (forward and backward), so
    the full-vocabulary logits never exist: the same numbers in float32 (benchmarks/README.md
    has the memory it saves). Where the model's head is not known exactly (remote code, LoRA on
    the output layer, an architecture outside the list in ``policy/forward.py``) the logits
    path runs instead and the device plan says why. False: always the logits path."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Rollout correction: importance weights for the rollout engine's sampling distribution."""
