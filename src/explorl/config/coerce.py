"""Building typed sections from plain data: types checked with the key path, ``--set`` values."""

from __future__ import annotations

import dataclasses
import difflib
import keyword
import types
import typing
from typing import Any, Literal

from explorl.errors import ConfigError


def _fail(path: str, msg: str) -> typing.NoReturn:
    raise ConfigError(f"{path}: {msg}" if path else msg)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " / ".join(map(str, typing.get_args(tp)))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(
            "None" if a is type(None) else _type_name(a) for a in typing.get_args(tp)
        )
    if typing.get_origin(tp) is list:
        return f"list[{_type_name(typing.get_args(tp)[0])}]"
    if typing.get_origin(tp) is dict:
        return f"dict[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _show(value: Any, limit: int = 80) -> str:
    """``repr`` cut to ``limit`` characters: an error message quotes the value, not a megabyte."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against annotation ``tp``; return it (ints accepted for floats)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if value is None:  # a section whose keys are all commented out
            value = {}
        if not isinstance(value, dict):
            _fail(
                path,
                f"expected a mapping of {tp.__name__} fields, "
                f"got {type(value).__name__} {_show(value)}",
            )
        return build(tp, value, path)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            _fail(path, f"{_show(value)} is not one of {', '.join(map(repr, allowed))}{hint}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except ConfigError as e:
                errors.append(str(e))
        _fail(path, f"expected {' or '.join(_type_name(a) for a in args)}, got {_show(value)}")
    if tp is Any:
        return value
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            _fail(path, f"expected a mapping, got {type(value).__name__} {_show(value)}")
        return {_coerce(k, key_tp, path): _coerce(v, value_tp, f"{path}.{k}")
                for k, v in value.items()}
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, (str, int, float)) and item_tp is type(value):
            value = [value]  # a single item where a list is expected: `train: lab:addition`
        if not isinstance(value, list):
            _fail(path, f"expected a list, got {type(value).__name__} {_show(value)}")
        return [_coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            _fail(path, f"expected true/false, got {_show(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, f"expected an integer, got {type(value).__name__} {_show(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(path, f"expected a number, got {type(value).__name__} {_show(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            _fail(path, f"expected a string, got {type(value).__name__} {_show(value)}")
        return value
    raise TypeError(
        f"unsupported annotation {tp!r} at {path}"
    )  # a bug in this file, not user input


def key_of(field_name: str) -> str:
    """The recipe key of a field: a Python keyword is spelled with a trailing ``_`` in the
    dataclass (``async_``) and without it in the recipe (``rollout.async``)."""
    bare = field_name[:-1]
    return bare if field_name.endswith("_") and keyword.iskeyword(bare) else field_name


def field_of(key: str) -> str:
    """The dataclass field of recipe key ``key`` (``key_of``'s inverse)."""
    return key + "_" if keyword.iskeyword(key) else key


def build(cls: type, data: dict, path: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [key_of(f.name) for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            hint = f"; did you mean {(path + '.' if path else '') + close[0]!r}?" if close else ""
            _fail(key_path, f"unknown key{hint} (valid keys here: {', '.join(names)})")
        kwargs[field_of(key)] = _coerce(value, hints[field_of(key)], key_path)
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict:
    def keys(x: Any) -> Any:
        return {key_of(k): keys(v) for k, v in x.items()} if isinstance(x, dict) else x

    return keys(dataclasses.asdict(cfg))


def set_path(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for i, k in enumerate(keys[:-1]):
        if node.get(k) is None:  # absent, or a section whose keys are all commented out
            node[k] = {}
        nxt = node[k]
        if not isinstance(nxt, dict):
            _fail(".".join(keys[: i + 1]), f"is a value, not a section (cannot set {dotted})")
        node = nxt
    node[keys[-1]] = value
