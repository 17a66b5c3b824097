"""What the trainer needs to know about a run's tools, read in a sandboxed worker: the trainer
never imports a tool's or an environment's module (its top level is user code, as its calls).

``describe`` imports the tools (``rollout.tools``) and the environment's class
(``rollout.environment``) in one worker of a ``VerifierPool`` (its own session, the workers'
memory cap, output to /dev/null, ``DESCRIBE_TIMEOUT_S``), checks them as the config check asks
(typed, documented, a class that takes no arguments, ...) and sends back plain data: each tool's
JSON schema, which the chat template shows the model and the lab format reads its one parameter
from, and whether the class defines ``get_reward``. A module that fails to import, raises, hangs
or kills its worker there is a ``ConfigError`` naming the key, before any model loads. Answers
are kept per process, keyed by the references and the files' modification times, so a config
checked twice starts one worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from explorl.refs import RefError, is_ref, search_dirs
from explorl.rewards.pool import VerifierPool
from explorl.tools.environments import load_environment, tools_of
from explorl.tools.functions import load_tool, schema

DESCRIBE_TIMEOUT_S = 60.0
"""How long importing and checking a run's tools in the sandbox may take."""


class ToolsUnusable(ValueError):
    """A tool or environment that does not load or check; ``key``: the config key to name."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


@dataclass(frozen=True)
class ToolsInfo:
    """A run's tools as plain data (no user code): the environment's methods, then
    ``rollout.tools``, each its schema, in that order."""

    methods: list[dict] = field(default_factory=list)
    """The environment's tool methods' schemas (``rollout.environment``)."""
    tools: list[dict] = field(default_factory=list)
    """``rollout.tools``' schemas, in the recipe's order."""
    get_reward: bool = False
    """Whether the environment's class defines ``get_reward``."""
    env_name: str = ""
    """The class's name."""

    @property
    def schemas(self) -> dict[str, dict]:
        """Every tool the model may call, by name."""
        return {s["function"]["name"]: s for s in self.methods + self.tools}


def _read(tools: tuple[str, ...], environment: str | None, dirs: tuple[str, ...]) -> dict:
    """The worker's side: import and check, answer plain data (errors as ``(key, message)``)."""
    out: dict = {"methods": [], "tools": [], "get_reward": False, "env_name": "", "errors": []}
    if environment:
        try:
            cls = load_environment(environment, dirs or None)
            out["methods"] = [schema(fn) for fn in tools_of(cls).values()]
            out["get_reward"] = callable(getattr(cls, "get_reward", None))
            out["env_name"] = cls.__name__
        except Exception as e:
            out["errors"].append(("rollout.environment", _why(e)))
    for i, ref in enumerate(tools):
        try:
            out["tools"].append(schema(load_tool(ref, dirs or None)))
        except Exception as e:
            out["errors"].append((f"rollout.tools[{i}]", _why(e)))
    return out


def _why(e: Exception) -> str:
    return str(e) if isinstance(e, (RefError, ImportError)) else f"{type(e).__name__}: {e}"


@dataclass(frozen=True)
class DescribeSpec:
    """The pool job that runs ``_read`` (picklable, hashable)."""

    tools: tuple[str, ...]
    environment: str | None
    dirs: tuple[str, ...]

    kind = "tool"

    @property
    def refs(self) -> tuple[str, ...]:  # what ``pool.describe`` shows
        return tuple(r for r in (self.environment, *self.tools) if r)

    def resolve(self, warm: bool = False):
        def run(_job=None, _gt=None, _ctx=None) -> dict:
            return _read(self.tools, self.environment, self.dirs)
        return run

    def check(self, value) -> dict:
        return value


_CACHE: dict[tuple, ToolsInfo] = {}


def _stamps(refs: tuple[str, ...], dirs: tuple[str, ...]) -> tuple:
    """The modification times of the files path references name (a module reference is
    keyed by its name only)."""
    out = []
    for ref in refs:
        target = ref.rpartition(":")[0]
        for d in ("", *dirs):
            path = os.path.join(d, target)
            if target.endswith(".py") and os.path.isfile(path):
                out.append(os.stat(path).st_mtime_ns)
                break
    return tuple(out)


def describe(tools: list[str] | tuple[str, ...], environment: str | None,
             dirs: tuple[str, ...] | None = None) -> ToolsInfo:
    """The run's tools read in the sandbox (see the module's docstring); ``ToolsUnusable`` for
    the first one that does not load or check."""
    tools, dirs = tuple(tools), tuple(search_dirs() if dirs is None else dirs)
    refs = tuple(r for r in (environment, *tools) if r)
    if not refs:
        return ToolsInfo()
    for i, ref in enumerate(tools):
        if not isinstance(ref, str) or not is_ref(ref):
            raise ToolsUnusable(f"rollout.tools[{i}]", f"{ref!r} is not a tool reference: "
                                "expected 'module:function' or 'path/to/file.py:function'")
    key = (tools, environment, dirs, _stamps(refs, dirs))
    if key not in _CACHE:
        spec = DescribeSpec(tools, environment, dirs)
        with VerifierPool(1, DESCRIBE_TIMEOUT_S, step_timeout_s=DESCRIBE_TIMEOUT_S + 30,
                          quiet=True) as pool:
            res = pool.score(spec, [""], [""])
        if res.failures:
            where = "rollout.environment" if environment else "rollout.tools"
            raise ToolsUnusable(where, f"importing {' and '.join(refs)} in a sandboxed worker "
                                       f"failed: {res.failures[0]}")
        got = res.scores[0]
        if got["errors"]:
            raise ToolsUnusable(*got["errors"][0])
        _CACHE[key] = ToolsInfo(got["methods"], got["tools"], got["get_reward"], got["env_name"])
    return _CACHE[key]
