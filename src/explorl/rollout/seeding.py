"""Counter-based sampling: a response's tokens depend on its own seed, not on its batch.

With several data-parallel ranks each rank generates its share of a step's prompts, in batches
whose composition depends on the number of ranks. A shared random stream (``torch.multinomial``
with one generator) would then give different responses at N=1 and N=2. Instead every response
gets a 63-bit key derived from (run seed, step, prompt position, sample index), and token t is
drawn from random numbers that are a function of (key, t) alone. The draw of a row never looks
at the other rows, so a prompt's responses are the same whichever rank samples them, in whatever
batch — and a run resumed at a different number of ranks continues the same sample stream.

Two draws, both exact samples of the policy's distribution p:

- **Small vocabularies on CPU** (|V| ≤ ``MT_VOCAB_MAX``: the lab models) use Gumbel-max,
  argmax(log p + G) with G = −log(−log U), where the row's U (one per token) is ``torch.rand(|V|)``
  from a generator seeded with ``mix_seed(key, t)``: the draws every committed lab run was
  sampled with. ``NoiseStream`` computes them for many rows and positions at once, bit for bit
  (seeding and one twist of MT19937, vectorised over the seeds).
- **Everything else** (real vocabularies, accelerators) uses inverse-CDF sampling with one
  uniform per row, ``row_uniform(key, t)``: the token whose cumulative probability interval
  holds u·Σp. Gumbel-max needs |V| random numbers per row and token and two logarithms over the
  (rows × |V|) block; this needs one pass over p (``inverse_cdf_sample``: block sums, then a
  cumulative sum inside one block per row, in float64 where the device has it).
"""

from __future__ import annotations

import numpy as np
import torch

_M64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from a tuple of integers (splitmix64 chain; order matters)."""
    h = 0x243F6A8885A308D3
    for p in parts:
        h = _splitmix64(h ^ (int(p) & _M64))
    return h >> 1  # fits a signed int64 tensor


def row_keys(seeds: list[int], n_samples: list[int]) -> torch.Tensor:
    """Per-response keys (N,) int64: response j of prompt i gets ``mix_seed(seeds[i], j)``."""
    return torch.tensor(  # host: callers move the keys to the sampling device
        [mix_seed(s, j) for s, n in zip(seeds, n_samples) for j in range(n)], dtype=torch.long
    )


def _generator_uniform(keys: torch.Tensor, t: int, vocab_size: int) -> torch.Tensor:
    """U (N, V) from one freshly seeded generator per row: the small-vocabulary CPU draws, as
    ``mt_uniform`` computes them in bulk (kept as their reference)."""
    out = torch.empty(len(keys), vocab_size, device=keys.device)
    for i, k in enumerate(keys.tolist()):
        g = torch.Generator(keys.device).manual_seed(mix_seed(k, t))
        torch.rand(vocab_size, generator=g, device=keys.device, out=out[i])
    return out.clamp_(min=2.0**-60)  # rand may return exactly 0


def gumbel_argmax(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row (N,) from log-probs (N, V) and uniform noise U (N, V): argmax(logp + G)."""
    return (logp - torch.log(-torch.log(u))).argmax(-1)


def gumbel_sample(logp: torch.Tensor, keys: torch.Tensor, t: int) -> torch.Tensor:
    """One token per row (N,) from log-probs (N, V): argmax(logp + Gumbel noise of (key, t)),
    the noise from the rows' seeded generators (the small-vocabulary CPU draw)."""
    return gumbel_argmax(logp, _generator_uniform(keys.cpu(), t, logp.shape[-1]).to(logp.device))


# ------------------------------------------------------- one uniform per row: inverse CDF

_BLOCK = 512
"""Tokens per block of ``inverse_cdf_sample``'s first level."""


def row_uniforms(keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """u in [0, 1) for every (key, position): (K,) × (T,) → (K, T) float64, 53 random bits each,
    from ``mix_seed(key, t)`` mixed once more (so it is not the Mersenne-Twister seed)."""
    with np.errstate(over="ignore"):
        h = _splitmix64_np(mix_seed_grid(keys, positions))
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


def row_uniform(key: int, t: int) -> float:
    """``row_uniforms`` for one (key, position)."""
    return (_splitmix64(mix_seed(key, t)) >> 11) * 2.0**-53


def inverse_cdf_sample(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row (N,): the first token whose cumulative probability exceeds u·Σp.

    ``p`` (N, V) non-negative (need not sum to 1; zeros are never drawn), ``u`` (N,) in [0, 1).
    Two levels, so no (N, V) cumulative sum is materialised: the sums of blocks of ``_BLOCK``
    tokens locate the block, a cumulative sum inside that block the token. Accumulated in
    float64 (float32 on devices without it), so u·Σp is placed to ~1e-16 of the total mass.
    """
    N, V = p.shape
    acc = torch.float32 if p.device.type == "mps" else torch.float64
    B = min(_BLOCK, V)
    nb, full = -(-V // B), V // B
    sums = torch.empty(N, nb, dtype=acc, device=p.device)
    sums[:, :full] = p[:, : full * B].reshape(N, full, B).sum(-1, dtype=acc)
    if full < nb:
        sums[:, full] = p[:, full * B:].sum(-1, dtype=acc)
    cum = sums.cumsum(-1)  # (N, nb)
    r = u.to(device=p.device, dtype=acc) * cum[:, -1]  # (N,) the mass to pass
    blk = torch.searchsorted(cum, r[:, None], right=True).squeeze(-1).clamp_(max=nb - 1)
    before = torch.where(blk > 0, cum.gather(1, (blk - 1).clamp(min=0)[:, None]).squeeze(-1),
                         torch.zeros((), dtype=acc, device=p.device))
    cols = blk[:, None] * B + torch.arange(B, device=p.device)  # (N, B)
    inside = cols < V
    pb = p.gather(1, cols.clamp(max=V - 1)).to(acc) * inside  # (N, B)
    j = torch.searchsorted(before[:, None] + pb.cumsum(-1), r[:, None], right=True).squeeze(-1)
    # Round-off can leave r at or past the block's end (the two sums add in different orders):
    # then the block's last token with mass, never one without.
    last = torch.where(pb > 0, torch.arange(B, device=p.device), -1).amax(-1)
    j = torch.minimum(j, last)
    return (blk * B + j).clamp_(0, V - 1)  # in range even for rows without finite mass (NaN)


# --------------------------------------------------------------- the CPU draws, vectorised

MT_VOCAB_MAX = 227
"""Largest vocabulary whose draws one MT19937 twist yields (624 − 397 words): a row's noise then
needs only words 0…|V| and 397…396+|V| of the generator's seeded state."""

_NOISE_BLOCK_ELEMENTS = 1 << 21  # floats per block of precomputed noise (8 MB)


def _splitmix64_np(x: np.ndarray) -> np.ndarray:
    """``_splitmix64`` on uint64 arrays (numpy's uint64 arithmetic wraps mod 2^64, as the mask
    does)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def mix_seed_grid(keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``mix_seed(key, t)`` for every (key, t) pair: (K,) × (T,) → (K, T) uint64."""
    with np.errstate(over="ignore"):
        h = np.full((len(keys), 1), 0x243F6A8885A308D3, dtype=np.uint64)
        h = _splitmix64_np(h ^ keys.astype(np.uint64)[:, None])
        h = _splitmix64_np(h ^ positions.astype(np.uint64)[None, :])
    return h >> np.uint64(1)


def mt_uniform(seeds: np.ndarray, vocab_size: int) -> torch.Tensor:
    """``torch.rand(V, generator=torch.Generator().manual_seed(s))`` for every seed s: (S, V).

    torch's CPU generator is MT19937 seeded with the seed's low 32 bits; a float32 draw is the
    low 24 bits of a tempered output times 2^-24. The seeding recurrence runs once over all the
    seeds (a few numpy calls per state word), instead of one generator per seed.
    """
    V = vocab_size
    if V > MT_VOCAB_MAX:
        raise ValueError(f"vocabulary of {V} tokens: more than one MT19937 twist")
    x = (seeds & np.uint64(0xFFFFFFFF)).astype(np.uint32)  # (S,) state word 0
    lo = np.empty((V + 1, len(x)), np.uint32)  # words 0..V
    hi = np.empty((V, len(x)), np.uint32)  # words 397..396+V
    lo[0] = x
    tmp = np.empty_like(x)
    mult = np.uint32(1812433253)
    with np.errstate(over="ignore"):
        for j in range(1, 397 + V):  # word j = 1812433253 · (w ^ (w >> 30)) + j  (mod 2^32)
            np.right_shift(x, 30, out=tmp)
            np.bitwise_xor(x, tmp, out=x)
            np.multiply(x, mult, out=x)
            np.add(x, np.uint32(j), out=x)
            if j <= V:
                lo[j] = x
            if j >= 397:
                hi[j - 397] = x
    # The twist of words 0..V-1, then tempering.
    y = (lo[:-1] & np.uint32(0x80000000)) | (lo[1:] & np.uint32(0x7FFFFFFF))
    w = (
        hi
        ^ (y >> np.uint32(1))
        ^ np.where(lo[1:] & np.uint32(1), np.uint32(0x9908B0DF), np.uint32(0))
    )
    w ^= w >> np.uint32(11)
    w ^= (w << np.uint32(7)) & np.uint32(0x9D2C5680)
    w ^= (w << np.uint32(15)) & np.uint32(0xEFC60000)
    w ^= w >> np.uint32(18)
    u = (w & np.uint32(0xFFFFFF)).astype(np.float32) * np.float32(2.0**-24)  # (V, S), exact
    return torch.from_numpy(np.ascontiguousarray(u.T))


class NoiseStream:
    """Counter-based sampling for a batch of rows over successive positions, rows dropping out.

    Small vocabularies on CPU: Gumbel-max with the rows' Mersenne-Twister noise, computed for a
    block of positions at once (``mt_uniform``), exactly what ``gumbel_sample`` draws. Otherwise
    inverse-CDF sampling with one ``row_uniform`` per row and position (``inverse_cdf_sample``).
    """

    def __init__(self, keys: torch.Tensor, vocab_size: int, max_len: int,
                 device: torch.device | str | None = None):
        device = torch.device(device) if device is not None else keys.device
        self.keys, self.V, self.max_len = keys.cpu(), vocab_size, max_len
        self.blocked = device.type == "cpu" and vocab_size <= MT_VOCAB_MAX
        self.block: torch.Tensor | None = None  # (positions, rows, V) noise or (positions, rows) u
        self.t0 = 0
        if not self.blocked:  # every position's uniforms at once, moved to the device once
            u = torch.from_numpy(np.ascontiguousarray(  # (max_len, rows)
                row_uniforms(self.keys.numpy(), np.arange(max_len)).T))
            self.block = u.to(device, torch.float32 if device.type == "mps" else torch.float64)

    def sample(self, logp: torch.Tensor, t: int, p: torch.Tensor | None = None) -> torch.Tensor:
        """One token per live row (n,) at position ``t`` from log-probs (n, V); ``p``: their
        exponentials when the caller has them (the inverse-CDF draw uses probabilities)."""
        if not self.blocked:
            return inverse_cdf_sample(logp.exp() if p is None else p, self.block[t])
        if self.block is None or t - self.t0 >= len(self.block):
            n = len(self.keys)
            width = max(1, min(self.max_len - t, _NOISE_BLOCK_ELEMENTS // max(1, n * self.V)))
            seeds = mix_seed_grid(self.keys.numpy(), np.arange(t, t + width))  # (n, width)
            u = mt_uniform(seeds.T.reshape(-1), self.V).view(width, n, self.V)
            self.block, self.t0 = u.clamp_(min=2.0**-60), t  # as ``_generator_uniform``
        return gumbel_argmax(logp, self.block[t - self.t0])

    def keep(self, rows: torch.Tensor) -> None:
        """Only ``rows`` (indices into the live rows) go on."""
        self.keys = self.keys[rows.cpu()]
        if self.block is not None:
            self.block = self.block[:, rows.to(self.block.device)]
