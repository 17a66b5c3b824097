"""The tasks for pretrained chat models (``chat_*``): prompts, answers, difficulty, splits."""

from __future__ import annotations

import random
import re

import pytest

from explorl.lab import make_splits
from explorl.lab.registry import get_task, task_params
from explorl.lab.tasks import _column_carries
from explorl.rewards.verifiers import boxed_integer as VERIFIERS_BOXED_INTEGER


def test_chat_addition_problem_reads_as_a_question_with_the_answer_format():
    task = get_task("chat_addition")
    p = task.sample(random.Random(3), **task.params)
    a, b = (int(x) for x in re.match(r"What is (\d+) \+ (\d+)\? ", p.prompt).groups())
    assert p.ground_truth == str(a + b)
    assert p.solution == f"\\boxed{{{a + b}}}"
    assert p.prompt.endswith("? Put your final answer in \\boxed{}.")
    assert task.source == "chat/addition" and task.alphabet is None
    assert task.check is VERIFIERS_BOXED_INTEGER


def test_chat_addition_checker_wants_the_number_not_the_question_in_the_box():
    from explorl.rewards import VERIFIERS

    check = get_task("chat_addition").check
    assert check("37 + 5 = 42, so \\boxed{42}", "42") == 1.0
    assert check("\\boxed{37 + 5 = 42.}", "42") == 1.0  # an equation ending in the answer
    assert check("\\boxed{$42$}", "42") == 1.0
    assert check("\\boxed{41}", "42") == 0.0
    assert check("I think it is large.", "42") == 0.0
    assert check("The answer is 42", "42") == 0.0  # not boxed
    assert check("\\boxed{37 + 5}", "42") == 0.0  # the question copied: no sum computed
    assert check("\\boxed{42} then \\boxed{41}", "42") == 0.0  # the last box counts
    # why the task does not use ``math``: math-verify evaluates the copied question
    assert VERIFIERS["math"]("\\boxed{37 + 5}", "42") == 1.0


def test_column_carries_by_hand():
    assert _column_carries([37, 5]) == 1      # 7+5=12
    assert _column_carries([99, 1]) == 2      # 9+1=10, 9+1=10
    assert _column_carries([12, 34]) == 0
    assert _column_carries([5, 5, 5]) == 1    # 15
    assert _column_carries([55, 55, 55]) == 2  # 15, 5+5+5+1=16


def test_chat_addition_params_and_splits():
    assert task_params("chat_addition", n_terms=3)["n_terms"] == 3
    with pytest.raises(ValueError, match="n_terms"):
        task_params("chat_addition", n_terms=9)
    with pytest.raises(ValueError, match="did you mean 'max_digits'"):
        task_params("chat_addition", max_digit=3)
    s = make_splits("chat_addition", seed=0, n_train=64, n_val=8, n_test=32)
    keys = [{(r.prompt.split("?")[0]) for r in s[k]} for k in ("train", "val", "test")]
    assert len(s["test"]) == 32 and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
    assert all(r.data_source == "chat/addition" for r in s["train"])


def test_boxed_format_rewards_any_boxed_answer_and_nothing_else():
    from explorl.rewards import VERIFIERS

    fmt = VERIFIERS["boxed_format"]
    assert fmt("7 + 5 = 13, so \\boxed{13}", "12") == 1.0  # wrong but boxed: format only
    assert fmt("The answer is 12", "12") == 0.0  # right but not boxed
    assert fmt("\\boxed{12", "12") == 0.0  # an unclosed box is no answer
    assert fmt("\\boxed{} 7 + 5 = \\boxed{ }", "12") == 0.0  # nor is an empty one


def test_chat_multiply_prompt_is_the_worked_example_then_the_question():
    from explorl.lab.tasks import CHAT_MULTIPLY_EXAMPLE

    task = get_task("chat_multiply")
    p = task.sample(random.Random(3), **task.params)
    assert p.prompt[:-1] == CHAT_MULTIPLY_EXAMPLE
    assert [m["role"] for m in p.prompt] == ["system", "user", "assistant", "user"]
    question = p.prompt[-1]["content"]
    a, b = (int(x) for x in re.match(r"What is (\d+) \* (\d+)\? ", question).groups())
    assert 100 <= a <= 999 and 10 <= b <= 99 and p.ground_truth == str(a * b)
    # the example's call ends in the lone "]" the lab tool format stops at, as the trace does
    assert "[12*34] {408}" in CHAT_MULTIPLY_EXAMPLE[-1]["content"]
    assert p.solution == f"[{a}*{b}]{{{a * b}}} So {a} * {b} = \\boxed{{{a * b}}}"
    assert p.difficulty == int(a * b >= 10_000)
    assert task.source == "chat/multiply" and task.check is VERIFIERS_BOXED_INTEGER


def test_chat_multiply_checker_reads_the_models_box_not_the_tool_result():
    check = get_task("chat_multiply").check
    assert check("[347*29]{10063} So 347 * 29 = \\boxed{10063}", "10063") == 1.0
    assert check("[347*29]{10063}", "10063") == 0.0  # the tool's result alone is no answer
    assert check("[347*29]{10063} So 347 * 29 = \\boxed{10036}", "10063") == 0.0
    assert check("347 * 29 = \\boxed{10063}", "10063") == 1.0  # right without the tool counts


def test_chat_multiply_params_and_splits():
    assert task_params("chat_multiply", a_digits=4)["a_digits"] == 4
    with pytest.raises(ValueError, match="b_digits <= a_digits"):
        task_params("chat_multiply", a_digits=2, b_digits=3)
    with pytest.raises(ValueError, match="did you mean 'a_digits'"):
        task_params("chat_multiply", a_digit=3)
    s = make_splits("chat_multiply", seed=0, n_train=64, n_val=8, n_test=32)
    keys = [{r.prompt[-1]["content"] for r in s[k]} for k in ("train", "val", "test")]
    assert len(keys[2]) == 32 and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
    assert all(r.data_source == "chat/multiply" for r in s["train"])
