"""reasoning-gym tasks (``rg:<task>``) as lab tasks: data sources, checkers and lab models.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ (pip ``reasoning-gym``,
Apache-2.0, the optional extra ``explorl[rg]``) generates ~100 procedural tasks;
``create_dataset(name, size=, seed=, **params)`` gives ``{"question", "answer", "metadata"}``
items and ``dataset.score_answer(answer, entry)`` scores an answer in [0, 1] (partial credit for
some tasks). ``rg_task("chain_sum")`` wraps one as a ``LabTask``: its problems are items drawn
from the dataset with the lab's seeded, deduplicated, disjoint train/val/test cut
(``make_splits``), its parameters are the task's config fields, and its checker calls
``score_answer`` on the record's item (kept in ``extra["rg"]``).

Safety. Some scorers run the model's answer as Python: ``eval()`` (string_insertion,
spiral_matrix, binary_matrix, n_queens) or ``sympy.parse_expr``, which calls ``eval`` on its
input (simple_integration, intermediate_integration, polynomial_multiplication, puzzle24,
countdown); ``composite`` forwards to any of them. These are ``EVAL_TASKS``, refused unless a
recipe opts in with ``reward.allow_eval_scorers`` (documented as unsafe); even then their checker
runs only inside a verifier-pool worker. Every other task of reasoning-gym 0.1.25 was read and
is in ``SUPPORTED``; a task of another version that is in neither list is refused like an eval
task, as not audited.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from typing import Any

from explorl import refs
from explorl.lab.tasks import LabTask, Problem

AUDITED_VERSION = "0.1.25"

EVAL_TASKS: dict[str, str] = {
    **{t: f"reasoning_gym's {t} scorer calls eval() on the model's answer"
       for t in ("string_insertion", "spiral_matrix", "binary_matrix", "n_queens")},
    **{t: f"reasoning_gym's {t} scorer parses the model's answer with sympy.parse_expr, which "
          "evaluates it as Python code"
       for t in ("simple_integration", "intermediate_integration", "polynomial_multiplication",
                 "puzzle24", "countdown")},
    "composite": "reasoning_gym's composite task forwards scoring to any task, eval() ones "
                 "included; name its tasks as separate rg:<task> sources instead",
}
"""Tasks whose scorer can execute the answer, and why."""

SUPPORTED = (
    "ab", "acre", "advanced_geometry", "aiw", "arc_1d", "arc_agi", "base_conversion",
    "basic_arithmetic", "bf", "binary_alternation", "bitwise_arithmetic", "boxnet",
    "caesar_cipher", "calendar_arithmetic", "chain_sum", "circuit_logic", "codeio", "coin_flip",
    "color_cube_rotation", "complex_arithmetic", "count_bits", "count_primes",
    "course_schedule", "cryptarithm", "decimal_arithmetic", "decimal_chain_sum", "dice",
    "emoji_mystery", "family_relationships", "figlet_font", "fraction_simplification",
    "futoshiki", "game_of_life", "game_of_life_halting", "gcd", "graph_color", "group_anagrams",
    "gsm_symbolic", "isomorphic_strings", "jugs", "kakurasu", "knight_swap", "knights_knaves",
    "largest_island", "lcm", "leg_counting", "letter_counting", "letter_jumble",
    "list_functions", "mahjong_puzzle", "manipulate_matrix", "maze", "mini_sudoku",
    "modulo_grid", "needle_haystack", "number_filtering", "number_format", "number_sequence",
    "number_sorting", "palindrome_generation", "palindrome_partitioning", "path_star",
    "polynomial_equations", "pool_matrix", "power_function", "prime_factorization", "products",
    "propositional_logic", "quantum_lock", "ransom_note", "rearc", "rectangle_count",
    "rotate_matrix", "rotten_oranges", "rubiks_cube", "rush_hour", "self_reference",
    "sentence_reordering", "shortest_path", "simple_equations", "simple_geometry", "sokoban",
    "spell_backward", "string_manipulation", "string_splitting", "string_synthesis", "sudoku",
    "survo", "syllogism", "time_intervals", "tower_of_hanoi", "tsumego", "word_ladder",
    "word_sequence_reversal", "word_sorting", "zebra_puzzles",
)
"""Tasks whose scorer (reasoning-gym 0.1.25) parses the answer without executing it."""

# Items are drawn by index from one dataset of this virtual size (reasoning-gym makes item i
# from Random(seed + i), so nothing is generated up front).
_INDEX_SPACE = 1 << 24
_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def refusal(task: str) -> str | None:
    """Why ``task`` is refused without ``reward.allow_eval_scorers``; None when it is not."""
    if task in EVAL_TASKS:
        return EVAL_TASKS[task] + ", so a model could run any code"
    if task not in SUPPORTED:
        return (f"{task} is not among the tasks explorl audited in reasoning-gym "
                f"{AUDITED_VERSION}; its scorer may execute the answer")
    return None


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as e:
        raise ImportError("reasoning-gym is not installed: pip install 'explorl[rg]' "
                          "(or reasoning-gym==0.1.25)") from e
    return reasoning_gym


def installed_version() -> str:
    from importlib.metadata import version

    return version("reasoning-gym")


def _config_class(task: str):
    _reasoning_gym()
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        close = difflib.get_close_matches(task, list(DATASETS), n=1)
        hint = f"; did you mean 'rg:{close[0]}'?" if close else ""
        raise ValueError(f"unknown reasoning-gym task {task!r}{hint} (README: reasoning-gym "
                         "tasks lists them)")
    return DATASETS[task][1]


@functools.lru_cache(maxsize=64)
def _dataset(task: str, params_json: str):
    """The task's dataset with these parameters (cached: the checker needs it per response)."""
    return _reasoning_gym().create_dataset(task, seed=0, size=_INDEX_SPACE,
                                           **json.loads(params_json))


def extract_answer(response: str) -> str:
    """The last ``<answer>...</answer>`` of a response (reasoning-gym's format), else all of it,
    stripped."""
    found = _ANSWER_TAG.findall(response)
    return (found[-1] if found else response).strip()


def score(data_source: str, solution_str: str, ground_truth: str,
          extra_info: dict | None = None) -> float:
    """The reasoning-gym checker (verl signature): ``score_answer`` of the record's task on its
    item. An eval task is scored only in a verifier-pool worker, and only for records that the
    recipe's ``reward.allow_eval_scorers`` marked; anywhere else it raises."""
    info = (extra_info or {}).get("rg")
    if not isinstance(info, dict):
        raise ValueError("not a reasoning-gym record (its extra has no 'rg' item)")  # noqa: TRY004
    task = info["task"]
    why = refusal(task)
    if why is not None:
        if not (info.get("allow_eval") and refs.IN_WORKER):
            raise PermissionError(f"refused to score rg:{task}: {why}")
    ds = _dataset(task, json.dumps(info["params"], sort_keys=True))
    return float(ds.score_answer(extract_answer(solution_str), info["entry"]))


def _sample(task: str, rng, **params: Any) -> Problem:
    entry = _dataset(task, json.dumps(params, sort_keys=True))[rng.randrange(_INDEX_SPACE)]
    answer = str(entry["answer"])
    return Problem((entry["question"],), entry["question"], answer, answer, 0,
                   {"rg": {"task": task, "params": params, "entry": entry}})


def _validate(task: str, **params: Any) -> None:
    try:
        cfg = _config_class(task)(seed=0, size=1, **params)
        if hasattr(cfg, "validate"):
            cfg.validate()
    except (AssertionError, TypeError) as e:
        raise ValueError(f"rg:{task} parameters {params}: {e or 'rejected'}") from e


@functools.cache
def rg_task(task: str) -> LabTask:
    """The reasoning-gym task ``task`` as a ``LabTask`` (``lab:rg:<task>`` / ``rg:<task>``).

    Its parameters are the task's config fields but ``seed`` and ``size`` (the lab's split seed
    and sizes set those); its alphabet is the characters its problems use; its lab model sees
    up to 256 positions (reasoning-gym prompts are long, 33–106 characters for the short tasks).
    """
    import dataclasses

    fields = [f for f in dataclasses.fields(_config_class(task)) if f.name not in ("seed", "size")]
    params = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
              for f in fields}
    return LabTask(
        name=f"rg:{task}",
        sample=functools.partial(_sample, task),
        check=score,
        params=params,
        validate=functools.partial(_validate, task),
        alphabet=None,
        max_response_len=24,
        build={"max_positions": 256},
        version=f"reasoning-gym {installed_version()}",
        data_source=f"rg/{task}",
    )
