"""A cached model as parts small enough to travel one by one (``explorl models pack``), and the
model rebuilt from them in another machine's model cache (``explorl models unpack``), checked by
sha256.

What travels is either the converted folder (``kind: folder``: float32 safetensors, 517 MiB for
SmolLM2-135M) or, with ``gguf=True``, the GGUF file it was converted from (``kind: gguf``: 98 MB
for SmolLM2-135M's Q4_1), which ``unpack`` converts there (that machine then needs the gguf
package, and gets the very same weights). The files are laid end to end in one byte stream (the
folder's sorted by name) cut into ``part-000``, ``part-001``, … of at most ``max_mib`` MiB each,
beside ``manifest.json`` (each part's and each file's size and sha256, the entry's name and
``source.json``). Unpacking checks every part before writing anything, rebuilds each file and
checks its sha256, and renames the result into ``<cache>/<name>``: ``model.path: <name>`` for a
known name, else the folder's path.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from explorl.errors import ConfigError, ModelPathError
from explorl.model_store.cache import build_once, cache_root, read_source
from explorl.model_store.gguf_files import ensure_converted, file_sha256, is_current

MANIFEST = "manifest.json"
FORMAT = 1
_BLOCK = 1 << 22


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


class _Parts:
    """Bytes written in order into ``part-NNN`` files of at most ``limit`` bytes each."""

    def __init__(self, out: Path, limit: int):
        self.out, self.limit = out, limit
        self.parts: list[dict] = []
        self.fh, self.hash = None, None

    def write(self, data: bytes) -> None:
        while data:
            if self.fh is None or self.parts[-1]["bytes"] == self.limit:
                self.close()
                self.parts.append({"file": f"part-{len(self.parts):03d}", "bytes": 0})
                self.fh, self.hash = open(self.out / self.parts[-1]["file"], "wb"), hashlib.sha256()
            room = self.limit - self.parts[-1]["bytes"]
            chunk, data = data[:room], data[room:]
            self.fh.write(chunk)
            self.hash.update(chunk)
            self.parts[-1]["bytes"] += len(chunk)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.parts[-1]["sha256"] = self.hash.hexdigest()
            self.fh = None


def pack(src: Path, out: Path, *, name: str, max_mib: float = 60.0, gguf: bool = False) -> dict:
    """Write the cache entry ``src`` (with ``gguf``: the GGUF file it was converted from) as
    parts of at most ``max_mib`` MiB and a manifest into ``out`` (empty or absent); returns the
    manifest."""
    src, out = Path(src), Path(out)
    source = read_source(src)
    if source is None:
        raise ModelPathError(f"{src}: not a model cache entry (no source.json)")
    if max_mib <= 0:
        raise ConfigError(f"--max-mib: must be > 0, got {max_mib}")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out}: exists and is not empty")
    if gguf:
        original = Path(source.get("gguf_file", ""))
        if not original.is_file() or file_sha256(original) != source.get("sha256"):
            raise ModelPathError(f"{src} was converted from {original}, which is gone or has "
                                 "changed since: pack the converted folder instead (no --gguf)")
        files = [(original.name, original)]
    else:
        files = [(p.relative_to(src).as_posix(), p) for p in sorted(src.rglob("*")) if p.is_file()]
    out.mkdir(parents=True, exist_ok=True)
    parts, records = _Parts(out, int(max_mib * 2**20)), []
    try:
        for rel, f in files:
            h, size = hashlib.sha256(), 0
            with open(f, "rb") as fh:
                while block := fh.read(_BLOCK):
                    h.update(block)
                    size += len(block)
                    parts.write(block)
            records.append({"path": rel, "bytes": size, "sha256": h.hexdigest()})
    finally:
        parts.close()
    manifest = {"format": FORMAT, "kind": "gguf" if gguf else "folder", "name": name,
                "source": source, "max_mib": max_mib, "parts": parts.parts, "files": records,
                "bytes": sum(r["bytes"] for r in records)}
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
    name = manifest.get("name") or ""
    if "/" in name or name.startswith(".") or not name:
        raise ModelPathError(f"{path}: bad entry name {name!r}")
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


def _rebuild(parts_dir: Path, manifest: dict, dest: Path) -> None:
    """The manifest's files into ``dest``, each checked against its sha256."""
    streams = (open(Path(parts_dir) / p["file"], "rb") for p in manifest["parts"])
    fh_in, pending = None, b""

    def read(n: int) -> bytes:
        nonlocal fh_in, pending
        while len(pending) < n:
            block = fh_in.read(_BLOCK) if fh_in is not None else b""
            if not block:
                if fh_in is not None:
                    fh_in.close()
                fh_in = next(streams, None)
                if fh_in is None:
                    break
                continue
            pending += block
        out, pending = pending[:n], pending[n:]
        return out

    try:
        for rec in manifest["files"]:
            target = dest / rec["path"]
            if not target.resolve().is_relative_to(dest.resolve()):
                raise ModelPathError(f"manifest: file {rec['path']!r} is outside the folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            h, left = hashlib.sha256(), rec["bytes"]
            with open(target, "wb") as fh:
                while left:
                    block = read(min(left, _BLOCK))
                    if not block:
                        raise ModelPathError(f"{parts_dir}: the parts end inside {rec['path']}")
                    fh.write(block)
                    h.update(block)
                    left -= len(block)
            if h.hexdigest() != rec["sha256"]:
                raise ModelPathError(f"{parts_dir}: {rec['path']} rebuilt with another sha256 "
                                     "than the manifest's")
    finally:
        if fh_in is not None:
            fh_in.close()
        for rest in streams:
            rest.close()


def unpack(parts_dir: Path, *, force: bool = False) -> Path:
    """Rebuild the packed model into ``<cache>/<name>`` (a GGUF file: converted there); returns
    the folder. An entry already there from the same source is kept unless ``force``."""
    parts_dir = Path(parts_dir)
    manifest = read_manifest(parts_dir)
    check_parts(parts_dir, manifest)
    final = cache_root() / manifest["name"]
    source = manifest["source"]
    if force:
        shutil.rmtree(final, ignore_errors=True)
    if manifest.get("kind") == "gguf":
        have = read_source(final)
        if have is not None and is_current(have, source["sha256"]):
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".unpack-", dir=final.parent) as tmp:
            _rebuild(parts_dir, manifest, Path(tmp))
            extra = {k: source[k] for k in ("name", "distribution") if k in source}
            return ensure_converted(Path(tmp) / manifest["files"][0]["path"], final, extra)

    def build(tmp: Path) -> dict:
        _rebuild(parts_dir, manifest, tmp)
        return source  # build_once writes source.json again, last: the entry's marker

    return build_once(final, build, lambda src: src == source)
