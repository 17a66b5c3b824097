"""summarize / plot_passk / write_eval_json on hand-worked correctness tables."""

import json

import pytest

from explorl.eval import pass_at_k, plot_passk, summarize, write_eval_json

T, F = True, False
CORRECT = [
    [T, F, F, F],  # math, c=1
    [T, T, F, F],  # math, c=2
    [F, F, F, F],  # code, c=0
]
SOURCES = ["math", "math", "code"]


def test_summary_numbers_by_hand():
    s = summarize(CORRECT, SOURCES, [2, 4])
    assert s["k_list"] == [1, 2, 4]
    o = s["overall"]
    assert o["pass@1"] == pytest.approx((1 / 4 + 2 / 4 + 0) / 3)
    # pass@2: 1 − C(3,2)/C(4,2) = 1/2 ; 1 − C(2,2)/C(4,2) = 5/6 ; 0
    assert o["pass@2"] == pytest.approx((1 / 2 + 5 / 6 + 0) / 3)
    assert o["pass@4"] == pytest.approx(2 / 3)
    assert o["mean@n"] == pytest.approx(o["pass@1"])
    assert o["n_problems"] == 3 and o["n_samples"] == 12
    assert list(s["by_source"]) == ["code", "math"]
    m = s["by_source"]["math"]
    assert m["pass@2"] == pytest.approx((1 / 2 + 5 / 6) / 2)
    assert m["pass@4"] == 1.0 and m["n_problems"] == 2
    assert s["by_source"]["code"]["pass@4"] == 0.0


def test_uneven_sample_counts():
    s = summarize([[T, F], [F, F, F, T, F, F, F, F]], ["a", "a"], [2])
    assert s["overall"]["pass@2"] == pytest.approx((1.0 + pass_at_k(8, 1, 2)) / 2)
    assert s["overall"]["mean@n"] == pytest.approx((1 / 2 + 1 / 8) / 2)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"problem 1 \(b\) has 2 samples but pass@4"):
        summarize([[T, F, F, F], [T, F]], ["a", "b"], [4])
    with pytest.raises(ValueError, match="2 problems but 1 data sources"):
        summarize([[T], [F]], ["a"], [1])
    with pytest.raises(ValueError, match="no problems"):
        summarize([], [], [1])


def test_write_eval_json_and_plot(tmp_path):
    s = summarize(CORRECT, SOURCES, [2, 4])
    path = write_eval_json(s, tmp_path / "out" / "eval.json")
    assert json.loads(path.read_text()) == s
    png = plot_passk(s, tmp_path / "passk.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one = summarize([[T, F]], ["only"], [1])  # a single k and a single source still plot
    assert plot_passk(one, tmp_path / "one.png").stat().st_size > 0
