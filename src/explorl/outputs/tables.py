"""Tables the command line prints, readable in an 80-column terminal: never a value cut to "…".

A table of numbers wider than the terminal is stacked: its value columns are split over several
tables, each repeating the label column(s), as pandas prints a wide frame. A table of text wraps
its last column at word boundaries and keeps every other cell whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

_CELL = 3
"""Characters a bordered rich column takes besides its text: a space either side and a rule."""


def _width(header: str, cells: Sequence[str]) -> int:
    return max([len(header), *map(len, cells)])


def stacked(header: Sequence[str], rows: Sequence[Sequence[str]], width: int, *,
            labels: int = 1, title: str | None = None) -> list[Table]:
    """``rows`` (strings) under ``header`` as one or more tables of at most ``width`` columns:
    the first ``labels`` columns in every table, the other columns split in order."""
    widths = [_width(h, [r[i] for r in rows]) for i, h in enumerate(header)]
    fixed = 1 + sum(w + _CELL for w in widths[:labels])
    groups: list[list[int]] = [[]]
    used = fixed
    for i in range(labels, len(header)):
        if groups[-1] and used + widths[i] + _CELL > width:
            groups.append([])
            used = fixed
        groups[-1].append(i)
        used += widths[i] + _CELL
    tables = []
    for n, group in enumerate(groups):
        part = title if n == 0 else None
        table = Table(title=part, title_justify="left")
        for i in [*range(labels), *group]:
            table.add_column(header[i], justify="left" if i < labels else "right", no_wrap=True,
                             min_width=widths[i])
        for r in rows:
            table.add_row(*[r[i] for i in [*range(labels), *group]])
        tables.append(table)
    return tables


def wrapped(header: Sequence[str], rows: Sequence[Sequence[str]], *,
            title: str | None = None) -> Table:
    """A table whose last column wraps at word boundaries (a word longer than the column folds
    onto the next line, never "…") and whose other cells are kept whole."""
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    for i, h in enumerate(header):
        last = i == len(header) - 1
        table.add_column(h, no_wrap=not last, overflow="fold",
                         min_width=None if last else _width(h, [r[i] for r in rows]))
    for r in rows:
        table.add_row(*r)
    return table


def print_tables(tables: Table | Sequence[Table], console: Console | None = None) -> None:
    """Print ``tables`` on ``console`` (default: stdout at the terminal's width)."""
    console = console or Console()
    for t in [tables] if isinstance(tables, Table) else tables:
        console.print(t)
