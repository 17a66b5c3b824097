"""The math verifier's final-answer rule: the last \\boxed{}, else an explicit final-answer line,
else a response that is nothing but an answer; never a number from the middle of the text."""

from __future__ import annotations

import pytest

from explorl.rewards.verifiers import final_answer, math_verifier


@pytest.mark.parametrize(
    "response, found",
    [
        (r"so \boxed{7}. Answer: 3", ("7", True)),  # a box wins over an answer line
        ("Let me think.\n6*7=42\n#### 42", ("42", False)),  # GSM8K
        ("Answer: 41\nmore text 42", ("41", False)),
        ("work\nThe final answer is $\\frac{1}{2}$.", ("$\\frac{1}{2}$", False)),
        ("**Final Answer:** 12", ("12", False)),
        ("the answer is: -3", ("-3", False)),
        ("Answer: first\nAnswer = 5", ("5", False)),  # the last answer line
        ("  42.  ", ("42", False)),  # a bare answer
        ("3/4", ("3/4", False)),
        ("1,000", ("1,000", False)),
        ("\\(x^2\\)", ("\\(x^2\\)", False)),
        ("asdkj qwe =42 zzz", None),  # garbage with =42 mid-string
        ('__import__("os").system("rm -rf /") = 42', None),
        ("so x = 42 and then", None),
        ("x = 42", None),
        ("the result is 42", None),
        ("Answer:", None),  # a marker with nothing after it
        ("$1$ and $2$", None),
        ("42\n43", None),
        ("", None),
    ],
)
def test_final_answer(response, found):
    assert final_answer(response) == found


@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("asdkj qwe =42 zzz", "42", 0.0),
        ("<python payload> = 42", "42", 0.0),
        ("I computed 6*7=42 somewhere in here, not sure", "42", 0.0),
        ("6*7=42\n#### 42", "42", 1.0),
        ("The final answer is 0.5", "1/2", 1.0),
        ("Answer: $\\frac{1}{2}$", "0.5", 1.0),
        ("42", "42", 1.0),
        ("Answer: 41\nsomething 42", "42", 0.0),
    ],
)
def test_math_verifier_scores_only_the_final_answer(response, truth, score):
    assert math_verifier(response, truth) == score


def test_long_garbage_is_linear():
    import time

    t0 = time.perf_counter()
    assert math_verifier("answer " * 20_000 + "so 42", "42") == 0.0  # no ':', 'is' or '='
    assert math_verifier("\\[" * 10_000 + " x =42 " + "\\]", "42") == 0.0  # too long to be bare
    assert math_verifier("#" * 50_000 + "\n" + "answer" + " " * 50_000, "42") == 0.0
    assert time.perf_counter() - t0 < 2.0
