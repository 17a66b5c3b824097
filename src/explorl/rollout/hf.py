"""Batched sampling on a Hugging Face causal LM with a KV cache.

Unlike ``model.generate`` this loop returns what RL needs from the sampling pass itself: the
log-prob and entropy of every sampled token at the sampling temperature (so the trainer can
reuse them as old log-probs while the policy is unchanged), and it accepts a different number
of samples per prompt (E3 budgets) in one batch.

Where the time goes, and what the loop does about it (figures: benchmarks/README.md):

- **Shared prompts are encoded once.** GRPO samples G responses per prompt; the prefill runs on
  the distinct prompts only and the KV cache is then fanned out to the G rows
  (``Cache.reorder_cache``), and the first token's distribution is computed once per prompt.
- **Finished rows leave the batch.** When enough rows have emitted EOS, the batch (KV cache,
  mask, positions) is compacted to the rows still going; the loop stops when none is left.
  Compacting only once the live fraction drops below ``compact_ratio`` bounds the copying.
- **One host round-trip per token at most**, and on accelerators one every ``sync_every``
  tokens: finished rows keep decoding (masked) until the next check.
- **No KV-cache copy per token.** transformers' ``DynamicCache`` concatenates every layer's
  keys and values with the new token's (O(T²) copying over a response); ``_BufferedLayer``
  writes into buffers with room to grow and hands attention views of the filled part (the same
  numbers: the kernels read the same values through strides).
- **A lean model call** (``policy.lean``) for Llama-family models: the decoder's own ops on
  the model's weights, without transformers' per-call machinery; the same logits bit for bit.
- **A static decode path** (``rollout.static``, ``rollout.hf.static``): on CUDA the decode step
  runs on preallocated buffers of fixed shape per batch-size bucket, replayed as one CUDA graph
  per bucket; the same tokens as this loop under the same seeds.
- **Counter-based draws without per-token noise over the vocabulary** (``rollout.seeding``):
  small vocabularies on CPU get their Gumbel noise for a block of positions at once; real
  vocabularies and accelerators draw by inverse CDF from one uniform per row (one pass over the
  probabilities instead of |V| random numbers and two logarithms per row and token).
"""

from __future__ import annotations

import warnings

import torch
from transformers import DynamicCache

try:  # transformers >= 4.56: caches made of per-layer objects
    from transformers.cache_utils import DynamicLayer
except ImportError:  # older: the plain DynamicCache
    DynamicLayer = None

from explorl.adapters import for_sampling
from explorl.config.sections import HFConfig
from explorl.hf_compat import cache_kwarg
from explorl.policy.forward import position_ids
from explorl.policy.lean import lean_logits, lean_sampling_supported
from explorl.rollout.progress import step as report_decode_step
from explorl.rollout.seeding import NoiseStream, row_keys
from explorl.rollout.static import (
    StaticDecoder,
    bucket,
    columns,
    compute_dtype,
    decoder_bytes,
    static_supported,
)
from explorl.rollout.types import Rollouts


def left_pad(
    seqs: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to one width: ``(ids (N, P), mask (N, P) bool)``."""
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[pad_id] * (width - len(s)) + list(s) for s in seqs], dtype=torch.long,
                       device=device)
    mask = torch.tensor([[False] * (width - len(s)) + [True] * len(s) for s in seqs],
                        dtype=torch.bool, device=device)
    return ids.reshape(len(seqs), width), mask.reshape(len(seqs), width)


class _BufferedLayer(DynamicLayer or object):
    """A ``DynamicLayer`` that keeps keys and values in buffers with spare room along the
    sequence and returns views of the filled part: no ``torch.cat`` of the whole cache per token.

    Room grows by doubling up to ``limit`` positions (the prompt plus the response budget), so
    memory follows the longest live row as with the dynamic cache.
    """

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.n = limit, 0
        self.k_buf = self.v_buf = None

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.n + key_states.shape[-2]
        if self.k_buf is None or n > self.k_buf.shape[-2]:
            cap = max(n, min(self.limit, 2 * n))
            k_buf = key_states.new_empty((*key_states.shape[:-2], cap, key_states.shape[-1]))
            v_buf = value_states.new_empty((*value_states.shape[:-2], cap, value_states.shape[-1]))
            if self.n:
                k_buf[..., : self.n, :] = self.keys
                v_buf[..., : self.n, :] = self.values
            self.k_buf, self.v_buf = k_buf, v_buf
        self.k_buf[..., self.n: n, :] = key_states
        self.v_buf[..., self.n: n, :] = value_states
        self.n = n
        self.keys, self.values = self.k_buf[..., :n, :], self.v_buf[..., :n, :]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.n

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.n:
            self.k_buf = self.k_buf.index_select(0, beam_idx.to(self.k_buf.device))
            self.v_buf = self.v_buf.index_select(0, beam_idx.to(self.v_buf.device))
            self.keys, self.values = self.k_buf[..., : self.n, :], self.v_buf[..., : self.n, :]


def decode_cache(config, limit: int) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose full-attention layers are ``_BufferedLayer``s
    (sliding-window layers, and caches of older transformers, stay as they are)."""
    cache = DynamicCache(config=config)
    layers = getattr(cache, "layers", None)
    if DynamicLayer is not None and isinstance(layers, list):
        for i, layer in enumerate(layers):
            if type(layer) is DynamicLayer:
                layers[i] = _BufferedLayer(limit)
    return cache


class HFEngine:
    """The ``hf`` rollout engine: sampling with the training model's weights and a KV cache.

    ``compact_ratio``: drop finished rows from the batch once at most this fraction of it is
    still generating (1 = as soon as any row finishes, 0 = never). ``sync_every``: on
    accelerators, how many tokens between checks for finished rows (each check is a device
    sync); on CPU every token is checked, as a check costs nothing there. ``static``: the static
    decode path (``rollout.hf.static``: auto, True or False); ``static_min_rows``: its smallest
    bucket.
    """

    static_min_rows = 8

    # Its float32 log-probs equal the trainer's forward up to ~1e-6 (same model, same weights), so
    # ``algorithm.old_logp: auto`` keeps them instead of recomputing (tests/test_rollout_hf.py).
    logprobs_match_trainer = True

    @classmethod
    def from_config(cls, cfg, tokenizer, model_path, dtype: torch.dtype, device=None,
                    eos_ids: list[int] | None = None) -> HFEngine:
        """The engine ``rollout.engine: hf`` builds (``rollout.base.ENGINES``); ``eos_ids``: its
        stop tokens (None: the tokenizer's EOS)."""
        return cls(tokenizer, batch_size=cfg.rollout.batch_size, static=cfg.rollout.hf.static,
                   eos_ids=eos_ids)

    def __init__(self, tokenizer, *, batch_size: int = 256, eos_ids: list[int] | None = None,
                 compact_ratio: float = 0.5, sync_every: int = 4, lean: bool = True,
                 static: bool | str = HFConfig.static):
        static = {"on": True, "off": False}.get(static, static)
        if static not in ("auto", True, False):
            raise ValueError(f"static must be auto, True or False, not {static!r}")
        self.tokenizer = tokenizer
        self.lean = lean
        self.static = static
        self._decoders: dict[int, StaticDecoder] = {}  # id(model) -> its buffers and graphs
        self.batch_size = batch_size
        self.compact_ratio = compact_ratio
        self.sync_every = sync_every
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        eos = [e for e in (eos_ids if eos_ids is not None else [tokenizer.eos_token_id])
               if e is not None]
        # moved to the model's device per call (the engine has no device of its own)
        self.eos_ids = torch.as_tensor(eos, dtype=torch.long)  # host

    def resident_bytes(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype,
                       prompt_len: int, out_len: int, models: int = 1) -> int:
        """Device memory the static decode path keeps between sampling calls for ``models``
        models of ``model``'s shape (EEPO's copy and the asynchronous worker's copy sample with
        their own buffers), at its largest call: ``batch_size`` rows (a validation pass fills
        it), the longest prompt (``prompt_len`` tokens) plus ``out_len``, computing in
        ``dtype``; 0 where the eager loop samples. The device plan keeps it out of the update's
        token budget (training/plan.py)."""
        if not (self._static_on(device) and self.lean and out_len > 0
                and static_supported(model)):
            return 0
        rows, cols = bucket(self.batch_size, self.static_min_rows), columns(prompt_len + out_len)
        return models * decoder_bytes(model, rows, cols, out_len, dtype)

    def _static_on(self, device: torch.device) -> bool:
        return self.static is True or (self.static == "auto" and device.type == "cuda")

    def generate(
        self,
        model: torch.nn.Module,
        prompt_ids: list[list[int]],
        n_samples: list[int],
        temperature: float,
        max_new_tokens: int,
        generator: torch.Generator | None = None,
        seeds: list[int] | None = None,
    ) -> Rollouts:
        """``seeds`` (one per prompt) switches to counter-based sampling: response j of prompt i
        depends only on (seeds[i], j), not on the batch it is generated in (``rollout.seeding``)."""
        if len(prompt_ids) != len(n_samples):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(n_samples)} sample counts")
        rows = [i for i, n in enumerate(n_samples) for _ in range(n)]  # response -> prompt
        keys = row_keys(seeds, n_samples) if seeds is not None else None  # (N,) per-response keys
        parts = []
        # Inference mode: no autograd bookkeeping on any op (version counters, view tracking),
        # ~5% of the lab's sampling time. The record leaves it as normal tensors (copies), which
        # the loss may save for its backward.
        with torch.inference_mode(), for_sampling(model) as model:  # LoRA: the adapted model
            for start in range(0, len(rows), self.batch_size):
                chunk = rows[start: start + self.batch_size]
                parts.append(
                    self._generate_rows(
                        model,
                        prompt_ids,
                        chunk,
                        temperature,
                        max_new_tokens,
                        generator,
                        None if keys is None else keys[start : start + self.batch_size],
                    )
                )
            ro = Rollouts.concat(parts, self.pad_id) if len(parts) > 1 else parts[0]
        return ro.copy()

    def _generate_rows(
        self, model, prompt_ids, prompt_index, temperature, max_new_tokens, generator, keys=None
    ) -> Rollouts:
        """Sample one response per entry of ``prompt_index`` (rows of one prompt are adjacent)."""
        device = next(model.parameters()).device
        lean = self.lean and lean_sampling_supported(model)
        # The plain call runs the modules, in eval mode; the lean call reads no module's training
        # flag, so it skips the two walks over every submodule that toggling costs (~1 ms a step
        # on the lab model).
        was_training = model.training and not lean
        if was_training:
            model.eval()
        N = len(prompt_index)
        # Distinct prompts of this batch; ``inv`` maps each row to its prompt's row in the prefill.
        uniq = list(dict.fromkeys(prompt_index))
        slot = {p: k for k, p in enumerate(uniq)}
        inv = torch.as_tensor(
            [slot[p] for p in prompt_index], dtype=torch.long, device=device
        )  # (N,)
        ids_u, mask_u = left_pad([prompt_ids[p] for p in uniq], self.pad_id, device)  # (U, P)
        P = ids_u.shape[1]
        greedy = temperature == 0
        check_every = 1 if device.type == "cpu" else max(1, self.sync_every)

        # Prefill: the distinct prompts once, then fan the cache and the last logits out to the
        # rows.
        cache = decode_cache(model.config, P + max_new_tokens)
        call = _model_logits
        if lean:
            padded = not bool(mask_u.all())  # else no row has padding: the lean call needs no mask

            def call(model, ids, mask, pos, cache):
                return lean_logits(model, ids, mask if padded else None, pos, cache)
        logits = call(model, ids_u, mask_u.long(), position_ids(mask_u), cache)  # (U, V)
        static = self._static_decoder(model, device, lean, N, P, max_new_tokens, greedy, keys)
        res = None
        if static is not None:
            first = position_ids(mask_u)[inv, -1] + 1  # (N,) position of the first response token
            try:
                res = static.decode(cache, logits[inv], inv, mask_u[inv], first, temperature, keys,
                                    max_new_tokens, check_every)
            except Exception as e:  # noqa: BLE001 - the eager loop draws the same tokens
                warnings.warn(f"rollout.hf.static: the static decode path failed "
                              f"({type(e).__name__}: {e}); the eager loop samples from now on",
                              RuntimeWarning, stacklevel=2)
                self.static, self._decoders = False, {}
        if res is not None:
            out_tokens, out_logp, out_ent, out_mask = res
            n_steps = out_tokens.shape[1]
            eos = self.eos_ids.to(device)
            finished = (out_mask & torch.isin(out_tokens, eos)).any(-1)  # EOS ends a response
        else:
            out_tokens, out_logp, out_ent, out_mask, finished, n_steps = self._decode_eager(
                model, call, cache, logits, inv, mask_u, max_new_tokens, temperature, generator,
                keys, check_every)
        if was_training:
            model.train()

        out_tokens, out_logp = out_tokens[:, :n_steps], out_logp[:, :n_steps]
        out_ent, out_mask = out_ent[:, :n_steps], out_mask[:, :n_steps]
        lengths = out_mask.sum(-1).tolist()
        texts = self.tokenizer.batch_decode(
            [row[:n] for row, n in zip(out_tokens.tolist(), lengths)], skip_special_tokens=True
        )
        return Rollouts(
            prompt_ids=ids_u[inv],
            prompt_mask=mask_u[inv],
            response_ids=out_tokens,
            response_mask=out_mask,
            old_logp=out_logp,
            entropy=out_ent,
            prompt_index=torch.as_tensor(prompt_index, dtype=torch.long, device=device),
            texts=texts,
            temperature=temperature,
            truncated=~finished,
        )

    def _decode_eager(self, model, call, cache, logits, inv, mask_u, max_new_tokens, temperature,
                      generator, keys, check_every):
        """The eager decode loop from the prefill's ``cache`` and ``logits`` (U rows each):
        tokens, log-probs, entropy, mask (N, R), finished (N,) and the steps taken."""
        device, N, P = logits.device, len(inv), mask_u.shape[1]
        uniq_n = logits.shape[0]
        single_eos = self.eos_ids.numel() == 1
        eos = self.eos_ids.to(device)
        eos_id = int(self.eos_ids[0]) if single_eos else None
        greedy = temperature == 0
        scale = 1.0 if greedy else 1.0 / temperature
        out_tokens = torch.full((N, max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        out_logp = torch.zeros((N, max_new_tokens), device=device)
        out_ent = torch.zeros((N, max_new_tokens), device=device)
        out_mask = torch.zeros((N, max_new_tokens), dtype=torch.bool, device=device)
        finished = torch.zeros(N, dtype=torch.bool, device=device)

        if uniq_n < N:
            cache.reorder_cache(inv)
            logits = logits[inv]  # (N, V)

        # The rows' attention masks over every position they can reach, sliced per step.
        attn = torch.cat(
            [mask_u[inv], torch.ones((N, max_new_tokens), dtype=torch.bool, device=device)], 1
        )
        pos = position_ids(mask_u)[inv, -1:] + 1  # (N, 1): position of the first response token
        idx = torch.arange(N, device=device)  # batch row -> output row
        noise = (
            NoiseStream(keys, logits.shape[-1], max_new_tokens, device=device)
            if keys is not None
            else None
        )
        alive = torch.ones(N, dtype=torch.bool, device=device)  # per batch row
        n_steps = 0
        for t in range(max_new_tokens):
            z = logits.float()  # (n, V) at the sampling temperature (×1: a pass for nothing)
            if scale != 1.0:
                z = z * scale
            logp_all = torch.log_softmax(z, dim=-1)
            p_all = logp_all.exp()
            # Entropy at the sampling temperature: the quantity E3's scheduler and the metrics use.
            ent = -(p_all * logp_all).sum(-1)  # (n,)
            if greedy:
                tok = z.argmax(-1)
            elif noise is not None:
                tok = noise.sample(logp_all, t, p_all)
            else:
                tok = torch.multinomial(p_all, 1, generator=generator).squeeze(-1)
            tok = tok.masked_fill(~alive, self.pad_id)
            out_tokens[idx, t] = tok
            out_logp[idx, t] = logp_all.gather(-1, tok[:, None]).squeeze(-1) * alive
            out_ent[idx, t] = ent * alive
            out_mask[idx, t] = alive
            n_steps = t + 1
            report_decode_step(n_steps, max_new_tokens, len(idx))
            done = alive & ((tok == eos_id) if single_eos else torch.isin(tok, eos))
            finished[idx] |= done
            alive = alive & ~done
            if t == max_new_tokens - 1:
                break
            if (t + 1) % check_every == 0:
                n_alive = int(alive.sum())  # the step's one host sync
                if n_alive == 0:
                    break
                if n_alive <= self.compact_ratio * len(alive) and n_alive < len(alive):
                    keep = alive.nonzero().squeeze(-1)  # (n_alive,)
                    cache.reorder_cache(keep)
                    idx, tok, alive, attn, pos = (
                        idx[keep],
                        tok[keep],
                        alive[keep],
                        attn[keep],
                        pos[keep],
                    )
                    if noise is not None:
                        noise.keep(keep)
            logits = call(model, tok[:, None], attn[:, : P + t + 1], pos, cache)
            pos = pos + 1
        return out_tokens, out_logp, out_ent, out_mask, finished, n_steps

    def _static_decoder(self, model, device, lean, N, P, R, greedy, keys):
        """The static decoder for this call (``rollout.static``), or None: the eager loop."""
        if not (self._static_on(device) and lean and R > 0 and P > 0
                and (greedy or keys is not None)):
            return None
        if not static_supported(model):
            return None
        if device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            # CPU autocast keeps some ops (attention among them) in float32 where the static
            # step, on weights cast once, runs them in the compute dtype: rows would part from
            # the eager loop's (~1e-2 in log-prob under bfloat16). On CUDA both match.
            if not getattr(self, "_warned_cpu_autocast", False):
                warnings.warn("rollout.hf.static: on the CPU under autocast the static path "
                              "would not compute what the eager loop does; the eager loop "
                              "samples", RuntimeWarning, stacklevel=3)
                self._warned_cpu_autocast = True
            return None
        dtype = compute_dtype(model, device)
        rows, cols = bucket(N, self.static_min_rows), columns(P + R)
        dec = self._decoders.get(id(model))
        if dec is None or not dec.fits(model, rows, cols, R, dtype):
            if dec is not None:  # grow: never shrink, so a slightly longer prompt rebuilds rarely
                rows, cols, R = max(rows, dec.rows), max(cols, dec.cols), max(R, dec.R)
            self._decoders.pop(id(model), None)
            dec = None  # the old buffers and graphs are freed before the new ones are allocated
            if len(self._decoders) >= 2:  # the policy and EEPO's copy; more are transient
                self._decoders.clear()
            dec = StaticDecoder(model, device, dtype, rows, cols, R, self.eos_ids, self.pad_id,
                                self.static_min_rows, graphs=True)
            self._decoders[id(model)] = dec
        return dec


def _model_logits(model, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
    """The plain model call: logits (N, V) of the last position, the cache extended."""
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=1,
        **{cache_kwarg(model): cache},
    ).logits[:, -1, :]
