"""Prompt records from local ``.jsonl``/``.json``/``.parquet`` files (verl or plain/TRL schema),
or from rows in memory (a ``datasets.Dataset``, a list of dicts).

``prompt_key`` / ``answer_key`` (``data.prompt_key`` / ``data.answer_key``) name the columns
when they are not the schemas' own; an answer key may be a dotted path into an object
(``reward_model.ground_truth``). Every other column goes to the record's ``extra``, verl's
``extra_info`` included, and so reaches verl- and TRL-style reward functions.

Files are read with the standard ``json`` module and ``pyarrow.parquet`` rather than
``datasets.load_dataset``: errors can then name the exact line, nothing is written to the HF
cache, and the ~1.5 s ``datasets`` import is skipped. ``datasets`` reads parquet with the same
pyarrow, so the rows are identical.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from explorl.errors import DataError
from explorl.records import PromptRecord

EXTENSIONS = (".jsonl", ".json", ".parquet")




def _read_rows(path: str) -> list[tuple[str, Any]]:
    """``(location, row)`` pairs; location is ``"row N"`` (0-based), plus the line for JSONL."""
    suffix = Path(path).suffix.lower()
    if suffix not in EXTENSIONS:
        raise DataError(
            f"{path}: unsupported file type {suffix or '(none)'!r} "
            f"(expected {', '.join(EXTENSIONS)})"
        )
    if not Path(path).is_file():
        what = "a directory, not a file" if Path(path).is_dir() else "file not found"
        raise DataError(f"{path}: {what}")
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{path}: not a readable parquet file ({e})") from e
        return [(f"row {i}", r) for i, r in enumerate(rows)]

    try:
        # utf-8-sig: a byte-order mark (as Windows editors write) is read, not a JSON error.
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from e
    if suffix == ".json":
        if not text.strip():
            return []
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} line {e.lineno}: invalid JSON ({e.msg})") from e
        except (RecursionError, ValueError) as e:
            raise DataError(f"{path}: invalid JSON ({_json_problem(e)})") from None
        if not isinstance(data, list):
            raise DataError(
                f"{path}: expected a JSON list of row objects, got {type(data).__name__}"
            )
        return [(f"row {i}", r) for i, r in enumerate(data)]

    out = []
    # Split on "\n" only: str.splitlines() also splits on U+2028 etc., legal inside JSON strings.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():  # blank lines (e.g. a trailing newline) are not rows
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path} line {lineno}: invalid JSON ({e.msg} at column {e.colno})"
            ) from e
        except (RecursionError, ValueError) as e:
            raise DataError(f"{path} line {lineno}: invalid JSON ({_json_problem(e)})") from None
        out.append((f"row {len(out)} (line {lineno})", row))
    return out


def _json_problem(e: Exception) -> str:
    """What json.loads choked on beyond syntax: nesting (RecursionError) or a huge integer."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return " ".join(str(e).split())


def _ground_truth(value: Any) -> str | None:
    """Ground truth as text: numbers become their decimal string, dicts (e.g. TinyZero's
    countdown ``{"target", "numbers"}``) become JSON; other types are rejected (None)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        # Integer columns with missing values come back from pandas-written parquet as floats.
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, dict):
        return json.dumps(value)
    return None


def _first_present(row: dict, keys: tuple[str, ...]) -> str | None:
    """The first of ``keys`` with a non-null value (parquet stores absent fields as null)."""
    return next((k for k in keys if _get(row, k) is not None), None)


def _get(row: dict, dotted: str) -> Any:
    """``row["a"]["b"]`` for ``"a.b"``; None where a step is missing."""
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _row_to_record(
    row: Any,
    where: str,
    index: int,
    data_source_default: str | None,
    prompt_key: str | None = None,
    answer_key: str | None = None,
) -> PromptRecord:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object, got {type(row).__name__}")
    keys = ", ".join(row) or "none"

    def missing(field_desc: str) -> DataError:
        return DataError(f"{where}: field {field_desc} is missing (row has keys: {keys})")

    def wrong(field_name: str, expected: str, value: Any) -> DataError:
        return DataError(
            f"{where}: field {field_name!r} must be {expected}, got {type(value).__name__}"
        )

    prompt_key, prompt = _prompt_of(row, where, prompt_key, missing, wrong)
    gt_key, ground_truth = _ground_truth_of(row, where, answer_key, prompt, missing, wrong)

    data_source = row.get("data_source")
    if data_source is None:
        data_source = data_source_default or "unknown"
    elif not isinstance(data_source, str):
        raise wrong("data_source", "a string", data_source)

    # A column nested under a user's answer_key stays: the rest of that object may matter.
    top = gt_key if "." not in gt_key or gt_key == "reward_model.ground_truth" else None
    used = {prompt_key, "data_source", (top or "").split(".")[0]}
    extra = {k: v for k, v in row.items() if k not in used}
    return PromptRecord(prompt, ground_truth, data_source, index, extra, origin=where)


def _prompt_of(row: dict, where: str, prompt_key: str | None, missing: Callable,
               wrong: Callable) -> tuple[str, str | list[dict[str, str]]]:
    """The row's prompt field and its prompt: verl's chat messages or plain text (``prompt``,
    else TRL/MATH's ``problem``; ``prompt_key`` when given)."""
    if prompt_key is not None:
        if row.get(prompt_key) is None:
            raise missing(f"{prompt_key!r} (data.prompt_key)")
    else:
        prompt_key = _first_present(row, ("prompt", "problem"))
        if prompt_key is None:
            raise missing("'prompt'")
    prompt = row[prompt_key]
    if isinstance(prompt, list):
        if not prompt:
            raise DataError(f"{where}: field {prompt_key!r} is an empty list of messages")
        messages = []
        for j, m in enumerate(prompt):
            if not (
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
            ):
                raise DataError(
                    f"{where}: field '{prompt_key}[{j}]' must be a message "
                    f'{{"role": str, "content": str}}, got {json.dumps(m, default=str)[:80]}'
                )
            messages.append({"role": m["role"], "content": m["content"]})
        prompt = messages
        if not any(m["content"].strip() for m in messages):
            raise DataError(f"{where}: field {prompt_key!r} has no message with any text")
    elif not isinstance(prompt, str):
        raise wrong(prompt_key, "a string or a list of {role, content} messages", prompt)
    elif not prompt.strip():
        raise DataError(f"{where}: field {prompt_key!r} is empty")
    return prompt_key, prompt


def _ground_truth_of(row: dict, where: str, answer_key: str | None, prompt, missing: Callable,
                     wrong: Callable) -> tuple[str, str]:
    """The row's ground-truth field and the ground truth as text: verl's
    ``reward_model.ground_truth``, else ``answer``, else ``solution`` (kept whole: the math
    verifier extracts its \\boxed{} answer); ``answer_key`` when given."""
    if answer_key is not None:
        if _get(row, answer_key) is None:
            raise missing(f"{answer_key!r} (data.answer_key)")
        gt_key, gt_value = answer_key, _get(row, answer_key)
    elif row.get("reward_model") is not None:
        rm = row["reward_model"]
        if not isinstance(rm, dict):
            raise wrong("reward_model", "an object", rm)
        if rm.get("ground_truth") is None:
            raise missing("'reward_model.ground_truth'")
        gt_key, gt_value = "reward_model.ground_truth", rm["ground_truth"]
    else:
        gt_key = _first_present(row, ("answer", "solution"))
        if gt_key is None:
            # Name the field of the schema the prompt suggests.
            raise missing(
                "'reward_model.ground_truth'"
                if isinstance(prompt, list)
                else "'answer' (or 'solution')"
            )
        gt_value = row[gt_key]
    ground_truth = _ground_truth(gt_value)
    if ground_truth is None:
        raise wrong(gt_key, "a string, number or object", gt_value)
    if not ground_truth.strip() or gt_value == {}:
        raise DataError(f"{where}: field {gt_key!r} is empty (every response would score 0)")
    return gt_key, ground_truth


def load_prompts(
    path: str,
    *,
    data_source_default: str | None = None,
    prompt_key: str | None = None,
    answer_key: str | None = None,
) -> list[PromptRecord]:
    """All rows of a ``.jsonl``/``.json``/``.parquet`` file as records, ``index`` = row number.

    Schemas: verl (``prompt`` = chat messages, ``reward_model.ground_truth``, ``data_source``)
    and plain/TRL (``prompt`` or ``problem`` text, ``answer`` or ``solution``); ``prompt_key`` /
    ``answer_key`` name other columns. Rows without a ``data_source`` get
    ``data_source_default`` (else ``"unknown"``); unused columns go to ``extra``. Raises
    ``DataError`` at the first bad row.
    """
    path = str(path)
    rows = _read_rows(path)
    if not rows:
        raise DataError(f"{path}: file is empty (no rows)")
    return [
        _row_to_record(row, f"{path} {loc}", i, data_source_default, prompt_key, answer_key)
        for i, (loc, row) in enumerate(rows)
    ]


def records_from_rows(
    rows,
    *,
    name: str = "dataset",
    data_source_default: str | None = None,
    prompt_key: str | None = None,
    answer_key: str | None = None,
) -> list[PromptRecord]:
    """Records from rows in memory: a ``datasets.Dataset``, or any sequence of dicts, in the
    same schemas and with the same checks as ``load_prompts`` (errors name ``name`` and the
    row)."""
    records = [
        _row_to_record(row, f"{name} row {i}", i, data_source_default, prompt_key, answer_key)
        for i, row in enumerate(rows)
    ]
    if not records:
        raise DataError(f"{name}: no rows")
    return records


def load_many(
    paths: list[str],
    *,
    data_source_default: str | None = None,
    prompt_key: str | None = None,
    answer_key: str | None = None,
) -> list[PromptRecord]:
    """Records of several files concatenated in order, re-indexed 0..N-1."""
    records = [r for p in paths
               for r in load_prompts(p, data_source_default=data_source_default,
                                     prompt_key=prompt_key, answer_key=answer_key)]
    return [dataclasses.replace(r, index=i) for i, r in enumerate(records)]


def tokenize_prompts(
    records: list[PromptRecord], tokenize: Callable[[Any], list[int]], max_len: int, what: str
) -> list[list[int]]:
    """Token ids of every record's prompt; a ``DataError`` naming the first prompt longer than
    ``max_len`` tokens (``data.max_prompt_len``), its file and row (``what`` = the recipe key).

    The trainer calls it once the tokenizer is loaded and before the model is, with
    ``tokenize(prompt)`` = the rendered prompt's ids (chat template included).
    """
    out = []
    for r in records:
        where = r.origin or f"{r.data_source} problem {r.index}"
        try:
            ids = tokenize(r.prompt)
        except DataError as e:  # e.g. characters outside a lab model's alphabet
            raise DataError(f"{what}: {where}: {e}") from None
        if len(ids) > max_len:
            raise DataError(f"{what}: {where}: the prompt has {len(ids)} tokens, more than "
                            f"data.max_prompt_len={max_len}")
        out.append(ids)
    return out
