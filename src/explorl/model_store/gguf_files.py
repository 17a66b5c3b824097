"""GGUF checkpoints as a model source: read a ``.gguf`` file's header, convert it once into the
model cache as an ordinary Hugging Face folder (float32 safetensors + tokenizer files).

transformers loads a GGUF file (``from_pretrained(dir, gguf_file=name)``) by dequantising every
tensor to float; such a model refuses ``save_pretrained``. Its weights are copied into a model
built from the same config without the ``quantization_config``, which saves like any other.
Every later load, checkpoint, ``explorl export``, LoRA merge and vLLM engine then reads the
converted folder, and the ``gguf`` package is needed only for the conversion.

Cache key: the sha256 of the file's bytes (a copied, moved or renamed file reuses its
conversion; an edited one never does). Hashing a large file on every load is avoided by a memo
keyed by the file's path, size, mtime and inode (``<cache>/.sha256/``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import logging
import re
import tempfile
from collections import Counter
from pathlib import Path

from explorl.errors import ModelPathError
from explorl.files import write_text_atomic
from explorl.hf_compat import quiet_transformers
from explorl.model_store.cache import build_once, cache_root, read_source

log = logging.getLogger(__name__)

SUFFIX = ".gguf"
CONVERTER_VERSION = 1
"""Bump when the conversion changes, so cached conversions are rebuilt."""
INSTALL_HINT = "pip install 'explorl[real]' (or pip install 'gguf>=0.10')"


@dataclasses.dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file's header says: its architecture and the storage type of its tensors."""

    path: Path
    architecture: str
    tensor_types: dict[str, int]
    """Storage type name (``F32``, ``Q4_1``, ``Q8_0``…) -> number of tensors stored so."""


def find_gguf(spec: str) -> Path | None:
    """The GGUF file ``model.path`` names: a ``.gguf`` file, or a folder without ``config.json``
    that holds exactly one; None when ``spec`` names neither (a model folder, a lab task)."""
    p = Path(spec).expanduser()
    if p.suffix.lower() == SUFFIX:
        if not p.is_file():
            raise ModelPathError(f"{spec}: no such GGUF file")
        return p
    if not p.is_dir() or (p / "config.json").exists():
        return None
    found = sorted(f for f in p.iterdir() if f.suffix.lower() == SUFFIX and f.is_file())
    if len(found) > 1:
        names = ", ".join(f.name for f in found)
        raise ModelPathError(f"{spec} holds {len(found)} GGUF files ({names}): name one of "
                             "them in model.path")
    return found[0] if found else None


def file_sha256(path: Path) -> str:
    """sha256 of ``path``'s bytes, remembered per (path, size, mtime, inode) in the cache."""
    path = Path(path).resolve()
    st = path.stat()
    stamp = f"{path}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    memo = cache_root() / ".sha256" / hashlib.sha256(stamp.encode()).hexdigest()[:32]
    try:
        known = memo.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{64}", known):
            return known
    except OSError:
        pass
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            h.update(block)
    digest = h.hexdigest()
    try:
        write_text_atomic(memo, digest + "\n")
    except OSError:  # a read-only cache: hash again next time
        pass
    return digest


def converted_dir(path: Path) -> Path:
    """Where ``path``'s conversion lives: ``<cache>/gguf/<stem>-<12 hex digits of sha256>``, or
    the conversion of the same bytes made under another file name."""
    sha = file_sha256(path)
    root = cache_root() / "gguf"
    for d in sorted(root.glob(f"*-{sha[:12]}")):
        src = read_source(d)
        if src is not None and src.get("sha256") == sha:
            return d
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(path).stem)
    return root / f"{stem}-{sha[:12]}"


def is_current(source: dict, sha256: str | None = None) -> bool:
    """Whether a cache entry's ``source.json`` is this converter's work (of that file)."""
    return (source.get("converter") == CONVERTER_VERSION
            and (sha256 is None or source.get("sha256") == sha256))


def cached(path: Path) -> Path | None:
    """``path``'s conversion when it is in the cache, else None (nothing is converted)."""
    final = converted_dir(path)
    src = read_source(final)
    return final if src is not None and is_current(src, file_sha256(path)) else None


def _gguf(path: Path):
    try:
        import gguf
    except ImportError:
        raise ModelPathError(f"{path}: reading a GGUF file needs the gguf package: "
                             f"{INSTALL_HINT}") from None
    return gguf


def _dequantizable(gguf, qtype) -> bool:
    """Whether the gguf package can turn ``qtype`` into floats (it raises NotImplementedError
    for the types it only knows by name); tried on one block of zero bytes."""
    import numpy as np

    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    try:
        gguf.quants.dequantize(np.zeros(nbytes, dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def inspect(path: Path) -> GGUFInfo:
    """Read ``path``'s header: a corrupt or truncated file, a quantisation the gguf package
    cannot dequantise, an architecture transformers does not load from GGUF, or a missing gguf
    package is a ``ModelPathError`` naming the file. Seconds for a 100 MB file (the reader
    parses the whole vocabulary), so a file's answer is kept for the process (config
    validation, then the conversion)."""
    st = Path(path).stat()
    return _inspect(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _inspect(path: str, size: int, mtime_ns: int) -> GGUFInfo:
    path = Path(path)
    gguf = _gguf(path)
    try:
        reader = gguf.GGUFReader(path)
        arch = reader.fields["general.architecture"].contents()
        types = Counter(t.tensor_type for t in reader.tensors)
    except Exception as e:  # the reader raises ValueError, KeyError, struct errors…
        why = " ".join(str(e).split())[:160] or type(e).__name__
        raise ModelPathError(f"{path}: not a readable GGUF file ({type(e).__name__}: {why}); "
                             "is it complete (its download or copy finished)?") from None
    if not types:
        raise ModelPathError(f"{path}: the GGUF file holds no tensors")
    bad = sorted(t.name for t in types if not _dequantizable(gguf, t))
    if bad:
        raise ModelPathError(
            f"{path}: its tensors are stored as {', '.join(bad)}, which gguf "
            f"{_version('gguf')} cannot dequantise; convert the model to a supported type "
            "(F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1, Q2_K–Q6_K, IQ*) with llama.cpp's tools")
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ModelPathError(
            f"{path}: architecture {arch!r} is not one transformers {_version('transformers')} "
            f"loads from GGUF (it loads {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})")
    return GGUFInfo(Path(path), str(arch), {t.name: n for t, n in sorted(types.items())})


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def convert(path: Path, out: Path) -> dict:
    """Dequantise ``path`` into ``out`` (float32 ``model.safetensors``, config, generation
    config, tokenizer with its chat template); returns the source record. Nothing is fetched:
    transformers reads only ``path`` (from a private folder holding a link to it, so files
    beside it, such as another model's tokenizer_config.json, are not mixed in)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path).resolve()
    info = inspect(path)
    log.info("converting %s (%s, %s) to a Hugging Face folder, once (~30 s for 100 MB)",
             path.name, info.architecture,
             ", ".join(f"{n} {t}" for t, n in info.tensor_types.items()))
    with tempfile.TemporaryDirectory(prefix="explorl-gguf-") as d:
        (Path(d) / path.name).symlink_to(path)
        try:
            with quiet_transformers():
                tok = AutoTokenizer.from_pretrained(d, gguf_file=path.name, local_files_only=True)
                quantised = AutoModelForCausalLM.from_pretrained(
                    d, gguf_file=path.name, dtype=torch.float32, local_files_only=True)
        except Exception as e:  # transformers' own refusal: one line naming the file
            why = " ".join(str(e).split())[:200] or type(e).__name__
            raise ModelPathError(f"{path}: transformers {_version('transformers')} could not "
                                 f"load it ({type(e).__name__}: {why})") from None
    settings = quantised.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        settings.pop(key, None)
    config = type(quantised.config).from_dict(settings)
    # The random initial weights are all overwritten; fork_rng leaves the caller's RNG as it was.
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict(), strict=True)
    model.generation_config = quantised.generation_config
    del quantised
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    st = path.stat()
    return {"converter": CONVERTER_VERSION, "gguf_file": str(path), "sha256": file_sha256(path),
            "bytes": st.st_size, "architecture": info.architecture,
            "tensor_types": info.tensor_types, "dtype": "float32",
            "transformers": _version("transformers"), "gguf": _version("gguf")}


def ensure_converted(path: Path, final: Path | None = None, extra: dict | None = None) -> Path:
    """``path``'s conversion (``final``, default ``converted_dir(path)``), converted now unless
    the cache holds it; ``extra`` is added to the source record (a registered model's name)."""
    path = Path(path)
    sha = file_sha256(path)
    final = final or converted_dir(path)

    def build(tmp: Path) -> dict:
        return {**convert(path, tmp), **(extra or {})}

    return build_once(final, build, lambda src: is_current(src, sha))

