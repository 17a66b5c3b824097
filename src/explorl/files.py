"""Files that are whole or absent: written to a temporary name beside them, then renamed.

A run or a study killed mid-write (a lost machine, a second Ctrl-C) leaves the previous file or
none, never a truncated one; the study reads ``summary.json`` and ``eval.json`` as markers of
finished work, so a half-written one would be trusted or crash the resume.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def write_text_atomic(path: str | Path, text: str | Iterable[str]) -> Path:
    """Write ``text`` (a string, or lines to join) to ``path`` atomically; returns the path."""
    return _atomic(path, "w", lambda fh: fh.write(text) if isinstance(text, str)
                   else fh.writelines(text))


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    return _atomic(path, "wb", lambda fh: fh.write(data))


def _atomic(path: str | Path, mode: str, write) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, mode) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
