"""Model sources beyond a Hugging Face folder: GGUF files and models known by name, each
converted once into the model cache (``explorl.model_store.cache``) as an ordinary folder.

``model.path`` is resolved in this order: ``lab:<task>`` (the lab model), a registered name
(``smollm2-135m``: ``explorl models get`` fetches it), a ``.gguf`` file or a folder holding
exactly one (converted on first use), a Hugging Face model folder.
"""

from __future__ import annotations

from pathlib import Path

from explorl.model_store.cache import cache_root, read_source
from explorl.model_store.gguf_files import cached, ensure_converted, find_gguf, inspect
from explorl.model_store.registry import KNOWN, fetched, get, is_name, resolve_name

__all__ = ["KNOWN", "cache_root", "check", "fetched", "get", "is_name", "read_source",
           "resolve"]


def resolve(spec: str) -> Path | None:
    """The model folder ``spec`` stands for when it is a registered name or a GGUF file
    (converting the file now unless its conversion is cached); None for anything else."""
    if is_name(spec):
        return resolve_name(spec)
    gguf = find_gguf(spec)
    return None if gguf is None else ensure_converted(gguf)


def check(spec: str) -> bool:
    """Config validation of ``model.path`` before any model loads: a registered name must be
    fetched; a GGUF file must be readable, of a supported quantisation and architecture (its
    header is read unless its conversion is cached). True when ``spec`` is one of the two;
    raises ``ModelPathError`` naming the file otherwise."""
    if is_name(spec):
        resolve_name(spec)
        return True
    gguf = find_gguf(spec)
    if gguf is None:
        return False
    if cached(gguf) is None:
        inspect(gguf)
    return True
