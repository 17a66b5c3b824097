"""Log-probs and entropy of given responses under a model (the loss's forward pass).

Two layouts, the same numbers (tests/test_rollout_hf.py):

- **padded**: one row per response, ``[prompt | response]``, left/right padding included.
- **packed** (when ``takes_custom_mask(model)``): each
  distinct prompt is encoded once and followed by the responses sampled from it, all laid end
  to end in packed rows of about ``pack_length(model)`` tokens, with a block attention mask
  (a response sees its prompt and its own past, nothing else) and positions restarting per
  response. GRPO's G responses per prompt share the prompt's forward and backward, and no token
  is spent on padding: at G = 8 on the lab task this is about a third of the padded tokens.
  The last response token is never an input (nothing after it is scored).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from explorl.adapters import plain
from explorl.algorithms.logprobs import logprobs_from_hidden, logprobs_from_logits
from explorl.policy.lean import additive_mask, lean_hidden, lean_training_supported


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding: 0 at each row's first real token."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


def takes_custom_mask(model: torch.nn.Module) -> bool:
    """Whether ``model`` uses a prepared 4-D additive attention mask as given.

    True for transformers' own models with sdpa or eager attention and full causal attention
    in every layer. Sliding-window and hybrid models build per-layer masks, flash/flex
    attention want other mask formats, and remote code may ignore the mask: they get 2-D masks.
    """
    return _full_causal_attention(model, ("sdpa", "eager"))


_PACK_LENGTH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its pack_length


def pack_length(model: torch.nn.Module) -> int:
    """Default length of a packed row for ``model``.

    Attention over a packed row of L tokens costs ~4·L·d FLOPs per token and layer whatever the
    mask hides, against ~2·(weights per layer) for the projections; L is chosen so that the
    former is about 1/8 of the latter: 128 tokens for the 1M-parameter lab model (measured best
    there, benchmarks/README.md), ~1k for a 0.5B model, 4096 at most. Computed once per model
    (a walk over every parameter).
    """
    if model not in _PACK_LENGTH:
        _PACK_LENGTH[model] = _pack_length(model)
    return _PACK_LENGTH[model]


def _pack_length(model: torch.nn.Module) -> int:
    cfg = getattr(model, "config", None)
    layers, d = getattr(cfg, "num_hidden_layers", None), getattr(cfg, "hidden_size", None)
    if not layers or not d:
        return 1024
    emb = {
        id(m.weight): m.weight.numel()
        for m in (model.get_input_embeddings(), model.get_output_embeddings())
        if m is not None
    }
    per_layer = (sum(p.numel() for p in model.parameters()) - sum(emb.values())) / layers
    return int(min(4096, max(128, per_layer / (16 * d))))


PLAIN_HEADS = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next",
    "phi", "phi3", "gemma", "olmo", "olmo2", "olmo3", "smollm3", "starcoder2", "stablelm",
    "gpt_neox", "deepseek_v3", "glm", "glm4", "ernie4_5", "seed_oss", "exaone4", "apertus",
    "arcee", "helium",
})
"""``config.model_type``s whose causal-LM logits are the output projection of the last hidden
state and nothing more (tests/test_fused_head.py reads each one's transformers source)."""
SCALED_HEADS = {"cohere": "logit_scale", "cohere2": "logit_scale",
                "granite": "1/logits_scaling", "granitemoe": "1/logits_scaling",
                "granitemoeshared": "1/logits_scaling"}
"""Heads that multiply their logits by a config constant (``1/x``: divide by it)."""
CAPPED_HEADS = frozenset({"gemma2", "gemma3_text"})
"""Heads that soft-cap their logits, c·tanh(logits / c), c = ``final_logit_softcapping``."""


@dataclass(frozen=True)
class Head:
    """What the fused log-prob pass needs to reproduce a model's logits from its hidden states:
    logits = softcap(scale · (hidden @ weightᵀ + bias)) (``logprobs_from_hidden``)."""

    body: torch.nn.Module  # the transformer body: ids -> last hidden states
    head: torch.nn.Linear  # the output projection (its weight may be the tied embedding)
    scale: float = 1.0
    softcap: float | None = None


def fused_head(model: torch.nn.Module) -> tuple[Head | None, str]:
    """The model's head as the fused pass computes it, or None and why it cannot.

    Only architectures whose head is known exactly qualify (``PLAIN_HEADS``, ``SCALED_HEADS``,
    ``CAPPED_HEADS``), as transformers' own classes: remote code and unknown heads (mup
    multipliers, masked vocabularies) take the full logits. A head carrying LoRA adapters (or
    any wrapper) is not a plain ``Linear`` and takes the full logits too; LoRA on the body is
    part of the body's forward and changes nothing here. Tied embeddings need nothing: the
    head's weight is the embedding's tensor and its gradient adds up there.
    """
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if not type(model).__module__.startswith("transformers.models."):
        return None, f"{type(model).__name__} is not a transformers class (its head is unknown)"
    if kind not in PLAIN_HEADS and kind not in SCALED_HEADS and kind not in CAPPED_HEADS:
        return None, f"model_type {kind!r}: its logits are not known to be a plain projection"
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear:
        return None, (f"the output layer is a {type(head).__name__}, not a plain Linear "
                      "(LoRA or another wrapper on the head)")
    body = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if not isinstance(body, torch.nn.Module):
        return None, "no transformer body under base_model_prefix"
    scale, softcap = 1.0, None
    if kind in SCALED_HEADS:
        key = SCALED_HEADS[kind]
        value = float(getattr(cfg, key.removeprefix("1/")))
        scale = 1.0 / value if key.startswith("1/") else value
    if kind in CAPPED_HEADS:
        softcap = getattr(cfg, "final_logit_softcapping", None)
    return Head(body, head, scale, softcap), f"{kind} head"


def takes_varlen(model: torch.nn.Module) -> bool:
    """Whether ``model`` reads packed sequences from restarting ``position_ids`` alone (no mask):
    transformers' own models with flash or flex attention and full causal attention, which
    then attend within each sequence (flash: varlen kernels from cu_seqlens; sdpa and eager do
    it with a block mask built from the positions, as tests/test_fused_update.py uses).
    transformers' flash path reads packed positions in a batch of one row only, so the varlen
    layout is one row holding every sequence: no padding at all."""
    return _full_causal_attention(model, VARLEN_ATTENTION)


VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")
"""Attention implementations that take the varlen layout by default (``takes_varlen``)."""


def response_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,  # (N, P) left-padded
    prompt_mask: torch.Tensor,  # (N, P) bool
    response_ids: torch.Tensor,  # (N, R) right-padded
    response_mask: torch.Tensor,  # (N, R) bool
    temperature: float,
    *,
    chunk_size: int = 2048,
    with_entropy: bool = True,
    pack: bool | None = None,
    pack_tokens: int | None = None,
    fused: bool = True,
    varlen: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob (N, R) of each response token at ``temperature`` and its entropy (N, R).

    Uses the same temperature as the sampler (E3: the PPO ratio must compare like with like).
    ``pack``: None picks a packed layout when the model supports it and it saves tokens;
    False forces the padded layout (True asks for packing where possible). ``pack_tokens``:
    length of a packed row (default ``pack_length(model)``; the varlen layout takes one row).
    ``fused``: the log-probs from the
    last hidden states in chunks of ``chunk_size`` tokens (``logprobs_from_hidden``), so the
    full-vocabulary logits never exist, where ``fused_head`` knows the head; else (or False)
    from the model's logits. ``varlen``: the packed layout without prompt sharing, sequences
    told apart by their positions alone (None: where ``takes_varlen`` and not
    ``takes_custom_mask``).
    """
    T = 1.0 if temperature == 0 else temperature
    model = plain(model)  # LoRA: the transformers model, its adapted layers in place
    head = fused_head(model)[0] if fused else None
    shared = takes_custom_mask(model)
    if varlen is None:
        varlen = not shared and takes_varlen(model)
    plan = None
    if pack is not False and (shared or varlen) and len(response_ids):
        row = (1 << 62) if varlen else pack_tokens or pack_length(model)  # varlen: one row
        plan = _pack_plan(prompt_ids, prompt_mask, response_mask, row, share=not varlen)
        if plan is not None and pack is None and plan["tokens"] > 0.9 * plan["padded_tokens"]:
            plan = None  # nothing shared, little padding: the plain layout is as cheap
    if plan is not None:
        return _packed_logprobs(model, head, plan, prompt_ids, response_ids, response_mask,
                                varlen, T, chunk_size, with_entropy)

    # Padded layout. The last response column is never an input: no score depends on its state.
    P = prompt_ids.shape[1]
    ids = torch.cat([prompt_ids, response_ids[:, :-1]], dim=1)  # (N, P+R-1)
    mask = torch.cat([prompt_mask, response_mask[:, :-1]], dim=1)
    inputs = {
        "input_ids": ids,
        "attention_mask": mask.long(),
        "position_ids": position_ids(mask),
        "use_cache": False,
    }
    if head is not None:
        hidden = head.body(**inputs).last_hidden_state
        hidden = hidden[:, P - 1:]  # (N, R, D): states that predict the response tokens
        logp, ent = _from_hidden(head, hidden, response_ids, T, chunk_size, with_entropy)
    else:
        logits = model(**inputs).logits[:, P - 1:]
        logp, ent = logprobs_from_logits(logits, response_ids, temperature=T, chunk_size=chunk_size,
                                         with_entropy=with_entropy)
    logp = logp * response_mask
    if ent is not None:
        ent = ent * response_mask
    return logp, ent


def _packed_logprobs(model, head: Head | None, plan: dict, prompt_ids: torch.Tensor,
                     response_ids: torch.Tensor, response_mask: torch.Tensor, varlen: bool,
                     T: float, chunk_size: int, with_entropy: bool
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``response_logprobs`` in the packed layout ``plan`` (``_pack_plan``): (N, R) log-probs and
    entropies, the packed rows' results scattered back to the responses' cells."""
    ids = _gather_tokens(plan, prompt_ids, response_ids)
    labels = response_ids[response_mask]  # (M,)
    if varlen:  # no mask: the positions restart at each sequence
        inputs = {"input_ids": ids, "attention_mask": None}
    else:
        inputs = {"input_ids": ids,
                  "attention_mask": additive_mask(plan["allowed"],
                                                  getattr(model, "dtype", torch.float32))}
    inputs.update(position_ids=plan["position_ids"], use_cache=False)
    if head is None:
        logits = model(**inputs).logits  # (B, L, V)
        logits = logits.reshape(-1, logits.shape[-1])[plan["source"]]  # (M, V)
        lp, h = logprobs_from_logits(logits[None], labels[None], temperature=T,
                                     chunk_size=chunk_size, with_entropy=with_entropy)
    else:
        if not varlen and lean_training_supported(model):  # the same ops, bit for bit
            hidden = lean_hidden(model, ids, inputs["attention_mask"], plan["position_ids"])
        else:
            hidden = head.body(**inputs).last_hidden_state  # (B, L, D)
        hidden = hidden.reshape(-1, hidden.shape[-1])[
            plan["source"]
        ]  # (M, D): states predicting the tokens
        lp, h = _from_hidden(head, hidden[None], labels[None], T, chunk_size, with_entropy)
    logp = _unflatten(lp[0], response_mask)
    ent = _unflatten(h[0], response_mask) if with_entropy else None
    return logp, ent


def _from_hidden(head: Head, hidden, labels, temperature, chunk_size, with_entropy):
    return logprobs_from_hidden(hidden, head.head.weight, labels, temperature=temperature,
                                chunk_size=chunk_size, with_entropy=with_entropy,
                                lm_head_bias=head.head.bias, logit_scale=head.scale,
                                softcap=head.softcap)


def _unflatten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(M,) values of the True cells of ``mask`` (N, R) back to (N, R), zeros elsewhere."""
    out = values.new_zeros(mask.shape)
    return out.masked_scatter(mask, values)


def _gather_tokens(
    plan: dict, prompt_ids: torch.Tensor, response_ids: torch.Tensor
) -> torch.Tensor:
    """The packed rows' token ids (B, L), read from the prompt and response tables."""
    table = torch.cat([prompt_ids.reshape(-1), response_ids.reshape(-1)])
    return table[plan["token_src"]]


def _pack_plan(prompt_ids, prompt_mask, response_mask, pack_tokens: int,
               share: bool = True) -> dict | None:
    """Index tensors for the packed layout, or None when the masks are not plain left/right padding.

    ``share``: responses to one prompt share its encoding, under a block mask (``allowed``);
    False: every response follows its own copy of its prompt, one sequence each, the positions
    restarting at each (the varlen layout: no mask, ``allowed`` is None).

    Segments are laid out in order: a prompt, then the responses that share it, then the next
    prompt (or the same one again when a row fills up). Built on the host from per-row lengths
    (one loop over responses, not tokens; the per-token indices in numpy, a handful of calls
    whatever the batch), then moved to the device; only the block mask is built there.
    """
    device = prompt_ids.device
    N, P = prompt_ids.shape
    R = response_mask.shape[1]
    lengths = _plain_padding(prompt_mask, response_mask)
    if lengths is None:
        return None
    group_l = _row_groups(prompt_ids, prompt_mask, share)
    p_len_l, r_len_l = (x.tolist() for x in lengths)
    order = sorted(range(N), key=group_l.__getitem__)  # stable: a prompt's responses stay in order
    lay = _even_layout(order, group_l, p_len_l, r_len_l, pack_tokens)
    B, L = len(lay["fills"]), max(lay["fills"])
    token_src, position, seg_of, owner_of = _token_tables(lay, p_len_l, N, P, R, B, L)
    source = _predicting_states(lay, r_len_l, L)

    def t(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(device)

    allowed = _block_mask(t(seg_of).view(B, L), t(owner_of).view(B, L)) if share else None
    # Varlen: padding sits at position 0, each padding token a sequence of its own.
    return {
        "token_src": t(token_src).view(B, L),
        "position_ids": t(position).view(B, L),
        "allowed": allowed,
        "source": t(source),
        "tokens": B * L,
        "padded_tokens": N * (P + R - 1),
    }


def _plain_padding(prompt_mask, response_mask) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The prompts' and responses' lengths (N,) when the padding is plain: prompts
    right-aligned, responses a prefix of their row; else None."""
    P, R = prompt_mask.shape[1], response_mask.shape[1]
    p_len = prompt_mask.sum(-1)  # (N,)
    r_len = response_mask.sum(-1)  # (N,)
    cols_p = torch.arange(P, device=prompt_mask.device)
    cols_r = torch.arange(R, device=prompt_mask.device)
    if not (torch.equal(prompt_mask, cols_p[None, :] >= P - p_len[:, None])
            and torch.equal(response_mask, cols_r[None, :] < r_len[:, None])):
        return None
    return p_len, r_len


def _row_groups(prompt_ids, prompt_mask, share: bool) -> list[int]:
    """Each row's group: rows with the same prompt (ids and length) share one encoding of it
    (without ``share``, every row its own). Small tables are grouped on the host; large ones
    (long prompts, many rows) by torch.unique where they are, rather than copying every token
    id to Python. The numbering is the same either way."""
    key = prompt_ids.masked_fill(~prompt_mask, -1)
    if not share:
        return list(range(prompt_ids.shape[0]))
    if key.numel() <= _HOST_GROUPING_MAX:
        return _prompt_groups(key.tolist())
    return torch.unique(key, dim=0, return_inverse=True)[1].tolist()


def _even_layout(order: list[int], group: list[int], p_len: list[int], r_len: list[int],
                 pack_tokens: int) -> dict:
    """``_layout`` into rows of ``pack_tokens``; then, with more than one row, the rows evened
    out when that takes no more of them: padding to the longest row is wasted work."""
    lay = _layout(order, group, p_len, r_len, pack_tokens)
    if len(lay["fills"]) > 1:
        even = _layout(order, group, p_len, r_len, -(-sum(lay["fills"]) // len(lay["fills"])))
        if len(even["fills"]) == len(lay["fills"]):
            lay = even
    return lay


def _token_tables(lay: dict, p_len_l: list[int], N: int, P: int, R: int, B: int,
                  L: int) -> tuple[np.ndarray, ...]:
    """Per position of the packed (B*L) layout: its token's source in
    ``cat([prompt_ids.flatten(), response_ids.flatten()])``, its position id, its segment and
    its segment's prompt segment (``owner``); padding 0, 0, -1, -1."""
    seg_pack, seg_start, seg_kind, seg_row, seg_len = (
        np.asarray(lay[k], dtype=np.int64) for k in ("pack", "start", "kind", "row", "len"))
    S = len(seg_len)
    p_len_n = np.asarray(p_len_l, dtype=np.int64)
    tok_seg = np.repeat(np.arange(S, dtype=np.int64), seg_len)  # (T_tot,) each token's segment
    within = np.arange(len(tok_seg), dtype=np.int64) - (np.cumsum(seg_len) - seg_len)[tok_seg]
    row = seg_row[tok_seg]
    is_resp = seg_kind[tok_seg] == 1
    # Token source in cat([prompt_ids.flatten(), response_ids.flatten()]).
    src = np.where(is_resp, N * P + row * R + within, row * P + (P - p_len_n[row]) + within)
    pos = np.where(is_resp, p_len_n[row] + within, within)
    flat = seg_pack[tok_seg] * L + seg_start[tok_seg] + within  # (T_tot,) position in (B*L)
    # A token attends (causally) to its own segment and to its segment's prompt segment
    # (``owner``: the latest prompt segment laid out before it); a prompt is its own owner.
    prompt_segs = np.flatnonzero(seg_kind == 0)
    seg_prompt = prompt_segs[np.searchsorted(prompt_segs, np.arange(S), side="right") - 1]
    token_src = np.zeros(B * L, dtype=np.int64)
    position = np.zeros(B * L, dtype=np.int64)
    seg_of = np.full(B * L, -1, dtype=np.int64)  # -1: padding
    owner_of = np.full(B * L, -1, dtype=np.int64)
    token_src[flat], position[flat] = src, pos
    seg_of[flat], owner_of[flat] = tok_seg, seg_prompt[tok_seg]
    return token_src, position, seg_of, owner_of


def _predicting_states(lay: dict, r_len_l: list[int], L: int) -> np.ndarray:
    """The position in (B*L) of the state predicting response token t of row i: the prompt's
    last token for t = 0, else response token t - 1 of the row's own segment (rows in order,
    as ``response_ids[response_mask]``)."""
    resp_pack, resp_start, resp_prompt_end = (
        np.asarray(lay[k], dtype=np.int64) for k in ("resp_pack", "resp_start", "resp_prompt_end"))
    r_len_n = np.asarray(r_len_l, dtype=np.int64)
    ri = np.repeat(np.arange(len(r_len_n), dtype=np.int64), r_len_n)
    ti = np.arange(len(ri), dtype=np.int64) - (np.cumsum(r_len_n) - r_len_n)[ri]
    base = resp_pack[ri] * L
    return np.where(ti == 0, base + resp_prompt_end[ri] - 1, base + resp_start[ri] + ti - 1)


def _block_mask(seg_of: torch.Tensor, owner_of: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, L): a token attends, causally, to its own segment and its prompt's."""
    L = seg_of.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=seg_of.device).tril_()
    q_seg, k_seg = seg_of[:, :, None], seg_of[:, None, :]
    allowed = (k_seg == q_seg) | (k_seg == owner_of[:, :, None])  # own segment or prompt
    allowed &= causal  # padding (segment −1) attends to padding: no row is empty
    return allowed[:, None]


_HOST_GROUPING_MAX = 1 << 16
"""Prompt tables up to this many token ids are grouped by ``_prompt_groups`` (a 32 × 8 table:
~20 µs; ``torch.unique(dim=0)`` compares rows one by one, ~200 µs on a CPU)."""


def _prompt_groups(keys: list[list[int]]) -> list[int]:
    """Each row's group: the rank of its prompt (ids, −1 for padding) among the distinct prompts
    in lexicographic order (``torch.unique(dim=0)``'s numbering, so layouts do not change)."""
    rows = [tuple(k) for k in keys]
    rank = {k: i for i, k in enumerate(sorted(set(rows)))}
    return [rank[k] for k in rows]


def _layout(
    order: list[int], group: list[int], p_len: list[int], r_len: list[int], pack_tokens: int
) -> dict:
    """Assign prompt and response segments to packed rows, next-fit, in ``order``.

    A segment is (packed row, start column, kind 0 = prompt / 1 = response, source row, length).
    A row that fills up continues in a new packed row, which starts with the prompt again; a
    prompt plus response longer than ``pack_tokens`` gets a row of its own.
    """
    seg = {k: [] for k in ("pack", "start", "kind", "row", "len")}
    n = len(group)
    resp_pack, resp_start, resp_prompt_end = [0] * n, [0] * n, [0] * n
    fills: list[int] = []  # tokens in each packed row
    open_group, prompt_end = None, 0

    def add(b, kind, i, length):
        for k, v in zip(("pack", "start", "kind", "row", "len"), (b, fills[b], kind, i, length)):
            seg[k].append(v)
        fills[b] += length

    for i in order:
        need = max(r_len[i] - 1, 0)  # the last response token is not an input
        new_group = group[i] != open_group
        if not fills or (
            fills[-1] > 0 and fills[-1] + need + (p_len[i] if new_group else 0) > pack_tokens
        ):
            fills.append(0)
            new_group = True
        b = len(fills) - 1
        if new_group:
            add(b, 0, i, p_len[i])
            open_group, prompt_end = group[i], fills[b]
        resp_pack[i], resp_start[i], resp_prompt_end[i] = b, fills[b], prompt_end
        if need:
            add(b, 1, i, need)
    return {**seg, "fills": fills, "resp_pack": resp_pack, "resp_start": resp_start,
            "resp_prompt_end": resp_prompt_end}


def _full_causal_attention(model, implementations) -> bool:
    """A transformers model whose attention is one of ``implementations``, causal, and full
    (no sliding window, no layer of another type)."""
    cfg = getattr(model, "config", None)
    if cfg is None or not type(model).__module__.startswith("transformers."):
        return False
    if getattr(cfg, "_attn_implementation", None) not in implementations or not getattr(
        cfg, "is_causal", True
    ):
        return False
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None:
        return all(t == "full_attention" for t in layer_types)
    return getattr(cfg, "sliding_window", None) is None
