"""Resolving a lab task by name (built-in ``TASKS``, ``rg:<task>``, or a user's ``LabTask``
reference), its parameters and its deterministic splits; and the ``lab:`` / ``rg:`` verifier
references, registered with ``explorl.rewards`` so a task's own checker scores its records.
"""

from __future__ import annotations

import difflib
import random
from typing import Any

from explorl.config import SPLIT_SIZES
from explorl.lab.rg import rg_task
from explorl.lab.tasks import TASKS, LabTask, Problem
from explorl.records import PromptRecord
from explorl.refs import is_ref, load_ref
from explorl.rewards.functions import Scheme, register_scheme


def get_task(ref: str | LabTask, *, dirs: tuple[str, ...] | None = None) -> LabTask:
    """The lab task ``ref`` names: a ``TASKS`` key, ``rg:<task>``, or a reference to a
    ``LabTask`` object (``module:attr`` or ``path/file.py:attr``, see ``explorl.refs``)."""
    if isinstance(ref, LabTask):
        return ref
    if ref in TASKS:
        return TASKS[ref]
    if ref.startswith("rg:"):
        return rg_task(ref[len("rg:"):])
    if is_ref(ref):
        obj = load_ref(ref, dirs=dirs)
        if not isinstance(obj, LabTask):
            raise ValueError(f"lab task {ref!r} is a {type(obj).__name__}, not an "
                             "explorl.lab.LabTask")
        return obj
    close = difflib.get_close_matches(ref, list(TASKS), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown lab task {ref!r}{hint} (valid tasks: {sorted(TASKS)}, "
                     "rg:<task>, or 'module:task' / 'path/to/file.py:task' naming a LabTask)")


def task_params(task: str | LabTask, **params: Any) -> dict[str, Any]:
    """The task's full parameter dict (defaults filled in), validated."""
    t = get_task(task)
    unknown = sorted(set(params) - set(t.params))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(t.params), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown parameter(s) {unknown} for lab task {t.name!r}{hint} "
                         f"(valid: {sorted(t.params)})")
    full = {**t.params, **params}
    if t.validate is not None:
        t.validate(**full)
    return full


"""The lab's default train/val/test sizes: the one home of these defaults (``make_splits``, the
lab model's ``BuildConfig`` and the recipes' ``lab:`` section all read them). The split depends
on all three, so a model built on them has never seen the validation and test problems."""


def make_splits(
    task: str | LabTask,
    *,
    seed: int = 0,
    n_train: int = SPLIT_SIZES["n_train"],
    n_val: int = SPLIT_SIZES["n_val"],
    n_test: int = SPLIT_SIZES["n_test"],
    **params: Any,
) -> dict[str, list[PromptRecord]]:
    """Deterministic, disjoint ``{"train", "val", "test"}`` splits of a lab task.

    Draws ``n_train + n_val + n_test`` distinct problems (distinct up to reordering of the
    operands/numbers) from ``random.Random(seed)``, shuffles them and cuts them in order
    test, val, train, so each split has the same mix of difficulties. The splits therefore
    depend on the seed, the task parameters and all three sizes.
    """
    t = get_task(task)
    full = task_params(t, **params)
    n = n_train + n_val + n_test
    if min(n_train, n_val, n_test) < 0:
        raise ValueError(f"split sizes must be >= 0, got {n_train}, {n_val}, {n_test}")
    rng = random.Random(f"explorl-lab/{t.name}/{seed}")
    seen: dict[tuple, Problem] = {}
    attempts = 0
    while len(seen) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(
                f"lab task {t.name!r} with {full} has too few distinct problems for {n} records; "
                "ask for fewer or widen the task parameters"
            )
        p = t.sample(rng, **full)
        seen.setdefault(p.key, p)
    problems = list(seen.values())
    rng.shuffle(problems)
    cuts = {
        "test": problems[:n_test],
        "val": problems[n_test : n_test + n_val],
        "train": problems[n_test + n_val :],
    }
    return {
        split: [
            PromptRecord(
                prompt=p.prompt,
                ground_truth=p.ground_truth,
                data_source=t.source,
                index=i,
                extra={"difficulty": p.difficulty, "solution": p.solution, **(p.extra or {})},
            )
            for i, p in enumerate(ps)
        ]
        for split, ps in (("train", cuts["train"]), ("val", cuts["val"]), ("test", cuts["test"]))
    }


def parse_lab_spec(spec: str) -> str | None:
    """The task reference of a ``lab:<ref>`` or ``rg:<task>`` spec; None for anything else.

    ``"lab:addition"`` → ``"addition"``; ``"rg:chain_sum"`` and ``"lab:rg:chain_sum"`` →
    ``"rg:chain_sum"``; ``"lab:mypkg.tasks:t"`` → ``"mypkg.tasks:t"``. A task that does not
    load raises ValueError naming the closest valid one.
    """
    if not isinstance(spec, str):
        return None
    if spec.startswith("rg:"):
        ref = spec.strip()
    elif spec.startswith("lab:"):
        ref = spec[len("lab:"):].strip()
    else:
        return None
    get_task(ref)
    return ref


def _checker(ref: str, dirs: tuple[str, ...] | None = None):
    """The check function of the task a ``lab:<ref>`` or ``rg:<task>`` verifier names."""
    return get_task(ref.removeprefix("lab:"), dirs=dirs).check


def _data_source(spec: str) -> tuple[str, str] | None:
    """``(verifier ref, data_source)`` of a lab or reasoning-gym data spec; None for files."""
    ref = parse_lab_spec(spec)
    return None if ref is None else (f"lab:{ref}", get_task(ref).source)


register_scheme(Scheme(prefixes=("lab:", "rg:"), checker=_checker, data_source=_data_source))
