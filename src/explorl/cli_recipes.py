"""``explorl recipes``: list, show and copy the recipes and study specs that ship in the package.

    explorl recipes                      # every built-in recipe: name, what it trains, the method
    explorl recipes --studies            # the study specs
    explorl recipes show lab/dapo        # print one (as a file: its comments included)
    explorl recipes cp lab/dapo [DEST]   # copy one to the working directory to edit it

A copy's ``base:`` names the built-in it started from (``base: lab/grpo``), so it keeps working
outside the package; a copied study's ``recipe_dir`` points at the package's recipes.
"""

from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console

from explorl import config as C
from explorl.config import builtin
from explorl.config.recipes import _read_recipe
from explorl.errors import ConfigError
from explorl.outputs.tables import print_tables, wrapped


def _trains(data: dict) -> str:
    """What a recipe trains, in a few words: its lab task(s) on the lab model, else its model
    (the data of the paper-scale recipes are placeholders to fill in)."""
    model = str((data.get("model") or {}).get("path", "lab:auto"))
    train = (data.get("data") or {}).get("train") or ["lab:addition"]
    train = train if isinstance(train, list) else [train]
    if model.startswith("lab:"):
        return ", ".join(map(str, train))
    return Path(model).name or model


def rows(kind: str = "recipe") -> list[tuple[str, str, str]]:
    """``(name, what it trains, method)`` of every built-in of ``kind`` (``launcher``: the
    ``accelerate launch`` configs); a method whose head is shared with another file of its
    folder gets its next clause too."""
    launcher = kind == "launcher"
    kind = "recipe" if launcher else kind
    names = [n for n in builtin.names(kind)
             if (n.partition("/")[0] == builtin.LAUNCHER_DIR) == launcher]
    heads = {n: builtin.summary(builtin.folder(kind) / f"{n}.yaml") for n in names}
    out = []
    for name in names:
        path = builtin.folder(kind) / f"{name}.yaml"
        folder = name.rpartition("/")[0]
        twins = [m for m in names if m != name and m.rpartition("/")[0] == folder
                 and heads[m] == heads[name]]
        method = builtin.summary(path, detail=True) if twins else heads[name]
        if kind == "study":
            task = (C.load_yaml(path.read_text(encoding="utf-8"), str(path)) or {}).get("task")
            trains = f"lab:{task or 'addition'}"
        elif launcher:
            trains = str(path)
        else:
            trains = _trains(_read_recipe(path))
        out.append((name, trains, method))
    return out


def list_builtins(kind: str, console: Console) -> None:
    what = "recipes" if kind == "recipe" else "study specs"
    header = ["name", "trains" if kind == "recipe" else "task", "method"]
    title = f"built-in {what} (explorl {'train' if kind == 'recipe' else 'study'} NAME)"
    print_tables(wrapped(header, rows(kind), title=title), console)
    if kind == "recipe":
        launch = [(name, what) for name, _, what in rows("launcher")]
        console.print()
        print_tables(wrapped(["name", "layout"], launch, title="launcher configs (accelerate "
                                                                "launch --config_file PATH)"),
                     console)
    more = ("explorl recipes show NAME | cp NAME [DEST]; study specs: explorl recipes --studies"
            if kind == "recipe" else "explorl recipes --studies show NAME | cp NAME [DEST]")
    console.print(more, highlight=False, markup=False)


def copy_text(path: Path, kind: str) -> str:
    """The file's text for a copy outside the package: a relative ``base:`` becomes the built-in
    name it points at; a study's ``recipe_dir`` becomes the package's folder."""
    text = path.read_text(encoding="utf-8")
    if kind == "recipe":
        def base(m: re.Match) -> str:
            target = (path.parent / m.group(2).strip("'\"")).resolve()
            root = builtin.folder("recipe").resolve()
            if not target.is_relative_to(root):
                return m.group(0)
            return f"{m.group(1)}{target.relative_to(root).with_suffix('').as_posix()}"
        return re.sub(r"(?m)^(base:\s*)(\S+)", base, text)

    def recipe_dir(m: re.Match) -> str:
        return f"{m.group(1)}{(path.parent / m.group(2)).resolve()}"
    return re.sub(r"(?m)^(recipe_dir:\s*)([^\s#]+)", recipe_dir, text)


def run(args, console: Console | None = None) -> int:
    console = console or Console()
    kind = "study" if args.studies else "recipe"
    if args.action is None:
        list_builtins(kind, console)
        return 0
    if args.name is None:
        raise ConfigError(f"explorl recipes {args.action}: give a NAME "
                          "(explorl recipes lists them)")
    path = builtin.find(args.name, kind)
    if path is None:
        raise builtin.not_found(args.name, kind)
    if args.action == "show":
        print(f"# {path}")
        print(path.read_text(encoding="utf-8"), end="")
        return 0
    dest = Path(args.dest) if args.dest else Path(path.name)
    if dest.is_dir():
        dest = dest / path.name
    if dest.exists() and not args.force:
        raise ConfigError(f"{dest} exists; pass --force to overwrite it")
    dest.write_text(copy_text(path, kind), encoding="utf-8")
    command = "train" if kind == "recipe" else "study"
    if args.name.startswith("accelerate/"):  # a launcher config, not a recipe
        run = f"accelerate launch --config_file {dest} -m explorl train RECIPE"
    else:
        run = f"explorl {command} {dest}"
    print(f"wrote {dest} (from {args.name}); run it with: {run}")
    return 0


def add_parser(sub, parents) -> None:
    r = sub.add_parser("recipes", parents=parents,
                       help="list the built-in recipes and study specs; show or copy one")
    r.add_argument("action", nargs="?", choices=["show", "cp"],
                   help="show: print one; cp: copy one to DEST (default ./NAME.yaml)")
    r.add_argument("name", nargs="?", help="a built-in name, e.g. quickstart or lab/dapo")
    r.add_argument("dest", nargs="?", help="cp: file or directory to write (default ./)")
    r.add_argument("--studies", action="store_true",
                   help="the study specs (explorl study NAME) instead of the recipes")
    r.add_argument("--force", action="store_true", help="cp: overwrite DEST")
    r.set_defaults(fn=run)
