"""The typed configuration tree: the only home of every default.

Each field carries its documentation as an attribute docstring (CleanRL's ``Args`` style);
``field_docs`` reads them back for ``--help`` and the recipe reference. Recipes are YAML files
that override fields; ``--set a.b=c`` overrides one field. Everything is validated before any
work starts: unknown keys (with the closest valid key suggested), wrong types and impossible
values raise ``ConfigError`` naming the key path.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import math
import re
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from explorl.errors import ConfigError

# Sizes of the lab's train/val/test splits (the lab model is built on the same split).
SPLIT_SIZES = {"n_train": 2000, "n_val": 128, "n_test": 256}


# ----------------------------------------------------------------------------- sections


@dataclass
class ModelConfig:
    path: str = "lab:addition"
    """Local HF model directory (``from_pretrained``), or ``lab:<task>`` for the built-in lab model."""
    trust_remote_code: bool = False
    """Allow custom modelling code shipped with the model. Off unless the recipe says so."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Compute dtype of forward passes (sampling, the loss, validation). ``auto``: bfloat16 on CUDA
    devices that support it, else float32. Below float32 the weights and optimizer state stay in
    float32 (master weights) and the forward runs under autocast, so small updates are not rounded
    away; float16 adds a gradient scaler."""
    pure_low_precision: bool = False
    """Opt-in: hold the weights themselves in ``dtype`` (no float32 master copy; half the memory).
    At lr 1e-6 bfloat16 weights keep ~2% of AdamW's updates: only for users who know they want it."""
    device: str = "auto"
    """``auto`` (CUDA if available, else CPU), or a torch device string such as ``cpu``/``cuda:1``."""
    use_chat_template: bool = True
    """Render prompts with the tokenizer's chat template when it has one."""


@dataclass
class LabConfig:
    split_seed: int = 0
    """Seed of the deterministic train/val/test split of lab and reasoning-gym tasks."""
    n_train: int = SPLIT_SIZES["n_train"]
    """Number of training problems generated for a lab task. The split depends on all three sizes:
    keep them equal to the lab model's build (the defaults) so validation problems stay unseen;
    use ``data.max_train_prompts`` for a smaller epoch."""
    n_val: int = SPLIT_SIZES["n_val"]
    """Number of validation problems."""
    n_test: int = SPLIT_SIZES["n_test"]
    """Number of test problems."""
    params: dict[str, Any] = field(default_factory=dict)
    """Parameters of the run's lab tasks (their model and their data), over the task's own
    defaults: e.g. ``{max_digits: 3}`` for addition, ``{n_numbers: 4}`` for countdown,
    ``{max_terms: 3}`` for rg:chain_sum. Each task takes the ones it declares; a name none of
    the run's lab tasks declares is an error (ignored in a run without lab tasks)."""


@dataclass
class DataConfig:
    train: list[str] = field(default_factory=lambda: ["lab:addition"])
    """Training data: ``lab:<task>`` or local jsonl/json/parquet files (verl or plain schema)."""
    val: list[str] = field(default_factory=list)
    """Validation data. Empty: the lab task's validation split (lab tasks only)."""
    anneal: list[str] = field(default_factory=list)
    """Second ("high-quality") dataset the curriculum switches to in the annealing phase."""
    max_train_prompts: Optional[int] = None
    """Use only the first N training prompts (a smaller epoch); None = all."""
    prompts_per_step: int = 8
    """Prompts per training step (B). The rollout batch holds about B × n_samples responses."""
    shuffle: bool = True
    """Reshuffle the training prompts every epoch (seeded)."""
    max_prompt_len: int = 1024
    """Prompts longer than this many tokens are rejected when the data is loaded."""
    prompt_key: Optional[str] = None
    """Column of a data file that holds the prompt (text or chat messages), e.g. ``question``.
    None: ``prompt``, else ``problem``."""
    answer_key: Optional[str] = None
    """Column that holds the ground truth; a dotted path reads inside an object. None:
    ``reward_model.ground_truth``, else ``answer``, else ``solution``."""


@dataclass
class VLLMConfig:
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Engine weights and compute dtype. ``auto``: the training compute dtype (``model.dtype``)."""
    kv_cache_gib: float = 1.0
    """KV-cache size in GiB (vLLM ``kv_cache_memory_bytes``; host memory on CPU, GPU memory on
    CUDA, where it replaces ``gpu_memory_utilization``'s profiling)."""
    max_model_len: Optional[int] = None
    """Longest prompt + response the engine serves. None: the model's own limit."""
    in_process: bool = True
    """Run vLLM's engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): weights are
    pushed as tensors. False: in a child process; each push goes through a safetensors file in
    /dev/shm."""
    recompute: bool = True
    """After sampling, one no-grad forward of the model that sampled (policy or EEPO's copy) over
    the responses gives old_logp and entropy (vLLM reports no entropy) and the logged gap to
    vLLM's log-probs; ``algorithm.old_logp: auto`` then needs no second pass in float32. False:
    old_logp is vLLM's and entropy NaN until the trainer recomputes them (not with EEPO)."""
    sync_check_tol: Optional[float] = None
    """Largest allowed log-prob gap between engine and training model on a fixed probe sequence,
    checked at every sampling call; a larger one (stale or broken weights) discards the samples,
    rebuilds the engine and pushes again, twice: an error. None: 1e-3 when both run in float32,
    else 0.1."""
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for ``vllm.LLM`` (e.g. ``enforce_eager: false``,
    ``tensor_parallel_size``); they override explorl's own choices."""


@dataclass
class RolloutConfig:
    n_samples: int = 8
    """Responses per prompt (G, E3's n_default)."""
    temperature: float = 1.0
    """Sampling temperature (the initial one when a controller owns the temperature)."""
    max_response_len: Optional[int] = None
    """Maximum number of generated tokens per response. None: the lab task's response length
    on a lab model, else 256."""
    engine: Literal["hf", "vllm"] = "hf"
    """Rollout engine. ``hf``: batched sampling with a KV cache on the training model. ``vllm``:
    a vLLM engine (``rollout.vllm``; install: README "Rollout engines"), weights pushed after
    every update."""
    batch_size: int = 256
    """Most responses generated in one forward batch (``vllm``: scored in one recompute batch)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Settings of the ``vllm`` engine."""


@dataclass
class RewardFunctionConfig:
    name: str = ""
    """A built-in verifier, ``lab:<task>``, ``rg:<task>``, ``module:function`` or
    ``path/to/file.py:function`` (relative to the recipe, else the working directory)."""
    weight: float = 1.0
    """Its weight in the reward Σ weight · f."""
    data_source: list[str] = field(default_factory=list)
    """Apply it only to records of these data sources (``fnmatch`` patterns such as ``rg/*``);
    empty = every record."""


@dataclass
class RewardConfig:
    verifier: str = "auto"
    """The verifier: decides which responses are correct (``reward.accuracy``) and, when
    ``reward.functions`` is empty, gives the reward. ``auto``: each data source's own checker
    (a lab or reasoning-gym task's), ``math`` for files; or ``math``, ``exact``, ``countdown``,
    ``addition``, ``lab:<task>``, ``rg:<task>``, ``module:function``, ``path/to/file.py:function``.
    A function may be ``f(response, ground_truth)``, verl's ``compute_score(data_source,
    solution_str, ground_truth, extra_info)`` or TRL's ``f(prompts, completions, **columns)``."""
    functions: list[RewardFunctionConfig] = field(default_factory=list)
    """Reward functions with weights (``[{name: my_rewards.py:fmt, weight: 0.2}, ...]``): the
    reward is Σ weight · f, continuous values allowed. Empty: the reward is the verifier's
    score."""
    accuracy: Literal["verifier", "reward"] = "verifier"
    """What decides that a response is correct, for ``reward/accuracy``, ``val/*`` and pass@k,
    dynamic sampling and rollout budgets: the verifier's score or the reward, ≥
    ``reward.accuracy_threshold``."""
    accuracy_threshold: float = 1.0
    """A response is correct when its verifier score (or reward) is at least this."""
    allow_eval_scorers: bool = False
    """UNSAFE. Allow reasoning-gym tasks whose scorer runs the model's answer as Python code
    (``eval``, ``sympy.parse_expr``: string_insertion, spiral_matrix, binary_matrix, n_queens,
    puzzle24, countdown, ...). They are then scored only in the verifier workers, which bound
    time and memory but are no security sandbox: the answer runs with your user's rights."""
    convention: Literal["binary", "signed"] = "binary"
    """Reward values: ``binary`` = {0, 1}; ``signed`` = {−1, 1} (DAPO, Entropy Scheduling).
    Applies to the verifier's score when ``reward.functions`` is empty."""
    num_workers: int = 2
    """Verifier worker processes. 0 verifies in-process without time limits (trusted debugging only)."""
    timeout_s: float = 5.0
    """Wall-clock limit per response; a verification over it scores as wrong."""
    step_timeout_s: Optional[float] = None
    """Wall-clock budget of one scoring call (a step's batch): responses not verified by then
    score as wrong and count as timeouts. None = timeout_s × (4 + responses / num_workers / 4)."""
    overlong_buffer: int = 0
    """DAPO overlong shaping: penalise responses longer than max_response_len − buffer (0 = off)."""
    overlong_penalty: float = 1.0
    """DAPO overlong shaping: penalty reached at the length limit."""


@dataclass
class AlgorithmConfig:
    advantage: str = "grpo"
    """Advantage estimator: ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp``; pass@k objectives
    (ALGORITHMS §6d) ``passk_training`` (Pass@k Training), ``pkpo``, ``pkpo_loo``,
    ``pkpo_loo_minus_one`` (PKPO; the paper recommends the last), ``grpo_passk`` (verl)."""
    passk_k: int | None = None
    """k of the pass@k estimators that take one (``passk_training``, ``pkpo``, ``pkpo_loo``,
    ``pkpo_loo_minus_one``; required there, unused otherwise). Must be ≤ every group's size
    (rollout.n_samples, and the smallest budget or curriculum count when those change it);
    ``pkpo_loo`` needs k < n. No shared default: pick k below n (e.g. 4 of 8)."""
    adv_eps: float = 1e-6
    """Added to the group std in GRPO normalisation."""
    loss: str = "ppo"
    """Policy loss: ``ppo``, ``clip_cov`` (Clip-Cov), ``kl_cov`` (KL-Cov), ``gspo`` (GSPO; needs
    ``agg: seq-mean-token-mean``), ``cispo`` (CISPO)."""
    eps_low: float = 0.2
    """PPO lower clip: ratio ≥ 1 − eps_low."""
    eps_high: float = 0.2
    """PPO upper clip: ratio ≤ 1 + eps_high. DAPO's clip-higher uses 0.28."""
    clip_c: Optional[float] = None
    """Dual-clip constant c for negative advantages (3.0 in the dual-clip paper); None = off. Not with
    ``loss: clip_cov`` (rejected: Clip-Cov as published has no dual clip)."""
    clip_cov_ratio: float = 2e-4
    """Clip-Cov: fraction of a mini-batch's valid tokens whose gradient is detached (selected over the
    whole mini-batch, however it is split into micro-batches)."""
    clip_cov_lb: float = 1.0
    """Clip-Cov: lower covariance bound of candidate tokens."""
    clip_cov_ub: float = 5.0
    """Clip-Cov: upper covariance bound of candidate tokens."""
    kl_cov_ratio: float = 2e-3
    """KL-Cov: fraction of a mini-batch's valid tokens (top covariance) that get the KL penalty."""
    kl_cov_coef: float = 1.0
    """KL-Cov: coefficient λ of |logp − old_logp| on the selected tokens."""
    kl_cov_tol: float = 1e-4
    """KL-Cov: |logp − old_logp| up to this counts as 0. The sampler's and the trainer's log-probs of
    one policy differ by float noise (~1e-6 in float32, up to ~1e-2 in bf16), and the gradient
    ±λ of |·| would turn that noise into a push on the first, on-policy update. Raise it for bf16."""
    cispo_w_max: float = 1.2
    """CISPO: absolute cap of the stop-gradient importance weight, w = sg(min(ratio, w_max)) (verl's
    example: clip_ratio_high 0.2 → 1.2; TRL recommends 5.0). eps_high is never used by CISPO."""
    cispo_mask: bool = False
    """CISPO: MiniMax-M1 Eq. 6 token mask (drop A > 0 ∧ ratio > w_max and A < 0 ∧ ratio <
    1 − eps_low). Off, as in the paper's main runs."""
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
    agg: str = "token-mean"
    """Loss aggregation over tokens and sequences: ``token-mean``, ``seq-mean-token-mean`` or
    ``seq-mean-token-sum-norm`` (``algorithms.AGG_MODES``)."""
    agg_max_len: Optional[int] = None
    """Constant length for ``seq-mean-token-sum-norm`` (Dr.GRPO). None = rollout.max_response_len."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient α: loss −= α · agg(H)."""
    kl_coef: float = 0.0
    """Coefficient β of the KL to a frozen reference policy (loaded only when > 0 or controlled)."""
    kl_estimator: str = "k3"
    """KL estimator for the reference penalty."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups with identical rewards, regenerate to refill the batch."""
    dynamic_sampling_metric: Literal["score", "reward"] = "score"
    """DAPO dynamic sampling: what must vary within a kept group. ``score`` (the verifier's accuracy,
    as DAPO and verl's ``filter_groups.metric: acc``) or ``reward`` (the shaped reward: with an
    overlong penalty an all-wrong group then survives on length alone)."""
    max_gen_rounds: int = 3
    """DAPO dynamic sampling: most generation rounds per step."""
    old_logp: Literal["auto", "sampler", "recompute"] = "auto"
    """Where the PPO ratio's old log-probs (and the step's entropy) come from. ``sampler``: the
    rollout engine's own values. ``recompute``: one no-grad forward of the policy before the update,
    in the trainer's precision and layout (verl's way), so the on-policy ratio is exactly 1.
    ``auto``: sampler for the HF engine in float32, recompute otherwise (bf16/fp16, other engines)."""
    logprob_chunk: int = 512
    """Tokens per chunk when computing log-probs and entropy (bounds the logits memory)."""


@dataclass
class OptimConfig:
    lr: float = 1e-6
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    beta1: float = 0.9
    """AdamW β1."""
    beta2: float = 0.999
    """AdamW β2."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps (then constant)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 = off)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    mini_batches: int = 1
    """Optimizer steps per pass (the rollout batch is split into this many mini-batches)."""
    micro_batch_size: int = 64
    """Most responses per forward/backward (gradient accumulation inside a mini-batch)."""
    max_bad_steps: int = 3
    """Stop the run after this many consecutive steps whose loss, gradient or rewards were not
    finite (each such step leaves the weights untouched and counts in ``train/skipped_steps``)."""


@dataclass
class TemperatureControlConfig:
    enabled: bool = False
    """E3 temperature scheduler (ALGORITHMS 1a): hold entropy at its first-step level H0."""
    t_min: float = 0.5
    """Lower clamp of the temperature."""
    t_max: float = 2.0
    """Upper clamp of the temperature."""
    anneal: bool = False
    """E3 annealing (1b): cosine-decay the target entropy to β·H0 over the last steps."""
    annealing_ratio: float = 0.4
    """Fraction of steps at the end of the run that anneal."""
    beta: float = 0.9
    """Final target as a fraction of H0."""


@dataclass
class BudgetControlConfig:
    enabled: bool = False
    """E3 dynamic rollout budgets (1c): more samples for harder prompts, same batch total."""
    n_min_limit: int = 4
    """Smallest per-prompt budget once fully widened."""
    n_max_limit: int = 12
    """Largest per-prompt budget once fully widened."""
    widen: int = 2
    """How much [n_min, n_max] widens per epoch (starts at [n_samples, n_samples])."""
    allocator: Literal["e3", "knapsack"] = "e3"
    """How counts are allocated within [n_min, n_max] at the same batch total: ``e3`` (E3's linear
    allocation by cumulative accuracy rank) or ``knapsack`` (Knapsack RL, §6h: maximise the
    expected value of non-zero-gradient groups from each prompt's last success rate; unseen
    prompts get n_samples)."""
    knapsack_alpha: float | None = 0.9
    """knapsack: a valued prompt needs only ln(1 − α)/ln max(p, 1 − p) samples and the excess goes
    to unsolved prompts (the code's fallback, 0.9). None = off (all to valued prompts)."""


@dataclass
class EEPOControlConfig:
    enabled: bool = False
    """EEPO sample-then-forget (section 3)."""
    window: int = 3
    """m: moving-average window of entropy for the gate."""
    alpha: float = 0.3
    """Gate: unlearn when the moving-average entropy is below alpha."""
    lr: float = 3e-3
    """Learning rate of the single unlearning gradient step on the rollout copy."""
    eps_l: float = 1e-3
    """Lower clip of the sampled token's probability in log(1 − p)."""
    eps_r: float = 1e-2
    """Upper clip margin: p ≤ 1 − eps_r."""


@dataclass
class ScheduleConfig:
    kind: str = "constant"
    """Target entropy schedule: constant, cosine (start→end over the run), wsd (stable then anneal)."""
    target: float = 0.4
    """constant/wsd: the held target entropy (nats)."""
    start: float = 0.6
    """cosine: target at the first step."""
    end: float = 0.2
    """cosine/wsd: target at the last step."""
    anneal_ratio: float = 0.1
    """wsd: fraction of steps at the end that anneal."""
    release: bool = False
    """wsd: in the anneal phase release the controller (knob returns to its floor) instead of decaying the target."""


@dataclass
class AdaptiveControlConfig:
    enabled: bool = False
    """Entropy Scheduling adaptive controller (4a) tracking a target entropy schedule."""
    actuator: str = "eps_high"
    """Knob it drives: eps_high (the paper), entropy_coef, kl_coef or temperature."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Target entropy schedule."""
    warmup: int = 5
    """Steps holding the initial knob value before control starts."""
    window: int = 3
    """Steps averaged for the current and scheduled entropy."""
    delta: Optional[float] = None
    """Step size of the knob per step. None = the actuator's default (eps_high: 0.01)."""
    init: Optional[float] = None
    """Initial knob value. None = the actuator's default (eps_high: 0.28)."""
    min: Optional[float] = None
    """Lower clamp. None = the actuator's default (eps_high: 0.2)."""
    max: Optional[float] = None
    """Upper clamp. None = the actuator's default (eps_high: 0.4)."""
    deadband: float = 0.02
    """No change while |target − entropy| ≤ deadband × target (bang_bang only)."""
    law: Literal["bang_bang", "pi"] = "bang_bang"
    """Control law. ``bang_bang``: ±delta per step (the paper's Algorithm 1). ``pi``: knob =
    clip(init + kp·e + ki·Σ earlier e, min, max) with e = sign·(target − entropy) over the
    window (§6f's PI law; sign +1 when raising the knob raises entropy)."""
    kp: float | None = None
    """pi: proportional gain, knob units per nat. None = 10·delta (a 0.1-nat error moves the knob
    by δ)."""
    ki: float | None = None
    """pi: integral gain, knob units per nat·step. None = delta."""
    anti_windup: bool = True
    """pi: stop integrating an error that pushes further into a bound the knob is pinned at."""


@dataclass
class EntroPICControlConfig:
    enabled: bool = False
    """EntroPIC (arXiv 2511.15248, §6f): a PI controller on the weight of positive vs negative
    samples among confident tokens (owns the ``pos_neg_weight`` knob α; loss += α·mean over
    tokens with π_old > p_min of −ratio·|A|). α > 0 sharpens, α < 0 raises entropy."""
    target: float = 0.1
    """Target entropy H* (nats; the official script's 0.1 at T = 0.6). < 0 = off (α = 0)."""
    kp: float = 1.0
    """Proportional gain (official: 1)."""
    ki: float = 0.01
    """Integral gain on the sum of earlier errors (official: 0.01)."""
    anti_windup: bool = False
    """Conditional integration while α is pinned at ±1 (ours; off as in the official code)."""
    p_min: float = 0.95
    """A token is confident when its probability under the sampling policy exceeds this
    (official: 0.95)."""


@dataclass
class EntropyCoefControlConfig:
    enabled: bool = False
    """Adaptive entropy coefficient (Skywork-OR1 ``EntController``; TRL #6140; §6g): the bonus uses
    c·1[H < target], then c ← clip(c ± delta) (+ while H < target). Owns ``entropy_coef``."""
    target: float = 0.2
    """Target entropy H* (nats; Skywork scripts: 0.2)."""
    delta: float = 1e-4
    """Step of c per training step (Skywork: 1e-4; TRL: 5e-3)."""
    init: float = 0.0
    """c₀ (Skywork: 0)."""
    min: float = 0.0
    """Lower bound of c. At 0 the controller keeps running (TRL's first version died there)."""
    max: float = 5e-3
    """Upper bound of c (Skywork: 5e-3; TRL: 1)."""
    inclusive: bool = False
    """Count H = target as below it (TRL's ≤); Skywork uses <."""


@dataclass
class CurriculumControlConfig:
    enabled: bool = False
    """Staged curriculum (4c): at the annealing phase switch data, samples and length limit."""
    start_ratio: float = 0.1
    """The last fraction of steps that form the annealing phase."""
    n_samples: Optional[int] = None
    """Samples per prompt in the annealing phase (paper: 8 → 32). None = unchanged."""
    max_response_len: Optional[int] = None
    """Length limit in the annealing phase (paper: 4k → 16k). None = unchanged."""


@dataclass
class ControlConfig:
    temperature: TemperatureControlConfig = field(default_factory=TemperatureControlConfig)
    """E3 temperature scheduler."""
    budget: BudgetControlConfig = field(default_factory=BudgetControlConfig)
    """E3 dynamic rollout budgets."""
    eepo: EEPOControlConfig = field(default_factory=EEPOControlConfig)
    """EEPO sample-then-forget."""
    adaptive: AdaptiveControlConfig = field(default_factory=AdaptiveControlConfig)
    """Entropy Scheduling adaptive controller."""
    curriculum: CurriculumControlConfig = field(default_factory=CurriculumControlConfig)
    """Staged curriculum."""
    entropic: EntroPICControlConfig = field(default_factory=EntroPICControlConfig)
    """EntroPIC positive/negative sample weights."""
    entropy_coef: EntropyCoefControlConfig = field(default_factory=EntropyCoefControlConfig)
    """Adaptive entropy coefficient (Skywork-OR1 / TRL)."""


@dataclass
class EvalConfig:
    every: int = 10
    """Validate every this many steps (and at the last step). 0 = never."""
    before_training: bool = True
    """Also validate the initial policy, logged as step 0 (the pre-RL point of every curve)."""
    n_samples: int = 4
    """Samples per validation problem (at the training temperature)."""
    k: list[int] = field(default_factory=lambda: [1])
    """k values for ``val/pass@k`` (each ≤ n_samples)."""
    max_problems: int = 128
    """Most validation problems used."""
    greedy: bool = True
    """Also report greedy accuracy (``val/greedy_accuracy``)."""
    temperature: Optional[float] = None
    """Validation sampling temperature. None = the current training temperature."""


@dataclass
class LogConfig:
    progress: bool = True
    """Show a rich progress bar."""
    plots: bool = True
    """Draw PNG curves under plots/ at each validation and at the end."""
    checkpoint_every: int = 0
    """Write a checkpoint every this many steps (0 = only at the end and on interrupt)."""
    keep_checkpoints: int = 2
    """Most recent checkpoints kept."""
    save_model: bool = True
    """Include the model weights (save_pretrained) in checkpoints."""
    report_to: list[str] = field(default_factory=list)
    """Experiment trackers that receive every metric of metrics.jsonl with its step, the resolved
    config as hyperparameters and the logged completions: any of ``tensorboard``, ``wandb``,
    ``trackio``, ``mlflow`` (each an optional extra, e.g. ``pip install 'explorl[wandb]'``). All
    write locally by default and a resume continues the same tracker run (docs/trackers.md)."""
    project: str = "explorl"
    """Project (wandb, trackio) or experiment (MLflow) name the trackers file the run under."""
    completions_every: int = 10
    """Append a sample of training completions (prompt, response, score, reward) to
    completions.jsonl every this many steps; every validation adds a sample too. 0 = never."""
    completions_per_step: int = 8
    """Completions sampled for completions.jsonl (and the trackers' tables) per logged step and
    per validation."""


@dataclass
class DistConfig:
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """Data-parallel engine when a launcher starts several processes (``accelerate launch``,
    ``torchrun``): ``ddp`` replicates the model; ``fsdp`` shards parameters, gradients and
    optimizer state (an accelerate config file with ``distributed_type: FSDP`` selects it too).
    Ignored in a single process."""


@dataclass
class RunConfig:
    name: str = "run"
    """Run/recipe name, used in report legends."""
    seed: int = 0
    """Seed of every random choice of the run (data order, sampling, Clip-Cov)."""
    max_steps: int = 100
    """Training steps."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy model."""
    lab: LabConfig = field(default_factory=LabConfig)
    """Built-in lab task parameters."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts and ground truths."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Verification and reward."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages, policy loss, aggregation, regularisers."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser and update schedule."""
    control: ControlConfig = field(default_factory=ControlConfig)
    """Exploration controllers."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Validation during training."""
    log: LogConfig = field(default_factory=LogConfig)
    """Logging, plots and checkpoints."""
    dist: DistConfig = field(default_factory=DistConfig)
    """Data-parallel training on several processes (README "Scaling out")."""


# ----------------------------------------------------------------------------- validation


def _fail(path: str, msg: str) -> typing.NoReturn:
    raise ConfigError(f"{path}: {msg}" if path else msg)


_SEED = "[0, 4294967295]"  # numpy's seed range (2**32 - 1)
_STEPS = "[1, 100000000]"
_TOKENS = "[1, 1048576]"  # lengths in tokens; 2**20 is beyond any model's context
_SAMPLES = "[1, 4096]"  # responses per prompt
_TEMPERATURE = "(0, 100]"

RANGES: dict[str, str] = {
    "seed": _SEED,
    "max_steps": _STEPS,
    "lab.split_seed": _SEED,
    "lab.n_train": "[1, 10000000]",
    "lab.n_val": "[0, 10000000]",
    "lab.n_test": "[0, 10000000]",
    "data.max_train_prompts": "[1, 1000000000]",
    "data.prompts_per_step": "[1, 1048576]",
    "data.max_prompt_len": _TOKENS,
    "rollout.n_samples": _SAMPLES,
    "rollout.temperature": _TEMPERATURE,
    "rollout.max_response_len": _TOKENS,
    "rollout.batch_size": "[1, 1048576]",
    "rollout.vllm.kv_cache_gib": "(0, 1048576]",
    "rollout.vllm.max_model_len": "[2, 1048576]",
    "rollout.vllm.sync_check_tol": "(0, inf)",
    "reward.num_workers": "[0, 1024]",
    "reward.timeout_s": "(0, 86400]",
    "reward.step_timeout_s": "(0, 604800]",
    "reward.overlong_buffer": "[0, 1048576]",
    "reward.overlong_penalty": "[0, inf)",
    "reward.accuracy_threshold": "(-inf, inf)",
    "algorithm.adv_eps": "(0, 1]",  # 0 divides 0 by 0 for a group of equal rewards
    "algorithm.eps_low": "[0, 1]",
    "algorithm.eps_high": "[0, 100]",
    "algorithm.clip_c": "(1, inf)",
    "algorithm.clip_cov_ratio": "(0, 1]",
    "algorithm.clip_cov_lb": "(-inf, inf)",
    "algorithm.clip_cov_ub": "(-inf, inf)",
    "algorithm.kl_cov_ratio": "(0, 1]",
    "algorithm.kl_cov_coef": "[0, inf)",
    "algorithm.kl_cov_tol": "[0, inf)",
    "algorithm.agg_max_len": _TOKENS,
    "algorithm.entropy_coef": "[0, inf)",
    "algorithm.kl_coef": "[0, inf)",
    "algorithm.max_gen_rounds": "[1, 1000]",
    "algorithm.logprob_chunk": _TOKENS,
    "algorithm.passk_k": _SAMPLES,
    "algorithm.cispo_w_max": "(0, inf)",
    "algorithm.entropy_mask_ratio": "[0, 1]",  # 0 = off
    "algorithm.entropy_shaping_alpha": "[0, inf)",  # 0 = off
    "algorithm.entropy_shaping_kappa": "[1, inf)",  # κ ≥ 1 keeps the sign of A
    "optim.lr": "(0, inf)",
    "optim.weight_decay": "[0, inf)",
    "optim.beta1": "[0, 1)",
    "optim.beta2": "[0, 1)",
    "optim.warmup_steps": "[0, 100000000]",
    "optim.max_grad_norm": "[0, inf)",
    "optim.ppo_epochs": "[1, 1000]",
    "optim.mini_batches": "[1, 1048576]",
    "optim.micro_batch_size": "[1, 1048576]",
    "optim.max_bad_steps": "[1, 1000000]",
    "control.temperature.t_min": _TEMPERATURE,
    "control.temperature.t_max": _TEMPERATURE,
    "control.temperature.annealing_ratio": "[0, 1)",
    "control.temperature.beta": "(0, 1]",
    "control.budget.n_min_limit": _SAMPLES,
    "control.budget.n_max_limit": _SAMPLES,
    "control.budget.widen": "[0, 4096]",
    "control.budget.knapsack_alpha": "(0, 1)",
    "control.eepo.window": "[1, 100000]",
    "control.eepo.alpha": "[0, inf)",
    "control.eepo.lr": "(0, inf)",
    "control.eepo.eps_l": "[0, 1)",
    "control.eepo.eps_r": "(0, 1)",  # 0 lets p reach 1: log(1 − p) = −inf
    "control.adaptive.schedule.target": "[0, inf)",
    "control.adaptive.schedule.start": "[0, inf)",
    "control.adaptive.schedule.end": "[0, inf)",
    "control.adaptive.schedule.anneal_ratio": "[0, 1)",
    "control.adaptive.warmup": "[0, 100000000]",
    "control.adaptive.window": "[1, 100000]",
    "control.adaptive.delta": "[0, inf)",
    "control.adaptive.init": "(-inf, inf)",  # and inside the actuator's own range, see below
    "control.adaptive.min": "(-inf, inf)",
    "control.adaptive.max": "(-inf, inf)",
    "control.adaptive.deadband": "[0, inf)",
    "control.adaptive.kp": "[0, inf)",
    "control.adaptive.ki": "[0, inf)",
    "control.entropic.target": "(-inf, inf)",  # < 0 = off
    "control.entropic.kp": "[0, inf)",
    "control.entropic.ki": "[0, inf)",
    "control.entropic.p_min": "(0, 1)",
    "control.entropy_coef.target": "(-inf, inf)",
    "control.entropy_coef.delta": "[0, inf)",
    "control.entropy_coef.init": "[0, inf)",
    "control.entropy_coef.min": "[0, inf)",
    "control.entropy_coef.max": "[0, inf)",
    "control.curriculum.start_ratio": "(0, 1)",
    "control.curriculum.n_samples": _SAMPLES,
    "control.curriculum.max_response_len": _TOKENS,
    "eval.every": "[0, 100000000]",
    "eval.n_samples": _SAMPLES,
    "eval.k": _SAMPLES,
    "eval.max_problems": "[1, 1000000000]",
    "eval.temperature": "[0, 100]",  # 0 = greedy
    "log.checkpoint_every": "[0, 100000000]",
    "log.keep_checkpoints": "[1, 1000000]",
    "log.completions_every": "[0, 100000000]",
    "log.completions_per_step": "[1, 1000000]",
}
"""Allowed interval of every numeric field (of each item for a list); ``None`` always passes.
Every number must also be finite. Relations between fields are ``_cross_checks``."""

# The field holding each knob the adaptive controller can drive: its range bounds the
# controller's init/min/max.
ADAPTIVE_KNOB_FIELDS = {
    "eps_high": "algorithm.eps_high",
    "entropy_coef": "algorithm.entropy_coef",
    "kl_coef": "algorithm.kl_coef",
    "temperature": "rollout.temperature",
}


@dataclass(frozen=True)
class Interval:
    """A closed, open or half-open interval written as in mathematics: ``"(0, 1]"``."""

    lo: float
    hi: float
    lo_closed: bool
    hi_closed: bool

    @classmethod
    def parse(cls, text: str) -> Interval:
        left, lo, hi, right = text[0], *text[1:-1].split(","), text[-1]
        return cls(float(lo), float(hi), left == "[", right == "]")

    def __contains__(self, x: float) -> bool:
        above = x >= self.lo if self.lo_closed else x > self.lo
        below = x <= self.hi if self.hi_closed else x < self.hi
        return above and below

    def describe(self) -> str:
        lo, hi = _num(self.lo), _num(self.hi)
        if math.isinf(self.lo) and math.isinf(self.hi):
            return "a finite number"
        if math.isinf(self.hi):
            return f"{'≥' if self.lo_closed else '>'} {lo}"
        return f"in {'[' if self.lo_closed else '('}{lo}, {hi}{']' if self.hi_closed else ')'}"


def _num(x: float) -> str:
    return str(int(x)) if math.isfinite(x) and x.is_integer() else repr(x)


def _get(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _check_ranges(cfg: RunConfig) -> None:
    for path, text in RANGES.items():
        value = _get(cfg, path)
        items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        interval = Interval.parse(text)
        for i, v in items:
            where = path if i is None else f"{path}[{i}]"
            if v is None:
                continue
            if not math.isfinite(v):
                _fail(where, f"must be a finite number, got {v}")
            if v not in interval:
                _fail(where, f"must be {interval.describe()}, got {v!r}")


def _smallest_group(c: RunConfig) -> int:
    """The fewest responses a prompt can get: n_samples, a curriculum's, the budget's floor."""
    ctl, n = c.control, c.rollout.n_samples
    sizes = [n]
    if ctl.curriculum.enabled and ctl.curriculum.n_samples is not None:
        sizes.append(ctl.curriculum.n_samples)
    if ctl.budget.enabled:  # the budget floor never goes below min(n_min_limit, n_default)
        sizes += [min(ctl.budget.n_min_limit, s) for s in list(sizes)]
    return min(sizes)


# (path, predicate, message) checks of relations between fields, run after the ranges.
def _cross_checks(c: RunConfig) -> list[tuple[str, bool, str]]:
    a, r, ctl = c.algorithm, c.rollout, c.control
    t, b, e = ctl.temperature, ctl.budget, ctl.eepo
    pk, n_group, ec = a.passk_k, _smallest_group(c), ctl.entropy_coef
    return [
        ("name", bool(c.name.strip()) and "/" not in c.name and "\\" not in c.name,
         f"must be a non-empty name without '/' (it names the run directory), got {c.name!r}"),
        ("data.train", len(c.data.train) >= 1, "needs at least one dataset"),
        ("data.max_train_prompts",
         c.data.max_train_prompts is None or c.data.max_train_prompts >= c.data.prompts_per_step,
         "must be ≥ data.prompts_per_step"),
        ("reward.overlong_buffer", c.reward.overlong_buffer < r.max_response_len,
         "must be < rollout.max_response_len"),
        ("reward.step_timeout_s",
         c.reward.step_timeout_s is None or c.reward.step_timeout_s >= c.reward.timeout_s,
         "must be ≥ reward.timeout_s (one response's limit)"),
        ("rollout.vllm.recompute", r.engine != "vllm" or r.vllm.recompute
         or (a.old_logp != "sampler" and not e.enabled),
         "false leaves entropy unknown (vLLM reports none): it needs algorithm.old_logp auto or "
         "recompute, and no EEPO (its stage-2 rows keep the engine's values)"),
        ("algorithm.clip_c", a.clip_c is None or a.loss != "clip_cov",
         ("Clip-Cov has no dual clip (neither the authors' code nor verl's has one, and a "
          "dual-clipped token could not be a Clip-Cov candidate); set algorithm.clip_c: null "
          "with loss clip_cov")),
        ("algorithm.clip_cov_ub", a.clip_cov_ub > a.clip_cov_lb, "must be > algorithm.clip_cov_lb"),
        ("control.temperature.t_min", t.t_min <= t.t_max, "must be ≤ control.temperature.t_max"),
        ("rollout.temperature", not t.enabled or t.t_min <= r.temperature <= t.t_max,
         (f"the temperature scheduler starts here, so it must be in control.temperature's "
          f"[t_min, t_max] = [{t.t_min}, {t.t_max}]")),
        ("control.budget.n_min_limit", not b.enabled or b.n_min_limit <= r.n_samples,
         "must be ≤ rollout.n_samples"),
        ("control.budget.n_max_limit", not b.enabled or b.n_max_limit >= r.n_samples,
         "must be ≥ rollout.n_samples"),
        ("control.eepo.eps_r", e.eps_l < 1 - e.eps_r, "need control.eepo.eps_l < 1 − eps_r"),
        ("control.eepo.enabled", not e.enabled or r.n_samples >= 2,
         "EEPO needs rollout.n_samples ≥ 2"),
        ("eval.k", all(k <= c.eval.n_samples for k in c.eval.k),
         "every k must be ≤ eval.n_samples"),
        ("log.report_to", len(set(c.log.report_to)) == len(c.log.report_to),
         "names a tracker twice"),
        ("algorithm.passk_k", pk is None or pk <= n_group,
         f"must be ≤ {n_group}: k ≤ n in every group (the smallest has {n_group} responses)"),
        ("algorithm.passk_k", pk is None or a.advantage != "pkpo_loo" or pk < n_group,
         f"pkpo_loo needs k < n in every group (the smallest group has {n_group} responses)"),
        ("algorithm.advantage", a.advantage != "grpo_passk" or n_group >= 2,
         "grpo_passk needs at least 2 responses in every group"),
        ("control.entropy_coef.init", ec.min <= ec.init <= ec.max,
         "need control.entropy_coef.min ≤ init ≤ max"),
    ]


def _check_adaptive(cfg: RunConfig) -> None:
    """The adaptive controller's knob values, with the actuator's defaults filled in, must
    satisfy min ≤ init ≤ max inside the knob's own range (e.g. temperature > 0)."""
    ad = cfg.control.adaptive
    if not ad.enabled:
        return
    from explorl.control.adaptive import ACTUATOR_DEFAULTS

    spec = ACTUATOR_DEFAULTS[ad.actuator]
    lo = spec.c_min if ad.min is None else ad.min
    hi = spec.c_max if ad.max is None else ad.max
    init = spec.c0 if ad.init is None else ad.init
    knob = ADAPTIVE_KNOB_FIELDS[ad.actuator]
    interval = Interval.parse(RANGES[knob])
    for key, v in (("min", lo), ("max", hi), ("init", init)):
        if v not in interval:
            _fail(f"control.adaptive.{key}", f"{ad.actuator} must be {interval.describe()} "
                  f"(the range of {knob}), got {v!r}")
    if not lo <= hi:
        _fail("control.adaptive.max", f"must be ≥ control.adaptive.min ({lo}), got {hi}")
    if not lo <= init <= hi:
        _fail("control.adaptive.init", f"must be in [min, max] = [{lo}, {hi}], got {init}")


def _check_controllers(cfg: RunConfig) -> None:
    """Each knob has one owner, and two entropy trackers never run together."""
    if sum(getattr(cfg.control, f.name).enabled for f in dataclasses.fields(cfg.control)) < 2:
        return
    from explorl.control import check_control_config

    check_control_config(cfg.control)  # a ControlError, printed like a ConfigError


def _closest(value: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_names(cfg: RunConfig) -> None:
    """Plug-point names are checked against the dicts that define them (no copied lists)."""
    from explorl.algorithms import ADVANTAGES, AGG_MODES, KL_ESTIMATORS, LOSSES
    from explorl.algorithms.advantages import TAKES_K
    from explorl.algorithms.losses import REQUIRED_AGG
    from explorl.control import ACTUATOR_DEFAULTS, SCHEDULES
    from explorl.trackers import TRACKERS

    a, ad = cfg.algorithm, cfg.control.adaptive
    if a.advantage in TAKES_K and a.passk_k is None:
        _fail("algorithm.passk_k",
              f"advantage {a.advantage!r} optimises pass@k: set k (≤ rollout.n_samples)")
    if a.loss in REQUIRED_AGG and a.agg != REQUIRED_AGG[a.loss]:
        _fail("algorithm.agg", f"loss {a.loss!r} needs agg {REQUIRED_AGG[a.loss]!r}, got {a.agg!r} "
              "(only then is the GSPO-token loss the sequence-level GSPO objective)")
    for path, value, table, kind in [("algorithm.loss", a.loss, LOSSES, "loss"),
                                     ("algorithm.advantage", a.advantage, ADVANTAGES, "advantage estimator"),
                                     ("algorithm.agg", a.agg, AGG_MODES, "aggregation mode"),
                                     ("algorithm.kl_estimator", a.kl_estimator, KL_ESTIMATORS, "KL estimator"),
                                     ("control.adaptive.actuator", ad.actuator, ACTUATOR_DEFAULTS, "actuator"),
                                     ("control.adaptive.schedule.kind", ad.schedule.kind, SCHEDULES, "schedule"),
                                     *[(f"log.report_to[{i}]", name, TRACKERS, "tracker")
                                       for i, name in enumerate(cfg.log.report_to)]]:
        if value not in table:
            close = difflib.get_close_matches(value, list(table), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            _fail(path, f"{value!r} is not a known {kind}{hint} (choices: {', '.join(table)})")


def _check_sources(cfg: RunConfig, env: bool) -> None:
    """With ``env``, that model and data paths exist. Task specs (``lab:<task>``,
    ``rg:<task>``) are checked by ``explorl.refs.check_references``."""
    from explorl.data.files import EXTENSIONS

    def lab_task(path: str, spec: str) -> bool:
        return spec.startswith(("lab:", "rg:"))

    if not cfg.model.path.strip():
        _fail("model.path", "is empty; give a local model directory or lab:<task>")
    if not lab_task("model.path", cfg.model.path) and env:
        p = Path(cfg.model.path).expanduser()
        if not p.is_dir():
            _fail("model.path", f"{cfg.model.path!r} is not a local directory; explorl loads "
                  "models with from_pretrained(local_path) (download them beforehand) or use "
                  "lab:<task>")
        if not (p / "config.json").is_file():
            _fail("model.path", f"{cfg.model.path!r} holds no config.json: not a Hugging Face "
                  "model directory")
    for key in ("train", "val", "anneal"):
        for i, spec in enumerate(getattr(cfg.data, key)):
            path = f"data.{key}[{i}]"
            if lab_task(path, spec) or not env:
                continue
            p = Path(spec).expanduser()
            if not p.is_file():
                _fail(path, f"data file {spec!r} not found" + _if_dir(p))
            if p.suffix.lower() not in EXTENSIONS:
                _fail(path, f"{spec!r}: unsupported file type {p.suffix or '(none)'!r} "
                      f"(expected {', '.join(EXTENSIONS)})")


def _if_dir(p: Path) -> str:
    return " (it is a directory)" if p.is_dir() else ""


def _check_device(device: str) -> None:
    """``model.device`` names a device this machine has."""
    if device in ("auto", "cpu"):
        return
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        _fail("model.device", f"{device!r} is not a torch device (e.g. auto, cpu, cuda, cuda:1)")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            _fail("model.device", f"{device!r}: CUDA is not available here (torch "
                  f"{torch.__version__}, CUDA build {torch.version.cuda}); use auto or cpu")
        if d.index is not None and d.index >= torch.cuda.device_count():
            _fail("model.device", f"{device!r}: this machine has {torch.cuda.device_count()} "
                  "CUDA device(s)")
    elif d.type == "mps" and not torch.backends.mps.is_available():
        _fail("model.device", f"{device!r}: MPS is not available here; use auto or cpu")


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " / ".join(map(str, typing.get_args(tp)))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join("None" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return f"list[{_type_name(typing.get_args(tp)[0])}]"
    if typing.get_origin(tp) is dict:
        return f"dict[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _show(value: Any, limit: int = 80) -> str:
    """``repr`` cut to ``limit`` characters: an error message quotes the value, not a megabyte."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against annotation ``tp``; return it (ints accepted for floats)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if value is None:  # a section whose keys are all commented out
            value = {}
        if not isinstance(value, dict):
            _fail(path, f"expected a mapping of {tp.__name__} fields, got {type(value).__name__} {_show(value)}")
        return build(tp, value, path)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            _fail(path, f"{_show(value)} is not one of {', '.join(map(repr, allowed))}{hint}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except ConfigError as e:
                errors.append(str(e))
        _fail(path, f"expected {' or '.join(_type_name(a) for a in args)}, got {_show(value)}")
    if tp is Any:
        return value
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            _fail(path, f"expected a mapping, got {type(value).__name__} {_show(value)}")
        return {_coerce(k, key_tp, path): _coerce(v, value_tp, f"{path}.{k}")
                for k, v in value.items()}
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, (str, int, float)) and item_tp is type(value):
            value = [value]  # a single item where a list is expected: `train: lab:addition`
        if not isinstance(value, list):
            _fail(path, f"expected a list, got {type(value).__name__} {_show(value)}")
        return [_coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            _fail(path, f"expected true/false, got {_show(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, f"expected an integer, got {type(value).__name__} {_show(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(path, f"expected a number, got {type(value).__name__} {_show(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            _fail(path, f"expected a string, got {type(value).__name__} {_show(value)}")
        return value
    raise TypeError(f"unsupported annotation {tp!r} at {path}")  # a bug in this file, not user input


def build(cls: type, data: dict, path: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            hint = f"; did you mean {(path + '.' if path else '') + close[0]!r}?" if close else ""
            _fail(key_path, f"unknown key{hint} (valid keys here: {', '.join(names)})")
        kwargs[key] = _coerce(value, hints[key], key_path)
    return cls(**kwargs)


def validate(cfg: RunConfig, *, env: bool = True) -> RunConfig:
    """Check a config before any work starts; return it (types re-checked after edits).

    Always: types, the range of every number (``RANGES``: finite, inside its interval),
    relations between fields, controller conflicts, plug-point names, lab task names and
    built-in verifier names. With ``env`` (the default) also what depends on this machine:
    the model directory and data files exist, ``model.device`` is present, and a
    ``module:function`` verifier imports. ``explorl config`` and recipe templates whose
    paths are placeholders pass ``env=False``.
    """
    from explorl.refs import check_references, fill_defaults

    cfg = build(RunConfig, to_dict(cfg))
    fill_defaults(cfg, env)
    _check_ranges(cfg)
    for path, ok, msg in _cross_checks(cfg):
        if not ok:
            _fail(path, msg)
    _check_sources(cfg, env)  # these import no torch: a typo fails in about a second
    # Lab and reasoning-gym tasks, reward functions and verifiers: loaded (with env) and checked.
    check_references(cfg, env)
    _check_names(cfg)
    _check_adaptive(cfg)
    _check_controllers(cfg)
    if env:
        _check_device(cfg.model.device)
    return cfg


def from_dict(data: dict | None, *, env: bool = True) -> RunConfig:
    """Build and validate a config from nested plain data (a parsed recipe)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        _fail("", f"a recipe must be a mapping of keys, got {type(data).__name__}")
    _migrate(data)
    return validate(build(RunConfig, data), env=env)


# lab keys of configs written before lab tasks became plugins (run directories' config.yaml),
# as the lab.params entry each became, with the old default that meant "not set".
_OLD_LAB_KEYS = {"min_digits": ("min_digits", 1), "max_digits": ("max_digits", 2),
                 "countdown_numbers": ("n_numbers", 3)}


def _migrate(data: dict) -> None:
    """Move old lab keys into ``lab.params`` (in place), so old runs still resume."""
    lab = data.get("lab")
    if not isinstance(lab, dict):
        return
    for old, (new, default) in _OLD_LAB_KEYS.items():
        if old in lab:
            value = lab.pop(old)
            if value != default:
                lab.setdefault("params", {})[new] = value


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def set_path(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for i, k in enumerate(keys[:-1]):
        if node.get(k) is None:  # absent, or a section whose keys are all commented out
            node[k] = {}
        nxt = node[k]
        if not isinstance(nxt, dict):
            _fail(".".join(keys[: i + 1]), f"is a value, not a section (cannot set {dotted})")
        node = nxt
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``"a.b=3"`` → ``("a.b", 3)``; the value is parsed as YAML (so lists/bools work)."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except ConfigError:  # not YAML (e.g. an unbalanced bracket): the text itself
        value = raw
    return key, value


def load(recipe: str | Path | None = None, overrides: list[str] | None = None, *, env: bool = True,
         **top: Any) -> RunConfig:
    """Load a YAML recipe, apply ``--set`` overrides and top-level keyword overrides, validate
    (``env``: see ``validate``).

    A recipe may say ``base: other.yaml`` (relative to itself) to start from another recipe.
    """
    data: dict = {}
    if recipe is not None:
        data = _read_recipe(Path(recipe))
        if "name" not in data:
            data["name"] = Path(recipe).stem
    for text in overrides or []:
        key, value = parse_override(text)
        set_path(data, key, value)
    for key, value in top.items():
        if value is not None:
            data[key] = value
    return from_dict(data, env=env)


def _read_recipe(path: Path, _seen: tuple = ()) -> dict:
    if not path.is_file():
        raise ConfigError(f"recipe {path} does not exist" + _if_dir(path))
    if path.resolve() in _seen:
        raise ConfigError(f"recipe {path}: circular 'base'")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"recipe {path} cannot be read: {e.strerror or e}") from None
    data = load_yaml(read_utf8(raw, f"recipe {path}"), f"recipe {path}") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path} must be a mapping of keys, got {type(data).__name__}")
    _anchor_refs(data, path.parent)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"recipe {path}: base: expected one recipe file name, got "
                          f"{type(base).__name__} {_show(base)}")
    base_path = path.parent / base
    if not base_path.is_file():
        raise ConfigError(f"recipe {path}: base {base!r} not found (looked for {base_path})")
    merged = _read_recipe(base_path, _seen + (path.resolve(),))
    _deep_update(merged, data)
    return merged


class _RecipeLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 numbers (``1e-5`` is a float, as in JSON; YAML 1.1
    reads it as a string) and no duplicate keys (YAML 1.1 keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue
                line = key_node.start_mark.line + 1
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r} (first at line "
                        f"{seen[key_node.value]})", key_node.start_mark)
                seen[key_node.value] = line
        return super().construct_mapping(node, deep)


_RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def read_utf8(raw: bytes, what: str) -> str:
    """Text of a UTF-8 file; a leading byte-order mark is dropped, other bytes are an error."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} is not UTF-8 text (invalid byte 0x{raw[e.start]:02x} at "
                          f"offset {e.start})") from None


def load_yaml(text: str, what: str = "YAML") -> Any:
    """Parse recipe YAML (``_RecipeLoader``); errors become a one-line ``ConfigError``."""
    try:
        return yaml.load(text, Loader=_RecipeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(f"{e.context or ''} {e.problem or ''}".split())
        raise ConfigError(f"{what}{where}: {problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} is not valid YAML: {' '.join(str(e).split())}") from None


def _anchor_refs(data: dict, base: Path) -> None:
    """Make the code references a recipe file writes (reward functions, lab tasks) point at
    files next to it, so a recipe's ``rewards.py:f`` works from any working directory."""
    from explorl.refs import anchor

    def fix(spec: Any) -> Any:
        if isinstance(spec, str) and spec.startswith("lab:") and not spec.startswith("lab:rg:"):
            return "lab:" + anchor(spec[len("lab:"):], base)
        return anchor(spec, base) if isinstance(spec, str) and not spec.startswith("rg:") else spec

    reward, model, d = data.get("reward"), data.get("model"), data.get("data")
    if isinstance(reward, dict):
        if "verifier" in reward:
            reward["verifier"] = fix(reward["verifier"])
        for f in reward.get("functions") or []:
            if isinstance(f, dict) and "name" in f:
                f["name"] = fix(f["name"])
    if isinstance(model, dict) and isinstance(model.get("path"), str) \
            and model["path"].startswith("lab:"):
        model["path"] = fix(model["path"])
    if isinstance(d, dict):
        for key in ("train", "val", "anneal"):
            specs = d.get(key)
            if isinstance(specs, list):
                d[key] = [fix(s) if isinstance(s, str) and s.startswith("lab:") else s
                          for s in specs]
            elif isinstance(specs, str) and specs.startswith("lab:"):
                d[key] = fix(specs)


def _deep_update(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_update(dst[k], v)
        else:
            dst[k] = v


def save(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


# ----------------------------------------------------------------------------- docs


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a config dataclass (the string literal after each field)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def reference(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Rows ``(key path, type, default, doc)`` for every leaf field (the recipe reference)."""
    rows = []
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    default = cls()
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            rows.extend(reference(tp, path + "."))
        else:
            rows.append((path, _type_name(tp), repr(getattr(default, f.name)), docs.get(f.name, "")))
    return rows
