"""The ``hf`` engine's static decode path: fixed shapes per batch-size bucket, and on CUDA one
graph per bucket for the whole decode step (``rollout.hf.static``).

At a decode step the eager loop spends its time around the arithmetic: hundreds of small kernel
launches, Python, the cache's bookkeeping. Here every tensor a step touches is preallocated:

- **KV buffers** (rows, kv heads, columns, head dim) per layer, in the compute dtype, with room
  for the prompt and the whole response; an additive mask hides the columns not yet written.
- **Buckets**: the batch runs as the first ``b`` rows of the buffers, ``b`` a power of two. When
  the live rows fit a smaller bucket (checked every ``sync_every`` tokens, the one host sync),
  they are gathered to the front and the loop goes on in that bucket.
- **One step, one graph**: the model call, the temperature, log-softmax, entropy, the draw of
  the token and the writes of token, log-prob, entropy and mask into the output buffers read
  only device tensors (the step counter included), so on CUDA each bucket's step is captured
  once (``torch.cuda.CUDAGraph``, one memory pool shared by the buckets) and replayed.

The draws are the eager loop's: the same uniforms per (response key, position)
(``seeding.row_uniforms``, gathered inside the step by the row's output index and the step
counter) and the same ops in the same order (``inverse_cdf_sample``); on CPU the small-vocabulary
Gumbel draws come from the same ``NoiseStream`` (never captured: CPU has no graphs). The model
call is ``lean._decoder``'s arithmetic with autocast's casts made explicit: matrices in the
compute dtype (float32 master weights are cast once per call into copies the graphs read), the
residual stream, norms and rotary tables in the weights' dtype, keys stored in the compute dtype
(what autocast's cast before attention gives).

Off CUDA the same step runs uncaptured, called with nothing from the host but (bucket, mode), as
a replay would be (tests/test_rollout_static.py compares it with the eager loop). A failed
capture warns and decodes on the buffers without graphs; the engine hands any other failure back
to its eager loop.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from explorl.policy.lean import (
    _GLOBAL_HOOKS,
    _hooked,
    _norm,
    _rope_tables,
    additive_mask,
    lean_sampling_supported,
)
from explorl.rollout.progress import step as report_decode_step
from explorl.rollout.seeding import MT_VOCAB_MAX, NoiseStream, inverse_cdf_sample, row_uniforms

_COLS = 128  # cache columns are allocated in multiples of this (aligned masks; fewer rebuilds)


def bucket(n: int, smallest: int) -> int:
    """The bucket that holds ``n`` rows: the next power of two, at least ``smallest``."""
    return max(smallest, 1 << max(0, n - 1).bit_length())


def columns(n: int) -> int:
    """Cache columns allocated for ``n`` positions (prompt + response): a multiple of 128."""
    return -(-n // _COLS) * _COLS


def static_supported(model: torch.nn.Module) -> bool:
    """Whether the static step computes what the lean call does for ``model``: a model the lean
    sampler takes, with plain ``Linear``/``Embedding`` modules (no adapter layers) and no hook on
    any module (a hook would fire once, at capture, not at every step)."""
    if not lean_sampling_supported(model):
        return False
    if any(getattr(torch.nn.modules.module, g) for g in _GLOBAL_HOOKS):
        return False
    if any(_hooked(m) for m in model.modules()):
        return False
    body, n = model.model, model.config.num_hidden_layers
    if type(body.embed_tokens) is not torch.nn.Embedding:
        return False
    lins = [model.lm_head]
    for layer in body.layers[:n]:
        a, m = layer.self_attn, layer.mlp
        if not all(hasattr(m, x) for x in ("gate_proj", "up_proj", "down_proj")):
            return False
        lins += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
    return all(type(lin) is torch.nn.Linear for lin in lins)


def compute_dtype(model: torch.nn.Module, device: torch.device) -> torch.dtype:
    """The dtype of the step's matrix products: autocast's where it is on, else the weights'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return model.lm_head.weight.dtype


def _matrices(model: torch.nn.Module) -> list[torch.Tensor | None]:
    """The step's (weight, bias) pairs, flat: each layer's q, k, v, o, gate, up, down, then the
    output head."""
    body, n = model.model, model.config.num_hidden_layers
    lins = []
    for layer in body.layers[:n]:
        a, m = layer.self_attn, layer.mlp
        lins += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
    lins.append(model.lm_head)
    return [t for lin in lins for t in (lin.weight, lin.bias)]


def decoder_bytes(model: torch.nn.Module, rows: int, cols: int, out_len: int,
                  dtype: torch.dtype) -> int:
    """Bytes a ``StaticDecoder(model, …, rows, cols, out_len)`` computing in ``dtype`` keeps
    allocated between sampling calls, worked out without allocating anything:

    - the compute-dtype copies of the step's matrices stored in another dtype (``_Weights``;
      float32 masters under bfloat16 autocast: 2 bytes per weight);
    - keys and values: ``2 × layers × rows × kv_heads × cols × head_dim`` in ``dtype``;
    - per row: the additive attention mask over the columns (``dtype``), the next token, its
      position and its output row (int64) and whether it is alive, ``rows × (cols·b + 25)``;
    - per (row, token) with one spare row: the uniforms (float64), tokens (int64), log-probs and
      entropies (float32) and the mask (bool), ``(rows + 1) × out_len × 25``;
    - the captured step's working memory at the largest bucket, which the graphs' pool keeps:
      the logits in ``dtype`` with their float32 log-softmax and one float32 temporary,
      ``rows × vocab × (b + 8)``.
    """
    b = dtype.itemsize
    cfg = model.config
    copies = sum(t.numel() * b for t in _matrices(model) if t is not None and t.dtype != dtype)
    layers = cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = model.model.layers[0].self_attn.head_dim
    kv = 2 * layers * rows * kv_heads * cols * head_dim * b
    per_row = rows * (cols * b + 8 + 8 + 8 + 1)
    outputs = (rows + 1) * out_len * (8 + 8 + 4 + 4 + 1)
    workspace = rows * model.lm_head.weight.shape[0] * (b + 8)
    return copies + kv + per_row + outputs + workspace


class _Weights:
    """The step's matrices (weight, bias) in the compute dtype: the model's own tensors where
    they are stored in it, else copies that ``refresh`` fills (float32 masters under autocast:
    the values autocast's casts give)."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        self.src = _matrices(model)
        self.dst = [t if t is None or t.dtype == dtype else torch.empty_like(t, dtype=dtype)
                    for t in self.src]

    def refresh(self) -> None:
        for s, d in zip(self.src, self.dst):
            if d is not s:
                d.copy_(s)

    def layer(self, i: int) -> list[torch.Tensor | None]:
        """Layer i's (weight, bias) × (q, k, v, o, gate, up, down), flat."""
        return self.dst[14 * i: 14 * i + 14]

    @property
    def head(self) -> list[torch.Tensor | None]:
        return self.dst[-2:]


def model_key(model: torch.nn.Module) -> tuple:
    """Identifies the storage the graphs read: a replaced tensor (not one updated in place) needs
    new graphs."""
    return (id(model), *(t.data_ptr() for t in model.parameters()),
            *(t.data_ptr() for t in model.buffers()))


class StaticDecoder:
    """Preallocated decode state for one model: ``rows`` batch rows (the largest bucket), cache
    columns ``cols`` (prompt + response), ``out_len`` response tokens, vocabulary ``vocab``."""

    def __init__(self, model, device: torch.device, dtype: torch.dtype, rows: int, cols: int,
                 out_len: int, eos: torch.Tensor, pad_id: int, smallest: int, graphs: bool):
        cfg = model.config
        self.model, self.device, self.dtype, self.key = model, device, dtype, model_key(model)
        self.rows, self.cols, self.R, self.smallest = rows, cols, out_len, smallest
        self.pad_id, self.eos = pad_id, eos.to(device)
        self.weights = _Weights(model, dtype)
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.layers = list(model.model.layers[: cfg.num_hidden_layers])
        d = self.layers[0].self_attn.head_dim
        zeros = functools.partial(torch.zeros, device=device)  # every buffer on the model's device
        self.k = [zeros(rows, self.kv_heads, cols, d, dtype=dtype) for _ in self.layers]
        self.v = [zeros(rows, self.kv_heads, cols, d, dtype=dtype) for _ in self.layers]
        self.mask = zeros(rows, 1, 1, cols, dtype=dtype)  # additive: 0 = may attend
        self.tok = zeros(rows, dtype=torch.long)  # the token each row feeds next
        self.pos = zeros(rows, dtype=torch.long)  # its rotary position
        self.row = zeros(rows, dtype=torch.long)  # slot -> output row (rows: none)
        self.alive = zeros(rows, dtype=torch.bool)
        self.t = zeros(1, dtype=torch.long)  # output column of the next draw
        self.col = zeros(1, dtype=torch.long)  # cache column of the fed token
        self.scale = torch.ones(1, dtype=torch.float32, device=device)
        acc = torch.float32 if device.type == "mps" else torch.float64  # as inverse_cdf_sample
        self.u = zeros(rows + 1, out_len, dtype=acc)  # uniforms per (row, t)
        self.out_tok = zeros(rows + 1, out_len, dtype=torch.long)  # row ``rows``:
        self.out_logp = zeros(rows + 1, out_len)  # where padding slots write
        self.out_ent = zeros(rows + 1, out_len)
        self.out_mask = zeros(rows + 1, out_len, dtype=torch.bool)
        self.use_graphs = graphs and device.type == "cuda"
        self.graphs: dict[tuple[int, tuple[str, bool]], torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.use_graphs else None

    def fits(self, model, rows: int, cols: int, out_len: int, dtype: torch.dtype) -> bool:
        return (self.key == model_key(model) and dtype == self.dtype and rows <= self.rows
                and cols <= self.cols and out_len <= self.R)

    # ------------------------------------------------------------------------- one step

    def _logits(self, b: int) -> torch.Tensor:
        """Logits (b, V) of the first ``b`` slots' fed tokens; their keys and values written at
        column ``col``. ``lean._decoder``'s ops with autocast's casts explicit."""
        dt, body = self.dtype, self.model.model
        h = body.embed_tokens(self.tok[:b, None])  # (b, 1, D)
        cos, sin = _rope_tables(*body.rotary_emb(h, self.pos[:b, None]))
        mask = self.mask[:b]
        mask.index_fill_(3, self.col, 0)
        h = h.reshape(b, -1)
        heads, kv_heads = self.heads, self.kv_heads
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            qw, qb, kw, kb, vw, vb, ow, ob, gw, gb, uw, ub, dw, db = self.weights.layer(i)
            d = attn.head_dim
            x = _norm(layer.input_layernorm, h).to(dt)
            q = F.linear(x, qw, qb).view(b, 1, -1, d)
            k = F.linear(x, kw, kb).view(b, 1, -1, d)
            v = F.linear(x, vw, vb).view(b, 1, -1, d).transpose(1, 2)
            if hasattr(attn, "q_norm"):  # Qwen3
                q, k = _norm(attn.q_norm, q), _norm(attn.k_norm, k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            q = q * cos + q.roll(d // 2, -1) * sin
            k = k * cos + k.roll(d // 2, -1) * sin
            K, V = self.k[i][:b], self.v[i][:b]
            K.index_copy_(2, self.col, k.to(dt))
            V.index_copy_(2, self.col, v.to(dt))
            q = q.to(dt)
            if heads != kv_heads:  # one query per row: a group's queries share their kv head
                q = q.reshape(b, kv_heads, heads // kv_heads, d)
            o = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=attn.scaling)
            h = h + F.linear(o.reshape(b, heads, 1, d).transpose(1, 2).reshape(b, -1), ow, ob)
            x = _norm(layer.post_attention_layernorm, h).to(dt)
            h = h + F.linear(F.silu(F.linear(x, gw, gb)) * F.linear(x, uw, ub), dw, db)
        return F.linear(_norm(body.norm, h).to(dt), *self.weights.head)

    def _draw(self, b: int, logits: torch.Tensor, mode: tuple[str, bool], noise=None, t: int = 0,
              n: int = 0) -> None:
        """Token ``t`` of the first ``b`` slots from their logits (b, V): the eager loop's ops.
        ``mode``: (draw: greedy, inverse or noise; whether to divide by the temperature)."""
        mode, scaled = mode
        z = logits.float()
        if scaled:
            z = z * self.scale
        logp = torch.log_softmax(z, dim=-1)
        p = logp.exp()
        ent = -(p * logp).sum(-1)  # (b,)
        if mode == "greedy":
            tok = z.argmax(-1)
        elif mode == "noise":  # CPU, small vocabulary: the rows' Mersenne-Twister Gumbel noise
            tok = torch.full((b,), self.pad_id, dtype=torch.long, device=z.device)
            tok[:n] = noise.sample(logp[:n], t, p[:n])
        else:
            tok = inverse_cdf_sample(p, self.u.view(-1).index_select(0, self.row[:b] * self.R
                                                                     + self.t))
        alive = self.alive[:b]
        tok = tok.masked_fill(~alive, self.pad_id)
        at = self.row[:b] * self.R + self.t  # (b,) flat output index
        self.out_tok.view(-1).index_copy_(0, at, tok)
        self.out_logp.view(-1).index_copy_(0, at, logp.gather(-1, tok[:, None]).squeeze(-1) * alive)
        self.out_ent.view(-1).index_copy_(0, at, ent * alive)
        self.out_mask.view(-1).index_copy_(0, at, alive)
        alive.logical_and_(~(tok[:, None] == self.eos).any(-1))
        self.tok[:b].copy_(tok)
        self.t.add_(1)

    def _step(self, b: int, mode: tuple[str, bool], noise=None, t: int = 0, n: int = 0) -> None:
        self._draw(b, self._logits(b), mode, noise, t, n)
        self.col.add_(1)
        self.pos[:b].add_(1)

    # ------------------------------------------------------------------------- graphs

    def _capture(self, mode: tuple[str, bool], top: int) -> None:
        """Graphs of the step for every bucket up to ``top`` (largest first, one shared memory
        pool). Warm-up steps run on a side stream first; they write garbage into the buffers,
        which ``decode`` fills afterwards. A failed capture warns and leaves graphs off."""
        todo = [b for b in self._buckets(top) if (b, mode) not in self.graphs]
        for b in todo:
            try:
                for buf in (self.t, self.col, self.row, self.alive):  # indices in range
                    buf.zero_()
                stream = torch.cuda.Stream(self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        self._step(b, mode)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                    self._step(b, mode)
                self.graphs[(b, mode)] = graph
            except Exception as e:  # noqa: BLE001 - any failure: the same step, uncaptured
                warnings.warn(f"rollout.hf.static: CUDA graph capture failed ({type(e).__name__}: "
                              f"{e}); decoding with static buffers, without graphs",
                              RuntimeWarning, stacklevel=2)
                self.use_graphs, self.graphs = False, {}
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                return

    def _buckets(self, top: int) -> list[int]:
        out = [top]
        while out[-1] > self.smallest:
            out.append(max(self.smallest, out[-1] // 2))
        return out

    def _run(self, b: int, mode: tuple[str, bool], noise, t: int, n: int) -> None:
        graph = self.graphs.get((b, mode))
        if graph is not None:
            graph.replay()
        elif noise is None:  # what a graph replays: the host passes (b, mode), nothing per step
            self._step(b, mode)
        else:  # CPU's Mersenne-Twister noise, drawn on the host
            self._step(b, mode, noise, t, n)

    def _compact(self, b: int, n_alive: int, noise) -> int:
        """Gather the live slots to the front; the bucket that holds them."""
        keep = self.alive[:b].nonzero().squeeze(-1)  # (n_alive,)
        for buf in (*self.k, *self.v, self.mask, self.tok, self.pos, self.row, self.alive):
            buf[:n_alive] = buf[:b].index_select(0, keep)
        nb = bucket(n_alive, self.smallest)
        self.row[n_alive:nb] = self.rows
        self.alive[n_alive:nb] = False
        if noise is not None:
            noise.keep(keep)
        return nb

    # ------------------------------------------------------------------------- the loop

    def decode(self, cache, logits: torch.Tensor, inv: torch.Tensor, prompt_mask: torch.Tensor,
               pos: torch.Tensor, temperature: float, keys: torch.Tensor | None, R: int,
               check_every: int) -> tuple[torch.Tensor, ...]:
        """Responses of N rows: ``cache`` holds the distinct prompts' keys and values (U rows,
        P columns; ``inv`` (N,) maps rows to them), ``logits`` (N, V) the first token's,
        ``prompt_mask`` (N, P) the rows' padding, ``pos`` (N,) the first token's position.
        Returns tokens, log-probs, entropy and mask (N, longest response)."""
        N, P = prompt_mask.shape
        V = logits.shape[-1]
        draw, noise = "greedy" if temperature == 0 else "inverse", None
        if draw != "greedy" and self.device.type == "cpu" and V <= MT_VOCAB_MAX:
            draw, noise = "noise", NoiseStream(keys, V, R, device=self.device)
        mode = (draw, temperature not in (0, 1))  # ×1 is exact: skip the pass
        cuda = self.device.type == "cuda"
        on_device = torch.cuda.device(self.device) if cuda else contextlib.nullcontext()
        with torch.autocast(self.device.type, enabled=False), on_device:  # graphs: model's GPU
            self.weights.refresh()
            top = bucket(N, self.smallest)
            if self.use_graphs and draw != "noise":
                self._capture(mode, top)
            for i, layer in enumerate(cache.layers):  # prompts fanned out to the rows
                self.k[i][:N, :, :P] = layer.keys.index_select(0, inv)
                self.v[i][:N, :, :P] = layer.values.index_select(0, inv)
                self.k[i][:N, :, P:].zero_()  # finite: masked columns still meet a 0 weight
                self.v[i][:N, :, P:].zero_()
            self.mask.fill_(torch.finfo(self.dtype).min)
            self.mask[:N, 0, 0, :P] = additive_mask(prompt_mask, self.dtype)
            self.pos.zero_()[:N] = pos
            self.row.fill_(self.rows)[:N] = torch.arange(N, device=self.device)
            self.alive.zero_()[:N] = True
            self.t.zero_()
            self.col.fill_(P)
            self.scale.fill_(1.0 / temperature if mode[1] else 1.0)
            if draw == "inverse":
                u = row_uniforms(keys.cpu().numpy(), np.arange(R))  # (N, R), as NoiseStream's
                self.u[:N, :R] = torch.from_numpy(u).to(self.device, self.u.dtype)
            for buf, value in ((self.out_tok, self.pad_id), (self.out_logp, 0),
                               (self.out_ent, 0), (self.out_mask, False)):
                buf[: N + 1].fill_(value)
            self._draw(N, logits, mode, noise, 0, N)
            report_decode_step(1, R, N)
            b, n = top, N
            for t in range(1, R):
                if t % check_every == 0:
                    n_alive = int(self.alive[:b].sum())  # the one host sync
                    if n_alive == 0:
                        break
                    if bucket(n_alive, self.smallest) < b:
                        b, n = self._compact(b, n_alive, noise), n_alive
                self._run(b, mode, noise, t, n)
                report_decode_step(t + 1, R, n)
            mask = self.out_mask[:N, :R]
            width = int(mask.sum(-1).max()) if N else 0
            return tuple(buf[:N, :width].clone()
                         for buf in (self.out_tok, self.out_logp, self.out_ent, self.out_mask))
