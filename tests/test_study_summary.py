"""The study's summary table: overheads against the study's own GRPO row, and columns that no
row has a number for left out with their notes."""

from types import SimpleNamespace

import pytest

import explorl.study as S
from explorl.report.declared import Declared
from explorl.report.documents import _summary
from explorl.study.analyse import baseline_row


def _run(**kw) -> dict:
    r = {key: None for key, *_ in S.columns([1, 16])}
    return r | {"step_s": 0.1} | kw


def _spec(claims=None):
    ev = SimpleNamespace(n=16, temperature=0.7, split="test", max_problems=None, k=[1, 16])
    return SimpleNamespace(eval=ev, claims=claims)


def test_overheads_divide_by_the_named_baseline():
    """real-grpo at 2.0 CPU-s/step, an arm at 3.0 and 2.5: +0.5 and +0.25, mean +0.375."""
    per_run = {"real-grpo": [_run(step_s=1.0, cpu_step_s=2.0)],
               "kl_cov": [_run(step_s=1.5, cpu_step_s=3.0), _run(step_s=1.0, cpu_step_s=2.5)]}
    table = S.build_table(["real-grpo", "kl_cov"], per_run, [1, 16], "real-grpo")
    assert table["kl_cov"]["cpu_overhead"].mean == pytest.approx(0.375)
    assert table["kl_cov"]["overhead"].mean == pytest.approx(0.25)
    none = S.build_table(["real-grpo", "kl_cov"], per_run, [1, 16], None)
    assert none["kl_cov"]["overhead"].mean is None and none["kl_cov"]["cpu_overhead"].mean is None


def test_the_baseline_row_is_grpo_or_what_a_library_claim_reads_as_grpo():
    claims = [Declared("5a", check="5a", renames={"grpo": "real-grpo"})]
    assert baseline_row(_spec(), ["grpo", "kl_cov"]) == "grpo"
    assert baseline_row(_spec(claims), ["real-grpo", "kl_cov"]) == "real-grpo"
    assert baseline_row(_spec(claims), ["kl_cov"]) is None
    assert baseline_row(_spec(), ["real-grpo"]) is None


def test_empty_columns_and_their_notes_are_left_out():
    per_run = {"real-grpo": [_run(step_s=1.0, cpu_step_s=2.0, entropy_ratio=0.5)],
               "es": [_run(step_s=1.0, cpu_step_s=2.2, entropy_ratio=0.8, tracking_error=0.25)]}
    rows = ["real-grpo", "es"]
    table = S.build_table(rows, per_run, [1, 16], "real-grpo")
    text = "\n".join(_summary(_spec(), rows, table, per_run, S.columns([1, 16]), "real-grpo"))
    header = text.split("\n")[0]
    assert "EEPO" not in text and "test pass@16" not in header  # no row has either
    assert "tracking error" in header and "**tracking error**" in text  # one row has it
    assert "overhead vs real-grpo" in header and "CPU s / step ÷ real-grpo's − 1" in text
    assert "| es | 1 | 0.800 |" in text and "| 0.10 |" in text  # CPU overhead 2.2 / 2.0 − 1
    assert "sample standard deviation" in text  # the closing note stays
    grpo = "\n".join(_summary(_spec(), ["grpo"], S.build_table(
        ["grpo"], {"grpo": per_run["real-grpo"]}, [1, 16]), {"grpo": per_run["real-grpo"]},
        S.columns([1, 16]), "grpo"))
    assert "overhead vs GRPO" in grpo
