"""Resolving a recipe's data specs into prompt records: ``lab:<task>``, ``rg:<task>`` or files."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from explorl.data.files import load_many, records_from_rows
from explorl.errors import DataError
from explorl.lab.registry import get_task, make_splits, parse_lab_spec
from explorl.lab.rg import refusal
from explorl.records import PromptRecord

if TYPE_CHECKING:
    from explorl.config import RunConfig
    from explorl.lab.tasks import LabTask


def params_for(task: LabTask, params: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``lab.params`` that ``task`` declares (a run may mix lab tasks; the config
    check makes sure every entry belongs to one of them)."""
    return {k: v for k, v in params.items() if k in task.params}


def load_split(specs: list[str], cfg: RunConfig, split: str) -> list[PromptRecord]:
    """Records of ``split`` from each spec; task specs take that split, files are used whole.

    Task specs (``lab:<task>``, ``rg:<task>``) are cut with ``cfg.lab``'s seed and sizes and
    take the ``lab.params`` their task declares; files are read with ``data.prompt_key`` /
    ``data.answer_key``. A reasoning-gym task whose scorer executes the answer is refused
    unless ``reward.allow_eval_scorers`` is on (``explorl.lab.rg``).
    """
    lab = cfg.lab
    records: list[PromptRecord] = []
    files: list[str] = []
    for spec in specs:
        ref = parse_lab_spec(spec)
        if ref is None:
            files.append(spec)
            continue
        task = get_task(ref)
        try:
            splits = make_splits(task, seed=lab.split_seed, n_train=lab.n_train, n_val=lab.n_val,
                                 n_test=lab.n_test, **params_for(task, lab.params))
        except ValueError as e:  # e.g. more problems asked for than the task has
            raise DataError(f"{spec}: {e} (lab.n_train/n_val/n_test)") from None
        recs = splits[split]
        if ref.startswith("rg:"):
            recs = _mark_eval_records(ref[len("rg:"):], recs, cfg.reward.allow_eval_scorers)
        records.extend(recs)
    if files:
        records.extend(load_many(files, prompt_key=cfg.data.prompt_key,
                                 answer_key=cfg.data.answer_key))
    # Controllers key per-prompt statistics by index: make it the position in this dataset.
    return [dataclasses.replace(r, index=i) for i, r in enumerate(records)]  # keeps ``origin``


def in_memory(data, cfg: RunConfig) -> list[PromptRecord]:
    """Records of rows given in memory: a ``datasets.Dataset`` or dicts (read with
    ``data.prompt_key`` / ``data.answer_key``), or ``PromptRecord``s (used as they are)."""
    rows = list(data)
    if rows and all(isinstance(r, PromptRecord) for r in rows):
        return [dataclasses.replace(r, index=i) for i, r in enumerate(rows)]
    return records_from_rows(rows, prompt_key=cfg.data.prompt_key, answer_key=cfg.data.answer_key)


def _mark_eval_records(task: str, records: list[PromptRecord], allowed: bool) -> list:
    """Refuse an eval task's records, or mark them as allowed (its checker reads the mark)."""
    why = refusal(task)
    if why is None:
        return records
    if not allowed:
        raise DataError(f"rg:{task} refused: {why}. Set reward.allow_eval_scorers: true to "
                        "accept that risk (UNSAFE; README 'reasoning-gym tasks')")
    return [dataclasses.replace(r, extra={**r.extra, "rg": {**r.extra["rg"], "allow_eval": True}})
            for r in records]
