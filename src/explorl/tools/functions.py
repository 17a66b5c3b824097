"""Tools as users write them: typed Python functions with a docstring (TRL's convention).

A recipe names them as references (``rollout.tools: [my_tools.py:calculator]``), resolved like
reward functions (``explorl.refs``). ``schema`` turns one into the JSON schema a chat template
shows the model (the OpenAI function format, as ``transformers.utils.get_json_schema``): its
name, the docstring's first paragraph as description, and one property per parameter from its
type hint and its line in the docstring's ``Args:`` section. ``call`` runs one with the
arguments the model wrote and returns the text the model reads back.
"""

from __future__ import annotations

import difflib
import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from explorl.refs import RefError, is_ref, load_ref

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
               dict: "object"}


class ToolCallError(ValueError):
    """A tool call the model wrote that cannot run (unknown tool, bad JSON, bad arguments)."""


def load_tool(ref: str, dirs: tuple[str, ...] | None = None) -> Callable:
    """The function ``ref`` (``module:function`` or ``path/file.py:function``) names, checked
    to be a tool: a function whose every parameter has a type hint, with a docstring."""
    if not is_ref(ref):
        raise RefError(f"{ref!r} is not a tool reference: expected 'module:function' or "
                       "'path/to/file.py:function'")
    fn = load_ref(ref, dirs=dirs)
    check_tool(fn, ref)
    return fn


def check_tool(fn: Any, name: str) -> None:
    """Raise ``RefError`` unless ``fn`` is a callable with a docstring and typed parameters
    (what its schema is made of)."""
    if not callable(fn):
        raise RefError(f"{name!r} is a {type(fn).__name__}, not a function")
    if not inspect.getdoc(fn):
        raise RefError(f"{name!r} has no docstring: a tool's docstring tells the model what it "
                       "does")
    hints = _hints(fn)
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise RefError(f"{name!r}: parameter {p.name!r} is *args/**kwargs; a tool's "
                           "parameters must be named and typed")
        if p.name not in hints:
            raise RefError(f"{name!r}: parameter {p.name!r} has no type hint (a tool's schema "
                           "is made from them)")


def _hints(fn: Callable) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: the raw annotations
        return {k: v for k, v in getattr(fn, "__annotations__", {}).items()}


def _json_type(hint: Any) -> dict:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _json_type(args[0]) if len(args) == 1 else {}
    if origin is typing.Literal:
        values = list(typing.get_args(hint))
        return {"type": _JSON_TYPES.get(type(values[0]), "string"), "enum": values}
    if origin in (list, tuple):
        args = typing.get_args(hint)
        return {"type": "array", **({"items": _json_type(args[0])} if args else {})}
    return {"type": _JSON_TYPES.get(origin or hint, "string")}


def _arg_docs(doc: str) -> dict[str, str]:
    """``name: text`` lines of a Google-style ``Args:`` section."""
    out, inside = {}, False
    for line in doc.splitlines():
        if re.match(r"^\s*(Args|Arguments|Parameters)\s*:\s*$", line):
            inside = True
            continue
        if inside:
            m = re.match(r"^\s+(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", line)
            if m:
                out[m.group(1)] = m.group(3).strip()
            elif line.strip() and not line.startswith((" ", "\t")):
                inside = False
    return out


def schema(fn: Callable) -> dict:
    """The tool's JSON schema in the OpenAI function format (what chat templates read)."""
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n")[0].replace("\n", " ").strip()
    args, hints = _arg_docs(doc), _hints(fn)
    props, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        prop = _json_type(hints.get(p.name, str))
        if p.name in args:
            prop["description"] = args[p.name]
        props[p.name] = prop
        if p.default is p.empty:
            required.append(p.name)
    return {"type": "function", "function": {
        "name": fn.__name__, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required}}}


def call(tools: dict[str, Callable], name: str, arguments: Any) -> str:
    """Run tool ``name`` with ``arguments`` (a dict of keyword arguments, or a JSON string of
    one) and return its result as text: a ``str``, a number as ``str(...)``, a dict or list as
    JSON; anything else (None, bytes, an object) raises ``TypeError``.

    ``ToolCallError`` when the call cannot run as written: unknown tool (the message names
    the closest one), arguments that are not an object, or that the function does not take.
    What the function itself raises propagates (the caller reports it to the model).
    """
    fn = tools.get(name)
    if fn is None:
        close = difflib.get_close_matches(str(name), list(tools), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ToolCallError(f"unknown tool {name!r}{hint} (tools: {', '.join(tools)})")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise ToolCallError(f"arguments of {name} are not JSON: {e}") from None
    if not isinstance(arguments, dict):
        raise ToolCallError(f"arguments of {name} must be an object, got "
                            f"{type(arguments).__name__}")
    try:
        inspect.signature(fn).bind(**arguments)
    except TypeError as e:
        raise ToolCallError(f"{name}: {e}") from None
    out = fn(**arguments)
    if isinstance(out, str):
        return out
    if isinstance(out, (dict, list)):
        return json.dumps(out)
    if isinstance(out, (int, float)):
        return str(out)
    raise TypeError(f"{name} returned a {type(out).__name__}, not text (a tool returns a str, a "
                    "number, or a dict or list sent as JSON)")
