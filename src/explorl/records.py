"""The record every data source produces: one prompt with its ground truth."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PromptRecord:
    """One training/evaluation problem.

    ``prompt`` is either plain text (used verbatim) or a list of chat messages
    ``[{"role": "user", "content": ...}, ...]`` (rendered with the tokenizer's chat template
    when it has one). ``index`` is the record's position in its dataset: controllers key
    per-prompt statistics by it, so it must be stable across runs and resumes.
    """

    prompt: str | list[dict[str, str]]
    ground_truth: str
    data_source: str = "unknown"
    index: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    origin: str = field(default="", compare=False)
    """Where the record was read (``"train.jsonl row 3 (line 4)"``), for error messages; empty
    for generated (lab) problems."""
