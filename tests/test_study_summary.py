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
    # without claims: a recipe folder's GRPO (real/grpo runs as real-grpo); a claim's reading
    # comes first
    assert baseline_row(_spec(), ["kl_cov", "real-grpo"]) == "real-grpo"
    other = [Declared("5a", check="5a", renames={"grpo": "my_grpo"})]
    assert baseline_row(_spec(other), ["real-grpo", "my_grpo"]) == "my_grpo"
    assert baseline_row(_spec(), ["kl_cov", "grpo_large"]) is None


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


def test_pass_at_k_and_power_tables_compare_with_the_study_s_grpo_row():
    """A study whose GRPO row is real-grpo: the − GRPO columns and the power table use it
    (kl_cov 0.75 against 0.70 at pass@4 on every problem and seed: +0.050)."""
    import numpy as np

    from explorl.report.evidence import Evidence
    from explorl.report.tables import passk_tables, power_table

    g = {1: np.full((2, 10), 0.5), 4: np.full((2, 10), 0.7)}
    m = {1: np.full((2, 10), 0.5), 4: np.full((2, 10), 0.75)}
    ev = Evidence({n: [{"seed": s} for s in (0, 1)] for n in ("real-grpo", "kl_cov")},
                  {"real-grpo": g, "kl_cov": m}, {"real-grpo": [0, 1], "kl_cov": [0, 1]},
                  None, [1, 4])
    spec = S.StudySpec(recipes=["grpo"], power=S.spec.PowerSpec(target_mde=0.03))
    assert power_table(spec, ev) == []  # without its name the study has no GRPO row
    assert "| kl_cov | — | — | — | — |" in "\n".join(passk_tables(ev))
    ev.baseline = "real-grpo"
    row = [x for x in passk_tables(ev) if x.startswith("| kl_cov |")][-1]  # the differences
    assert row.endswith("| **+0.050 [+0.050, +0.050]** ±0.000 |")
    power = power_table(spec, ev)
    # pass@4: 0.75 − 0.70; the coverage margin pass@4 − pass@1: (0.75 − 0.5) − (0.70 − 0.5)
    assert sum(x.startswith("| kl_cov − real-grpo | +0.050") for x in power) == 2
    assert any("pass@4 − pass@1 difference" in x for x in power)
    assert "The coverage margin pass@4 − pass@1" in "\n".join(power)


def test_the_chance_line_counts_the_decided_verdicts_against_what_chance_gives():
    """21 judged claims (n/a and not run are not judged): up to 0.05 × 21 = 1.05 decided by
    chance, at least one with probability 1 − 0.95^21 = 0.659."""
    from explorl.report.claims import chance_line

    verdicts = ["shown"] + ["opposite"] * 2 + ["not shown"] * 17 + ["partial", "n/a", "not run"]
    line = chance_line([{"verdict": v} for v in verdicts])
    assert "21 claims judged here: 1 shown, 2 opposite." in line
    assert "up to 1.1 such verdicts" in line and "probability up to 66%" in line
