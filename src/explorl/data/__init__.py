"""Prompt data: loaders for local files and rows in memory, lab and reasoning-gym splits, the epoch
order; the record type, ``PromptRecord``, lives in ``explorl.records``."""

from __future__ import annotations

from explorl.data.files import DataError, load_many, load_prompts, records_from_rows
from explorl.records import PromptRecord

__all__ = ["DataError", "PromptRecord", "load_many", "load_prompts", "records_from_rows"]
