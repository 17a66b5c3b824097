"""The order in which training prompts are visited: seeded per-epoch permutations."""

from __future__ import annotations

import torch

from explorl.errors import DataError


class DataOrder:
    """Batches of ``batch_size`` dataset indices, reshuffled each epoch.

    The permutation of epoch e is a pure function of (seed, e), so the only state is the
    position (epoch, offset) — which is what a checkpoint stores. The incomplete tail of an
    epoch is dropped so that every step sees the same number of prompts.
    """

    def __init__(self, n: int, batch_size: int, seed: int, shuffle: bool = True):
        if n < batch_size:
            raise DataError(
                f"the training set has {n} prompts, fewer than data.prompts_per_step={batch_size}"
            )
        self.n, self.batch_size, self.seed, self.shuffle = n, batch_size, seed, shuffle
        self.epoch, self.offset = 0, 0

    def _perm(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    @property
    def batches_per_epoch(self) -> int:
        return self.n // self.batch_size

    def next_batch(self) -> tuple[list[int], int, bool]:
        """``(indices, epoch, epoch_end)``; epoch_end is True on an epoch's last batch."""
        perm = self._perm(self.epoch)
        idx = perm[self.offset: self.offset + self.batch_size]
        epoch = self.epoch
        self.offset += self.batch_size
        end = self.offset + self.batch_size > self.n
        if end:
            self.epoch, self.offset = self.epoch + 1, 0
        return idx, epoch, end

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.offset = state["epoch"], state["offset"]
