"""Resolving a recipe's data specs (``lab:<task>`` or local files) into prompt records."""

from __future__ import annotations

import dataclasses

from explorl.config import LabConfig
from explorl.data.records import PromptRecord
from explorl.errors import DataError


def lab_task_params(task: str, lab: LabConfig) -> dict:
    """The lab config fields that parameterise ``task``'s problem generator."""
    if task == "addition":
        return {"min_digits": lab.min_digits, "max_digits": lab.max_digits}
    if task == "countdown":
        return {"n_numbers": lab.countdown_numbers}
    return {}


def load_split(specs: list[str], lab: LabConfig, split: str) -> list[PromptRecord]:
    """Records of ``split`` from each spec; lab specs take that split, files are used whole."""
    from explorl.data.files import load_many
    from explorl.lab import make_splits, parse_lab_spec

    records: list[PromptRecord] = []
    files: list[str] = []
    for spec in specs:
        task = parse_lab_spec(spec)
        if task is None:
            files.append(spec)
            continue
        try:
            splits = make_splits(task, seed=lab.split_seed, n_train=lab.n_train, n_val=lab.n_val,
                                 n_test=lab.n_test, **lab_task_params(task, lab))
        except ValueError as e:  # e.g. more problems asked for than the task has
            raise DataError(f"{spec}: {e} (lab.n_train/n_val/n_test)") from None
        records.extend(splits[split])
    if files:
        records.extend(load_many(files))
    # Controllers key per-prompt statistics by index: make it the position in this dataset.
    return [dataclasses.replace(r, index=i) for i, r in enumerate(records)]


def default_verifier(specs: list[str]) -> str:
    """``reward.verifier: auto`` → the lab task's verifier, else ``math``."""
    from explorl.lab import TASKS, parse_lab_spec

    names = {TASKS[t].verifier for s in specs if (t := parse_lab_spec(s)) is not None}
    if len(names) > 1:
        raise ValueError(f"data mixes lab tasks with different verifiers {sorted(names)}; set reward.verifier")
    if names and any(parse_lab_spec(s) is None for s in specs):
        raise ValueError("data mixes lab tasks and files; set reward.verifier explicitly")
    return names.pop() if names else "math"
