"""A study's warm start (``start:``): one run trained first, whose final checkpoint every other
run of the study starts from (``model.path``), and whose final policy is the base model's
evaluation.

It is a run like the others (``plan_start``): trained by the same job machinery, resumable,
its configuration checked against its folder's. Its last checkpoint holds the weights the arms
load, so a study restored from an archive (``--from``: metrics and configs, no weights) that
still has runs to train trains it again: training is deterministic on one machine, and the
digest of its weights (``model.sha256``, packed with its metrics) says whether the retrained
policy is the one the restored runs started from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from explorl.study.data import WEIGHTS, sha256
from explorl.study.jobs import EXIT_TIME_LIMIT, Deadline, finished, run_jobs, time_limit_note
from explorl.study.plan import (
    RunPlan,
    eval_done_at,
    final_evals,
    plan_runs,
    policy_evals,
    run_state,
    start_checkpoint_of,
)
from explorl.study.spec import StudySpec

DIGEST = "model.sha256"  # the start run's final weights' SHA-256, beside its metrics


def has_weights(start: RunPlan) -> bool:
    """Whether the start run's final checkpoint holds its weights."""
    return (start_checkpoint_of(start) / WEIGHTS).is_file()


def work_left(spec: StudySpec, spec_path: Path, out: Path, chosen: dict | None) -> bool:
    """Whether anything of the study still needs the start run's policy: tuning not finished
    (``chosen`` None), a final run not finished, or the base model's evaluation not done."""
    if chosen is None:
        return True
    base = spec.base_eval and not all(eval_done_at(out / "base" / f, e)
                                      for f, e in policy_evals(final_evals(spec)))
    return base or not all(finished(p) for p in plan_runs(spec, spec_path, out, chosen))


def run_start(start: RunPlan, spec: StudySpec, out: Path, work_left: bool,
              log: Callable[[str], None], deadline: Deadline | None = None,
              on_done: Callable[[], None] | None = None) -> int | None:
    """Train (or resume) the start run unless it is finished with its final checkpoint; a
    finished one without weights (restored from an archive) is trained again only when
    ``work_left`` (a run or evaluation still needs its policy). None when done, else an exit
    code (interrupted, stopped by the time limit, failed)."""
    ckpt = start_checkpoint_of(start)
    state = run_state(start)
    packed = None
    if state == "done" and not has_weights(start):
        if not work_left:
            return None  # a re-analysis: every run that starts from it is finished
        digest = start.out / DIGEST
        packed = digest.read_text().strip() if digest.is_file() else None
        log(f"the start run {start.out} is finished but its final checkpoint {ckpt} has no "
            "weights (restored from an archive, which carries none): training it again")
        (start.out / "summary.json").unlink()  # → restarted from scratch (deterministic)
    elif state == "done":
        return None
    else:
        log(f"start: {start.recipe.stem} seed {start.seed}, {start.cfg.max_steps} steps → "
            f"{start.out} (every run starts from its final checkpoint)")
    results = run_jobs([start], spec, out / "logs", log, deadline, on_done=on_done)
    if results is not None and deadline is not None and time_limit_note(results):
        log(time_limit_note(results))
        return EXIT_TIME_LIMIT
    if results is None or any(r.status == "interrupted" for r in results):
        log("interrupted; rerun the same command to continue")
        return 130
    if any(r.status == "failed" for r in results) or not has_weights(start):
        log(f"the start run failed (no weights in {ckpt}); see {out / 'logs'}; rerun to retry")
        return 1
    got = sha256(ckpt / WEIGHTS)
    (start.out / DIGEST).write_text(got + "\n")
    if packed is not None and packed != got:
        log(f"WARNING: the retrained start run's weights differ from those the restored runs "
            f"started from (SHA-256 {got[:12]}… ≠ {packed[:12]}…: another CPU's float sums); "
            "the runs trained here start from a slightly different policy")
    return None
