"""VerifierPool: worker-process scoring with per-response time limits and crash recovery."""

import json

import pytest

from explorl.rewards import VerifierPool, resolve_verifier

T = "explorl.rewards.testing:"
TIMEOUT_S = 1.0  # generous: a descheduled worker on a busy machine must not time out


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(num_workers=2, timeout_s=TIMEOUT_S, memory_limit_mb=1024) as p:
        yield p


def mixed_batch():
    cd = json.dumps({"numbers": [1, 2, 3, 4], "target": 10})
    return {
        "exact": (["a", " a ", "b"] * 20, ["a"] * 60),
        "addition": (["46", "046", "46.", "45"] * 10, ["46"] * 40),
        "countdown": (["1+2+3+4", "4*3-2*1", "1+2+3", "2**99"] * 10, [cd] * 40),
    }


def test_pool_matches_in_process_scoring(pool):
    for name, (responses, truths) in mixed_batch().items():
        fn = resolve_verifier(name)
        res = pool.score(name, responses, truths)
        assert res.scores == [fn(r, t) for r, t in zip(responses, truths)], name
        assert (res.timeouts, res.errors) == (0, 0)


def test_pool_math(pool):
    responses = [r"\boxed{1/2}", r"\boxed{0.5}", r"\boxed{2}", "the answer is 0.5", ""]
    res = pool.score("math", responses, ["0.5"] * 5)
    assert res.scores == [1.0, 1.0, 0.0, 1.0, 0.0]


def test_inline_pool_matches_and_counts_errors():
    inline = VerifierPool(num_workers=0, timeout_s=1.0)
    for name, (responses, truths) in mixed_batch().items():
        fn = resolve_verifier(name)
        assert inline.score(name, responses, truths).scores == [
            fn(r, t) for r, t in zip(responses, truths)
        ]
    res = inline.score(T + "_echo", ["a", "raise"], ["a", "a"])
    assert (res.scores, res.timeouts, res.errors) == ([1.0, 0.0], 0, 1)


def test_lab_verifiers_are_scored_in_process_everything_else_in_workers():
    # The lab tasks' checkers are bounded pure functions (verifiers.in_process): no worker
    # sees them. A spec with any other function goes to the workers whole.
    from explorl.rewards.functions import RewardSpec, Term

    with VerifierPool(num_workers=1, timeout_s=TIMEOUT_S, memory_limit_mb=1024) as p:
        for name, (responses, truths) in mixed_batch().items():
            fn = resolve_verifier(name)
            assert p.score(name, responses, truths).scores == [
                fn(r, t) for r, t in zip(responses, truths)]
        assert p._workers[0].specs == {"exact"}  # only exact was sent to the worker
        both = RewardSpec((Term("addition", 1.0), Term(T + "_echo", 1.0)), bounded=False)
        assert p.score(both, ["46"], ["46"]).scores == [2.0]
        assert p._workers[0].specs == {"exact", both}
        lab = RewardSpec((Term("addition", 1.0), Term("lab:addition", 0.5)), bounded=False)
        assert p.score(lab, ["46"], ["46"]).scores == [1.5] and lab not in p._workers[0].specs
        assert p.score("addition", ["46", "x"], ["oops", "1"]).errors == 1  # still counted


def test_hang_is_cut_off_and_pool_keeps_working(pool):
    responses = ["a", "hang", "b", "c", "hang", "d"]
    res = pool.score(T + "_echo", responses, ["a", "x", "b", "c", "x", "x"])
    assert res.scores == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert (res.timeouts, res.errors) == (2, 0)
    assert pool.score("exact", ["a", "b"], ["a", "a"]).scores == [1.0, 0.0]


def test_sleep_forever_verifier(pool):
    res = pool.score(T + "_sleep_forever", ["a"], ["a"])
    assert (res.scores, res.timeouts, res.errors) == ([0.0], 1, 0)


def test_slow_but_in_time_is_scored(pool):
    res = pool.score(T + "_echo", ["sleep:0.1", "x"], ["sleep:0.1", "x"])
    assert (res.scores, res.timeouts) == ([1.0, 1.0], 0)


@pytest.mark.parametrize("bad", ["_crash", "_segfault", "_raise", "_memory_bomb"])
def test_failing_verifier_counts_as_error_and_pool_recovers(pool, bad):
    res = pool.score(T + bad, ["a", "b"], ["a", "b"])
    assert (res.scores, res.timeouts, res.errors) == ([0.0, 0.0], 0, 2)
    assert pool.score("exact", ["a"] * 8, ["a"] * 8).scores == [1.0] * 8


def test_crash_mid_batch_only_costs_that_response(pool):
    responses = ["a", "crash", "b", "raise", "c"] * 4
    res = pool.score(T + "_echo", responses, ["a", "x", "b", "x", "c"] * 4)
    assert res.scores == [1.0, 0.0, 1.0, 0.0, 1.0] * 4
    assert (res.timeouts, res.errors) == (0, 8)


def test_worker_killed_while_idle_is_replaced(pool):
    pool._workers[0].proc.kill()
    pool._workers[0].proc.join()
    assert pool.score("exact", ["a"] * 10, ["a"] * 10).scores == [1.0] * 10


def test_arguments_are_checked(pool):
    with pytest.raises(ValueError, match="valid: math"):
        pool.score("nope", ["a"], ["a"])
    with pytest.raises(ValueError, match="2 responses but 1 ground truths"):
        pool.score("exact", ["a", "b"], ["a"])
    assert pool.score("exact", [], []).scores == []
    with pytest.raises(ValueError):
        VerifierPool(num_workers=-1, timeout_s=1.0)
    with pytest.raises(ValueError):
        VerifierPool(num_workers=1, timeout_s=0)


def test_close_is_idempotent_and_final():
    p = VerifierPool(num_workers=1, timeout_s=1.0)
    procs = [w.proc for w in p._workers]
    p.close()
    p.close()
    assert not any(proc.is_alive() for proc in procs)
    with pytest.raises(RuntimeError, match="closed"):
        p.score("exact", ["a"], ["a"])


def test_interrupted_call_leaves_no_stale_answers(pool):
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(KeyboardInterrupt):
            pool.score(T + "_echo", ["sleep:0.3"] * 4, ["x"] * 4)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert pool.score("exact", ["a", "b", "a"], ["a"] * 3).scores == [1.0, 0.0, 1.0]


def test_workers_that_cannot_warm_up_raise():
    # math's warm-up imports sympy, far longer than 10 ms.
    with VerifierPool(num_workers=2, timeout_s=1.0, startup_timeout_s=0.01) as p:
        with pytest.raises(RuntimeError, match="failed to start"):
            p.score("math", [r"\boxed{1}"], ["1"])
        p.startup_timeout_s = 60.0
        assert p.score("exact", ["a"], ["a"]).scores == [1.0]
