"""Synthetic reasoning tasks with deterministic, disjoint train/val/test splits.

Prompts are plain text for the lab's character tokenizer (no chat template):

- ``addition``: ``"37+5="`` → ``"42"``. Each operand has between ``min_digits`` and
  ``max_digits`` digits (drawn independently); difficulty = number of carries.
- ``countdown``: ``"2 3 7>17:"`` = the numbers (sorted, one space apart), ``>``, the target,
  ``:``. The answer is an expression such as ``"2*7+3"`` that uses every number exactly once
  with ``+ - * /`` and parentheses and equals the target; several answers can be right. The
  ground truth is the JSON string ``{"numbers": [2, 3, 7], "target": 17}``. Problems are
  generated from a random expression tree with integer, non-negative intermediate results, so
  every problem has a solution; difficulty = number of operators other than ``+`` in it.
  ``n_numbers`` (3 or 4) numbers in 1..``max_number`` (12), targets in 1..``max_target`` (99).

Every record carries ``extra = {"difficulty": int, "solution": str}``; ``solution`` is the
reference answer the lab model is warm-started on (for addition it equals the ground truth).
``Task.check`` is a small local checker used to measure the lab model while it is built; the
reward path uses ``explorl.rewards``.
"""

from __future__ import annotations

import ast
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

from explorl.config import SPLIT_SIZES
from explorl.data.records import PromptRecord


class Problem(NamedTuple):
    key: tuple  # canonical identity: two problems with one key never go to different splits
    prompt: str
    ground_truth: str
    solution: str  # one correct response (the SFT target)
    difficulty: int


@dataclass(frozen=True)
class Task:
    name: str
    verifier: str
    """Name of the default verifier in ``explorl.rewards``."""
    defaults: dict[str, Any]
    """Task parameters and their defaults (the keyword arguments ``make_splits`` accepts)."""
    sample: Callable[..., Problem]
    """``sample(rng, **params) -> Problem``: one random problem."""
    check: Callable[[str, str], bool]
    """``check(response, ground_truth) -> bool``: the build-time accuracy check."""
    validate: Callable[..., None]
    """``validate(**params)``: raise ValueError on impossible parameters."""


# ----------------------------------------------------------------------------- addition


def _carries(a: int, b: int) -> int:
    n, carry = 0, 0
    while a or b:
        carry = (a % 10 + b % 10 + carry) >= 10
        n += carry
        a, b = a // 10, b // 10
    return n


def _sample_addition(rng: random.Random, *, min_digits: int, max_digits: int) -> Problem:
    def operand() -> int:
        d = rng.randint(min_digits, max_digits)
        return rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1)

    a, b = operand(), operand()
    answer = str(a + b)
    return Problem((min(a, b), max(a, b)), f"{a}+{b}=", answer, answer, _carries(a, b))


def _validate_addition(*, min_digits: int, max_digits: int) -> None:
    if not 1 <= min_digits <= max_digits <= 3:
        raise ValueError(
            f"addition needs 1 <= min_digits <= max_digits <= 3, got {min_digits}, {max_digits}"
        )


def _check_addition(response: str, ground_truth: str) -> bool:
    return response.strip() == ground_truth.strip()


# ----------------------------------------------------------------------------- countdown

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def _tree(rng: random.Random, nums: list[int]) -> tuple[int, str, int, int]:
    """A random expression over ``nums`` (in order): (value, text, precedence, non-+ ops)."""
    if len(nums) == 1:
        return nums[0], str(nums[0]), 3, 0
    k = rng.randint(1, len(nums) - 1)
    lv, ls, lp, ln = _tree(rng, nums[:k])
    rv, rs, rp, rn = _tree(rng, nums[k:])
    # Only integer, non-negative intermediates: a tiny model can imitate those, and any
    # verifier (float or exact) agrees on them.
    ops = ["+", "*"] + (["-"] if lv >= rv else []) + (["/"] if rv != 0 and lv % rv == 0 else [])
    op = rng.choice(ops)
    value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv // rv if rv else 0}[op]
    p = _PREC[op]
    if lp < p:
        ls = f"({ls})"
    if rp < p or (rp == p and op in "-/"):  # a-(b+c), a/(b*c) need them; a+(b-c) does not
        rs = f"({rs})"
    return value, f"{ls}{op}{rs}", p, ln + rn + (op != "+")


def _sample_countdown(
    rng: random.Random, *, n_numbers: int, max_number: int, max_target: int
) -> Problem:
    while True:
        nums = [rng.randint(1, max_number) for _ in range(n_numbers)]
        order = nums[:]
        rng.shuffle(order)
        target, expr, _, n_hard = _tree(rng, order)
        if 1 <= target <= max_target:
            break
    nums.sort()
    prompt = " ".join(map(str, nums)) + f">{target}:"
    truth = json.dumps({"numbers": nums, "target": target})
    return Problem((tuple(nums), target), prompt, truth, expr, n_hard)


def _validate_countdown(*, n_numbers: int, max_number: int, max_target: int) -> None:
    if n_numbers not in (3, 4):
        raise ValueError(f"countdown needs n_numbers in (3, 4), got {n_numbers}")
    if max_number < 1 or max_target < 1:
        raise ValueError(
            f"countdown needs max_number >= 1 and max_target >= 1, got {max_number}, {max_target}"
        )


def _eval_expr(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult, ast.Div):
        a, b = _eval_expr(node.left, used), _eval_expr(node.right, used)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        return a / b  # ZeroDivisionError is caught by the caller
    raise ValueError("not an arithmetic expression")


def _check_countdown(response: str, ground_truth: str) -> bool:
    truth = json.loads(ground_truth)
    text = response.strip()
    if not text or len(text) > 64 or not set(text) <= set("0123456789+-*/() "):
        return False
    try:
        used: list[int] = []
        value = _eval_expr(ast.parse(text, mode="eval").body, used)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return False
    return sorted(used) == sorted(truth["numbers"]) and value == truth["target"]


# ----------------------------------------------------------------------------- registry

TASKS: dict[str, Task] = {
    "addition": Task(
        name="addition",
        verifier="addition",
        defaults={"min_digits": 1, "max_digits": 2},
        sample=_sample_addition,
        check=_check_addition,
        validate=_validate_addition,
    ),
    "countdown": Task(
        name="countdown",
        verifier="countdown",
        defaults={"n_numbers": 3, "max_number": 12, "max_target": 99},
        sample=_sample_countdown,
        check=_check_countdown,
        validate=_validate_countdown,
    ),
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown lab task {name!r}; valid tasks: {sorted(TASKS)}")
    return TASKS[name]


def task_params(task: str, **params: Any) -> dict[str, Any]:
    """The task's full parameter dict (defaults filled in), validated."""
    t = get_task(task)
    unknown = set(params) - set(t.defaults)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {sorted(unknown)} for lab task {task!r}; valid: {sorted(t.defaults)}"
        )
    full = {**t.defaults, **params}
    t.validate(**full)
    return full


"""The lab's default train/val/test sizes: the one home of these defaults (``make_splits``, the
lab model's ``BuildConfig`` and the recipes' ``lab:`` section all read them). The split depends
on all three, so a model built on them has never seen the validation and test problems."""


def make_splits(
    task: str,
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
    full = task_params(task, **params)
    n = n_train + n_val + n_test
    if min(n_train, n_val, n_test) < 0:
        raise ValueError(f"split sizes must be >= 0, got {n_train}, {n_val}, {n_test}")
    rng = random.Random(f"explorl-lab/{task}/{seed}")
    seen: dict[tuple, Problem] = {}
    attempts = 0
    while len(seen) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(
                f"lab task {task!r} with {full} has too few distinct problems for {n} records; "
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
                data_source=f"lab/{task}",
                index=i,
                extra={"difficulty": p.difficulty, "solution": p.solution},
            )
            for i, p in enumerate(ps)
        ]
        for split, ps in (("train", cuts["train"]), ("val", cuts["val"]), ("test", cuts["test"]))
    }


def parse_lab_spec(spec: str) -> str | None:
    """``"lab:addition"`` -> ``"addition"``; None when ``spec`` is not a ``lab:`` spec.

    An unknown task name raises ValueError listing the lab's tasks.
    """
    if not isinstance(spec, str) or not spec.startswith("lab:"):
        return None
    name = spec[len("lab:") :].strip()
    get_task(name)
    return name
