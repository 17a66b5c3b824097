"""Recipe files: YAML (1.2 numbers, no duplicate keys, UTF-8), ``base:`` chains, ``--set``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from explorl.config.builtin import find as find_builtin
from explorl.config.builtin import resolve as resolve_builtin
from explorl.config.coerce import _show, set_path, to_dict
from explorl.config.sections import RunConfig
from explorl.errors import ConfigError
from explorl.refs import anchor


def read_recipe(recipe: str | Path | None = None, overrides: list[str] | None = None,
                **top: Any) -> dict:
    """A YAML recipe as plain data, with ``--set`` overrides and top-level keyword overrides
    applied (not validated: ``explorl.validation.load`` builds and checks it).

    A recipe may say ``base: other.yaml`` (relative to itself) to start from another recipe.
    ``recipe`` names a file, else a built-in recipe (``quickstart``, ``lab/grpo``: ``builtin``).
    """
    data: dict = {}
    if recipe is not None:
        data = _read_recipe(resolve_builtin(recipe, "recipe"))
        if "name" not in data:
            data["name"] = Path(recipe).stem
    for text in overrides or []:
        key, value = parse_override(text)
        set_path(data, key, value)
    for key, value in top.items():
        if value is not None:
            data[key] = value
    return data


def _if_dir(p: Path) -> str:
    return " (it is a directory)" if p.is_dir() else ""


def _read_recipe(path: Path, _seen: tuple = ()) -> dict:
    if not path.is_file():
        raise ConfigError(f"recipe {path} does not exist" + _if_dir(path))
    if path.resolve() in _seen:
        raise ConfigError(f"recipe {path}: circular 'base'")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"recipe {path} cannot be read: {e.strerror or e}") from None
    data = load_yaml(read_utf8(raw, f"recipe {path}"), f"recipe {path}") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path} must be a mapping of keys, got {type(data).__name__}")
    _anchor_refs(data, path.parent)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"recipe {path}: base: expected one recipe file name, got "
                          f"{type(base).__name__} {_show(base)}")
    base_path = path.parent / base
    if not base_path.is_file():  # a built-in (``base: lab/grpo``, as ``explorl recipes cp`` writes)
        base_path = find_builtin(base) or base_path
    if not base_path.is_file():
        raise ConfigError(f"recipe {path}: base {base!r} not found (looked for {base_path} and "
                          "a built-in recipe of that name)")
    merged = _read_recipe(base_path, _seen + (path.resolve(),))
    _deep_update(merged, data)
    return merged


class _RecipeLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 numbers (``1e-5`` is a float, as in JSON; YAML 1.1
    reads it as a string) and no duplicate keys (YAML 1.1 keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue
                line = key_node.start_mark.line + 1
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r} (first at line "
                        f"{seen[key_node.value]})", key_node.start_mark)
                seen[key_node.value] = line
        return super().construct_mapping(node, deep)


_RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def read_utf8(raw: bytes, what: str) -> str:
    """Text of a UTF-8 file; a leading byte-order mark is dropped, other bytes are an error."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} is not UTF-8 text (invalid byte 0x{raw[e.start]:02x} at "
                          f"offset {e.start})") from None


def load_yaml(text: str, what: str = "YAML") -> Any:
    """Parse recipe YAML (``_RecipeLoader``); errors become a one-line ``ConfigError``."""
    try:
        return yaml.load(text, Loader=_RecipeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(f"{e.context or ''} {e.problem or ''}".split())
        raise ConfigError(f"{what}{where}: {problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} is not valid YAML: {' '.join(str(e).split())}") from None


def _anchor_refs(data: dict, base: Path) -> None:
    """Make the code references a recipe file writes (reward functions, lab tasks, tools and
    environments) point at
    files next to it, so a recipe's ``rewards.py:f`` works from any working directory."""
    def fix(spec: Any) -> Any:
        if isinstance(spec, str) and spec.startswith("lab:") and not spec.startswith("lab:rg:"):
            return "lab:" + anchor(spec[len("lab:"):], base)
        return anchor(spec, base) if isinstance(spec, str) and not spec.startswith("rg:") else spec

    reward, model, d = data.get("reward"), data.get("model"), data.get("data")
    if isinstance(reward, dict):
        if "verifier" in reward:
            reward["verifier"] = fix(reward["verifier"])
        for f in reward.get("functions") or []:
            if isinstance(f, dict) and "name" in f:
                f["name"] = fix(f["name"])
    rollout = data.get("rollout")
    if isinstance(rollout, dict) and isinstance(rollout.get("tools"), list):
        rollout["tools"] = [fix(t) for t in rollout["tools"]]
    if isinstance(rollout, dict) and isinstance(rollout.get("environment"), str):
        rollout["environment"] = fix(rollout["environment"])
    if isinstance(model, dict) and isinstance(model.get("path"), str) \
            and model["path"].startswith("lab:"):
        model["path"] = fix(model["path"])
    if isinstance(d, dict):
        for key in ("train", "val", "anneal"):
            specs = d.get(key)
            if isinstance(specs, list):
                d[key] = [fix(s) if isinstance(s, str) and s.startswith("lab:") else s
                          for s in specs]
            elif isinstance(specs, str) and specs.startswith("lab:"):
                d[key] = fix(specs)


def _deep_update(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_update(dst[k], v)
        else:
            dst[k] = v


HISTORY_KEY = "resumes"
"""The key of a run's ``config.yaml`` that lists its resumes (training/history.py); a config
read from such a file ignores it."""


def save(cfg: RunConfig, path: str | Path, comments: list[str] = (),
         history: list | None = None) -> None:
    """``cfg`` as YAML at ``path``, below ``comments`` (each a ``#`` line; it loads back), then
    the run's ``history`` of resumes, if any."""
    head = "".join(f"# {line}\n" for line in comments)
    tail = (yaml.safe_dump({HISTORY_KEY: history}, sort_keys=False, allow_unicode=True)
            if history else "")
    Path(path).write_text(head + yaml.safe_dump(to_dict(cfg), sort_keys=False) + tail)


def parse_override(text: str) -> tuple[str, Any]:
    """``"a.b=3"`` → ``("a.b", 3)``; the value is parsed as YAML (so lists/bools work)."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except ConfigError:  # not YAML (e.g. an unbalanced bracket): the text itself
        value = raw
    return key, value
