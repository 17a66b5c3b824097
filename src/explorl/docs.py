"""Generate docs/recipes.md (the recipe reference) from the config tree's field docstrings."""

from __future__ import annotations

import dataclasses
import typing

from explorl import config as C
from explorl.validation.checks import ALL_RANGES

HEADER = """# Recipe reference

Generated from the config dataclasses in `src/explorl/config/` by
`python -m explorl.docs > docs/recipes.md` (a test keeps it in sync). Every key of a recipe, its
type, its default and its meaning; the config classes are the only home of these defaults.
Override any key with `--set key=value`. *allowed* is the interval every number of the key must
lie in (`config.RANGES`, and for a loss's or an advantage estimator's keys its spec in
`explorl.algorithms`); all numbers must be finite, and relations between keys are checked too
([Failure behaviour](failures.md)).
"""


def _allowed(path: str) -> str:
    return f"`{ALL_RANGES[path]}`" if path in ALL_RANGES else ""


def recipe_reference() -> str:
    lines = [HEADER]
    hints = typing.get_type_hints(C.RunConfig)
    top_docs = C.field_docs(C.RunConfig)
    leaf_rows = [r for r in C.reference() if "." not in r[0]]
    head = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    lines += ["## Top level", "", *head]
    lines += [f"| `{p}` | {t} | `{d}` | {_allowed(p)} | {doc} |" for p, t, d, doc in leaf_rows]
    for f in dataclasses.fields(C.RunConfig):
        tp = hints[f.name]
        if not dataclasses.is_dataclass(tp):
            continue
        lines += ["", f"## `{f.name}` — {top_docs.get(f.name, '')}", "", *head]
        for p, t, d, doc in C.reference(tp, f.name + "."):
            lines.append(f"| `{p}` | {t.replace('|', '/')} | `{d}` | {_allowed(p)} | "
                         f"{doc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(recipe_reference(), end="")
