"""Prompt data: the record type and loaders for local files."""

from __future__ import annotations

from explorl.data.files import DataError, load_many, load_prompts
from explorl.data.records import PromptRecord

__all__ = ["DataError", "PromptRecord", "load_many", "load_prompts"]
