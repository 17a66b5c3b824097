"""The config checks that load what a recipe references: lab and reasoning-gym tasks, reward
functions and verifiers, and the defaults that depend on them (``rollout.max_response_len``).

A name that does not resolve raises ``ConfigError`` naming the key and the closest valid name.
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path

from explorl.config import ConfigError
from explorl.data.sources import params_for
from explorl.lab.registry import get_task, parse_lab_spec, task_params
from explorl.lab.rg import refusal
from explorl.lab.tasks import TASKS
from explorl.refs import is_ref
from explorl.rewards.functions import check_reward
from explorl.rewards.verifiers import VERIFIERS
from explorl.tools.environments import GET_REWARD
from explorl.tools.sandbox import ToolsUnusable, describe

DEFAULT_RESPONSE_LEN = 256
"""``rollout.max_response_len`` of a run whose model is not a lab model."""


def _needs_env(ref: str) -> bool:
    """Whether checking ``ref`` (a lab task or reward reference) imports the user's code or an
    optional package, which ``validate(env=False)`` (recipe templates) does not."""
    name = ref.removeprefix("lab:")
    return not (name in VERIFIERS or name in TASKS or not (is_ref(name) or ":" in name))


def fill_defaults(cfg, env: bool = True) -> None:
    """Fill the fields whose default depends on other fields (in place):
    ``rollout.max_response_len`` from the lab task (or a built lab model's lab.json)."""
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
        length = json.loads(meta.read_text()).get("max_response_len")
    cfg.rollout.max_response_len = length or DEFAULT_RESPONSE_LEN


def check_references(cfg, env: bool = True) -> None:
    """Load every lab task, reasoning-gym task and reward function the config names, and check
    ``lab.params`` against the tasks: raise ``ConfigError`` naming the key and the closest
    valid name. Runs in config validation, before any model is loaded. Without ``env`` only
    the built-in names are checked (nothing is imported)."""
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
    check_tools(cfg, env, fail)
    for key in ("prompt_key", "answer_key"):
        if getattr(cfg.data, key) == "":
            fail(f"data.{key}", "must be a column name or null")


def _task_specs(specs: list[tuple[str, str]]) -> set[str]:
    """The distinct task specs among ``(key, spec)`` pairs (``lab:`` / ``rg:`` ones)."""
    return {s.removeprefix("lab:") for _, s in specs if s.startswith(("lab:", "rg:"))}


def check_environment(cfg, env: bool, fail, info) -> dict:
    """``rollout.environment``: a class with ``reset`` and typed, documented tool methods (with
    ``env``, read in the sandbox: ``info``); ``get_reward`` read by a reward function when the
    class has one, and that reward function only with an environment. Returns its tool
    methods' schemas by name (none without ``env``)."""
    ref, fns = cfg.rollout.environment, [f.name for f in cfg.reward.functions]
    if ref is None:
        if GET_REWARD in fns:
            fail(f"reward.functions[{fns.index(GET_REWARD)}].name",
                 "reads each response's environment, and rollout.environment is null")
        return {}
    if not isinstance(ref, str) or not is_ref(ref):
        fail("rollout.environment", f"{ref!r} is not an environment reference: expected "
                                    "'module:Class' or 'path/to/file.py:Class'")
    if not env:
        return {}
    if info.get_reward and GET_REWARD not in fns:
        fail("rollout.environment", f"{info.env_name} defines get_reward, and no reward function "
                                    f"reads it: add {{name: {GET_REWARD}}} to reward.functions "
                                    "(TRL adds it with weight 1), or remove the method")
    return {s["function"]["name"]: s for s in info.methods}


def _n_params(schema: dict) -> int:
    return len(schema["function"]["parameters"]["properties"])


def check_tools(cfg, env: bool, fail) -> None:
    """``rollout.tools``: each a typed, documented function that loads (with ``env``: imported
    and checked in a sandboxed worker, ``tools.sandbox``; the trainer never imports them), no
    name twice (an environment's methods included); the lab format's one tool with one
    parameter."""
    tools = cfg.rollout.tools
    for i, ref in enumerate(tools):
        if not isinstance(ref, str) or not is_ref(ref):
            fail(f"rollout.tools[{i}]", f"{ref!r} is not a tool reference: expected "
                                        "'module:function' or 'path/to/file.py:function'")
    environment = cfg.rollout.environment
    valid = isinstance(environment, str) and is_ref(environment)
    info = None
    if env and (tools or valid):
        try:
            info = describe(tools, environment if valid else None)
        except ToolsUnusable as e:
            fail(e.key, e.message)
    methods = check_environment(cfg, env, fail, info)
    names: dict[str, int] = {}
    path = cfg.model.path
    lab = cfg.rollout.tool_format == "lab" or cfg.rollout.tool_format == "auto" and (
        path.startswith("lab:") or (Path(path).expanduser() / "lab.json").is_file())
    for name, sch in methods.items():
        if lab and _n_params(sch) != 1:
            fail("rollout.environment", f"the lab tool format passes one argument ([arg]); "
                                        f"{name} takes {_n_params(sch)}")
    for i, sch in enumerate(info.tools if info is not None else []):
        key, name = f"rollout.tools[{i}]", sch["function"]["name"]
        if name in names:
            fail(key, f"a second tool named {name!r} (rollout.tools[{names[name]}])"
                       "; the model calls tools by name")
        if name in methods:
            fail(key, f"a tool named {name!r}, as a method of rollout.environment; the "
                       "model calls tools by name")
        names[name] = i
        if lab and _n_params(sch) != 1:
            fail(key, "the lab tool format passes one argument ([arg]); this tool takes "
                       f"{_n_params(sch)}")
    if len(tools) > 1 and lab:
        fail("rollout.tools", f"the lab tool format calls one tool, and {len(tools)} are named")
    if methods and len(tools) + len(methods) > 1 and lab:
        fail("rollout.environment", "the lab tool format calls one tool, and the run has "
                                    f"{len(tools) + len(methods)}: {', '.join(methods)}"
                                    + (" and rollout.tools" if tools else ""))
