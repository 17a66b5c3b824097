"""The config tree's sections: one dataclass per recipe section, a docstring per field, the
only home of every default (``control_sections`` holds the controllers')."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from explorl.config.algorithm_sections import AlgorithmConfig
from explorl.config.control_sections import ControlConfig
from explorl.config.watch_sections import WatchConfig

# Sizes of the lab's train/val/test splits (the lab model is built on the same split).
SPLIT_SIZES = {"n_train": 2000, "n_val": 128, "n_test": 256}


# ----------------------------------------------------------------------------- sections


@dataclass
class LoRAConfig:
    enabled: bool = False
    """Train LoRA adapters (PEFT) instead of the whole model: only the adapters reach the
    optimizer, the base weights stay frozen (in the compute dtype, e.g. bfloat16 on GPUs), the
    KL reference is the base with the adapters disabled (no second copy) and checkpoints hold
    the adapters in PEFT's format (docs/lora.md)."""
    rank: int = 8
    """LoRA rank r of each adapted layer (PEFT ``r``)."""
    alpha: float = 16.0
    """LoRA scaling α: the update is (α / r)·B·A (PEFT ``lora_alpha``)."""
    dropout: float = 0.0
    """Dropout on the adapters' input in training passes (PEFT ``lora_dropout``). 0 keeps the
    loss's log-probs equal to the sampler's, as RL wants (the model's own dropout is off)."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Layers that get adapters: ``all-linear`` (every linear layer of the decoder, the output
    layer excluded: PEFT's shorthand), or module names such as ``[q_proj, v_proj]`` (a name
    matches a module whose dotted path ends with it)."""


@dataclass
class ModelConfig:
    path: str = "lab:addition"
    """Local HF model directory (``from_pretrained``); ``lab:<task>`` for the built-in lab model;
    a model name such as ``smollm2-135m`` (``explorl models`` lists them; ``explorl models get
    NAME`` fetches one); or a ``.gguf`` file (or a folder holding exactly one), converted once
    into the model cache (``$EXPLORL_MODEL_CACHE``, else ``~/.cache/explorl/models``). Names are
    resolved before paths."""
    trust_remote_code: bool = False
    """Allow custom modelling code shipped with the model. Off unless the recipe says so."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Compute dtype of forward passes (sampling, the loss, validation). ``auto``: bfloat16 on CUDA
    devices that support it, else float32. Below float32 the weights and optimizer state stay in
    float32 (master weights) and the forward runs under autocast, so small updates are not rounded
    away; float16 adds a gradient scaler."""
    pure_low_precision: bool = False
    """Opt-in: hold the weights themselves in ``dtype`` (no float32 master copy; half the memory).
    At lr 1e-6 bfloat16 weights keep ~2% of AdamW's updates: only for users who know they want
    it."""
    device: str = "auto"
    """``auto`` (CUDA if available, else CPU), or a torch device string such as
    ``cpu``/``cuda:1``."""
    cpu_threads: Optional[int] = None
    """torch's intra-op threads when the model runs on the CPU (``torch.set_num_threads``, for
    the whole process, set when the model loads). None: torch's default, one per core. The lab
    recipes set 1: a ~1M-parameter model gains nothing from more (the quickstart's 80 steps: 8 s
    at one thread, 7 s at two on an idle 2-core machine), and threads that wait on a busy core
    are slow (72 s at two threads with another process on one of the two cores, 8 s at one).
    A resume should use the same count (``--resume`` warns otherwise)."""
    compile: bool = False
    """Opt-in: ``torch.compile`` each decoder layer (regional compilation: one graph, dynamic
    shapes, reused by every layer) for the loss passes only; sampling and validation stay eager
    (their shapes change every token). Compiled at setup on a tiny batch (and once more when
    the first batch needs a new shape specialisation); if that fails, a warning and eager
    layers. Not with ``dist.strategy: fsdp``. Compiling costs ~5–25 s at the start on CPU
    (less with inductor's cache warm) for fewer, fused kernels per step: on the CPU lab the
    quickstart step is 3–12% faster, which does not repay the compile in a lab run; meant for
    long runs on GPUs (not measured on one). Results equal eager's up to float round-off."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them
    (transformers' non-reentrant checkpointing; the policy only, training passes only): the
    loss pass holds one layer's activations instead of all of them, for ~1/3 more compute.
    The same gradients bit for bit. For long responses or large micro-batches on a GPU
    (``optim.micro_batch_tokens``); the model must support it (transformers' own do)."""
    use_chat_template: bool = True
    """Render prompts with the tokenizer's chat template when it has one."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters (PEFT) instead of full fine-tuning; off by default."""


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
    model_size: Literal["default", "large"] = "default"
    """Size of the lab model ``model.path: lab:<task>`` builds: ``default`` (~0.9M parameters:
    4 layers, width 128) or ``large`` (~9.6M: 5 layers, width 384), for size effects such as the
    entropy law's coefficients vs model size. Each is built and cached once per task."""
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
    kv_cache_gib: Optional[float] = None
    """KV-cache size in GiB (vLLM ``kv_cache_memory_bytes``; host memory on CPU, GPU memory on
    CUDA, where it replaces ``gpu_memory_utilization``'s profiling). None: 1 GiB on CPU; on CUDA
    the cache gets what ``gpu_memory_utilization`` leaves (docs/gpu-vllm.md)."""
    gpu_memory_utilization: float = 0.3
    """CUDA: fraction of the GPU's memory the engine may use, weights and KV cache together (vLLM's
    own; TRL's colocated default 0.3 leaves the rest to training). Unused on CPU or with
    ``kv_cache_gib``."""
    tensor_parallel_size: int = 1
    """GPUs one engine spreads each layer over (vLLM ``tensor_parallel_size``); >1 with one
    training process only."""
    prefix_caching: bool = True
    """Share the KV cache of a prompt between its n_samples responses (vLLM
    ``enable_prefix_caching``)."""
    sleep_level: Literal[0, 1, 2] = 0
    """CUDA sleep mode: the engine sleeps after sampling and wakes before the next weight push.
    0: off. 1: KV cache freed, weights offloaded to host memory. 2: weights discarded too (the
    push refills them). Frees GPU memory for the update; refused on CPU."""
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
    ``max_num_seqs``); they override explorl's own choices."""


@dataclass
class HFConfig:
    static: Union[bool, Literal["auto"]] = "auto"
    """The static decode path: KV buffers of fixed shape per batch-size bucket (powers of two),
    finished rows moved to a smaller bucket, and on CUDA each bucket's decode step (model call,
    temperature, draw, log-prob and entropy) replayed as one CUDA graph; the same tokens as the
    eager loop under the same seeds (docs/rollout-engines.md). ``auto``: on CUDA, for the models
    the lean call takes (Llama, Qwen2, Qwen3) without adapters or hooks; ``true`` (``on``): on
    any device (no graphs off CUDA); ``false`` (``off``): the eager loop. Its buffers and graphs
    stay allocated between calls."""


@dataclass
class AsyncConfig:
    enabled: bool = False
    """Overlap sampling and training: a rollout worker samples and scores the batches of the
    coming steps with the weights it last received while the trainer updates on the current one
    (docs/rollout-engines.md). Off: the two alternate."""
    max_staleness: int = 1
    """Most updates between the weights that sampled a batch and the trainer's at the start of
    the update that trains on it (TRL ``max_staleness``, AReaL ``max_head_offpolicyness``).
    0: no overlap, the synchronous run bit for bit. Above 0 the update recomputes the old
    log-probs with the trainer's weights (π_prox) and ``algorithm.rollout_correction`` weighs
    π_prox against the sampler's log-probs (docs/rollout-engines.md §8)."""
    worker: Literal["auto", "thread", "process"] = "auto"
    """Where the rollout worker runs. ``process``: a forked child with its own copy of the policy
    and verifiers (weights pushed through a pipe); ``thread``: a thread of the trainer's process
    (an in-memory push). ``auto``: a process on the CPU with the ``hf`` engine and max_staleness
    > 0 (small models sample in Python, which one interpreter runs one thread at a time), else a
    thread (CUDA kernels and vLLM run outside the interpreter's lock; CUDA cannot be forked)."""


@dataclass
class ARPOConfig:
    enabled: bool = False
    """ARPO's entropy-based adaptive rollout (arXiv 2507.19849; docs/methods/arpo.md): with
    ``rollout.tools``, training responses branch after tool results where entropy rose."""
    initial_rollouts: int = 4
    """M: responses per prompt sampled from the prompt in turn 1 (global sampling); the rest of
    the prompt's budget (``rollout.n_samples`` or a budget controller's) is partial sampling."""
    beam_size: int = 2
    """k: a response that just got a tool result may add up to k − 1 copies of itself."""
    branch_probability: float = 0.5
    """β: a copy is made with probability clip(β + α·ΔH, 0, 1)."""
    entropy_weight: float = 0.2
    """α: the weight of the entropy change ΔH in the branch probability."""
    entropy_window: int = 20
    """Tokens at the start of a turn whose entropies are summed into the turn's H."""
    entropy_at: Literal["after_result", "call_turn"] = "after_result"
    """Where ΔH = H − H_init is measured when a response gets a tool result. ``after_result``
    (the paper's rule): the first ``entropy_window`` tokens sampled after the result (a
    look-ahead, kept as the response's own next tokens). ``call_turn`` (the authors' code): the
    turn that called the tool, sampled before the result; at a response's first call that is
    its first turn, so ΔH = 0 there and the copy probability is β."""
    mode: Literal["arpo", "aepo"] = "arpo"
    """``aepo``: AEPO's dynamic entropy-balanced rollout (arXiv 2510.14545; docs/methods/aepo.md):
    copy iff clip((u + α·ΔH)·max(0, 1 − λ·c), 0, 1) ≥ β, c the prompt's consecutive rounds that
    added responses, and optionally M by entropy pre-monitoring (``dynamic_initial``)."""
    branch_penalty: float = 0.05
    """AEPO: λ, the branch penalty per consecutive branching round of a prompt."""
    dynamic_initial: bool = False
    """AEPO: entropy pre-monitoring. One probe response per prompt (not trained on) sets its
    M = min(N, ⌊N·σ(s·(H_root − H̄_tool))⌋ + 1) in place of ``initial_rollouts``. Off in the
    authors' scripts."""
    budget_sharpness: float = 0.5
    """AEPO: s, the sigmoid's slope in entropy pre-monitoring's M."""


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
    hf: HFConfig = field(default_factory=HFConfig)
    """Settings of the ``hf`` engine."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Settings of the ``vllm`` engine."""
    async_: AsyncConfig = field(default_factory=AsyncConfig)
    """Asynchronous rollouts with bounded staleness (the recipe key is ``async``)."""
    tools: list[str] = field(default_factory=list)
    """Tools the model may call (multi-turn rollouts, docs/tools.md): typed Python functions with
    a docstring, as ``module:function`` or ``path/to/file.py:function``. Each call runs in the
    reward's worker pool (``reward.timeout_s``, ``reward.num_workers``); empty: single-turn."""
    environment: Optional[str] = None
    """A class whose instances are stateful tools (TRL's ``environment_factory``,
    docs/tools.md "Environments"), as ``module:Class`` or ``path/to/file.py:Class``: one
    instance per response, ``reset(**row)`` with its dataset row, its public methods the tools
    the model calls; each reset and call runs in the reward's worker pool. null: none."""
    max_turns: int = 4
    """Model turns per response with ``rollout.tools`` (a turn ends at EOS or a tool call; so at
    most ``max_turns - 1`` calls are answered). The response budget, ``max_response_len``,
    counts the model's tokens and the tool results together."""
    tool_format: Literal["auto", "lab", "chat"] = "auto"
    """How the model writes a call and reads a result: ``lab`` (``[arg]`` → ``{result}``, the lab
    models), ``chat`` (``<tool_call>`` JSON and the chat template's tool role); ``auto``: lab on
    a lab model, else chat."""
    tool_result_max_chars: int = 2000
    """A longer tool result is an error message the model reads instead (and counts in
    ``tools/errors``)."""
    env_observation_max_chars: int = 2000
    """The longest text an environment's ``reset`` may return (it is appended to the prompt);
    a longer one stops the run with an error naming the environment and this key."""
    env_state_max_bytes: int = 1048576
    """The most bytes an environment's instance may pickle to (the trainer keeps each
    response's bytes): a call that leaves a larger state is an error message the model reads
    (the state stays as before the call); a reset that does stops the run."""
    arpo: ARPOConfig = field(default_factory=ARPOConfig)
    """ARPO's branching rollouts (with ``rollout.tools``)."""


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
    """Verifier worker processes. 0 verifies in-process without time limits (trusted debugging
    only)."""
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
class OptimConfig:
    lr: float = 1e-6
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    beta1: float = 0.9
    """AdamW β1."""
    beta2: float = 0.999
    """AdamW β2."""
    fused: bool | None = None
    """Fused AdamW (one kernel for every parameter). None or true: fused on CUDA and CPU with
    replicated parameters (on the CPU lab ~2 ms less per optimizer step than the multi-tensor
    path; deterministic, so runs and resumes reproduce). false: the multi-tensor (foreach) path,
    which rounds differently in the last bit (~1 parameter in 10⁵ per step): the lab studies
    published before the fused default set it to reproduce their figures. Other devices: the
    multi-tensor path; FSDP's shards: torch's default."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps (then constant)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 = off)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    mini_batches: int = 1
    """Optimizer steps per pass (the rollout batch is split into this many mini-batches)."""
    micro_batch_size: Optional[int] = None
    """Most responses per forward/backward (gradient accumulation inside a mini-batch). None:
    64 off CUDA; on CUDA no limit of its own (the token budget decides). The run's
    ``config.yaml`` records the number used."""
    micro_batch_tokens: Optional[int] = None
    """Most tokens per forward/backward, counted as prompt + response per response (an upper
    bound: the packed layout encodes a shared prompt once). A micro-batch also ends before the
    response that would pass it; a longer response gets one of its own. Bounds memory when
    lengths vary. Applies to the update and the old-log-prob pass. None: off CUDA, rows only;
    on CUDA, planned at the start from the free memory and the model's shape (docs/gpu.md),
    printed, and recorded in the run's ``config.yaml``."""
    max_bad_steps: int = 3
    """Stop the run after this many consecutive steps whose loss, gradient or rewards were not
    finite (each such step leaves the weights untouched and counts in ``train/skipped_steps``)."""
    max_bad_frac: float = 0.1
    """Also stop once more than this fraction of ``max_steps`` was skipped for non-finite
    values, in a row or not (each skipped step prints one warning line as it happens)."""


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
    """Show progress: a live bar on a terminal; off one (output to a file, a cluster job's log),
    plain lines: one per step and one every ``progress_every_s`` seconds of a long phase."""
    progress_every_s: float = 30.0
    """Off a terminal, the most seconds between two progress lines (training, validation and
    ``explorl eval``): a step, validation or evaluation batch that runs longer prints where it
    is (docs/metrics.md#progress-off-a-terminal)."""
    plots: bool = True
    """Draw PNG curves under plots/ at each validation and at the end."""
    checkpoint_every: int = 0
    """Write a checkpoint every this many steps (0 = only at the end and on interrupt)."""
    checkpoint_every_minutes: float = 30.0
    """Also write one at the end of the first step that ends this many minutes after the last
    checkpoint (or the start), so a kill -9 loses at most about that much work. 0 = off."""
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
    watch: WatchConfig = field(default_factory=WatchConfig)
    """When a run warns or stops on its own: policy collapse, failing reward functions."""


