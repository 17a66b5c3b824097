"""The package's shape (issue 12): a short trainer, no long files, no import cycles."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "explorl"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _eager_imports() -> dict[str, set[str]]:
    """Module -> explorl modules imported at module level (what runs at import time)."""
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.parse(path.read_text()).body:
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and t.startswith("explorl"):
                    deps.add(t)
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (c := visit(d)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_no_import_cycle_at_import_time():
    assert _cycle(_eager_imports()) is None, (
        f"import cycle: {' -> '.join(_cycle(_eager_imports()))}"
    )


def test_config_depends_on_nothing_above_it():
    graph = _eager_imports()
    for name, deps in graph.items():
        if name == "explorl.config" or name.startswith("explorl.config."):
            above = {
                d for d in deps if d != "explorl.errors" and not d.startswith("explorl.config")
            }
            assert not above, f"{name} imports {sorted(above)} at import time"


def test_trainer_is_short_and_no_file_is_long():
    assert len((SRC / "training" / "loop.py").read_text().splitlines()) <= 300
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"files over 500 lines: {long}"
