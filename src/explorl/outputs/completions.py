"""``completions.jsonl``: samples of what the model wrote and what the verifier said about it.

Every ``log.completions_every`` training steps, and at every validation,
``log.completions_per_step`` responses are drawn (seeded by the run seed, the step and the split;
no global RNG is touched, so logging them never changes a run) and appended as one JSON object
each. The fields are documented in docs/completions.md; the same rows go to the trackers' table
views.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from explorl.outputs.runlog import MetricsLog
from explorl.records import PromptRecord

SPLIT_SEED = {"train": 0, "val": 1}


@dataclass
class Completion:
    """One response with its prompt and verdict (a row of ``completions.jsonl``)."""

    step: int  # the training step whose policy wrote it (0 = before training)
    split: str  # "train" (a training rollout) or "val" (a validation sample)
    data_source: str
    prompt: str  # the prompt as text (chat messages as "role: content" lines)
    ground_truth: str
    response: str  # the decoded response, special tokens stripped
    score: float  # the verifier's score in {0, 1}
    reward: float | None  # the training reward (convention and shaping applied); None for val


def prompt_text(prompt: str | list[dict]) -> str:
    """A record's prompt as text: plain prompts verbatim, chat messages one per line."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in prompt)


def completions_of(step: int, split: str, records: Sequence[PromptRecord], texts: Sequence[str],
                   scores: Sequence[float], rewards: Sequence[float] | None = None
                   ) -> list[Completion]:
    """One ``Completion`` per response; ``records[i]`` is the problem of response i."""
    return [Completion(step=step, split=split, data_source=str(r.data_source),
                       prompt=prompt_text(r.prompt), ground_truth=str(r.ground_truth),
                       response=t, score=float(s),
                       reward=None if rewards is None else float(rewards[i]))
            for i, (r, t, s) in enumerate(zip(records, texts, scores))]


def training_completions(step: int, collected, data: Sequence[PromptRecord]) -> list[Completion]:
    """This rank's trained responses of a step (``training.collect.Collected``) as completions."""
    ro, sb = collected.rollouts, collected.batch
    records = [data[sb.prompt_indices[p]] for p in ro.prompt_index.tolist()]
    return completions_of(step, "train", records, ro.texts, collected.scores.tolist(),
                          collected.rewards.tolist())


class CompletionsLog:
    """Appends a seeded sample of completions to ``completions.jsonl`` (rank 0 only).

    ``truncate_after``: a resumed run drops the rows of the steps after its checkpoint (the
    interrupted tail, which it logs again), as ``metrics.jsonl`` does.
    """

    def __init__(self, path: str | Path, *, every: int, per_step: int, seed: int,
                 truncate_after: int | None = None):
        self.every, self.per_step, self.seed = every, per_step, seed
        self.path = Path(path)
        self._log = MetricsLog(self.path, truncate_after=truncate_after)

    def due(self, step: int) -> bool:
        """Whether training step ``step`` logs completions (validations always do)."""
        return self.every > 0 and step % self.every == 0

    def sample(self, rows: Sequence[Completion], step: int, split: str) -> list[Completion]:
        """``per_step`` of ``rows`` drawn by a generator seeded with (seed, step, split), in
        their original order."""
        if len(rows) <= self.per_step:
            return list(rows)
        rng = random.Random(f"{self.seed}/{step}/{SPLIT_SEED.get(split, split)}")
        keep = sorted(rng.sample(range(len(rows)), self.per_step))
        return [rows[i] for i in keep]

    def log(self, rows: Sequence[Completion], step: int, split: str) -> list[dict]:
        """Sample, append and flush; returns the written rows as dicts (for the trackers)."""
        out = [dataclasses.asdict(c) for c in self.sample(rows, step, split)]
        for row in out:
            self._log.write(row)
        return out

    def close(self) -> None:
        self._log.close()


def read_completions(path: str | Path) -> list[dict]:
    """The rows of a ``completions.jsonl`` (or of a run directory's)."""
    import json

    path = Path(path)
    if path.is_dir():
        path = path / "completions.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
