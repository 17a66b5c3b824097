"""Reward functions as users write them, told apart by their parameters, behind one call.

Three signatures are accepted (``signature_of``):

- **explorl**: ``f(response, ground_truth) -> float``;
- **verl** (``custom_reward_function``): ``compute_score(data_source, solution_str, ground_truth,
  extra_info=None) -> float | {"score": float, ...}``;
- **TRL** (``reward_funcs``): ``f(prompts, completions, **columns) -> list[float]``, called with a
  batch of one (so each response keeps its own time limit in the pool); ``None`` counts as 0.

``as_scorer`` wraps any of them into ``score(response, ground_truth, ctx) -> float`` where
``ctx = (prompt, data_source, extra)`` comes from the response's ``PromptRecord``, with a fourth
item in runs with ``rollout.environment``: the response's environment, which a TRL-style
function taking ``environments`` receives as TRL passes it (``[instance]``). A
``RewardSpec`` names several of them with weights and data-source filters; the verifier pool
sends it to its workers, which resolve it there (``resolve_scorer``), so user code runs only
in the workers.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

from explorl.refs import RefError, is_ref, load_ref
from explorl.rewards.verifiers import VERIFIERS, warm_up

Context = tuple
"""``(prompt, data_source, extra)`` of the record a response answers, and with
``rollout.environment`` its environment (an object whose ``load()`` gives the instance)."""
Scorer = Callable[[str, str, "Context | None"], float]

SIGNATURES = ("explorl", "verl", "trl")
_VERL_PARAMS = {"data_source", "solution_str", "ground_truth", "extra_info"}


@dataclass(frozen=True)
class Scheme:
    """Verifier references that another package resolves: ``explorl.lab`` registers ``lab:``
    and ``rg:`` (a task's own checker), so this package never imports the lab."""

    prefixes: tuple[str, ...]
    checker: Callable[[str, tuple[str, ...] | None], Callable]
    """``(ref, dirs) -> check function`` of a reference with one of ``prefixes``."""
    data_source: Callable[[str], tuple[str, str] | None]
    """``data spec -> (verifier ref, data_source)`` for ``reward.verifier: auto``; None when the
    spec is not this scheme's (a data file)."""


SCHEMES: list[Scheme] = []
"""The registered schemes; a verifier worker imports each one's module before it resolves."""


def register_scheme(scheme: Scheme) -> None:
    """Add ``scheme`` (once per module import; a re-import replaces the old entry)."""
    SCHEMES[:] = [s for s in SCHEMES if s.prefixes != scheme.prefixes] + [scheme]


def scheme_modules() -> tuple[str, ...]:
    """The modules that register the schemes (imported first in verifier workers)."""
    return tuple(sorted({s.checker.__module__ for s in SCHEMES}))


def _scheme_of(ref: str) -> Scheme | None:
    return next((s for s in SCHEMES if ref.startswith(s.prefixes)), None)


def signature_of(fn: Callable) -> str:
    """``explorl``, ``verl`` or ``trl``, from the parameter names; ValueError when none fits."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: the plain form
        return "explorl"
    names = set(params)
    if "completions" in names:
        return "trl"
    if {"data_source", "solution_str"} & names:
        return "verl"
    kinds = [p.kind for p in params.values()]
    positional = [p for p in params.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if (len(positional) >= 2 or inspect.Parameter.VAR_POSITIONAL in kinds) and len(required) <= 2:
        return "explorl"
    shown = ", ".join(params) or "none"
    raise ValueError(
        f"cannot tell how to call it (parameters: {shown}); a reward function is "
        "f(response, ground_truth), compute_score(data_source, solution_str, ground_truth, "
        "extra_info) (verl) or f(prompts, completions, **columns) (TRL)")


def _number(value: Any) -> float:
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"a reward dict needs a 'score' key, got keys {sorted(value)}")
        value = value["score"]
    if isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        raise ValueError(f"reward {value!r:.60} is a {type(value).__name__}, not a number")
    out = float(value)
    if not math.isfinite(out):  # a NaN reward would poison every advantage of its group
        raise ValueError(f"reward is not finite: {out}")
    return out


def _accepts(fn: Callable) -> tuple[set[str], bool]:
    """Keyword names ``fn`` takes and whether it takes ``**kwargs``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set(), True
    return ({p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)},
            any(p.kind == p.VAR_KEYWORD for p in params))


def extra_info(extra: dict) -> dict:
    """verl's ``extra_info``: the row's ``extra_info`` column when it has one, else its other
    columns."""
    inner = extra.get("extra_info")
    return inner if isinstance(inner, dict) else extra


def trl_columns(gt: str, source: str, extra: dict) -> dict:
    """A record's columns as TRL-style functions (and an environment's ``reset``) receive them:
    the ground truth under its usual names, the row's other columns, its data source."""
    return {"ground_truth": gt, "answer": gt, "solution": gt, **extra, "data_source": source}


def as_scorer(fn: Callable) -> Scorer:
    """``score(response, ground_truth, ctx) -> float`` calling ``fn`` in its own signature."""
    kind = signature_of(fn)
    if kind == "explorl":
        return lambda response, gt, ctx=None: _number(fn(response, gt))
    names, var_kw = _accepts(fn)

    def pick(kwargs: dict) -> dict:
        return kwargs if var_kw else {k: v for k, v in kwargs.items() if k in names}

    if kind == "verl":
        def verl(response: str, gt: str, ctx: Context | None = None) -> float:
            _, source, extra = (ctx or (None, "unknown", {}))[:3]
            return _number(fn(**pick({"data_source": source, "solution_str": response,
                                      "ground_truth": gt, "extra_info": extra_info(extra)})))
        return verl

    def trl(response: str, gt: str, ctx: Context | None = None) -> float:
        prompt, source, extra = (ctx or (response, "unknown", {}))[:3]
        # Conversational data gets conversational completions, as in TRL.
        completion = ([{"role": "assistant", "content": response}] if isinstance(prompt, list)
                      else response)
        kwargs = {k: [v] for k, v in trl_columns(gt, source, extra).items()}
        if ctx is not None and len(ctx) > 3 and ctx[3] is not None:
            kwargs["environments"] = [ctx[3].load()]
        out = fn(**pick({**kwargs, "prompts": [prompt], "completions": [completion]}))
        value = out[0] if isinstance(out, (list, tuple)) else out
        return 0.0 if value is None else _number(value)
    return trl


# ----------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class Term:
    """One reward function of a ``RewardSpec``."""

    ref: str
    """A ``VERIFIERS`` name, ``lab:<task>``, ``rg:<task>``, ``module:function`` or
    ``path/file.py:function``."""
    weight: float = 1.0
    sources: tuple[str, ...] = ()
    """``data_source`` patterns (``fnmatch``) it applies to; empty = every record."""


@dataclass(frozen=True)
class RewardSpec:
    """Several reward functions as one scorer, picklable and hashable (a verifier pool key).

    ``combine="sum"``: Σ weight · f over the terms whose sources match the record (a record no
    term matches scores 0). ``combine="first"``: the first matching term's score (per-source
    dispatch; a record no term matches raises, so the pool counts it as an error).
    """

    terms: tuple[Term, ...]
    combine: Literal["sum", "first"] = "sum"
    dirs: tuple[str, ...] = ()
    """Directories searched for ``module:function`` references (the working directory when
    the spec was made, so workers find the same modules whatever their own directory)."""
    bounded: bool = True
    """Scores must lie in the pool's ``SCORE_RANGE`` [0, 1] (a verifier); False: any finite
    value (a weighted sum of reward functions)."""


def load_reward(ref: str, dirs: tuple[str, ...] | None = None) -> Callable:
    """The callable ``ref`` names (any of the three signatures)."""
    if ref in VERIFIERS:
        return VERIFIERS[ref]
    if (scheme := _scheme_of(ref)) is not None:
        return scheme.checker(ref, dirs)
    if is_ref(ref):
        fn = load_ref(ref, dirs=dirs)
        if not callable(fn):
            raise RefError(f"{ref!r} is a {type(fn).__name__}, not a function")
        return fn
    close = difflib.get_close_matches(ref, list(VERIFIERS), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise RefError(f"unknown verifier {ref!r}{hint}; valid: {', '.join(VERIFIERS)}, "
                   "lab:<task>, rg:<task>, 'module:function' or 'path/to/file.py:function'")


def check_reward(ref: str, dirs: tuple[str, ...] | None = None) -> str:
    """Load ``ref`` and tell its signature; RefError / ValueError say what is wrong."""
    return signature_of(load_reward(ref, dirs))


def resolve_scorer(spec: str | RewardSpec, *, warm: bool = False) -> Scorer:
    """The scorer of a pool spec: a verifier name / reference (str), or a ``RewardSpec``."""
    if isinstance(spec, str):
        if warm:
            warm_up(spec)
        return as_scorer(load_reward(spec))
    terms = [(t, as_scorer(load_reward(t.ref, spec.dirs or None))) for t in spec.terms]
    if warm:
        for t, _ in terms:
            warm_up(t.ref)

    def score(response: str, gt: str, ctx: Context | None = None) -> float:
        source = ctx[1] if ctx else "unknown"
        total = 0.0
        for t, fn in terms:
            if t.sources and not any(fnmatchcase(source, p) for p in t.sources):
                continue
            if spec.combine == "first":
                return fn(response, gt, ctx)
            try:
                total += t.weight * fn(response, gt, ctx)
            except Exception as e:  # which of several functions failed, as the user named it
                if len(terms) > 1 and len(e.args) == 1 and isinstance(e.args[0], str):
                    e.args = (f"{t.ref}: {e.args[0]}",)
                raise
        if spec.combine == "first":
            raise ValueError(f"no verifier for data source {source!r}")
        return total
    return score
