"""Rule-based verifiers: ``(response_text, ground_truth) -> 1.0 | 0.0``.

Model output is untrusted: verifiers only parse it, never execute it. A malformed response
scores 0.0; a malformed *ground truth* is a data bug and raises ``ValueError`` (the pool counts
it as an error rather than silently rewarding nothing).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections import Counter
from collections.abc import Callable
from fractions import Fraction

from explorl.errors import RewardError
from explorl.refs import is_ref, load_ref

Verifier = Callable[[str, str], float]


def in_process(fn: Verifier) -> Verifier:
    """Mark ``fn`` as safe to run in the trainer's own process: a pure function of the two
    strings whose cost is bounded by length checks or linear scans before any parsing (no
    evaluation, no imports, no I/O, no unbounded recursion). The verifier pool scores such
    verifiers inline instead of in its workers (no pipe round trips: ~2 ms of a 40 ms lab step);
    an exception still scores 0 and counts as an error. Only for explorl's own verifiers: user
    functions, math-verify and reasoning-gym scorers always run in the workers."""
    fn.explorl_in_process = True
    return fn


# ----------------------------------------------------------------------------- exact


def exact_verifier(response: str, ground_truth: str) -> float:
    """1.0 iff the texts are equal after stripping and collapsing runs of whitespace."""
    return float(" ".join(response.split()) == " ".join(ground_truth.split()))


# ----------------------------------------------------------------------------- addition

_INT = re.compile(r"\s*(-?[0-9]{1,100})\s*")


@in_process
def addition_verifier(response: str, ground_truth: str) -> float:
    """1.0 iff the whole response (surrounding whitespace allowed) is the ground-truth integer.

    The lab's addition task: the response is only the sum, e.g. ``"46"`` (text after EOS is
    already cut by the rollout). ASCII digits with an optional leading ``-``; anything else
    (``"46."``, ``"46 apples"``, ``"+46"``) is wrong. Integer values are compared, so ``"046"``
    counts. More than 100 digits is wrong without conversion (Python caps int parsing).
    """
    m = _INT.fullmatch(response)
    return float(m is not None and int(m.group(1)) == int(ground_truth.strip()))


# ----------------------------------------------------------------------------- countdown

MAX_COUNTDOWN_CHARS = 200
MAX_COUNTDOWN_DEPTH = 16
_TOKEN = re.compile(r"\s*(?:([0-9]+)|(.))")


class _Reject(Exception):
    """The response is not a valid Countdown expression."""


class _ExprParser:
    """Recursive descent over ``expr := term (('+'|'-') term)*``, ``term := factor (('*'|'/')
    factor)*``, ``factor := INT | '(' expr ')'``, evaluated exactly with ``Fraction``.

    Unary signs and every other operator (``**``, ``//``, ``%``, names, calls) are rejected:
    the game's operations are the four binary ones, and a whitelist grammar cannot be talked
    into evaluating anything else.
    """

    def __init__(self, text: str):
        self.tokens: list[str] = []
        for m in _TOKEN.finditer(text):
            num, other = m.groups()
            if num is not None:
                self.tokens.append(num)
            elif other.isspace():  # trailing whitespace
                continue
            elif other in "+-*/()":
                self.tokens.append(other)
            else:
                raise _Reject(f"character {other!r}")
        self.pos = 0
        self.numbers: list[int] = []

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _next(self) -> str:
        tok = self._peek()
        if tok is None:
            raise _Reject("unexpected end")
        self.pos += 1
        return tok

    def parse(self) -> Fraction:
        value = self._expr(0)
        if self._peek() is not None:
            raise _Reject(f"unexpected {self._peek()!r}")
        return value

    def _expr(self, depth: int) -> Fraction:
        value = self._term(depth)
        while self._peek() in ("+", "-"):
            op, rhs = self._next(), self._term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def _term(self, depth: int) -> Fraction:
        value = self._factor(depth)
        while self._peek() in ("*", "/"):
            op, rhs = self._next(), self._factor(depth)
            if op == "/" and rhs == 0:
                raise _Reject("division by zero")
            value = value * rhs if op == "*" else value / rhs
        return value

    def _factor(self, depth: int) -> Fraction:
        tok = self._next()
        if tok.isdigit():
            self.numbers.append(int(tok))
            return Fraction(int(tok))
        if tok == "(":
            if depth >= MAX_COUNTDOWN_DEPTH:
                raise _Reject("nested too deeply")
            value = self._expr(depth + 1)
            if self._next() != ")":
                raise _Reject("missing ')'")
            return value
        raise _Reject(f"unexpected {tok!r}")


def parse_countdown_ground_truth(ground_truth: str) -> tuple[list[int], int]:
    """``(numbers, target)`` from the JSON ground truth ``{"numbers": [..], "target": int}``."""
    try:
        gt = json.loads(ground_truth)
        numbers, target = gt["numbers"], gt["target"]
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(
            f'countdown ground truth must be JSON {{"numbers": [..], "target": int}}, '
            f"got {ground_truth[:100]!r}"
        ) from e
    if not (
        isinstance(numbers, list) and all(type(x) is int for x in numbers) and type(target) is int
    ):
        raise ValueError(
            f"countdown ground truth needs integer numbers and target, got {ground_truth[:100]!r}"
        )
    return numbers, target


@in_process
def countdown_verifier(response: str, ground_truth: str) -> float:
    """1.0 iff the response is an expression using each given number exactly once that equals
    the target (the Countdown task of TinyZero).

    Only ``+ - * /`` and parentheses; division is exact (``Fraction``), division by zero is
    wrong. Expressions longer than ``MAX_COUNTDOWN_CHARS`` are wrong before parsing and nesting
    deeper than ``MAX_COUNTDOWN_DEPTH`` is rejected while parsing, so the cost is bounded.
    """
    numbers, target = parse_countdown_ground_truth(ground_truth)
    text = response.strip()
    if not text or len(text) > MAX_COUNTDOWN_CHARS:
        return 0.0
    try:
        parser = _ExprParser(text)
        value = parser.parse()
    except _Reject:
        return 0.0
    return float(Counter(parser.numbers) == Counter(numbers) and value == target)


MAX_SUBSET_CHARS = 64
"""Subset-sum responses longer than this are wrong before parsing."""
# ASCII digits only (``\d`` would also match "٦" or "６", which ``int`` reads as 6), written
# as the prompt writes them: no leading zeros.
_NUMBER = r"(?:0|[1-9][0-9]{0,2})"
_SUBSET_RE = re.compile(rf"{_NUMBER}(?:\+{_NUMBER})*")


@in_process
def subset_sum_verifier(response: str, ground_truth: str) -> float:
    """1.0 iff the response is a sum ``a+b+…`` of given numbers (each used at most as often as it
    is given) that equals the target; any such subset is right.

    The ground truth is the countdown JSON ``{"numbers": [..], "target": int}``. The response is
    matched by a regular expression of digits and ``+`` only (no evaluation), after a length
    check, so the cost is bounded.
    """
    numbers, target = parse_countdown_ground_truth(ground_truth)
    text = response.strip()
    if not text or len(text) > MAX_SUBSET_CHARS or not _SUBSET_RE.fullmatch(text):
        return 0.0
    terms = Counter(int(x) for x in text.split("+"))
    return float(not terms - Counter(numbers) and sum(terms.elements()) == target)


# ----------------------------------------------------------------------------- math


def last_boxed(text: str) -> str | None:
    """Contents of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    end = len(text)
    for m in reversed(list(re.finditer(r"\\(?:boxed|fbox)\s*\{", text))):
        depth, start = 1, m.end()
        for i in range(start, end):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i]
        # An earlier box that is still open where this unclosed one starts never closes, so
        # each earlier candidate only needs scanning up to here: linear time overall.
        end = m.start()
    return None


@functools.lru_cache(maxsize=1)
def _math_verify():
    """Import math-verify on first use: it pulls in sympy (~0.5 s), which only ``math`` needs."""
    import math_verify
    import math_verify.grader
    import math_verify.parser

    # We pass timeout=None (its SIGALRM timer breaks outside the main thread; the pool enforces
    # wall-clock limits instead). Mark its once-per-process warning about that as shown.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify


@functools.lru_cache(maxsize=4096)
def _parse_gold(ground_truth: str) -> list:
    """Parsed ground truth; cached because a group of responses shares one ground truth."""
    mv = _math_verify()
    gt = ground_truth.strip()
    # Bare answers ("1/2", "\frac{1}{2}", "(1,2)") parse as LaTeX only inside math delimiters.
    text = gt if ("\\boxed" in gt or "$" in gt) else f"${gt}$"
    return mv.parse(text, parsing_timeout=None) or mv.parse(gt, parsing_timeout=None) or [gt]


# An explicit final-answer line: "#### 42" (GSM8K), "Answer: 42", "The final answer is 42.",
# "**Final Answer:** $x=2$". The answer is the rest of that line.
_ANSWER_LINE = re.compile(
    r"(?:^\s*#{4}|\banswer\b[\s*]*(?:is\b[\s*]*:?|:|=))[\s*]*(.*)$", re.IGNORECASE
)
# A bare answer: the whole response is one number or one math-delimited expression.
_BARE = re.compile(
    r"\s*(?:[-+]?[0-9][0-9,]*(?:\.[0-9]+)?(?:\s*/\s*[0-9]+)?%?"
    r"|\$\$?[^$]+\$\$?|\\\([^\n]+?\\\)|\\\[.+?\\\])\s*\.?\s*",
    re.DOTALL,
)
MAX_BARE_CHARS = 1000


def final_answer(response: str) -> tuple[str, bool] | None:
    """The answer a response commits to, as ``(text, boxed)``; None when it commits to none.

    In order: the last complete ``\\boxed{...}`` (or ``\\fbox``); else the last line with an
    explicit final-answer marker (``#### …``, ``Answer: …``, ``The (final) answer is …``),
    whose answer is the rest of that line; else the whole response when it is nothing but a bare
    answer (one number such as ``42``, ``-1.5`` or ``3/4``, or one ``$…$``/``\\(…\\)``/
    ``\\[…\\]`` expression). Text in the middle of a response is never taken as its answer:
    ``"so x =42 and then"`` commits to nothing.
    """
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed, True
    for line in reversed(response.splitlines()):
        m = _ANSWER_LINE.search(line)
        if m:
            text = m.group(1).strip().rstrip(".").strip().strip("*").strip()
            return (text, False) if text else None
    if len(response) <= MAX_BARE_CHARS and _BARE.fullmatch(response):
        return response.strip().rstrip(".").strip(), False
    return None


def _parse_answer(text: str) -> list:
    """math-verify's parse of an answer written bare or in math delimiters."""
    mv = _math_verify()
    delimited = "$" in text or "\\(" in text or "\\[" in text
    return (mv.parse(text if delimited else f"${text}$", parsing_timeout=None)
            or mv.parse(text, parsing_timeout=None) or [text])


def math_verifier(response: str, ground_truth: str) -> float:
    """1.0 iff the response's final answer is mathematically equivalent to the ground truth.

    The final answer is what ``final_answer`` finds (the last ``\\boxed{}``, else an explicit
    final-answer line, else a response that is only an answer); a response without one scores
    0. Equivalence is math-verify's ``verify`` (HuggingFace, 0.9: numeric, symbolic, sets,
    intervals).
    """
    mv = _math_verify()
    found = final_answer(response)
    if found is None:
        return 0.0
    text, boxed = found
    if boxed:
        latex = mv.LatexExtractionConfig(boxed_match_priority=0)
        pred = mv.parse(f"\\boxed{{{text}}}", extraction_config=[latex], parsing_timeout=None)
        pred = pred or [text.strip()]  # unparseable (e.g. plain words): still compare as text
    else:
        pred = _parse_answer(text)
    return float(bool(pred) and mv.verify(_parse_gold(ground_truth), pred, timeout_seconds=None))


_BOXED_INT = re.compile(r"-?[0-9]{1,30}")


def boxed_integer(response: str, ground_truth: str) -> float:
    """1.0 iff the last ``\\boxed{}`` holds the integer ``ground_truth`` written out as a number:
    ``\\boxed{42}``, or an equation that ends in it (``\\boxed{37 + 5 = 42}``); spaces, ``$`` and a
    final ``.`` are ignored. For arithmetic tasks, where ``math`` would be fooled: math-verify
    evaluates what it parses, so ``\\boxed{37 + 5}`` (the question copied into the box) scores as
    right under it."""
    boxed = last_boxed(response)
    if boxed is None:
        return 0.0
    text = boxed.rsplit("=", 1)[-1].replace("$", "").replace(" ", "").rstrip(".")
    return float(bool(_BOXED_INT.fullmatch(text)) and int(text) == int(ground_truth))


def boxed_format(response: str, ground_truth: str) -> float:
    """1.0 iff the response's last ``\\boxed{}`` holds an answer (not blank), right or wrong: a
    format reward to weigh beside a verifier (``reward.functions``), as R1-style recipes do. It
    never decides correctness; as ``reward.verifier`` it would count every boxed answer as right.
    An empty box earns nothing: SmolLM2-135M-Instruct, rewarded for any ``\\boxed{`` ``}``,
    learned within 10 steps to open its replies with ``\\boxed{}`` and answer nothing."""
    boxed = last_boxed(response)
    return float(boxed is not None and bool(boxed.strip()))


# ----------------------------------------------------------------------------- registry

VERIFIERS: dict[str, Verifier] = {
    "math": math_verifier,
    "exact": exact_verifier,
    "countdown": countdown_verifier,
    "subset_sum": subset_sum_verifier,
    "addition": addition_verifier,
    "boxed_integer": boxed_integer,
    "boxed_format": boxed_format,
}

# Work a verifier does once per process (imports, parser warm-up), kept out of the first
# response's time limit by the pool.
_WARMUPS: dict[str, Callable[[], object]] = {
    "math": lambda: math_verifier("\\boxed{1}", "1"),
}


def warm_up(spec: str) -> None:
    """Do ``spec``'s once-per-process work (imports, parser warm-up) now, if it has any."""
    if spec in _WARMUPS:
        _WARMUPS[spec]()


def resolve_verifier(spec: str, *, warm: bool = False) -> Verifier:
    """The verifier ``spec``: a ``VERIFIERS`` key, ``"module:function"`` or
    ``"path/to/file.py:function"`` (``explorl.refs``), as the user wrote it."""
    if spec in VERIFIERS:
        if warm:
            warm_up(spec)
        return VERIFIERS[spec]
    if is_ref(spec):
        try:
            fn = load_ref(spec)
        except (ImportError, ValueError) as e:
            raise RewardError(f"cannot load verifier {spec!r}: {e}") from e
        if not callable(fn):
            raise RewardError(f"verifier {spec!r} is not callable")
        return fn
    close = difflib.get_close_matches(spec, list(VERIFIERS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise RewardError(
        f"unknown verifier {spec!r}{hint}; valid: {', '.join(VERIFIERS)} (or 'module:function')"
    )
