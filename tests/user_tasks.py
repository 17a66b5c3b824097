"""A lab task written the way a user would, outside ``src/`` (tests/test_user_tasks.py uses it).

``letters``: the prompt is letters in comma-separated groups and ``=``, the answer the letters
without the commas: ``"ab,c="`` → ``"abc"``. Its alphabet has letters and a comma, which the
built-in lab tokenizer does not know.
"""

from __future__ import annotations

import random

from explorl.lab import LabTask, Problem


def sample(rng: random.Random, *, n_letters: int, groups: int) -> Problem:
    parts = ["".join(rng.choice("abcd") for _ in range(rng.randint(1, n_letters)))
             for _ in range(groups)]
    answer = "".join(parts)
    return Problem((tuple(parts),), ",".join(parts) + "=", answer, answer, len(answer))


def check(response: str, ground_truth: str) -> float:
    return float(response.strip() == ground_truth)


def validate(*, n_letters: int, groups: int) -> None:
    if n_letters < 1 or groups < 1:
        raise ValueError(f"letters needs n_letters ≥ 1 and groups ≥ 1, got {n_letters}, "
                         f"{groups}")


# A lab model built in seconds: a test needs one that loads and samples, not a good one.
TINY_BUILD = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64,
              "batch_size": 16, "max_steps": 20, "check_every": 10, "eval_samples": 2}

letters = LabTask(
    name="letters",
    sample=sample,
    check=check,
    params={"n_letters": 2, "groups": 2},
    validate=validate,
    alphabet="abcd,=",
    max_response_len=6,
    build=TINY_BUILD,
)

# Its sampler writes an "e", which its alphabet lacks.
bad_alphabet = LabTask(name="bad_alphabet", sample=lambda rng, **p: Problem((rng.random(),), "ae=",
                       "ae", "ae", 0), check=check, alphabet="abcd,=", build=TINY_BUILD)
