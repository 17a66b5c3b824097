"""A cached model folder as parts small enough to travel one by one (``explorl models pack``),
and the folder rebuilt from them (``explorl models unpack``), checked by sha256.

The folder's files are laid end to end in one byte stream (sorted by name) cut into parts of at
most ``max_mib`` MiB: ``part-000``, ``part-001``, … and ``manifest.json`` (each part's and each
file's size and sha256, the entry's name). Unpacking checks every part before writing anything,
rebuilds each file from the stream, checks its sha256, and renames the rebuilt folder into the
model cache (``<cache>/<name>``), so ``model.path: <name>`` works there without the original
GGUF file or the gguf package.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from explorl.errors import ConfigError, ModelPathError
from explorl.model_store.cache import build_once, cache_root, read_source

MANIFEST = "manifest.json"
FORMAT = 1
_BLOCK = 1 << 22


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def pack(src: Path, out: Path, *, name: str, max_mib: float = 60.0) -> dict:
    """Write ``src``'s files as parts of ≤ ``max_mib`` MiB and a manifest into ``out`` (which
    must be empty or absent); returns the manifest."""
    src, out = Path(src), Path(out)
    if read_source(src) is None:  # its source.json travels in the manifest too
        raise ModelPathError(f"{src}: not a model cache entry (no source.json)")
    if max_mib <= 0:
        raise ConfigError(f"--max-mib: must be > 0, got {max_mib}")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out}: exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    limit = int(max_mib * 2**20)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    parts: list[dict] = []
    records: list[dict] = []
    part = None
    part_hash = None

    def close() -> None:
        if part is not None:
            part.close()
            parts[-1]["sha256"] = part_hash.hexdigest()

    try:
        for f in files:
            fh_hash = hashlib.sha256()
            size = 0
            with open(f, "rb") as fh:
                while block := fh.read(_BLOCK):
                    fh_hash.update(block)
                    size += len(block)
                    while block:
                        if part is None or parts[-1]["bytes"] == limit:
                            close()
                            parts.append({"file": f"part-{len(parts):03d}", "bytes": 0})
                            part = open(out / parts[-1]["file"], "wb")
                            part_hash = hashlib.sha256()
                        room = limit - parts[-1]["bytes"]
                        chunk, block = block[:room], block[room:]
                        part.write(chunk)
                        part_hash.update(chunk)
                        parts[-1]["bytes"] += len(chunk)
            records.append({"path": f.relative_to(src).as_posix(), "bytes": size,
                            "sha256": fh_hash.hexdigest()})
        close()
    except BaseException:
        if part is not None:
            part.close()
        raise
    manifest = {"format": FORMAT, "name": name, "source": read_source(src),
                "max_mib": max_mib, "parts": parts,
                "files": records, "bytes": sum(r["bytes"] for r in records)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_manifest(parts_dir: Path) -> dict:
    path = Path(parts_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelPathError(f"{path}: cannot read the manifest ({e})") from None
    if manifest.get("format") != FORMAT:
        raise ModelPathError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest


def check_parts(parts_dir: Path, manifest: dict) -> None:
    """Every part present with its size and sha256; one error listing the ones that are not."""
    bad = []
    for p in manifest["parts"]:
        f = Path(parts_dir) / p["file"]
        if not f.is_file():
            bad.append(f"{p['file']} missing")
        elif f.stat().st_size != p["bytes"]:
            bad.append(f"{p['file']} has {f.stat().st_size} bytes, expected {p['bytes']}")
        elif _sha256(f) != p["sha256"]:
            bad.append(f"{p['file']} sha256 differs")
    if bad:
        raise ModelPathError(f"{parts_dir}: {len(bad)} of {len(manifest['parts'])} parts are "
                             f"not right ({'; '.join(bad)}); copy them again")


class _Stream:
    """The parts read back to back as one stream."""

    def __init__(self, files: list[Path]):
        self.files, self.fh = list(files), None

    def read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            if self.fh is None:
                if not self.files:
                    break
                self.fh = open(self.files.pop(0), "rb")
            block = self.fh.read(n - len(out))
            if not block:
                self.fh.close()
                self.fh = None
                continue
            out += block
        return out

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


def _rebuild(parts_dir: Path, manifest: dict, dest: Path) -> None:
    stream = _Stream([Path(parts_dir) / p["file"] for p in manifest["parts"]])
    try:
        for rec in manifest["files"]:
            target = dest / rec["path"]
            if not target.resolve().is_relative_to(dest.resolve()):
                raise ModelPathError(f"manifest: file {rec['path']!r} is outside the folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            h, left = hashlib.sha256(), rec["bytes"]
            with open(target, "wb") as fh:
                while left:
                    block = stream.read(min(left, _BLOCK))
                    if not block:
                        raise ModelPathError(f"{parts_dir}: the parts end inside {rec['path']}")
                    fh.write(block)
                    h.update(block)
                    left -= len(block)
            if h.hexdigest() != rec["sha256"]:
                raise ModelPathError(f"{parts_dir}: {rec['path']} rebuilt with another sha256 "
                                     "than the manifest's")
    finally:
        stream.close()


def unpack(parts_dir: Path, *, force: bool = False) -> Path:
    """Rebuild the packed folder into ``<cache>/<name>``; returns it. An entry already there
    with the same ``source.json`` is kept unless ``force``."""
    parts_dir = Path(parts_dir)
    manifest = read_manifest(parts_dir)
    check_parts(parts_dir, manifest)
    name = manifest["name"]
    if not name or "/" in name or name.startswith("."):
        raise ModelPathError(f"{parts_dir / MANIFEST}: bad entry name {name!r}")
    final = cache_root() / name
    want = manifest["source"]

    def build(tmp: Path) -> dict:
        _rebuild(parts_dir, manifest, tmp)
        return want  # build_once writes source.json again, last: the entry's marker

    if force:
        shutil.rmtree(final, ignore_errors=True)
    return build_once(final, build, lambda src: src == want)

