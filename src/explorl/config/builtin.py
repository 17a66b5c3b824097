"""The recipes and study specs that ship inside the package (``explorl recipes``).

A built-in recipe is named by its path under ``explorl/recipes/`` without ``.yaml``
(``quickstart``, ``lab/grpo``, ``math/dapo``); a study spec by its name under
``explorl/studies/`` (``lab``, ``subset_sum``). ``explorl train NAME`` and ``explorl study NAME``
fall back to them when no file of that name exists: a file always wins. The old clone paths
(``recipes/lab/grpo.yaml``, ``studies/lab.yaml``) name the same files.
"""

from __future__ import annotations

import difflib
import re
from importlib import resources
from pathlib import Path

from explorl.errors import ConfigError

KINDS = {"recipe": "recipes", "study": "studies"}
"""What ships, and the package folder it ships in."""

LAUNCHER_DIR = "accelerate"
"""The recipes folder holding ``accelerate launch --config_file`` files (not training recipes)."""


def folder(kind: str) -> Path:
    """The package folder of ``kind`` (``recipe`` or ``study``)."""
    return Path(str(resources.files("explorl").joinpath(KINDS[kind])))


def names(kind: str) -> list[str]:
    """Every built-in name of ``kind``, sorted (``lab/grpo``, ``quickstart``, …)."""
    root = folder(kind)
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def _key(ref: str, kind: str) -> str:
    """``ref`` as a built-in name: ``.yaml`` and a leading ``recipes/`` (``studies/``) dropped."""
    key = ref.strip().replace("\\", "/")
    key = re.sub(r"\.ya?ml$", "", key)
    prefix = KINDS[kind] + "/"
    return key[len(prefix):] if key.startswith(prefix) else key


def find(ref: str | Path, kind: str = "recipe") -> Path | None:
    """The built-in file ``ref`` names, or None."""
    key = _key(str(ref), kind)
    path = folder(kind) / f"{key}.yaml"
    return path if key and path.is_file() else None


def display(path: str | Path, kind: str = "recipe") -> str:
    """How a command line names ``path``: a built-in by its name (``subset_sum_v3``), a file
    under the working directory by its relative path, any other by the path itself."""
    path = Path(path).resolve()
    root = folder(kind).resolve()
    if path.is_relative_to(root) and path.suffix in (".yaml", ".yml"):
        return path.relative_to(root).with_suffix("").as_posix()
    cwd = Path.cwd().resolve()
    return path.relative_to(cwd).as_posix() if path.is_relative_to(cwd) else str(path)


def resolve(ref: str | Path, kind: str = "recipe") -> Path:
    """The file ``ref`` names: the path itself when it is a file (a file always wins), else the
    built-in of that name; otherwise a ``ConfigError`` listing the closest built-in names."""
    path = Path(ref)
    if path.is_file():
        return path
    builtin = find(ref, kind)
    if builtin is not None:
        if kind == "recipe" and builtin.parent.name == LAUNCHER_DIR:
            raise ConfigError(f"{ref} is an `accelerate launch --config_file` file, not a recipe "
                              f"(its path: {builtin})")
        return builtin
    raise not_found(ref, kind)


def not_found(ref: str | Path, kind: str = "recipe") -> ConfigError:
    """The error for a name that is neither a file nor a built-in, with the closest built-ins."""
    what = "recipe" if kind == "recipe" else "study spec"
    hint = " (it is a directory)" if Path(ref).is_dir() else ""
    close = difflib.get_close_matches(_key(str(ref), kind), names(kind), n=3, cutoff=0.5)
    if close:
        hint += f"; closest built-in {what}s: {', '.join(close)}"
    command = "recipes" if kind == "recipe" else "recipes --studies"
    return ConfigError(f"{what} {ref} does not exist: no such file and no built-in {what} of "
                       f"that name{hint} (`explorl {command}` lists them)")


def summary(path: Path, detail: bool = False) -> str:
    """What a file's opening comment says it is: the words before its first colon or full stop,
    without parenthesised asides (paper and issue references). ``detail`` adds the next clause
    (to tell apart files whose heads are the same, e.g. three Entropy Scheduling schedules)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(" ".join(lines).split()).replace("`", "")
    text = re.sub(r"\s*\([^()]*\)", "", text)
    parts = re.split(r"(?::\s|\.\s|\.$|;\s)", text, maxsplit=1)
    head = parts[0].strip()
    if detail and len(parts) > 1:
        head += ": " + re.split(r"[,.;:]\s", parts[1], maxsplit=1)[0].strip()
    return head.rstrip(".") or path.stem
