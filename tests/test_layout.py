"""The package's shape: a short trainer, no long files, imports in one direction, no cycles."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "explorl"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_blocks(tree: ast.Module) -> set[int]:
    """ids of the nodes under a module-level ``if TYPE_CHECKING:`` (never run)."""
    return {id(n) for node in tree.body if isinstance(node, ast.If)
            and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
            for n in ast.walk(node)}


def _imports(*, lazy_too: bool, typing_too: bool = False
             ) -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """Module -> explorl modules it imports (module level; with ``lazy_too`` inside functions as
    well; with ``typing_too`` under ``if TYPE_CHECKING:`` too), and the (module, target) pairs
    imported inside a function."""
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    lazy: set[tuple[str, str]] = set()
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        skip = set() if typing_too else _type_checking_blocks(tree)
        deps = set()
        for node in ast.walk(tree):
            if id(node) in skip or (not lazy_too and id(node) not in top):
                continue
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
                    if id(node) not in top:
                        lazy.add((name, t))
        graph[name] = deps
    return graph, lazy


def _eager_imports() -> dict[str, set[str]]:
    """Module -> explorl modules imported at module level (what runs at import time)."""
    return _imports(lazy_too=False)[0]


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


def test_trainer_is_short_and_no_file_is_long():
    assert len((SRC / "training" / "loop.py").read_text().splitlines()) <= 300
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"files over 500 lines: {long}"


# Function-level imports of explorl modules that are deliberate, each pointing downwards:
# the CLI imports a command's machinery only when that command runs (``explorl --help`` stays
# fast); ``explorl.lab`` builds its model lazily (parsing a ``lab:`` spec imports no torch).
DELIBERATE_LAZY = {
    "explorl.cli": "the CLI's commands",
    "explorl.cli_study": "the study command's phases",
    "explorl.lab": "lab_model_path (torch/transformers)",
}


def test_no_import_cycle_counting_function_level_imports():
    graph, _ = _imports(lazy_too=True)
    cycle = _cycle(graph)
    assert cycle is None, f"import cycle (function-level imports counted): {' -> '.join(cycle)}"


def test_function_level_imports_only_where_deliberate():
    _, lazy = _imports(lazy_too=True)
    stray = sorted(f"{a} -> {b}" for a, b in lazy if a not in DELIBERATE_LAZY)
    assert not stray, f"function-level explorl imports outside DELIBERATE_LAZY: {stray}"


def test_config_is_plain_data():
    """``explorl.config`` imports no feature, not even inside a function: only ``errors`` and
    ``refs`` (two leaf utilities)."""
    graph, _ = _imports(lazy_too=True)
    for name, deps in graph.items():
        if name == "explorl.config" or name.startswith("explorl.config."):
            above = {d for d in deps if d not in ("explorl.errors", "explorl.refs")
                     and not d.startswith("explorl.config")}
            assert not above, f"{name} imports {sorted(above)}"
    assert graph["explorl.refs"] <= {"explorl.errors"}


# The layers, bottom first. A package (``explorl/rollout/``) or top-level module (``models.py``)
# imports only from its own layer and the layers beneath it; docs/architecture.md draws them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "refs", "files", "hf_compat", "records"),  # leaf utilities, PromptRecord
    ("config",),  # plain data: sections, ranges, recipes
    ("algorithms",),  # pure tensor math
    ("control",),  # controllers, their specs, the knob contract
    ("rewards",),  # verifiers, reward functions, the sandboxed pool
    ("tools", "lab"),  # tool calls and environments; the lab's tasks, tokenizer and model
    ("data",),  # prompt files, lab and reasoning-gym splits, epoch order
    ("model_store", "models", "adapters"),  # loading the policy; LoRA
    ("policy",),  # the policy's forward passes (sampling's lean call, the loss's log-probs)
    ("rollout",),  # engines and samplers
    ("outputs",),  # what a run writes: metrics, completions, checkpoints, trackers
    ("validation", "analysis"),  # checking a recipe; reading runs back
    ("eval",),  # validation's sampling routine, explorl eval
    ("training",),  # the trainer and its phases
    ("report",),  # a study's report: numbers, intervals, claims, tables, figures, documents
    ("study",),  # lab studies (runs the command line as child processes)
    ("integrations", "api", "docs", "cli_models", "cli_recipes", "cli_study", "cli", "__main__",
     "explorl"),
)


def _package(module: str) -> str:
    """``explorl.rollout.hf`` -> ``rollout``; ``explorl.models`` -> ``models``; the root itself
    -> ``explorl``."""
    return module.split(".")[1] if "." in module else module


def _package_imports() -> dict[tuple[str, str], list[str]]:
    """(package, package it imports) -> the module imports behind that arrow. Every import
    counts: module level, inside functions, under ``if TYPE_CHECKING:``. ``from explorl import
    config`` names the root package too; the root imports nothing itself (its public names
    resolve lazily), so only the module imported counts."""
    graph, _ = _imports(lazy_too=True, typing_too=True)
    arrows: dict[tuple[str, str], list[str]] = {}
    for module, deps in graph.items():
        for dep in deps:
            a, b = _package(module), _package(dep)
            if dep != "explorl" and a != b:
                arrows.setdefault((a, b), []).append(f"{module} -> {dep}")
    return arrows


def test_every_package_has_a_layer():
    layer_of = [p for layer in LAYERS for p in layer]
    assert len(layer_of) == len(set(layer_of)), "a package listed on two layers"
    packages = {_package(m) for m in _imports(lazy_too=False)[0]}
    assert packages == set(layer_of), (
        f"packages without a layer: {sorted(packages - set(layer_of))}; "
        f"layers naming no package: {sorted(set(layer_of) - packages)}"
    )


def test_imports_point_down_the_layers():
    level = {p: i for i, layer in enumerate(LAYERS) for p in layer}
    upward = sorted(f"{a} (layer {level[a]}) -> {b} (layer {level[b]}): {', '.join(sorted(how))}"
                    for (a, b), how in _package_imports().items() if level[b] > level[a])
    assert not upward, "imports pointing up the layers:\n" + "\n".join(upward)


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for a, b in _package_imports():
        graph.setdefault(a, set()).add(b)
    cycle = _cycle(graph)
    assert cycle is None, f"packages importing each other: {' -> '.join(cycle)}"


MAX_FUNCTION_LINES = 80
# The functions still over MAX_FUNCTION_LINES, each to be split into named steps. The list only
# shrinks: a new long function fails, and so does a listed one that is no longer long (strike it).
LONG_FUNCTIONS: frozenset[str] = frozenset()


def _long_functions() -> dict[str, int]:
    """``path:name`` -> lines of every function (methods and nested ones too) longer than
    MAX_FUNCTION_LINES, from its ``def`` to its last line."""
    out = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out[f"{path.relative_to(SRC).as_posix()}:{node.name}"] = lines
    return out


def test_long_functions_are_named_and_only_shrink():
    long = _long_functions()
    new = {f: n for f, n in long.items() if f not in LONG_FUNCTIONS}
    assert not new, (f"functions over {MAX_FUNCTION_LINES} lines: {new}; split them into named "
                     "steps")
    shortened = sorted(LONG_FUNCTIONS - set(long))
    assert not shortened, f"now {MAX_FUNCTION_LINES} lines or fewer, strike from LONG_FUNCTIONS: " \
                          f"{shortened}"
