"""Counter-based sampling noise: a response's tokens depend on its own seed, not on its batch.

With several data-parallel ranks each rank generates its share of a step's prompts, in batches
whose composition depends on the number of ranks. A shared random stream (``torch.multinomial``
with one generator) would then give different responses at N=1 and N=2. Instead every response
gets a 63-bit key derived from (run seed, step, prompt position, sample index), and token t is
drawn by Gumbel-max with noise that is a hash of (key, t, token id):
argmax(log p + G), G = −log(−log U), is an exact sample of p. The draw of a row never looks at
the other rows, so a prompt's responses are the same whichever rank samples them, in whatever
batch — and a run resumed at a different number of ranks continues the same sample stream.

On CPU token t of a row uses ``torch.rand(|V|)`` from a generator seeded with
``mix_seed(key, t)`` (torch's Mersenne Twister); on accelerators an integer hash over the whole
(N, |V|) block (one kernel chain). For vocabularies of at most ``MT_VOCAB_MAX`` tokens (the lab
models) ``NoiseStream`` computes the CPU draws of many rows and positions at once, bit for bit
those of the per-row generators: seeding and one twist of MT19937, vectorised over the seeds.
"""

from __future__ import annotations

import numpy as np
import torch

_M64 = (1 << 64) - 1
_M32 = 0xFFFFFFFF


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
    return torch.tensor(
        [mix_seed(s, j) for s, n in zip(seeds, n_samples) for j in range(n)], dtype=torch.long
    )


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """An avalanche hash of 32-bit values held in int64 (multipliers < 2^31: no overflow)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x1B873593) & _M32
    return x ^ (x >> 16)


def _hashed_uniform(keys: torch.Tensor, t: int, vocab_size: int) -> torch.Tensor:
    """U (N, V) as a vectorised hash of (key, t, token id), 24 random bits (for accelerators)."""
    lo, hi = keys & _M32, keys >> 32  # (N,)
    row = _mix32(_mix32(lo ^ ((t * 0x61C88647 + 1) & _M32)) ^ hi)  # (N,)
    row2 = _mix32(row ^ 0x5BD1E995)
    tok = _mix32(
        torch.arange(vocab_size, device=keys.device, dtype=torch.long) * 0x2545F491 & _M32
    )  # (V,)
    bits = _mix32(_mix32(row[:, None] ^ tok[None, :]) ^ row2[:, None])  # (N, V)
    return ((bits >> 8).float() + 0.5) / float(1 << 24)


def _generator_uniform(keys: torch.Tensor, t: int, vocab_size: int) -> torch.Tensor:
    """U (N, V) from one freshly seeded generator per row (CPU: faster than int64 hashing)."""
    out = torch.empty(len(keys), vocab_size, device=keys.device)
    for i, k in enumerate(keys.tolist()):
        g = torch.Generator(keys.device).manual_seed(mix_seed(k, t))
        torch.rand(vocab_size, generator=g, device=keys.device, out=out[i])
    return out.clamp_(min=2.0**-60)  # rand may return exactly 0


def uniform_noise(keys: torch.Tensor, t: int, vocab_size: int) -> torch.Tensor:
    """U (N, V) float32 in (0, 1) that depends only on (row key, position t, token id).

    On CPU one generator per row (N small launches are cheap there); on accelerators an
    integer hash over the whole (N, V) block (one kernel chain instead of N launches). The
    two give different (equally valid) draws, as CPU and GPU runs differ anyway.
    """
    if keys.device.type == "cpu":
        return _generator_uniform(keys, t, vocab_size)
    return _hashed_uniform(keys, t, vocab_size)


def gumbel_argmax(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row (N,) from log-probs (N, V) and uniform noise U (N, V): argmax(logp + G)."""
    return (logp - torch.log(-torch.log(u))).argmax(-1)


def gumbel_sample(logp: torch.Tensor, keys: torch.Tensor, t: int) -> torch.Tensor:
    """One token per row (N,) from log-probs (N, V): argmax(logp + Gumbel noise of (key, t))."""
    return gumbel_argmax(logp, uniform_noise(keys.to(logp.device), t, logp.shape[-1]))


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
    """Gumbel-max sampling for a batch of rows over successive positions, rows dropping out.

    Draws exactly what ``gumbel_sample(logp, keys, t)`` draws. On CPU with a small vocabulary
    the noise of the live rows is computed for a block of positions at once (``mt_uniform``);
    otherwise position by position (``uniform_noise``).
    """

    def __init__(self, keys: torch.Tensor, vocab_size: int, max_len: int):
        self.keys, self.V, self.max_len = keys, vocab_size, max_len
        self.blocked = keys.device.type == "cpu" and vocab_size <= MT_VOCAB_MAX
        self.block: torch.Tensor | None = None  # (positions, rows, V), position-major
        self.t0 = 0

    def sample(self, logp: torch.Tensor, t: int) -> torch.Tensor:
        """One token per live row (n,) at position ``t`` from log-probs (n, V)."""
        if not self.blocked:
            return gumbel_sample(logp, self.keys, t)
        if self.block is None or t - self.t0 >= len(self.block):
            n = len(self.keys)
            width = max(1, min(self.max_len - t, _NOISE_BLOCK_ELEMENTS // max(1, n * self.V)))
            seeds = mix_seed_grid(self.keys.numpy(), np.arange(t, t + width))  # (n, width)
            u = mt_uniform(seeds.T.reshape(-1), self.V).view(width, n, self.V)
            self.block, self.t0 = u.clamp_(min=2.0**-60), t  # as ``_generator_uniform``
        return gumbel_argmax(logp, self.block[t - self.t0])

    def keep(self, rows: torch.Tensor) -> None:
        """Only ``rows`` (indices into the live rows) go on."""
        self.keys = self.keys[rows]
        if self.block is not None:
            self.block = self.block[:, rows]
