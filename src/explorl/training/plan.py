"""The run's device plan: how many tokens one forward/backward takes and where the PPO ratio's old
log-probs come from, decided once at setup from the device, the model's shape and the config.

docs/gpu.md explains the arithmetic. Two pure functions decide, so both are tested by hand
without a GPU: ``token_budget`` (free bytes, shape, precision -> tokens per micro-batch) and
``old_logp_source`` (config -> ``sampler`` / ``update`` / ``recompute``); ``make_plan`` joins
them and ``apply`` writes the chosen sizes into the config the run saves (``config.yaml``), so
a resume reuses them whatever the memory free then.

On a CPU: 64-row micro-batches (``CPU_MICRO_BATCH_ROWS``), and a token budget from a share of
the memory available (``CPU_MEMORY_FRACTION``) only where 64 of the run's longest rows would not
fit in it (a pretrained model's update; never the lab's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import psutil
import torch

from explorl.adapters import plain
from explorl.config import RunConfig
from explorl.models import resolve_dtype
from explorl.policy.forward import fused_head, pack_length, takes_custom_mask

CPU_MICRO_BATCH_ROWS = 64
"""``optim.micro_batch_size: null`` off CUDA: responses per forward/backward (the CPU lab's)."""
CPU_MEMORY_FRACTION = 0.25
"""Off CUDA, the share of the memory available at the start (``psutil``'s ``available``, with the
weights loaded) a micro-batch's forward and backward may plan on: the rest is the sampler's, the
reward workers', the evaluation's and everyone else's on the machine."""
PLANNED_FIELDS = ("micro_batch_size", "micro_batch_tokens")
"""``optim`` fields the plan fills in where the config leaves them None (``apply``)."""
GIB = 2**30
TOKEN_QUANTUM = 256
"""Planned budgets are a multiple of this many tokens (and at least one quantum)."""
MAX_TOKENS = 1 << 20
"""Largest planned budget (``optim.micro_batch_size``'s upper bound)."""
RESERVE_FRACTION, RESERVE_MIN = 0.10, 1 * GIB
"""Kept free for the allocator's fragmentation, cuBLAS workspaces and the eager decode loop's
KV cache: 10% of the free memory (after the static decode path's buffers), at least 1 GiB."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory arithmetic reads from a decoder-only model."""

    hidden: int  # H
    layers: int  # L
    vocab: int  # V, rows of the output projection
    intermediate: int  # I, the MLP's inner width
    kv_dim: int  # key/value width per layer: kv heads × head dim
    params: int  # every parameter (P)
    trainable: int  # parameters with a gradient and AdamW state
    pack_len: int = 0  # packed-row length of the loss pass (forward.pack_length); 0: padded
    fused: bool = True  # log-probs from the hidden states (forward.fused_head): no full logits

    @classmethod
    def of(cls, model: torch.nn.Module, pack_len: int = 0, fused: bool = True) -> ModelShape:
        c = model.config
        H, heads = c.hidden_size, c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or H // heads
        kv = getattr(c, "num_key_value_heads", None) or heads
        return cls(hidden=H, layers=c.num_hidden_layers,
                   vocab=model.get_output_embeddings().weight.shape[0],
                   intermediate=getattr(c, "intermediate_size", None) or 4 * H,
                   kv_dim=kv * head_dim,
                   params=sum(p.numel() for p in model.parameters()),
                   trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
                   pack_len=pack_len, fused=fused)


@dataclass(frozen=True)
class Budget:
    """``token_budget``'s answer and every term it used (bytes)."""

    tokens: int
    per_token: int  # activations kept for the backward, per token
    fixed: int  # optimizer state and gradients to come, weight casts, the log-prob workspace
    usable: int  # free − reserve − fixed
    note: str = ""


def token_budget(free: int, shape: ModelShape, *, compute_bytes: int, master_bytes: int,
                 checkpointing: bool, logprob_chunk: int, shards: int = 1) -> Budget:
    """Tokens (prompt + response, as ``optim.micro_batch_tokens`` counts them) one forward and
    backward can take in ``free`` bytes, measured with the weights already in place.

    Per token and decoder layer the backward keeps, in the compute dtype (b bytes), the inputs
    of q/k/v, q, k, v, rotated q and k, the attention output (4H + 3·kv) and the MLP's input,
    gate, up, act(gate) and act·up (H + 4I); and in the master dtype (m) the residual stream and
    the two RMSNorms' inputs and outputs (4H): ``layer = b·(5H + 3kv + 4I) + 4H·m``. Per token:
    ``(L + 1)·layer`` (the +1: one layer's gradients in flight in the backward), the embedding
    output, final norm and head input and its gradient ``4H·m``, and the packed layout's mask
    row ``pack_len·(m + 1)``. Gradient checkpointing keeps only each layer's input (``L·H·m``)
    and recomputes one layer at a time: ``2·layer`` instead of ``(L + 1)·layer``. With the fused
    log-probs (``shape.fused``) the vocabulary never scales with tokens: they are taken
    ``logprob_chunk`` tokens at a time from the hidden states, with two float32 chunk × V
    buffers and the head's chunk of logits (``chunk·V·(8 + b)``, fixed). Without them the model
    writes the full logits, kept for the backward, and the backward their gradient at the
    response positions and at every position: ``3·b·V`` more per token.

    Fixed: gradients and AdamW's two moments of the trainable weights (``3·m`` per parameter,
    over ``shards`` FSDP shards; they appear at the first step), the autocast copies of the
    weights when the compute dtype is narrower than the master (``b·P``), the log-prob workspace,
    and a reserve (10% of ``free``, ≥ 1 GiB). The budget is what is left divided by the
    per-token bytes, rounded down to ``TOKEN_QUANTUM`` tokens, within [quantum, ``MAX_TOKENS``].
    """
    H, L, b, m = shape.hidden, shape.layers, compute_bytes, master_bytes
    layer = b * (5 * H + 3 * shape.kv_dim + 4 * shape.intermediate) + 4 * H * m
    outside = 4 * H * m + shape.pack_len * (m + 1)
    per_token = (L * H * m + 2 * layer if checkpointing else (L + 1) * layer) + outside
    if not shape.fused:
        per_token += 3 * b * shape.vocab
    state = 3 * m * shape.trainable // shards
    casts = b * shape.params if b < m else 0
    workspace = logprob_chunk * shape.vocab * (8 + b)
    reserve = max(RESERVE_MIN, int(RESERVE_FRACTION * free))
    fixed = state + casts + workspace
    usable = free - reserve - fixed
    raw = usable // per_token if usable > 0 else 0
    tokens = min(MAX_TOKENS, raw // TOKEN_QUANTUM * TOKEN_QUANTUM)
    note = ""
    if tokens < TOKEN_QUANTUM:
        tokens = TOKEN_QUANTUM
        note = ("the model barely fits: a longer pass may run out of memory "
                "(model.gradient_checkpointing: true keeps ~1/L of the activations)")
    return Budget(tokens=tokens, per_token=per_token, fixed=fixed, usable=usable, note=note)


def old_logp_source(cfg: RunConfig, engine_exact: bool) -> tuple[str, str]:
    """Where the PPO ratio's old log-probs come from, and why (``algorithm.old_logp``).

    ``sampler``: the engine's values. ``recompute``: one no-grad pass of the policy before the
    update. ``update``: the update's own forward, detached (no pass of its own): under ``auto``
    when it gives exactly what the recompute would, i.e. one optimizer step per rollout batch
    (the weights are still the sampling ones), every row sampled by the policy itself, and no
    part of the step that reads old log-probs before the update. ``engine_exact``: the engine's
    float32 log-probs are the trainer's own (then ``auto`` keeps them, as before).
    """
    mode, asy = cfg.algorithm.old_logp, cfg.rollout.async_
    if mode != "auto":
        return mode, f"algorithm.old_logp: {mode}"
    if asy.enabled and asy.max_staleness > 0:  # π_prox (docs/rollout-engines.md §8)
        return "recompute", (f"rollout.async.max_staleness={asy.max_staleness}: the sampler's "
                             "weights may be older than the trainer's, so the clip acts on "
                             "π_θ/π_prox with π_prox recomputed")
    if engine_exact:
        return "sampler", "the engine's float32 log-probs are the trainer's own"
    o, c, r = cfg.optim, cfg.control, cfg.rollout
    rc = cfg.algorithm.rollout_correction
    blockers = [
        (o.ppo_epochs > 1, f"optim.ppo_epochs={o.ppo_epochs}: later passes see updated weights"),
        (o.mini_batches > 1, f"optim.mini_batches={o.mini_batches}: later mini-batches see "
                             "updated weights"),
        (c.eepo.enabled, "control.eepo: stage-2 rows come from the unlearned copy"),
        (c.entropic.enabled, "control.entropic counts confident tokens before the update"),
        (r.engine == "vllm" and not r.vllm.recompute,
         "rollout.vllm.recompute: false leaves the entropy to the trainer"),
        (rc.mode not in ("off", "auto") or (rc.mode == "auto" and r.engine == "vllm"),
         "algorithm.rollout_correction weighs the trainer's log-probs against the engine's "
         "before the update"),
        (cfg.algorithm.kl_in_reward,
         "algorithm.kl_in_reward puts the policy's KL into the rewards before the update"),
    ]
    why = [text for hit, text in blockers if hit]
    if why:
        return "recompute", "; ".join(why)
    return "update", ("one update per rollout batch with the same weights and dtype: the "
                      "update's own forward gives them (the first ratio is exactly 1)")


@dataclass(frozen=True)
class Plan:
    """The run's choice: micro-batch sizes, the old-log-prob source, and the reasons."""

    device: str
    micro_batch_size: int
    micro_batch_tokens: int | None
    old_logp: str  # sampler | update | recompute
    sizes_why: str
    old_logp_why: str
    budget: Budget | None = None
    logprobs_why: str = ""  # how the loss's log-probs are taken (``logprob_path``)

    @property
    def passes(self) -> int:
        """Passes of the policy over the rollout batch per step (each over every micro-batch),
        at most: a recompute reuses the first mini-batch's forward where that mini-batch is one
        micro-batch (``PolicyUpdate.recompute``), so 2 − 1/mini_batches there."""
        return 2 if self.old_logp == "recompute" else 1

    def lines(self) -> list[str]:
        """The plan in words: printed once at the start and written atop ``config.yaml``."""
        tok, n = self.micro_batch_tokens, self.micro_batch_size
        rows = (f"≤ {tok:,} tokens" if tok and n >= tok else f"≤ {n} responses"
                + (f" and ≤ {tok:,} tokens" if tok else ""))
        src = {"sampler": "the sampler", "update": "the update's own forward",
               "recompute": "a separate no-grad pass"}[self.old_logp]
        fold = (" (the first mini-batch's rows from its own forward, with gradients, which the "
                "update reuses, when that mini-batch is one micro-batch)"
                if self.old_logp == "recompute" else "")
        out = [f"device plan ({self.device}): micro-batches of {rows}: {self.sizes_why}",
               f"  old log-probs from {src}{fold} ({self.old_logp_why}); "
               f"{'up to ' if fold else ''}{self.passes} pass"
               f"{'es' if self.passes > 1 else ''} of the policy over the batch per step"]
        return out + ([f"  log-probs {self.logprobs_why}"] if self.logprobs_why else [])


def logprob_path(cfg: RunConfig, model: torch.nn.Module) -> tuple[bool, str]:
    """Whether the loss's log-probs come from the hidden states (``algorithm.fused_logprobs``
    and a head ``forward.fused_head`` knows), and the plan's words for it."""
    chunk = cfg.algorithm.logprob_chunk
    if not cfg.algorithm.fused_logprobs:
        return False, (f"from the full logits, {chunk} tokens at a time "
                       "(algorithm.fused_logprobs: false)")
    head, why = fused_head(model)
    if head is None:
        return False, f"from the full logits, {chunk} tokens at a time ({why})"
    return True, (f"from the hidden states through the {why}, {chunk} tokens at a time: the "
                  "full-vocabulary logits never exist")


def make_plan(cfg: RunConfig, device: torch.device, *, shape: ModelShape | None,
              free: int | None, engine_exact: bool, shards: int = 1, resident: int = 0,
              logprobs_why: str = "", prompt_len: int = 0) -> Plan:
    """The plan for ``cfg`` on ``device``. ``free``: bytes free on the device with the weights
    loaded (CUDA), or available in the host's memory (CPU; ``_cpu_plan``); None: unknown.
    ``prompt_len``: the longest prompt's tokens (the CPU plan's row length). ``resident``:
    bytes the sampler will keep allocated between calls once it has run (the static decode
    path's buffers, CUDA), taken out of ``free`` before the budget. ``logprobs_why``:
    ``logprob_path``'s words. Sizes set in the config are kept as written."""
    o, src = cfg.optim, old_logp_source(cfg, engine_exact)
    rows, tokens, budget = o.micro_batch_size, o.micro_batch_tokens, None
    if device.type != "cuda":
        return _cpu_plan(cfg, device, shape, free, src, prompt_len, logprobs_why)
    if free is None or shape is None:
        rows = CPU_MICRO_BATCH_ROWS if rows is None else rows
        why = "as set" if o.micro_batch_size is not None else "the default off CUDA"
        return Plan(device.type, rows, tokens, src[0], why, src[1], logprobs_why=logprobs_why)
    if tokens is None:
        c = resolve_dtype(cfg.model.dtype, device).itemsize
        budget = token_budget(free - resident, shape, compute_bytes=c,
                              master_bytes=c if cfg.model.pure_low_precision else 4,
                              checkpointing=cfg.model.gradient_checkpointing,
                              logprob_chunk=cfg.algorithm.logprob_chunk, shards=shards)
        tokens = budget.tokens
        kept = (f" ({resident / GIB:.1f} GiB of it kept for the sampler's static decode "
                f"buffers)" if resident else "")
        why = (f"{free / GIB:.1f} GiB free{kept}, {budget.fixed / GIB:.1f} GiB fixed, "
               f"{budget.per_token / 2**20:.2f} MiB of activations per token "
               f"({shape.layers} layers × hidden {shape.hidden}"
               f"{', checkpointed' if cfg.model.gradient_checkpointing else ''}"
               f"{'' if shape.fused else f', full logits of {shape.vocab:,} words'})")
        if budget.note:
            why += f"; {budget.note}"
    else:
        why = "optim.micro_batch_tokens as set"
    # A micro-batch of T tokens never holds more than T responses: no separate row limit.
    rows = min(tokens, MAX_TOKENS) if rows is None else rows
    return Plan(device.type, rows, tokens, src[0], why, src[1], budget, logprobs_why)


def _cpu_plan(cfg: RunConfig, device: torch.device, shape: ModelShape | None, free: int | None,
              src: tuple[str, str], prompt_len: int, logprobs_why: str) -> Plan:
    """Off CUDA: ``CPU_MICRO_BATCH_ROWS`` responses per pass, and a token budget only where
    that many of the run's longest rows (``prompt_len`` + ``rollout.max_response_len``) would
    not fit in ``CPU_MEMORY_FRACTION`` of the available memory (``token_budget`` on that share,
    float32). A size set in the config is kept as written."""
    o = cfg.optim
    rows, tokens = o.micro_batch_size, o.micro_batch_tokens
    why = "as set" if rows is not None or tokens is not None else "the default off CUDA"
    rows = CPU_MICRO_BATCH_ROWS if rows is None else rows
    if o.micro_batch_size is not None or tokens is not None or free is None or shape is None:
        return Plan(device.type, rows, tokens, src[0], why, src[1], logprobs_why=logprobs_why)
    c = resolve_dtype(cfg.model.dtype, device).itemsize
    share = int(CPU_MEMORY_FRACTION * free)
    budget = token_budget(share, shape, compute_bytes=c,
                          master_bytes=c if cfg.model.pure_low_precision else 4,
                          checkpointing=cfg.model.gradient_checkpointing,
                          logprob_chunk=cfg.algorithm.logprob_chunk)
    longest = rows * (prompt_len + (cfg.rollout.max_response_len or 0))
    if budget.tokens >= longest > 0:
        return Plan(device.type, rows, None, src[0], why, src[1], logprobs_why=logprobs_why)
    why = (f"{CPU_MEMORY_FRACTION:.0%} of {free / GIB:.1f} GiB available, "
           f"{budget.fixed / GIB:.1f} GiB fixed, {budget.per_token / 2**20:.2f} MiB of "
           f"activations per token ({shape.layers} layers × hidden {shape.hidden}"
           f"{', checkpointed' if cfg.model.gradient_checkpointing else ''}); "
           f"{rows} rows of up to {longest // rows:,} tokens would not fit")
    if budget.note:
        why += f"; {budget.note}"
    return Plan(device.type, rows, budget.tokens, src[0], why, src[1], budget, logprobs_why)


def free_bytes(device: torch.device) -> int | None:
    """Bytes a new allocation can get: on a CUDA ``device`` free plus the allocator's cached
    blocks; on a CPU the host's available memory (``psutil``)."""
    if device.type == "cpu":
        return int(psutil.virtual_memory().available)
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def apply(cfg: RunConfig, plan: Plan) -> RunConfig:
    """``cfg`` with the planned micro-batch sizes written in (what ``config.yaml`` records)."""
    optim = dataclasses.replace(cfg.optim, micro_batch_size=plan.micro_batch_size,
                                micro_batch_tokens=plan.micro_batch_tokens)
    return dataclasses.replace(cfg, optim=optim)


def engine_exact(cfg: RunConfig, engine, device: torch.device) -> bool:
    """Whether ``engine``'s old log-probs are the trainer's own: it says so
    (``logprobs_match_trainer``) and the run computes in float32."""
    return (getattr(engine, "logprobs_match_trainer", False)
            and resolve_dtype(cfg.model.dtype, device) == torch.float32)


def sampling_models(cfg: RunConfig) -> int:
    """Models the sampler keeps decode buffers for: the policy, and a copy where EEPO's second
    stage or an asynchronous worker samples with one."""
    a = cfg.rollout.async_
    return 2 if cfg.control.eepo.enabled or (a.enabled and a.max_staleness > 0) else 1


def plan_for(cfg: RunConfig, device: torch.device, policy: torch.nn.Module, dist,
             engine, prompt_len: int = 0) -> Plan:
    """The plan of a run set up this far: a token budget from the least free memory of any rank
    (every rank joins the gather), measured with the weights and the engine in place; on CUDA
    less what the engine's static decode path will keep for prompts of up to ``prompt_len``
    tokens (it allocates on its first call, after the plan); on a CPU ``_cpu_plan``'s."""
    free = free_bytes(device)
    resident = 0
    if free is not None:
        free = min(p["free"] for p in dist.gather({"free": free}))
        if device.type == "cuda" and hasattr(engine, "resident_bytes"):
            resident = engine.resident_bytes(policy, device, resolve_dtype(cfg.model.dtype, device),
                                             prompt_len, cfg.rollout.max_response_len or 0,
                                             sampling_models(cfg))
    pack = pack_length(policy) if takes_custom_mask(policy) else 0
    fused, logprobs_why = logprob_path(cfg, plain(policy))
    shape = ModelShape.of(policy, pack, fused) if free is not None else None
    shards = dist.world_size if dist.strategy == "fsdp" else 1
    return make_plan(cfg, device, shape=shape, free=free, shards=shards, resident=resident,
                     engine_exact=engine_exact(cfg, engine, device), logprobs_why=logprobs_why,
                     prompt_len=prompt_len)
