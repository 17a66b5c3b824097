"""The documentation site's structure, checked without mkdocs: every page in the nav exists,
every hand-written page is in the nav, the README stays short with the two quickstart commands,
no user-facing page cites internal issue numbers, and the architecture page's import diagram
matches the code. `make docs` (--strict, in CI) checks links."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = ("lab-study/", "lab-study-clip/")  # the study tool's reports, linked from the pages


def _nav_files(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [f for v in node.values() for f in _nav_files(v)]
    return [f for item in node for f in _nav_files(item)]


def _nav() -> list[str]:
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return _nav_files(cfg["nav"])


def test_every_nav_entry_is_a_page():
    missing = [f for f in _nav() if not (DOCS / f).is_file()]
    assert not missing, f"mkdocs.yml nav names pages that do not exist: {missing}"


def test_every_page_is_in_the_nav():
    nav = set(_nav())
    pages = [p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")]
    orphans = [p for p in pages if p not in nav and not p.startswith(GENERATED)]
    assert not orphans, f"pages missing from mkdocs.yml's nav: {orphans}"


def _block_after(text: str, heading: str) -> str:
    """The first fenced block after ``heading``."""
    start = text.index("```", text.index(heading))
    return text[text.index("\n", start) + 1:text.index("```", start + 3)]


def test_readme_is_short_and_keeps_the_quickstart():
    """At most 200 lines; the two quickstart commands, the same (times included) in the README
    and the Quickstart page; the lab's findings in at most 20 lines, one table row per method."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make demo   # sets up .venv" in readme and "make test   # sets up .venv" in readme
    quick = _block_after(readme, "## Quickstart")
    assert [line.split()[:2] for line in quick.splitlines()] == [["make", "demo"], ["make", "test"]]
    assert quick == _block_after((DOCS / "getting-started.md").read_text(), "# Quickstart")
    lab = readme[readme.index("## What the lab shows"):]
    lab = lab[:lab.index("\n## ")].rstrip().splitlines()
    assert len(lab) <= 20, len(lab)
    rows = [line for line in lab if line.startswith("| ") and not line.startswith("| method")]
    assert len({r.split("|")[1] for r in rows}) == len(rows) and all(len(r) <= 100 for r in rows)


def test_no_internal_issue_numbers_in_user_pages():
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *DOCS.rglob("*.md")]
    hits = [f"{p.relative_to(ROOT)}:{m.group(0)}" for p in pages
            for m in re.finditer(r"\bissues? #?\d+", p.read_text(), re.IGNORECASE)]
    assert not hits, hits


def _diagram_lines() -> list[list[str]]:
    """The import diagram of docs/architecture.md, top line first: each line's modules as
    ``explorl.…`` names (``training/loop, update`` -> explorl.training.loop, …update)."""
    text = (DOCS / "architecture.md").read_text()
    start = text.index("- Imports flow one way")
    block = text[text.index("```", start) + 3:]
    block = block[block.index("\n") + 1:block.index("```")]
    lines = []
    for row in filter(str.strip, block.splitlines()):
        entries, prefix, names = re.split(r"\s{2,}", row.strip())[0], "", []
        for item in (e.strip() for e in entries.split(",")):
            if "/" in item:
                prefix, item = item.split("/")
            names.append("explorl" if item == "explorl" else
                         ".".join(["explorl", *([prefix] if prefix else []), item]))
        lines.append(names)
    return lines


def _diagram_line(module: str, lines: list[list[str]]) -> int | None:
    """Index of the line holding ``module``: its own entry, else its package's (longest match);
    a split package's ``__init__`` goes with the package's highest line."""
    best, where = -1, None
    for i, names in enumerate(lines):
        for n in names:
            hit = module == n or (n != "explorl" and module.startswith(n + "."))
            if hit and len(n) > best:
                best, where = len(n), i
    if where is None:
        for i, names in enumerate(lines):
            if any(n.startswith(module + ".") for n in names):
                return i
    return where


def test_architecture_import_diagram_matches_the_code():
    """Every explorl module has a line in docs/architecture.md's import diagram, and every
    import (function-level ones included) points to its own line or a line beneath."""
    from test_layout import _imports

    graph, _ = _imports(lazy_too=True)
    lines = _diagram_lines()
    where = {m: _diagram_line(m, lines) for m in graph}
    missing = sorted(m for m, i in where.items() if i is None)
    assert not missing, f"modules missing from docs/architecture.md's import diagram: {missing}"
    # ``from explorl import refs`` names the root package too; it imports nothing itself (its
    # public names resolve lazily), so only the module imported counts.
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                    if d != "explorl" and where[d] < where[m])
    assert not upward, f"imports pointing up docs/architecture.md's diagram: {upward}"


def test_architecture_import_diagram_draws_the_layers():
    """The diagram's lines are tests/test_layout.py's ``LAYERS``, top line = last layer."""
    from test_layout import LAYERS

    drawn = [{n if n == "explorl" else n.split(".", 1)[1] for n in names}
             for names in reversed(_diagram_lines())]
    assert drawn == [set(layer) for layer in LAYERS], (
        "docs/architecture.md's import diagram and test_layout.LAYERS differ: "
        f"drawn {drawn}, layers {LAYERS}"
    )
