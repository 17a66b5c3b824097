"""Environments: tools with state, one instance per response (TRL's ``environment_factory``).

A recipe names a class (``rollout.environment: my_env.py:MyEnv``). Each response gets its own
instance, ``MyEnv()``, then ``reset(**row)`` with the dataset row's fields (``prompt``,
``ground_truth`` with its aliases ``answer`` and ``solution``, ``data_source`` and the row's
other columns; only those ``reset`` takes unless it takes ``**kwargs``). A string ``reset``
returns is appended to the prompt (to the last message's content, as TRL does). The class's
public methods other than ``reset`` and ``get_reward`` (typed, with a docstring, as any tool)
are the tools the model calls; they read and change the instance.

**Where the state lives.** A reset and every call run in the reward's worker pool, as a tool
call does: the instance travels to the worker as ``pickle`` bytes with the call, and the
worker answers with the result and the instance's bytes after it. The trainer keeps each
response's bytes and never unpickles them. The worker checks the limits, so nothing past them
reaches the trainer: ``rollout.env_state_max_bytes`` on the pickled instance,
``rollout.env_observation_max_chars`` on ``reset``'s text. A call that fails (raises, hangs
past ``reward.timeout_s``, kills its worker, returns too much, leaves too large a state) is an
error message the model reads, and the response keeps the bytes it had: its state is as before
the call. A reset that fails stops the run (``EnvironmentFailed``). Bytes are
immutable, so an ARPO branch that copies a response after a tool result has its own copy of
the state from there. An instance lives for one rollout (one response); nothing of it is
checkpointed.

**Rewards.** A reward function in TRL's signature that takes ``environments`` (or
``**kwargs``) receives ``[the response's instance]`` after its last call, unpickled in the
reward worker; ``get_reward`` below reads TRL's ``get_reward()`` method.
"""

from __future__ import annotations

import inspect
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from explorl.errors import EnvironmentFailed
from explorl.refs import RefError, is_ref, load_ref, search_dirs
from explorl.rewards.functions import trl_columns
from explorl.tools.functions import call, check_tool
from explorl.tools.runner import ToolAnswer, ToolRunner, ToolSpec, check_text

SPECIAL = ("reset", "get_reward")  # methods that are not tools (TRL's rule)
GET_REWARD = "explorl.tools.environments:get_reward"  # the reward function that reads them


def methods_of(cls: type) -> list[str]:
    """The names of ``cls``'s tool methods: its public functions but ``reset`` and
    ``get_reward``, in name order (``inspect.getmembers`` on the class, as TRL)."""
    return [n for n, _ in inspect.getmembers(cls, inspect.isfunction)
            if n not in SPECIAL and not n.startswith("_")]


def tools_of(cls: type) -> dict[str, Callable]:
    """The tool methods bound to an instance made without ``__init__`` (no user code runs):
    what schemas and formats read (their signatures lack ``self``)."""
    blank = object.__new__(cls)
    return {n: getattr(blank, n) for n in methods_of(cls)}


def check_environment(cls: Any, name: str) -> None:
    """Raise ``RefError`` unless ``cls`` is a class that takes no constructor arguments, has a
    ``reset`` and at least one tool method, each typed and documented."""
    if not inspect.isclass(cls):
        raise RefError(f"{name!r} is a {type(cls).__name__}, not a class (an environment is a "
                       "class: one instance per response)")
    if not callable(getattr(cls, "reset", None)):
        raise RefError(f"{name!r} has no reset method: reset(**row) starts each response's "
                       "instance")
    try:
        inspect.signature(cls).bind()
    except TypeError as e:
        raise RefError(f"{name!r}: {cls.__name__}() must take no arguments ({e})") from None
    except ValueError:  # no signature to read (a builtin base): nothing to check
        pass
    tools = tools_of(cls)
    if not tools:
        raise RefError(f"{name!r} has no tool methods: its public methods other than reset and "
                       "get_reward are the tools the model calls")
    for n, fn in tools.items():
        check_tool(fn, f"{name}.{n}")


def load_environment(ref: str, dirs: tuple[str, ...] | None = None) -> type:
    """The class ``ref`` (``module:Class`` or ``path/file.py:Class``) names, checked."""
    if not is_ref(ref):
        raise RefError(f"{ref!r} is not an environment reference: expected 'module:Class' or "
                       "'path/to/file.py:Class'")
    cls = load_ref(ref, dirs=dirs)
    check_environment(cls, ref)
    return cls


def reset_arguments(reset: Callable, record) -> dict:
    """The keyword arguments ``reset`` gets for ``record`` (a ``PromptRecord``): the row's
    fields, or those ``reset`` names when it takes no ``**kwargs``."""
    fields = {"prompt": record.prompt,
              **trl_columns(record.ground_truth, record.data_source, record.extra)}
    params = inspect.signature(reset).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return fields
    return {k: v for k, v in fields.items() if k in {p.name for p in params}}


@dataclass(frozen=True)
class EnvState:
    """A response's environment after its last call, as reward functions receive it: ``load``
    unpickles it (after importing its class's module by ``ref``)."""

    ref: str
    blob: bytes
    dirs: tuple[str, ...] = ()

    def load(self) -> Any:
        load_ref(self.ref, dirs=self.dirs or None)  # the class's module, for pickle to find
        return pickle.loads(self.blob)


@dataclass(frozen=True)
class EnvSpec:
    """``rollout.environment`` (and any ``rollout.tools`` beside it) as a worker-pool job.

    A job is ``("reset", row)`` or ``("call", name, arguments)`` with the instance's bytes as
    its context; the worker answers ``(kind, text, bytes after)``."""

    ref: str
    tools: tuple[str, ...] = ()
    """Stateless tools beside the environment's methods (``rollout.tools``)."""
    max_chars: int = 2000
    dirs: tuple[str, ...] = ()
    max_observation_chars: int = 2000
    """``rollout.env_observation_max_chars``: the longest text ``reset`` may return."""
    max_state_bytes: int = 1 << 20
    """``rollout.env_state_max_bytes``: the most bytes an instance may pickle to."""

    kind = "tool"  # how the pool's log lines name it

    @property
    def refs(self) -> tuple[str, ...]:  # what ``pool.describe`` shows
        return (self.ref, *self.tools)

    def load(self) -> dict[str, Callable]:
        """The tools by name: the environment's methods (bound to a blank instance), then the
        stateless tools."""
        return {**tools_of(load_environment(self.ref, self.dirs or None)),
                **ToolSpec(self.tools, self.max_chars, self.dirs).load()}

    def resolve(self, warm: bool = False) -> Callable:
        cls = load_environment(self.ref, self.dirs or None)
        names = methods_of(cls)
        plain = ToolSpec(self.tools, self.max_chars, self.dirs).load()

        def run(job: tuple, _gt=None, blob: bytes | None = None) -> tuple:
            # Checked here, in the worker: an observation or a state past its limit never
            # crosses the pipe.
            if job[0] == "reset":
                env = cls()
                obs = env.reset(**reset_arguments(env.reset, job[1]))
                if obs is not None and not isinstance(obs, str):
                    raise TypeError(f"reset returned a {type(obs).__name__}, not text or None")
                if obs is not None and len(obs) > self.max_observation_chars:
                    raise LimitExceeded(
                        f"{self.ref}: reset returned {len(obs)} characters > "
                        f"rollout.env_observation_max_chars={self.max_observation_chars}")
                return "reset", obs, self._pickled(env)
            env = pickle.loads(blob)
            tools = {**plain, **{n: getattr(env, n) for n in names}}
            text = check_text(call(tools, job[1], job[2]), self.max_chars)
            return "call", text, self._pickled(env)
        return run

    def _pickled(self, env) -> bytes:
        blob = pickle.dumps(env)
        if len(blob) > self.max_state_bytes:
            raise LimitExceeded(f"{self.ref}: the instance pickles to {len(blob)} bytes > "
                                f"rollout.env_state_max_bytes={self.max_state_bytes}")
        return blob

    def check(self, value) -> tuple:
        """``value`` when it is a job's answer: ``(kind, text or None, bytes)``."""
        if not (isinstance(value, tuple) and len(value) == 3 and isinstance(value[2], bytes)):
            raise TypeError(f"not an environment's answer: {type(value).__name__}")
        if value[0] == "call":
            check_text(value[1], self.max_chars)
        return value


class LimitExceeded(ValueError):
    """An environment's observation or state past its limit (``rollout.env_*``)."""


class EnvRunner(ToolRunner):
    """Resets environments and runs calls on them through the worker pool (``EnvSpec``)."""

    @classmethod
    def from_config(cls, cfg) -> EnvRunner:
        r = cfg.reward
        return cls(spec_of(cfg.rollout), num_workers=r.num_workers, timeout_s=r.timeout_s,
                   step_timeout_s=r.step_timeout_s)

    def reset(self, records: list) -> list[tuple[str | None, bytes]]:
        """One new instance per record, reset with its fields: ``(observation, bytes)`` each.
        A reset that fails stops the run (the environment is broken, not the model)."""
        res = self._score([("reset", r) for r in records], [None] * len(records))
        if res.failures:
            i, why = next(iter(sorted(res.failures.items())))
            raise EnvironmentFailed(f"rollout.environment: {self.spec.ref} failed to reset for "
                                    f"{len(res.failures)} of {len(records)} responses, e.g. "
                                    f"{why}")
        return [s[1:] for s in res.scores]

    def run(self, calls: list[tuple[str, dict]], states: list[bytes] | None = None
            ) -> list[ToolAnswer]:
        """Answer each call on its response's instance (``states``); a good answer carries the
        instance's new bytes (``ToolAnswer.state``), a failed one none."""
        if not calls:
            return []
        res = self._score([("call", n, a) for n, a in calls], list(states))
        answers = []
        for i, value in enumerate(res.scores):
            why = res.failures.get(i)
            if why is None and not (isinstance(value, tuple) and isinstance(value[1], str)
                                    and isinstance(value[2], bytes)):  # never expected
                why = f"not a tool result: {type(value).__name__}"
            answers.append(ToolAnswer("", why) if why is not None
                           else ToolAnswer(value[1], state=value[2]))
        self.report([n for n, _ in calls], answers)
        return answers

    def state_of(self, blob: bytes) -> EnvState:
        """What reward functions receive for a response's final bytes."""
        return EnvState(self.spec.ref, blob, self.spec.dirs)


def get_reward(completions: list, environments: list, **kwargs) -> list[float]:
    """TRL's environment reward: each response's ``environment.get_reward()`` (name it in
    ``reward.functions``: ``explorl.tools.environments:get_reward``)."""
    return [float(e.get_reward()) for e in environments]


def runner_of(cfg) -> ToolRunner:
    """The runner of a ``RunConfig``'s tool rollouts: an ``EnvRunner`` with
    ``rollout.environment``, else a ``ToolRunner``."""
    return (EnvRunner if cfg.rollout.environment else ToolRunner).from_config(cfg)


def spec_of(rollout) -> ToolSpec | EnvSpec:
    """The job spec of a config's ``rollout`` section (with tools or an environment)."""
    if rollout.environment:
        return EnvSpec(rollout.environment, tuple(rollout.tools),
                       rollout.tool_result_max_chars, search_dirs(),
                       rollout.env_observation_max_chars, rollout.env_state_max_bytes)
    return ToolSpec(tuple(rollout.tools), rollout.tool_result_max_chars, search_dirs())

