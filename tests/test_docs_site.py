"""The documentation site's structure, checked without mkdocs: every page in the nav exists,
every hand-written page is in the nav, the README stays short with the two quickstart commands,
and no user-facing page cites internal issue numbers. `make docs` (--strict, in CI) checks links."""

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


def test_readme_is_short_and_keeps_the_quickstart():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "make demo   # sets up .venv" in readme and "make test   # sets up .venv" in readme


def test_no_internal_issue_numbers_in_user_pages():
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *DOCS.rglob("*.md")]
    hits = [f"{p.relative_to(ROOT)}:{m.group(0)}" for p in pages
            for m in re.finditer(r"\bissues? #?\d+", p.read_text(), re.IGNORECASE)]
    assert not hits, hits
