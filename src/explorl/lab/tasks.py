"""Lab tasks: synthetic problems with deterministic, disjoint train/val/test splits.

A lab task is a ``LabTask`` object: its sampler, its one checker (the task's reward function,
also used to measure the lab model while it is built), its parameters with their defaults,
the alphabet of the lab model's character tokenizer, the response length and the build
settings of its lab model. A recipe names one as ``lab:<ref>``: a built-in name (``TASKS``), a
reasoning-gym task (``rg:<task>``, see ``explorl.lab.rg``), or a user's object
(``lab:mypkg.tasks:my_task``, ``lab:path/to/tasks.py:my_task``); ``lab.params`` sets its
parameters. A new task needs no edit under ``src/``.

Built-in tasks. Prompts are plain text for the lab's character tokenizer (no chat template):

- ``addition``: ``"37+5="`` → ``"42"``. Each operand has between ``min_digits`` and
  ``max_digits`` digits (drawn independently); difficulty = number of carries.
- ``countdown``: ``"2 3 7>17:"`` = the numbers (sorted, one space apart), ``>``, the target,
  ``:``. The answer is an expression such as ``"2*7+3"`` that uses every number exactly once
  with ``+ - * /`` and parentheses and equals the target; several answers can be right. The
  ground truth is the JSON string ``{"numbers": [2, 3, 7], "target": 17}``. Problems are
  generated from a random expression tree with integer, non-negative intermediate results, so
  every problem has a solution; difficulty = number of operators other than ``+`` in it.
  ``n_numbers`` (3 or 4) numbers in 1..``max_number`` (12), targets in 1..``max_target`` (99);
  the reference expressions use the operators in ``ops`` (default ``"+-*/"``; ``"+-"`` makes
  the easier variant the 1M lab model learns, see docs/lab-study/regime.md). Answers may use any
  operator whatever ``ops`` is.

- ``subset_sum``: ``"1 3 4 6 8 9>15:"`` (numbers sorted, ``>``, target, ``:``) → any sum of
  given numbers equal to the target, each used at most as often as given: ``"6+9"``,
  ``"1+6+8"``, ``"3+4+8"`` … all count (the checker parses digits and ``+`` only). Targets are
  the sum of ``min_terms``–``max_terms`` of the ``n_numbers`` numbers (1..``max_number``); the
  warm start imitates one answer (ascending) drawn at random among those of
  ``min_terms``–``max_terms`` terms, so the lab model starts with several modes per prompt.
  Difficulty 0–3 from the number of distinct answers (≥ 6, 3–5, 2, 1); ``extra["n_answers"]``
  holds it.

- ``multiply``: ``"347*29="`` → ``"10063"``, an ``a_digits`` × ``b_digits`` product: beyond
  what the lab model computes in its head, so it needs the calculator tool
  (``explorl.tools.calculator:calculator``, ``rollout.tools``; docs/tools.md). A response
  ``[347*29]{10063}10063`` calls it (``[...]``), reads the result (``{...}``, inserted by
  explorl) and answers; the checker reads the answer after the last result. The warm start
  imitates that trace on ``tool_frac`` of the problems and the bare answer on the rest.

A task for pretrained chat models (no lab model is built for it; the run names a real model):

- ``chat_addition``: ``"What is 37 + 65? Put your final answer in \\boxed{}."`` →
  ``"102"``, asked through the model's chat template; ``n_terms`` operands of
  ``min_digits``–``max_digits`` digits; checked by ``boxed_integer`` (the sum as a number in the
  last box); difficulty = carries of the column sum.
- ``chat_multiply``: ``"What is 347 * 29? …"``, an ``a_digits`` × ``b_digits`` product asked
  after a worked example of the calculator tool in the lab tool format (``rollout.tool_format:
  lab``: ``[347*29]`` calls it, ``{10063}`` is its result); checked by ``boxed_integer``;
  difficulty as ``multiply``. Its prompt is a list of chat messages (``CHAT_MULTIPLY_EXAMPLE``).

Every record carries ``extra = {"difficulty": int, "solution": str}`` plus the problem's own
``extra``; ``solution`` is the reference answer the lab model is warm-started on (for addition
it equals the ground truth).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from explorl.lab.tokenizer import CHARS
from explorl.rewards.verifiers import (
    addition_verifier,
    boxed_integer,
    countdown_verifier,
    in_process,
    subset_sum_verifier,
)


class Problem(NamedTuple):
    key: tuple  # canonical identity: two problems with one key never go to different splits
    prompt: str | list[dict[str, str]]  # text, or chat messages (the chat tasks)
    ground_truth: str
    solution: str  # one correct response (the SFT target)
    difficulty: int
    extra: dict | None = None  # more fields for the record's ``extra`` (what a checker needs)


@dataclass(frozen=True)
class LabTask:
    """A lab task: everything the lab needs to make its data and build its model."""

    name: str
    """Short name, used in the lab model's cache directory and the records' ``data_source``."""
    sample: Callable[..., Problem]
    """``sample(rng: random.Random, **params) -> Problem``: one random problem."""
    check: Callable
    """The task's checker and default reward function, in any signature ``explorl.rewards``
    accepts (``f(response, ground_truth) -> float`` is the plain one). During RL it runs in the
    verifier pool; while the lab model is built, in-process (a score ≥ 1 counts as correct)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Parameters and their defaults: the keyword arguments of ``sample``, set by
    ``lab.params``."""
    validate: Callable[..., None] | None = None
    """``validate(**params)``: raise ValueError on impossible parameters."""
    alphabet: str | None = CHARS
    """Every character of the prompts and solutions, in the order of the lab tokenizer's ids.
    None: the characters the generated problems use, sorted."""
    max_response_len: int = 8
    """Tokens a response may take (the answer and EOS, with room for a longer wrong one): the
    ``rollout.max_response_len`` of a run on its lab model when the recipe leaves it unset."""
    build: dict[str, Any] = field(default_factory=dict)
    """``BuildConfig`` settings of its lab model that differ from the defaults."""
    version: str | None = None
    """Part of the lab model's cache key: change it when the sampler changes."""
    data_source: str | None = None
    """The records' ``data_source``; None = ``lab/<name>``."""

    @property
    def source(self) -> str:
        return self.data_source or f"lab/{self.name}"


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


# ----------------------------------------------------------------------------- countdown

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def _tree(rng: random.Random, nums: list[int], allowed: str = "+-*/"
          ) -> tuple[int, str, int, int]:
    """A random expression over ``nums`` (in order) with operators from ``allowed`` (``+``
    always among them): (value, text, precedence, non-+ ops)."""
    if len(nums) == 1:
        return nums[0], str(nums[0]), 3, 0
    k = rng.randint(1, len(nums) - 1)
    lv, ls, lp, ln = _tree(rng, nums[:k], allowed)
    rv, rs, rp, rn = _tree(rng, nums[k:], allowed)
    # Only integer, non-negative intermediates: a tiny model can imitate those, and any
    # verifier (float or exact) agrees on them.
    ops = ["+", "*"] + (["-"] if lv >= rv else []) + (["/"] if rv != 0 and lv % rv == 0 else [])
    op = rng.choice([o for o in ops if o in allowed])
    value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv // rv if rv else 0}[op]
    p = _PREC[op]
    if lp < p:
        ls = f"({ls})"
    if rp < p or (rp == p and op in "-/"):  # a-(b+c), a/(b*c) need them; a+(b-c) does not
        rs = f"({rs})"
    return value, f"{ls}{op}{rs}", p, ln + rn + (op != "+")


def _sample_countdown(
    rng: random.Random, *, n_numbers: int, max_number: int, max_target: int, ops: str = "+-*/"
) -> Problem:
    while True:
        nums = [rng.randint(1, max_number) for _ in range(n_numbers)]
        order = nums[:]
        rng.shuffle(order)
        target, expr, _, n_hard = _tree(rng, order, ops)
        if 1 <= target <= max_target:
            break
    nums.sort()
    prompt = " ".join(map(str, nums)) + f">{target}:"
    truth = json.dumps({"numbers": nums, "target": target})
    return Problem((tuple(nums), target), prompt, truth, expr, n_hard)


def _validate_countdown(*, n_numbers: int, max_number: int, max_target: int, ops: str = "+-*/"
                        ) -> None:
    if not isinstance(ops, str) or "+" not in ops or set(ops) - set("+-*/"):
        raise ValueError(f"countdown needs ops: a string of + - * / that contains +, got {ops!r}")
    if n_numbers not in (3, 4):
        raise ValueError(f"countdown needs n_numbers in (3, 4), got {n_numbers}")
    if max_number < 1 or max_target < 1:
        raise ValueError(
            f"countdown needs max_number >= 1 and max_target >= 1, got {max_number}, {max_target}"
        )


# ----------------------------------------------------------------------------- subset_sum


def subset_sums(nums: list[int], target: int) -> list[tuple[int, ...]]:
    """Every distinct multiset of ``nums`` (as a sorted tuple) whose sum is ``target``."""
    found = set()
    for mask in range(1, 1 << len(nums)):
        pick = tuple(sorted(x for i, x in enumerate(nums) if mask >> i & 1))
        if sum(pick) == target:
            found.add(pick)
    return sorted(found)


def _sample_subset_sum(
    rng: random.Random, *, n_numbers: int, max_number: int, min_terms: int, max_terms: int
) -> Problem:
    nums = sorted(rng.randint(1, max_number) for _ in range(n_numbers))
    target = sum(rng.sample(nums, rng.randint(min_terms, max_terms)))
    answers = subset_sums(nums, target)
    # The warm start imitates one answer (in ascending order) drawn among those of
    # min_terms–max_terms terms: the lab model learns several answers per prompt, not one.
    pick = rng.choice([a for a in answers if min_terms <= len(a) <= max_terms])
    prompt = " ".join(map(str, nums)) + f">{target}:"
    truth = json.dumps({"numbers": nums, "target": target})
    n = len(answers)
    difficulty = 0 if n >= 6 else 1 if n >= 3 else 2 if n == 2 else 3
    return Problem((tuple(nums), target), prompt, truth, "+".join(map(str, pick)), difficulty,
                   {"n_answers": len(answers)})


def _validate_subset_sum(*, n_numbers: int, max_number: int, min_terms: int, max_terms: int
                         ) -> None:
    if not 3 <= n_numbers <= 8:
        raise ValueError(f"subset_sum needs 3 <= n_numbers <= 8, got {n_numbers}")
    if not 1 <= min_terms <= max_terms <= n_numbers:
        raise ValueError(f"subset_sum needs 1 <= min_terms <= max_terms <= n_numbers, got "
                         f"{min_terms}, {max_terms}, {n_numbers}")
    if not 2 <= max_number <= 99:
        raise ValueError(f"subset_sum needs 2 <= max_number <= 99, got {max_number}")


# ----------------------------------------------------------------------------- multiply

TOOL_ALPHABET = CHARS + "[]{}?"
"""The tool task's characters: the built-in ones and the lab tool format's markers
(``explorl.tools.formats.LabFormat``: ``[call]``, ``{result}``, ``{?}`` for an error)."""


def _sample_multiply(rng: random.Random, *, a_digits: int, b_digits: int, tool_frac: float
                     ) -> Problem:
    a = rng.randint(10 ** (a_digits - 1), 10**a_digits - 1)
    b = rng.randint(10 ** (b_digits - 1), 10**b_digits - 1)
    answer = str(a * b)
    # The warm start imitates a calculator call on a fraction of problems and a guess on the
    # rest: RL then has both behaviours to choose between.
    trace = f"[{a}*{b}]{{{answer}}}{answer}" if rng.random() < tool_frac else answer
    # difficulty: 1 when the product has the most digits it can have (a_digits + b_digits)
    return Problem((a, b), f"{a}*{b}=", answer, trace, int(len(answer) == a_digits + b_digits))


def _validate_multiply(*, a_digits: int, b_digits: int, tool_frac: float) -> None:
    if not (1 <= b_digits <= a_digits <= 4):
        raise ValueError(f"multiply needs 1 <= b_digits <= a_digits <= 4, got {a_digits}, "
                         f"{b_digits}")
    if not 0.0 <= tool_frac <= 1.0:
        raise ValueError(f"multiply needs 0 <= tool_frac <= 1, got {tool_frac}")


@in_process
def multiply_verifier(response: str, ground_truth: str) -> float:
    """1.0 iff the final answer (the text after the last tool result ``{...}``, or the whole
    response without one) is the ground-truth integer."""
    answer = response[response.rindex("}") + 1:] if "}" in response else response
    answer = answer.strip()
    return 1.0 if answer.isdigit() and len(answer) < 12 and answer == ground_truth.strip() else 0.0


# ----------------------------------------------------------------------------- registry

TASKS: dict[str, LabTask] = {
    "addition": LabTask(
        name="addition",
        sample=_sample_addition,
        check=addition_verifier,
        params={"min_digits": 1, "max_digits": 2},
        validate=_validate_addition,
        max_response_len=8,  # answers are ≤ 4 characters + EOS
    ),
    "countdown": LabTask(
        name="countdown",
        sample=_sample_countdown,
        check=countdown_verifier,
        params={"n_numbers": 3, "max_number": 12, "max_target": 99, "ops": "+-*/"},
        validate=_validate_countdown,
        max_response_len=20,  # reference solutions are ≤ 15 characters + EOS
        # SFT stalls near 20% sampled val accuracy from about step 500 on, long before 0.35;
        # more steps only memorise the train split (62% sampled train accuracy at step 1200),
        # which leaves RL less to learn on it. So it stops at 600 steps.
        build={"max_steps": 600},
    ),
    "subset_sum": LabTask(
        name="subset_sum",
        sample=_sample_subset_sum,
        check=subset_sum_verifier,
        params={"n_numbers": 6, "max_number": 9, "min_terms": 3, "max_terms": 4},
        validate=_validate_subset_sum,
        max_response_len=16,  # warm-start answers are 5–7 characters + EOS
    ),
    "multiply": LabTask(
        name="multiply",
        sample=_sample_multiply,
        check=multiply_verifier,
        params={"a_digits": 3, "b_digits": 2, "tool_frac": 0.3},
        validate=_validate_multiply,
        alphabet=TOOL_ALPHABET,
        max_response_len=24,  # [347*29]{10063}10063 and EOS: 21 tokens
        # Sampled without the tool, the lab model guesses (a 1M model cannot multiply in its
        # head): the accuracy target is never met, so the build runs its step cap.
        build={"max_steps": 400, "target_accuracy": 1.0},
    ),
}
"""The built-in lab tasks."""


# ----------------------------------------------------------------------------- chat tasks
# Tasks for pretrained chat models: natural-language prompts through the chat template, answers
# as \boxed{} (the convention of math RL data); no lab model is built for them (the run names a
# real model in model.path).

ANSWER_FORMAT = "Put your final answer in \\boxed{}."
"""The format instruction every ``chat_*`` prompt ends with. SmolLM2-135M-Instruct boxes its
answer to 12% of "What is 7 + 5? …" prompts with it at T = 0.7 (9% right); a worked example in
the instruction (``\\boxed{12}``) raised that to 33% but the model then boxed the example's
number (3% right); a system prompt asking for it, to 3%."""


def _operand(rng: random.Random, min_digits: int, max_digits: int) -> int:
    d = rng.randint(min_digits, max_digits)
    return rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1)


def _column_carries(terms: list[int]) -> int:
    """Columns whose digit sum (with the incoming carry) reaches 10: the difficulty."""
    n, carry, terms = 0, 0, list(terms)
    while any(terms) or carry:
        s = sum(t % 10 for t in terms) + carry
        carry = s // 10
        n += carry > 0
        terms = [t // 10 for t in terms]
    return n


def _sample_chat_addition(rng: random.Random, *, min_digits: int, max_digits: int,
                          n_terms: int) -> Problem:
    terms = [_operand(rng, min_digits, max_digits) for _ in range(n_terms)]
    total = sum(terms)
    prompt = "What is " + " + ".join(map(str, terms)) + "? " + ANSWER_FORMAT
    return Problem(tuple(sorted(terms)), prompt, str(total), f"\\boxed{{{total}}}",
                   _column_carries(terms))


def _validate_chat_addition(*, min_digits: int, max_digits: int, n_terms: int) -> None:
    if not 1 <= min_digits <= max_digits <= 9:
        raise ValueError(f"chat_addition needs 1 <= min_digits <= max_digits <= 9, got "
                         f"{min_digits}, {max_digits}")
    if not 2 <= n_terms <= 6:
        raise ValueError(f"chat_addition needs 2 <= n_terms <= 6, got {n_terms}")


CHAT_TOOL_SYSTEM = (
    "You are a helpful assistant with a calculator. To compute a product, write the expression "
    "in square brackets, e.g. [12*34]; the calculator's result then appears in curly brackets, "
    "e.g. {408}, and you answer with it.")
CHAT_MULTIPLY_EXAMPLE = [
    {"role": "system", "content": CHAT_TOOL_SYSTEM},
    {"role": "user", "content": "What is 12 * 34? " + ANSWER_FORMAT},
    {"role": "assistant", "content": "[12*34] {408} So 12 * 34 = \\boxed{408}"},
]
"""The messages every ``chat_multiply`` prompt opens with: the calculator in the lab tool format
and one worked exchange. SmolLM2-135M-Instruct (T = 0.7, 128 replies to 3-digit × 2-digit
products) calls the tool in 36% of its replies after it and answers 15% right, against 4% calls
with the example inside the question's own message and none in the Hermes ``<tool_call>`` JSON
format (docs/tools.md). The space after ``]`` matters: ``]{`` is one token of its tokenizer, and
with ``[12*34]{408}`` in the example the model wrote that token, never the lone ``]`` that ends a
call, and made up the result."""


def _sample_chat_multiply(rng: random.Random, *, a_digits: int, b_digits: int) -> Problem:
    a = rng.randint(10 ** (a_digits - 1), 10**a_digits - 1)
    b = rng.randint(10 ** (b_digits - 1), 10**b_digits - 1)
    q = f"What is {a} * {b}? " + ANSWER_FORMAT
    prompt = [*CHAT_MULTIPLY_EXAMPLE, {"role": "user", "content": q}]
    return Problem((a, b), prompt, str(a * b), f"[{a}*{b}]{{{a * b}}} So {a} * {b} = "
                   f"\\boxed{{{a * b}}}", int(len(str(a * b)) == a_digits + b_digits))


def _validate_chat_multiply(*, a_digits: int, b_digits: int) -> None:
    if not (1 <= b_digits <= a_digits <= 6):
        raise ValueError(f"chat_multiply needs 1 <= b_digits <= a_digits <= 6, got {a_digits}, "
                         f"{b_digits}")


TASKS.update({
    "chat_addition": LabTask(
        name="chat_addition",
        sample=_sample_chat_addition,
        # not ``math``: math-verify evaluates the box, so \boxed{37 + 5} (the question) would
        # score as right; SmolLM2-135M-Instruct wrote such boxes within 15 steps of RL
        check=boxed_integer,
        params={"min_digits": 1, "max_digits": 2, "n_terms": 2},
        validate=_validate_chat_addition,
        alphabet=None,
        max_response_len=64,
        version="1",
        data_source="chat/addition",
    ),
    "chat_multiply": LabTask(
        name="chat_multiply",
        sample=_sample_chat_multiply,
        check=boxed_integer,  # the model's own box: a tool result is never boxed
        params={"a_digits": 3, "b_digits": 2},
        validate=_validate_chat_multiply,
        alphabet=None,
        max_response_len=64,
        version="1",
        data_source="chat/multiply",
    ),
})
