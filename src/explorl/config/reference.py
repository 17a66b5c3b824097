"""The recipe reference (``explorl config``, docs/recipes.md) from the fields' docstrings."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing

from explorl.config.coerce import _type_name, key_of
from explorl.config.sections import RunConfig

# ----------------------------------------------------------------------------- docs


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a config dataclass (the string literal after each field)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def reference(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Rows ``(key path, type, default, doc)`` for every leaf field (the recipe reference)."""
    rows = []
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    default = cls()
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        path = f"{prefix}{key_of(f.name)}"
        if dataclasses.is_dataclass(tp):
            rows.extend(reference(tp, path + "."))
        else:
            rows.append(
                (path, _type_name(tp), repr(getattr(default, f.name)), docs.get(f.name, ""))
            )
    return rows
