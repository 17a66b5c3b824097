"""Counter-based sampling noise: a response's tokens depend on its own seed, not on its batch.

With several data-parallel ranks each rank generates its share of a step's prompts, in batches
whose composition depends on the number of ranks. A shared random stream (``torch.multinomial``
with one generator) would then give different responses at N=1 and N=2. Instead every response
gets a 63-bit key derived from (run seed, step, prompt position, sample index), and token t is
drawn by Gumbel-max with noise that is a hash of (key, t, token id):
argmax(log p + G), G = −log(−log U), is an exact sample of p. The draw of a row never looks at
the other rows, so a prompt's responses are the same whichever rank samples them, in whatever
batch — and a run resumed at a different number of ranks continues the same sample stream.

Cost per generated token: N seeded ``torch.rand`` calls on CPU (cheaper than ``multinomial``),
one (N, |V|) integer hash on accelerators.
"""

from __future__ import annotations

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


def gumbel_sample(logp: torch.Tensor, keys: torch.Tensor, t: int) -> torch.Tensor:
    """One token per row (N,) from log-probs (N, V): argmax(logp + Gumbel noise of (key, t))."""
    u = uniform_noise(keys.to(logp.device), t, logp.shape[-1])
    return (logp - torch.log(-torch.log(u))).argmax(-1)
