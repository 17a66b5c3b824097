"""References from a recipe to user code (``module:attr``, ``path/to/file.py:attr``), and the
config check that loads every reference of a recipe.

A reward function, a verifier or a lab task a recipe names is loaded here, with no
``PYTHONPATH`` needed: a file path is resolved against the working directory (``explorl.config``
has already anchored paths written in a recipe to the recipe's directory), and a module that
is not importable from ``sys.path`` is looked up in the working directory too. A name that does
not resolve raises ``RefError`` with the closest valid name.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import math
import os
import sys
from pathlib import Path
from typing import Any

from explorl.errors import ExplorlError


class RefError(ExplorlError, ValueError):
    """A reference that cannot be loaded; the message names the closest valid name."""


def is_ref(spec: str) -> bool:
    """True for ``module:attr`` and ``file.py:attr`` (text on both sides of a colon)."""
    target, sep, attr = spec.rpartition(":")
    return bool(sep and target and attr)


def is_file_ref(spec: str) -> bool:
    """True when the target of ``spec`` is a ``.py`` file rather than a module name."""
    target = spec.rpartition(":")[0]
    return target.endswith(".py") or "/" in target or os.sep in target


def anchor(spec: str, base: Path) -> str:
    """``spec`` with a relative ``file.py`` target, or a module that is a file next to the
    recipe, made absolute against ``base`` (the recipe's directory) when it exists there."""
    if not isinstance(spec, str) or not is_ref(spec):
        return spec
    target, _, attr = spec.rpartition(":")
    if is_file_ref(spec):
        if not Path(target).is_absolute() and (base / target).is_file():
            return f"{(base / target).resolve()}:{attr}"
        return spec
    top = target.split(".")[0]
    local = base / f"{top}.py"
    if "." not in target and local.is_file() and not Path(f"{top}.py").is_file():
        return f"{local.resolve()}:{attr}"
    return spec


def search_dirs() -> tuple[str, ...]:
    """Directories searched for a module that ``sys.path`` lacks: the working directory."""
    return (os.getcwd(),)


def load_ref(spec: str, *, dirs: tuple[str, ...] | None = None) -> Any:
    """The object ``spec`` names: ``module:attr`` or ``path/to/file.py:attr`` (attr may be dotted).

    ``dirs`` (default: the working directory) are searched when the module is not importable
    from ``sys.path``; a directory that serves one is added to ``sys.path``.
    """
    if not is_ref(spec):
        raise RefError(f"{spec!r} is not a reference: expected 'module:function' or "
                       "'path/to/file.py:function'")
    target, _, attr = spec.rpartition(":")
    module = _load_file(target) if is_file_ref(spec) else _import(target, dirs or search_dirs())
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1, cutoff=0.6)
            hint = f"; did you mean '{target}:{'.'.join([*attr.split('.')[:i], close[0]])}'?" \
                if close else ""
            raise RefError(f"{spec!r}: {target} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    return obj


def ref_of(obj: Any) -> str:
    """The reference that loads ``obj`` (a module-level function, class or object) again, for a
    config: ``module:qualname``, or ``/path/script.py:qualname`` for one defined in the script
    being run (whose workers then import the script: it needs an ``if __name__ ==
    "__main__":`` guard, as any script that starts worker processes)."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not name or "<" in name:
        raise RefError(f"{obj!r} has no importable name: define it at module level (not a "
                       "lambda or a nested function)")
    if module == "__main__":
        path = getattr(sys.modules["__main__"], "__file__", None)
        if path is None:
            raise RefError(f"{name} is defined interactively: put it in a .py file")
        return f"{Path(path).resolve()}:{name}"
    return f"{module}:{name}"


class StopScript(BaseException):
    """Raised by ``explorl.train`` while explorl imports a user's script for its functions: the
    import stops there, with every function defined above the call in place."""


_LOADING = [0]  # depth of script files being imported as references


def loading_script() -> bool:
    """Whether explorl is importing a user's script file right now (or runs in a verifier
    worker, which only ever imports scripts for their functions)."""
    from explorl.rewards import pool

    return _LOADING[0] > 0 or pool.IN_WORKER


def _load_file(target: str):
    path = Path(target).expanduser()
    if not path.is_file():
        raise RefError(f"no file {target!r} (relative to {os.getcwd()}){_close_file(path)}")
    path = path.resolve()
    # One module per file, named after its path, so two files called rewards.py do not clash.
    name = f"explorl_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    if str(path.parent) not in sys.path:  # so the file can import its neighbours
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    _LOADING[0] += 1
    try:
        spec.loader.exec_module(module)
    except StopScript:  # a script that calls explorl.train(...) at top level: defined enough
        pass
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        _LOADING[0] -= 1
    return module


def _close_file(path: Path) -> str:
    parent = path.parent if path.parent.is_dir() else None
    if parent is None:
        return ""
    close = difflib.get_close_matches(path.name, [p.name for p in parent.glob("*.py")], n=1)
    return f"; did you mean '{parent / close[0]}'?" if close else ""


def _import(target: str, dirs: tuple[str, ...]):
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        top = target.split(".")[0]
        if e.name not in (top, target):
            raise  # the module exists but one of its own imports is missing
        missing = e
    top = target.split(".")[0]
    for d in dirs:
        if (Path(d) / f"{top}.py").is_file() or (Path(d) / top / "__init__.py").is_file():
            if d not in sys.path:
                sys.path.insert(0, d)
            importlib.invalidate_caches()
            return importlib.import_module(target)
    local = [p.stem for d in dirs for p in Path(d).glob("*.py")]
    close = difflib.get_close_matches(top, local, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise RefError(f"no module named {missing.name!r} (searched sys.path and "
                   f"{', '.join(dirs)}){hint}") from None


# ----------------------------------------------------------------------------- config checks

DEFAULT_RESPONSE_LEN = 256
"""``rollout.max_response_len`` of a run whose model is not a lab model."""


def _needs_env(ref: str) -> bool:
    """Whether checking ``ref`` (a lab task or reward reference) imports the user's code or an
    optional package, which ``validate(env=False)`` (recipe templates) does not."""
    from explorl.lab.tasks import TASKS
    from explorl.rewards.verifiers import VERIFIERS

    name = ref.removeprefix("lab:")
    return not (name in VERIFIERS or name in TASKS or not (is_ref(name) or ":" in name))


def fill_defaults(cfg, env: bool = True) -> None:
    """Fill the fields whose default depends on other fields (in place):
    ``rollout.max_response_len`` from the lab task (or a built lab model's lab.json)."""
    from explorl.config import ConfigError
    from explorl.lab.tasks import get_task

    if cfg.rollout.max_response_len is not None:
        return
    path, length = cfg.model.path, None
    if path.startswith("lab:") and (env or not _needs_env(path)):
        try:
            length = get_task(path[len("lab:"):].strip()).max_response_len
        except (ValueError, ImportError) as e:
            raise ConfigError(f"model.path: {e}") from None
    meta = Path(path).expanduser() / "lab.json"
    if length is None and meta.is_file():  # a lab model directory
        import json

        length = json.loads(meta.read_text()).get("max_response_len")
    cfg.rollout.max_response_len = length or DEFAULT_RESPONSE_LEN


def check_references(cfg, env: bool = True) -> None:
    """Load every lab task, reasoning-gym task and reward function the config names, and check
    ``lab.params`` against the tasks: raise ``ConfigError`` naming the key and the closest
    valid name. Runs in config validation, before any model is loaded. Without ``env`` only
    the built-in names are checked (nothing is imported)."""
    from explorl.config import ConfigError
    from explorl.data.sources import params_for
    from explorl.lab.rg import refusal
    from explorl.lab.tasks import get_task, parse_lab_spec, task_params
    from explorl.rewards.functions import check_reward

    def fail(path: str, e: Exception | str) -> None:
        raise ConfigError(f"{path}: {e}") from None

    r = cfg.reward
    tasks = {}
    specs = [("model.path", cfg.model.path)] if cfg.model.path.startswith("lab:") else []
    for key in ("train", "val", "anneal"):
        specs += [(f"data.{key}[{i}]", s) for i, s in enumerate(getattr(cfg.data, key))]
    for path, spec in specs:
        if not spec.startswith(("lab:", "rg:")) or (_needs_env(spec) and not env):
            continue
        try:
            ref = parse_lab_spec(spec)
        except (ValueError, ImportError) as e:
            fail(path, e)
        tasks[ref] = get_task(ref)
        why = refusal(ref[len("rg:"):]) if ref.startswith("rg:") else None
        if why and path == "model.path":
            fail(path, f"{spec} cannot be a lab model: {why}, and the lab build scores its "
                       "samples in-process")
        if why and not r.allow_eval_scorers:
            fail(path, f"{spec} refused: {why}. Set reward.allow_eval_scorers: true to accept "
                       "that risk (UNSAFE; README 'reasoning-gym tasks')")
    if r.allow_eval_scorers and r.num_workers == 0:
        fail("reward.num_workers", "must be ≥ 1 with reward.allow_eval_scorers: scorers that "
                                   "run the answer as code run only in worker processes")

    # With no lab task in the run, lab.params has nothing to set (a shared base recipe may
    # carry it); with some (all loaded: without env a plugin task is not), every entry must
    # belong to one of them.
    declared = {name for t in tasks.values() for name in t.params}
    for name in cfg.lab.params if tasks and len(tasks) == len(_task_specs(specs)) else ():
        if name not in declared:
            close = difflib.get_close_matches(name, sorted(declared), n=1)
            hint = f"; did you mean 'lab.params.{close[0]}'?" if close else ""
            owners = ", ".join(t.name for t in tasks.values())
            fail(f"lab.params.{name}", f"not a parameter of the run's lab tasks ({owners}){hint}")
    for t in tasks.values():
        try:
            task_params(t, **params_for(t, cfg.lab.params))
        except ValueError as e:
            fail("lab.params", e)

    names = [("reward.verifier", r.verifier)] if r.verifier != "auto" else []
    names += [(f"reward.functions[{i}].name", f.name) for i, f in enumerate(r.functions)]
    for path, name in names:
        if not name:
            fail(path, "is required")
        if env or not _needs_env(name):
            try:
                check_reward(name)
            except (ValueError, ImportError) as e:
                fail(path, e)
    for i, f in enumerate(r.functions):
        if not math.isfinite(f.weight):
            fail(f"reward.functions[{i}].weight", "must be a finite number")
    if r.functions and r.convention == "signed":
        fail("reward.convention", "'signed' maps a {0, 1} verifier score; with reward.functions "
                                  "the reward is their weighted sum (set its range there)")
    for key in ("prompt_key", "answer_key"):
        if getattr(cfg.data, key) == "":
            fail(f"data.{key}", "must be a column name or null")


def _task_specs(specs: list[tuple[str, str]]) -> set[str]:
    """The distinct task specs among ``(key, spec)`` pairs (``lab:`` / ``rg:`` ones)."""
    return {s.removeprefix("lab:") for _, s in specs if s.startswith(("lab:", "rg:"))}
