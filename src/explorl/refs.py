"""References from a recipe to user code (``module:attr``, ``path/to/file.py:attr``).

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


IN_WORKER = False
"""True inside a verifier worker process (``rewards.pool`` sets it when the worker starts)."""


def loading_script() -> bool:
    """Whether explorl is importing a user's script file right now (or runs in a verifier
    worker, which only ever imports scripts for their functions)."""
    return _LOADING[0] > 0 or IN_WORKER


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
