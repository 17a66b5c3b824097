"""Verifiers and the reward convention (explorl.rewards)."""

import json
import threading

import pytest

from explorl.rewards import VERIFIERS, resolve_verifier, to_reward
from explorl.rewards.verifiers import (
    addition_verifier,
    countdown_verifier,
    exact_verifier,
    last_boxed,
    math_verifier,
)


def test_registry_names_and_unknown_name():
    assert set(VERIFIERS) == {"math", "exact", "countdown", "subset_sum", "addition",
                              "boxed_integer", "boxed_format"}
    with pytest.raises(ValueError, match="valid: math, exact, countdown, subset_sum, addition"):
        resolve_verifier("maths")


def test_resolve_dotted_path():
    assert resolve_verifier("explorl.rewards.verifiers:exact_verifier") is exact_verifier
    with pytest.raises(ValueError, match="cannot load verifier"):
        resolve_verifier("explorl.rewards.verifiers:nope")
    with pytest.raises(ValueError, match="cannot load verifier"):
        resolve_verifier("no_such_module_xyz:f")


def test_to_reward():
    assert [to_reward(s, "binary") for s in (0.0, 1.0)] == [0.0, 1.0]
    assert [to_reward(s, "signed") for s in (0.0, 1.0)] == [-1.0, 1.0]
    with pytest.raises(ValueError, match="binary, signed"):
        to_reward(1.0, "pm1")


# ----------------------------------------------------------------------------- exact / addition


def test_exact():
    assert exact_verifier("  the   answer\n", "the answer") == 1.0
    assert exact_verifier("The answer", "the answer") == 0.0
    assert exact_verifier("", "x") == 0.0


@pytest.mark.parametrize(
    "response,expected",
    [
        ("46", 1.0),
        (" 46\n", 1.0),
        ("046", 1.0),
        ("46.", 0.0),
        ("46 apples", 0.0),
        ("4 6", 0.0),
        ("+46", 0.0),
        ("", 0.0),
        ("47", 0.0),
        ("４６", 0.0),  # full-width digits are not ASCII
        ("9" * 5000, 0.0),
    ],
)
def test_addition(response, expected):
    assert addition_verifier(response, "46") == expected


def test_addition_negative_and_bad_ground_truth():
    assert addition_verifier("-5", "-5") == 1.0
    with pytest.raises(ValueError):
        addition_verifier("5", "five")


# ----------------------------------------------------------------------------- countdown


def gt(numbers, target):
    return json.dumps({"numbers": numbers, "target": target})


@pytest.mark.parametrize(
    "expr", ["1+2+3+4", "4*3-2*1", "4*2+3-1", " (4 * 3) - (2 * 1)\n", "((1+2)+3)+4"]
)
def test_countdown_several_correct_answers(expr):
    assert countdown_verifier(expr, gt([1, 2, 3, 4], 10)) == 1.0


def test_countdown_exact_fractional_division():
    assert countdown_verifier("6/(1-3/4)", gt([1, 3, 4, 6], 24)) == 1.0
    assert countdown_verifier("7/2*2", gt([7, 2, 2], 7)) == 1.0  # exact, not float or floor
    assert countdown_verifier("7/2", gt([7, 2], 3)) == 0.0


@pytest.mark.parametrize(
    "expr,why",
    [
        ("4*3-1-1", "reuses 1, misses 2"),
        ("2*3+4", "misses 1"),
        ("1+2+3+4+0", "uses a number not given"),
        ("1+2+3+4", "wrong value for target 11"),
        ("5/(2-2)+1+3", "division by zero"),
        ("-1+2+3+4", "unary minus"),
        ("1+2+3+4=10", "trailing equation"),
        ("1 + 2 + 3 + 4.0", "decimal"),
        ("__import__('os').system('true')", "code"),
        ("(1+2+3+4", "unbalanced"),
        ("1+2)+3+4", "unbalanced"),
        ("1 2 3 4", "no operators"),
        ("", "empty"),
    ],
)
def test_countdown_wrong(expr, why):
    target = 11 if "target 11" in why else 10
    numbers = [2, 2, 5, 1, 3] if why == "division by zero" else [1, 2, 3, 4]
    assert countdown_verifier(expr, gt(numbers, target)) == 0.0, why


def test_countdown_rejects_power_and_huge_input_quickly():
    # `**` is not in the grammar, so 2**99999999 is never evaluated.
    assert countdown_verifier("2**99999999", gt([2, 99999999], 8)) == 0.0
    assert countdown_verifier("2**3", gt([2, 3], 8)) == 0.0
    assert countdown_verifier("2//1", gt([2, 1], 2)) == 0.0
    assert countdown_verifier("1+" * 500_000 + "1", gt([1, 1], 2)) == 0.0
    assert countdown_verifier("(" * 18 + "1" + ")" * 18, gt([1], 1)) == 0.0  # too deep
    assert countdown_verifier("(1)", gt([1], 1)) == 1.0


def test_countdown_bad_ground_truth_raises():
    for bad in ["24", "{}", '{"numbers": [1, "2"], "target": 3}', "not json"]:
        with pytest.raises(ValueError, match="countdown ground truth"):
            countdown_verifier("1+2", bad)


# ----------------------------------------------------------------------------- math


def test_last_boxed():
    assert last_boxed(r"so \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{3} or \boxed{4}") == "4"
    assert last_boxed(r"\boxed{3} then \boxed{\frac{1}{") == "3"  # last *complete* one
    assert last_boxed("no box") is None


@pytest.mark.parametrize(
    "response,truth",
    [
        (r"so \boxed{1/2}", "0.5"),
        (r"\boxed{1/2}", r"\frac{1}{2}"),
        (r"\boxed{0.5}", r"\frac{1}{2}"),
        (r"\boxed{\dfrac12}", "1/2"),
        (r"first \boxed{3}, on reflection \boxed{\frac{1}{2}}", "0.5"),
        ("The final answer is 0.5", "1/2"),
        (r"\boxed{0.5}", r"Halving gives $\boxed{\frac12}$."),  # a whole `solution` as ground truth
        (r"\boxed{(1, 2)}", "(1,2)"),
        (r"\boxed{x^2+1}", "1 + x^2"),
    ],
)
def test_math_correct(response, truth):
    assert math_verifier(response, truth) == 1.0


@pytest.mark.parametrize(
    "response",
    [
        r"\boxed{2/3}",
        r"first \boxed{\frac{1}{2}}, on reflection \boxed{3}",  # the last box counts
        "",
        "I don't know",
        r"\boxed{",
        r"\boxed{}",
        "}}}{{{\\boxed",
    ],
)
def test_math_wrong_or_malformed(response):
    assert math_verifier(response, "0.5") == 0.0


def test_math_works_off_the_main_thread():
    # math-verify's own timeout uses SIGALRM, which fails outside the main thread; we disable it.
    out = []
    t = threading.Thread(target=lambda: out.append(math_verifier(r"\boxed{1/2}", "0.5")))
    t.start()
    t.join()
    assert out == [1.0]


def test_last_boxed_many_unclosed_boxes_is_linear():
    text = r"\boxed{7} " + r"\boxed{{" * 20_000
    assert last_boxed(text) == "7"
    assert last_boxed(r"\boxed{a} \boxed{b \boxed{c}") == "c"


def test_public_api():
    import explorl.rewards

    assert set(explorl.rewards.__all__) == {
        "REWARD_CONVENTIONS", "VERIFIERS", "ScoreResult", "VerifierPool", "addition_verifier",
        "countdown_verifier", "exact_verifier", "math_verifier", "resolve_verifier", "to_reward",
    }  # fmt: skip
