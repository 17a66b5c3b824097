"""The model cache: each entry an ordinary Hugging Face folder (``config.json``, safetensors,
tokenizer files) that ``from_pretrained`` loads, plus ``source.json`` saying where it came from.

Location: ``$EXPLORL_MODEL_CACHE``, else ``$XDG_CACHE_HOME/explorl/models``, else
``~/.cache/explorl/models`` (the lab cache's rule, ``explorl.lab.build.cache_root``). Named
models (``explorl models get smollm2-135m``) live in ``<cache>/<name>``, converted GGUF files
in ``<cache>/gguf/<file stem>-<sha256 prefix>``.

An entry is built in a temporary folder beside it and renamed into place under a file lock: a
reader never sees a half-written folder, and concurrent builders (two runs, pytest-xdist
workers) build it once.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = "source.json"
"""Written into every entry before it is renamed into place: where it came from (the GGUF
file, its sha256, the versions that converted it)."""


def cache_root() -> Path:
    """``$EXPLORL_MODEL_CACHE``, else ``$XDG_CACHE_HOME/explorl/models``, else
    ``~/.cache/explorl/models``."""
    if os.environ.get("EXPLORL_MODEL_CACHE"):
        return Path(os.environ["EXPLORL_MODEL_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "explorl" / "models"


def read_source(entry: Path) -> dict | None:
    """An entry's ``source.json``, or None when ``entry`` is not a complete cache entry."""
    try:
        return json.loads((Path(entry) / SOURCE).read_text())
    except (OSError, ValueError):
        return None


def build_once(final: Path, build: Callable[[Path], dict],
               fresh: Callable[[dict], bool]) -> Path:
    """``final`` when its ``source.json`` is ``fresh``; else ``build(tmp)`` (it fills a
    temporary folder and returns the source record), then ``tmp`` renamed to ``final``.

    A stale entry (another source, an older converter) is replaced only once the new one is
    complete. Temporary folders left by a killed builder are removed by the next one."""
    def done() -> bool:
        src = read_source(final)
        return src is not None and fresh(src)

    if done():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if done():  # built by someone else while we waited
                return final
            for stale in final.parent.glob(f".{final.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
            tmp.chmod(0o755)  # mkdtemp makes it owner-only; a shared cache should be readable
            try:
                record = build(tmp)
                for f in tmp.rglob("*"):  # some writers make owner-only files (mkstemp)
                    if f.is_file():
                        f.chmod(0o644)
                (tmp / SOURCE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
                old = final.parent / f".{final.name}.old"
                if final.exists():
                    shutil.rmtree(old, ignore_errors=True)
                    os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return final
