"""Every citation in the code, tests, docs and benchmarks names a file of this repository: a docs
page, a README, a benchmark note. A path that does not exist fails, and so does a cited section
(``page.md#anchor`` or ``page.md §2c``) that the page has no heading for. Reference sheets kept
outside the repository cannot be cited: what explorl relies on is written in its own docs
(docs/methods/*.md, docs/architecture.md). Checked without mkdocs, in well under a second."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("src", "tests", "docs", "benchmarks")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt"}
# CHANGELOG.md is history, kept as written; the docs site shows it through a snippet include.
TOP_LEVEL = ("README.md", "Makefile", "mkdocs.yml", "pyproject.toml")

# Sheets that lived beside the repository, never in it (spelt in two pieces so that this file
# does not cite them itself).
OUTSIDE = re.compile(r"\b(?:" + "ALGO" + r"RITHMS|" + "STY" + r"LE\.md)\b|\.\./shared\b")
SEC = r"\d{1,2}[a-z]?(?:-[a-z])?"
# A repository path: docs/…, benchmarks/…, src/…, tests/… ending in .md, or a top-level .md file;
# then an optional #anchor, then optional sections (§2c, §2c/§2d, §0, §7b).
PATH = re.compile(r"(?<![\w/.-])((?:(?:docs|benchmarks|src|tests)/[\w./-]*?|README|CHANGELOG)"
                  r"\.md)(#[\w-]+)?((?:(?:\s*,\s*|\s*/\s*|\s+)§" + SEC + r")*)")
# A markdown link in a .md page, relative to the page: [text](target.md#anchor), [text](#anchor).
LINK = re.compile(r"\]\(((?:[\w./-]*\.md)?)(#[\w.-]+)?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::[\w-]+)?"\s*$', re.M)



def _rel(path: Path) -> Path:
    """``path`` relative to the repository when it lies inside it (it may already be)."""
    path = Path(path)
    return path.relative_to(ROOT) if path.is_absolute() and ROOT in path.parents else path

def _files() -> list[Path]:
    files = [ROOT / f for f in TOP_LEVEL if (ROOT / f).is_file()]
    for top in SCANNED:
        files += [p for p in (ROOT / top).rglob("*")
                  if p.suffix in SUFFIXES and p.is_file() and "__pycache__" not in p.parts
                  and p != Path(__file__).resolve()]  # this file's examples are bad on purpose
    return sorted(files)


def _slug(text: str) -> str:
    """Python-Markdown's toc slug (what mkdocs links to): ASCII-folded, punctuation dropped,
    lower case, runs of spaces and hyphens joined by one hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # [text](url) -> text
    text = re.sub(r"[`*]", "", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _text(page: Path) -> str:
    """The page as mkdocs renders it, snippet includes (--8<-- "path") expanded."""
    text = page.read_text()
    return SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text()
                       if (ROOT / m.group(1)).is_file() else "", text)


def _headings(page: Path) -> tuple[set[str], list[str]]:
    """(anchors, heading texts) of a markdown page; headings inside code fences do not count."""
    anchors, texts, seen, fenced = set(), [], {}, False
    for line in _text(page).splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not m:
            continue
        text, explicit = m.group(1), re.search(r"\s*\{[^}]*#([\w-]+)[^}]*\}\s*$", m.group(1))
        if explicit:
            text = text[:explicit.start()]
            anchor = explicit.group(1)
        else:
            base = _slug(text)
            anchor = base if base not in seen else f"{base}_{seen[base]}"
            seen[base] = seen.get(base, 0) + 1
        anchors.add(anchor)
        texts.append(text)
    anchors |= set(re.findall(r'\bid="([\w-]+)"', page.read_text()))
    return anchors, texts


def _section_ids(texts: list[str]) -> set[str]:
    """The section numbers a page's headings carry: '2c. Clip-Cov' -> 2c; 'Formulas (§0)' -> 0."""
    ids = set()
    for t in texts:
        m = re.match(r"(\d{1,2}[a-z]?)\.\s", t)
        if m:
            ids.add(m.group(1))
        ids |= set(re.findall(r"§(\d{1,2}[a-z]?)\b", t))
    return ids


def _expand(section: str) -> list[str]:
    """'6a-c' -> ['6a', '6b', '6c']; '2c' -> ['2c']."""
    m = re.fullmatch(r"(\d+)([a-z])-([a-z])", section)
    if not m:
        return [section]
    return [m.group(1) + chr(c) for c in range(ord(m.group(2)), ord(m.group(3)) + 1)]


def _has_section(section: str, ids: set[str]) -> bool:
    """§2c needs a heading numbered 2c; §2 a heading numbered 2 or 2a, 2b, …"""
    return any(i == section or (i[:-1] == section and i[-1].isalpha()) for i in ids)


def problems_in(text: str, where: Path) -> list[str]:
    """What is wrong with the citations in ``text`` (read from ``where``)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in OUTSIDE.finditer(line):
            out.append(f"{where}:{n}: cites {m.group(0)!r}, which is not in the repository")
    for m in PATH.finditer(text):
        n = text.count("\n", 0, m.start()) + 1
        target = ROOT / m.group(1)
        if not target.is_file():
            out.append(f"{where}:{n}: {m.group(1)} does not exist")
            continue
        out += _check_target(target, m.group(2), m.group(3), f"{where}:{n}: {m.group(0).strip()}")
    if where.suffix == ".md":
        for m in LINK.finditer(text):
            if not m.group(1) and not m.group(2):
                continue
            n = text.count("\n", 0, m.start()) + 1
            target = (where.parent / m.group(1)).resolve() if m.group(1) else where
            if not target.is_file():
                out.append(f"{where}:{n}: link to {m.group(1)}, which does not exist")
                continue
            out += _check_target(target, m.group(2), "", f"{where}:{n}: link {m.group(0)}")
    return out


def _check_target(target: Path, anchor: str | None, sections: str, label: str) -> list[str]:
    if target.suffix != ".md" or not (anchor or sections):
        return []
    anchors, texts = _headings(target)
    out = []
    if anchor and anchor[1:] not in anchors and not (
            anchor.startswith("#explorl") and ":::" in target.read_text()):  # API reference
        out.append(f"{label}: no heading with anchor {anchor} in {_rel(target)}")
    ids = _section_ids(texts)
    for sec in re.findall(r"§(" + SEC + ")", sections or ""):
        for s in _expand(sec):
            if not _has_section(s, ids):
                out.append(f"{label}: {_rel(target)} has no section §{s}")
    return out


def test_every_citation_names_a_file_and_section_of_the_repository():
    problems = [p for f in _files() for p in problems_in(f.read_text(), f.relative_to(ROOT))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("text, expected", [
    ("see ALGO" "RITHMS.md §2c", "not in the repository"),
    ("(ALGO" "RITHMS 1a)", "not in the repository"),
    ("layout: see STY" "LE.md", "not in the repository"),
    ("docs/methods/nowhere.md", "does not exist"),
    ("docs/methods/entropy-mechanism.md §2e", "has no section §2e"),
    ("docs/methods/wider-field.md §6k-n", "has no section §6n"),
    ("docs/methods/combining.md#the-knob-contracts", "no heading with anchor"),
    ("[x](methods/e3.md#1z-nothing)", "no heading with anchor"),
])
def test_the_checker_catches_a_bad_citation(text, expected):
    problems = problems_in(text, Path("docs/example.md"))
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("text", [
    "docs/methods/entropy-mechanism.md §2c, §2d", "docs/methods/e3.md §1a/§1b",
    "docs/methods/entropy-mechanism.md §2", "docs/methods/wider-field.md §6a-b",
    "docs/methods/baseline.md §0, §7b", "docs/rollout-engines.md §8",
    "docs/methods/combining.md#the-knob-contract",
    "docs/methods/baseline.md#7a-rollout-correction-tis-and-mis",
    "docs/architecture.md#rules-that-keep-it-this-way",
    "[x](methods/e3.md#1a-temperature-scheduler-eq-4)",
])
def test_the_checker_accepts_a_good_citation(text):
    assert problems_in(text, Path("docs/example.md")) == []
