"""VerifierPool under abuse: scores that are not scores, a per-call budget, and plain scripts
without a main guard."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time

import pytest

from explorl.rewards import VerifierPool
from explorl.rewards.pool import call_budget, check_score
from explorl.rewards.testing import _ODD_SCORES

T = "explorl.rewards.testing:"
ODD = list(_ODD_SCORES)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_scores_that_are_not_finite_numbers_in_range_count_as_errors(num_workers):
    responses = ["ok", *ODD, "ok"]
    with VerifierPool(num_workers, timeout_s=5.0) as pool:
        res = pool.score(T + "_returns", responses, ["x"] * len(responses))
    # NaN, ±inf, 1e30, -0.5, 2.0, the string "1.0", None and [1.0] all score 0 as errors
    assert res.scores == [1.0] + [0.0] * len(ODD) + [1.0]
    assert (res.errors, res.timeouts) == (len(ODD), 0)


def test_check_score():
    assert check_score(1) == 1.0 and check_score(True) == 1.0 and check_score(0.25) == 0.25
    import numpy as np

    assert check_score(np.float32(0.5)) == 0.5
    for bad, why in [
        ("1.0", "is a str, not a number"),
        (None, "is a NoneType"),
        (float("nan"), "outside [0, 1]"),
        (1e30, "outside [0, 1]"),
        (-0.5, "outside"),
        (1.001, "outside"),
    ]:
        with pytest.raises(ValueError, match=re.escape(why)):
            check_score(bad)
    # float round-off just outside [0, 1] is clamped (8 × 1/8 as reasoning-gym sums it)
    assert check_score(1.0000000000000002) == 1.0 and check_score(-1e-12) == 0.0
    assert check_score(1.0000000000000002, bounded=False) == 1.0000000000000002


def test_budget_bounds_a_call_and_scores_the_rest_as_timeouts():
    # 12 hangs on 2 workers at 0.5 s each would take ≥ 3 s one by one; the budget is 1.5 s
    responses = ["a", "b"] + ["hang"] * 12 + ["c"]
    with VerifierPool(2, timeout_s=0.5, step_timeout_s=1.5) as pool:
        pool.score("exact", ["warm"], ["warm"])  # workers started: the budget counts from here
        pool.score(T + "_echo", ["a"], ["a"])
        t0 = time.monotonic()
        res = pool.score(T + "_echo", responses, ["a", "b"] + ["x"] * 12 + ["c"])
        took = time.monotonic() - t0
        assert took < 1.5 + 1.0, took  # the budget plus replacing the stuck workers
        assert res.timeouts + sum(res.scores) == len(responses) - res.errors
        assert res.timeouts >= 12 - 4 and res.errors == 0  # at most ~3 hangs fit in 1.5 s
        assert pool.score("exact", ["a", "b"], ["a", "a"]).scores == [1.0, 0.0]  # still works


def test_default_budget_grows_with_the_batch():
    assert call_budget(5.0, 64, 2) == 5.0 * (4 + 8)
    assert call_budget(5.0, 0, 2) == 20.0
    assert call_budget(1.0, 10, 0) == 4 + 10 / 4


def test_a_script_without_main_guard_can_build_a_pool(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(
        textwrap.dedent("""
        # no `if __name__ == "__main__":` guard: workers must not run this file again
        import sys
        from explorl.rewards import VerifierPool

        print("top level ran", flush=True)
        pool = VerifierPool(2, timeout_s=5.0)
        res = pool.score("exact", ["3", "4", " 7 "], ["3", "3", "7"])  # in the workers
        pool.close()
        print("scores", res.scores, res.errors, flush=True)
    """)
    )
    p = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("top level ran") == 1  # not re-run in a worker
    assert "scores [1.0, 0.0, 1.0] 0" in p.stdout
    assert "failed to start" not in p.stderr


def test_a_script_that_never_closes_its_pool_still_exits(tmp_path):
    """The workers ignore SIGTERM (a job's stop signal is the trainer's to act on), which is how
    multiprocessing stops daemonic children at exit: the pool kills them itself from an exit hook
    that runs first, so a script (or a test) that forgets ``close()`` does not hang."""
    script = tmp_path / "unclosed.py"
    script.write_text(textwrap.dedent("""
        from explorl.rewards import VerifierPool

        pool = VerifierPool(1, timeout_s=5.0)
        print("scores", pool.score("exact", ["3"], ["3"]).scores, flush=True)
    """))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, str(script)], capture_output=True, check=False,
                       text=True, timeout=90, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "scores [1.0]" in p.stdout
    assert time.perf_counter() - t0 < 60
