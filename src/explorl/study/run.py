"""A study end to end (``run_study``): plan, run the jobs, then analyse (``analyse``): the overlay
report, per-run numbers, table, claims, figures and documents."""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from explorl import config as C
from explorl.config import builtin
from explorl.files import write_text_atomic
from explorl.models import resolve_model_path
from explorl.report.documents import publish
from explorl.study.analyse import analyse
from explorl.study.data import complete, lab_models, pack, packable, unpack
from explorl.study.jobs import (
    EXIT_TIME_LIMIT,
    Before,
    Deadline,
    JobResult,
    JobTimes,
    base_evals_left,
    finished,
    run_base_eval,
    run_jobs,
    time_limit_note,
)
from explorl.study.plan import (
    RunPlan,
    base_folders,
    eval_done,
    plan_runs,
    plan_start,
    plan_tuning,
    run_state,
    value_text,
    with_start,
)
from explorl.study.pricing import find_rates, job_times, time_limit_lines
from explorl.study.spec import StudySpec, archive_path, auto_jobs, load_spec
from explorl.study.start import has_weights, run_start, work_left
from explorl.study.tuning import (
    GridPoint,
    beyond_edge,
    choices,
    edge_won,
    grid_table,
    tuning_markdown,
)
from explorl.study.wall import Wall, wall_jobs


def run_tuning(spec: StudySpec, spec_path: Path, out: Path, log: Callable[[str], None],
               deadline: Deadline | None = None, on_done: Callable[[], None] | None = None
               ) -> dict[str, list[GridPoint]] | int:
    """Train and evaluate every ``tune:`` grid point (finished ones are skipped) and pick each
    recipe's value, extending a grid past the edge its choice sits on (``tuning.extend``); the
    grid table, or an exit code when interrupted or a point failed.

    The ``tuning.share`` sources are tuned first and their choices shared with the other grids.
    Extensions are replayed from the finished runs on every invocation, so an interrupted study
    extends its grids the same way when it continues."""
    (out / "tune" / "choices.json").unlink(missing_ok=True)  # rewritten when tuning ends
    sources = set(spec.tuning.share.values())
    stages = [[n for n in spec.tune if n in sources], [n for n in spec.tune if n not in sources]]
    table: dict[str, list[GridPoint]] = {}
    for names in (s for s in stages if s):
        chosen = choices(table)
        for key, src in spec.tuning.share.items():
            if src in chosen:
                log(f"  shared with the other grids: {key} = {value_text(chosen[src])} ({src}'s "
                    "choice)")
        got = _tune_stage(spec, names, chosen, spec_path, out, log, deadline, on_done)
        if isinstance(got, int):
            return got
        table.update(got)
    table = {n: table[n] for n in spec.tune}
    for name, pts in table.items():
        for p in pts:
            p.added = p.value not in spec.tune[name].values
    write_text_atomic(out / "tune" / "choices.json", json.dumps(
        {n: [p.to_json() for p in pts] for n, pts in table.items()}, indent=1) + "\n")
    # readable while the final runs train (study.md repeats it when they are done)
    write_text_atomic(out / "tune" / "tuning.md", "\n".join(
        [f"# Tuning: study {spec.name}", "", *tuning_markdown(spec, table), ""]))
    for name, value in choices(table).items():
        log(f"  tuned {name}: {spec.tune[name].key} = {value_text(value)}")
    return table


def _tune_stage(spec: StudySpec, names: list[str], chosen: dict[str, Any], spec_path: Path,
                out: Path, log: Callable[[str], None], deadline: Deadline | None = None,
                on_done: Callable[[], None] | None = None) -> dict[str, list[GridPoint]] | int:
    """The grids of ``names`` (the earlier stages' ``chosen`` shared), extended at edge choices
    until none grows; their table, or an exit code."""
    grids = {name: list(spec.tune[name].values) for name in names}
    first = True
    while True:
        current = dataclasses.replace(spec, tune={
            n: dataclasses.replace(spec.tune[n], values=grids[n]) for n in names})
        plans = plan_tuning(current, spec_path, out, chosen)
        todo = sum(run_state(p) != "done" or not eval_done(p) for p in plans)
        if todo or first:
            first = False
            log(f"tuning: {len(names)} recipes, {len(plans)} grid runs ({todo} to do) on the "
                f"{spec.tuning.split} split")
        results = run_jobs(plans, current, out / "tune" / "logs", log, deadline, on_done=on_done)
        if results is not None and deadline is not None and (
                note := time_limit_note(results)):
            log(note)
            return EXIT_TIME_LIMIT
        if results is None or any(r.status == "interrupted" for r in results):
            log("interrupted; rerun the same command to continue")
            return 130
        failed = [r for r in results if r.status == "failed"]
        if failed:
            log("failed tuning runs (rerun to retry): "
                + "; ".join(f"{r.plan.key} ({r.detail})" for r in failed))
            return 1
        table = grid_table(current, plans)
        grow = _extensions(spec, current, chosen, spec_path, out, table, log)
        if not grow:
            return table
        for name, value in grow.items():
            grids[name].append(value)


def _extensions(spec: StudySpec, current: StudySpec, chosen: dict[str, Any], spec_path: Path,
                out: Path, table: dict[str, list[GridPoint]],
                log: Callable[[str], None]) -> dict[str, Any]:
    """``{recipe: next value}`` for each recipe whose choice sits on its grid's edge and that
    has added fewer than ``tuning.extend`` values, when its config accepts the value."""
    grow: dict[str, Any] = {}
    for name, value in choices(table).items():
        values = current.tune[name].values
        if len(values) - len(spec.tune[name].values) >= spec.tuning.extend:
            continue
        new = beyond_edge(values, value)
        if new is None or new in values or not edge_won(table[name], spec.tuning.tie):
            continue
        one = dataclasses.replace(current, tune={name: dataclasses.replace(
            current.tune[name], values=[new])})
        try:
            plan_tuning(one, spec_path, out, chosen)
        except C.ConfigError:
            continue  # past the knob's range: the grid stays as it is (the report says so)
        log(f"  {name}: the choice {spec.tune[name].key} = {value_text(value)} is its grid's "
            f"edge; adding {value_text(new)}")
        grow[name] = new
    return grow


def _build_models(plans: list[RunPlan]) -> None:
    """Each lab model (task, parameters, size) is built once, under a file lock, before the jobs
    start, not by all of them at once; resolved with the run's lab section, as the runs do."""
    built = {(p.cfg.model.path, repr(p.cfg.lab)): p for p in plans
             if p.cfg.model.path.startswith("lab:")}
    for p in built.values():
        resolve_model_path(p.cfg.model.path, p.cfg.lab)


def run_study(spec_path: str | Path, *, quick: bool = False, out: str | Path | None = None,
              jobs: int | str | None = None, recipes: str | Path | None = None,
              restore: str | Path | None = None, time_limit: float | None = None,
              log: Callable[[str], None] = print) -> int:
    """Run (or continue) a study end to end; returns an exit code (0 ok, 1 failed runs,
    130 interrupted, 75 stopped by ``time_limit``: seconds, ``--time-limit``, after which no
    job starts that would not save its work before it and the running ones checkpoint and
    stop).
    ``jobs`` (an int or ``auto``) replaces the spec's; ``recipes`` replaces the spec's
    ``recipe_dir`` (relative to the working directory, not the spec); ``restore``: an archive
    (``pack_study``, a published one) whose finished runs the study directory lacks
    are restored first."""
    spec_path = Path(spec_path)
    spec = load_spec(spec_path, quick=quick)
    if threading.current_thread() is threading.main_thread():
        # A study started in the background (`nohup … &` from a script) inherits SIGINT ignored;
        # `kill -INT` must still stop it cleanly (the runs checkpoint; rerun to continue).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _command_line(spec, jobs, recipes)
    out = Path(out) if out else Path("runs") / f"study-{spec.name}{'-quick' if quick else ''}"
    plan_runs(spec, spec_path, out)  # every config checked before the tuning runs start
    if restore is not None:
        _restore(Path(restore), out, log)
    tuned: dict[str, list[GridPoint]] = {}
    wall = Wall(out, spec.jobs)
    deadline = None
    if time_limit:  # before any work: does what is left fit (from the measured rates)?
        lines, times = _time_limit_lines(spec, spec_path, out, time_limit)
        deadline = Deadline.after(time_limit, times)
        for line in lines:
            log(line)
    else:
        times = _job_times(spec, spec_path, out)
    if (start := plan_start(spec, spec_path, out)) is not None:  # before every other run
        _build_models([] if has_weights(start) else [start])
        left = work_left(spec, spec_path, out, _chosen(spec, out))
        if (rc := run_start(start, spec, out, left, log, deadline, wall.tick)) is not None:
            wall.close()
            return rc
    if spec.tune:
        _build_models([p for p in plan_tuning(spec, spec_path, out) if not complete(p.out)])
        got = run_tuning(spec, spec_path, out, log, deadline, on_done=wall.tick)
        if isinstance(got, int):
            wall.close()
            return got
        tuned = got
    plans = plan_runs(spec, spec_path, out, choices(tuned))
    states = {p.key: run_state(p) for p in plans}
    todo = sum(s != "done" for s in states.values())
    log(f"study {spec.name}{' (quick)' if quick else ''}: {len(plans)} runs ({todo} to train, "
        f"{len(plans) - todo} finished), {spec.max_steps} steps each, {spec.jobs} at a time "
        f"→ {out}")
    _build_models([p for p in plans if states[p.key] != "done"])  # a re-analysis builds none
    before = [_base_eval_job(p, spec, out, folder, log)
              for folder, p in (base_folders(plans).items() if spec.base_eval else ())]
    results = run_jobs(plans, spec, out / "logs", log, deadline, on_done=wall.tick,
                       before=before, times=times)
    if (rc := _stopped(results, deadline, log)) is not None:
        wall.close()
        return rc
    failed = [r for r in results if r.status == "failed"]
    # Wall-clock adds up over the invocations that built this study (a rerun that only resumes
    # or re-analyses does not reset it).
    payload = analyse(out, spec, spec_path, quick, plans, failed, wall.close(), tuned,
                      wall_jobs(out))
    return _finish(out, spec, plans, payload, failed, log)


def _base_eval_job(plan: RunPlan, spec: StudySpec, out: Path, folder: str,
                   log: Callable[[str], None]) -> Before:
    """The evaluation of the model ``plan`` starts from (before RL) into ``out/folder``, as a
    job of the study's pool (``run_jobs``' ``before``): it runs beside the first run rather
    than ahead of every run, so no core waits for it."""
    whose = "" if folder == "base" else f" of {plan.name}"

    def job(stop: threading.Event, deadline: Deadline | None, running: dict) -> str:
        t0 = time.perf_counter()
        if not base_evals_left(plan, out / folder):
            return f"the base model{whose}: evaluated before"
        log(f"  evaluating the base model{whose} (the model before RL)")
        if run_base_eval(plan, spec, out / folder, out / "logs", stop, deadline, running):
            return f"the base model{whose}: evaluated in {time.perf_counter() - t0:.0f}s"
        if stop.is_set() or (deadline is not None and not deadline.allows(plan, base=True)):
            return f"the base model{whose}: not evaluated (the study stopped first)"
        return f"the base model's evaluation failed; see {out / 'logs' / folder}.log"

    return job


def _command_line(spec: StudySpec, jobs: int | str | None, recipes: str | Path | None) -> None:
    """``--jobs`` (an int or ``auto``) and ``--recipes`` into ``spec``."""
    if jobs is not None:
        if jobs != "auto" and (not isinstance(jobs, int) or jobs < 1):
            raise C.ConfigError(f"--jobs must be ≥ 1 or auto, got {jobs}")
        spec.jobs = jobs
    if spec.jobs == "auto":
        spec.jobs = auto_jobs()
    if recipes is not None:
        if not Path(recipes).is_dir():
            raise C.ConfigError(f"--recipes {recipes}: not a directory")
        spec.recipe_dir = str(Path(recipes).resolve())


def _restore(archive: Path, out: Path, log: Callable[[str], None]) -> None:
    """``--from``: the archive's finished runs (and lab models) the study directory lacks."""
    got = unpack(archive, out)
    lab = [u for u in got if u.startswith("lab/")]
    runs = [u for u in got if u not in lab and not u.endswith(".json")]
    log(f"restored {len(runs)} finished runs and evaluations from {archive} into {out}"
        + (f", and the lab model {', '.join(u[4:] for u in lab)} they started from"
           if lab else ""))


def _time_limit_lines(spec: StudySpec, spec_path: Path, out: Path, time_limit: float
                      ) -> tuple[list[str], JobTimes | None]:
    """Whether what is left fits ``--time-limit`` (from the measured rates), before any work,
    and each job's estimated wall-clock from the same rates (None: none found)."""
    chosen = _chosen(spec, out)
    tuning = plan_tuning(spec, spec_path, out) if spec.tune and chosen is None else []
    try:
        final = plan_runs(spec, spec_path, out, chosen or {})
        rates = find_rates([*tuning, *final], out)
        return (time_limit_lines(spec, tuning, final, out, spec.jobs, time_limit, rates),
                job_times(rates) if rates else None)
    except (C.ConfigError, OSError, ValueError, KeyError) as e:  # no estimate: still run
        return [f"--time-limit: no estimate of the study's cost ({e})"], None


def _job_times(spec: StudySpec, spec_path: Path, out: Path) -> JobTimes | None:
    """Each job's estimated wall-clock from the measured rates (the study's own runs, else a
    cached calibration: ``pricing.find_rates``), for the ETA; None without rates."""
    if not out.is_dir():
        return None
    chosen = _chosen(spec, out)
    tuning = plan_tuning(spec, spec_path, out) if spec.tune and chosen is None else []
    try:
        rates = find_rates([*tuning, *plan_runs(spec, spec_path, out, chosen or {})], out)
    except (C.ConfigError, OSError, ValueError, KeyError):  # no estimate: the mean-run ETA
        return None
    return job_times(rates) if rates else None


def _stopped(results: list[JobResult] | None, deadline: Deadline | None,
             log: Callable[[str], None]) -> int | None:
    """The exit code of final runs stopped by ``--time-limit`` or interrupted; None when every
    run ended (finished or failed)."""
    if results is not None and deadline is not None and (note := time_limit_note(results)):
        log(note)
        return EXIT_TIME_LIMIT
    if results is None or any(r.status == "interrupted" for r in results):
        log("interrupted; rerun the same command to continue")
        return 130
    return None


def _finish(out: Path, spec: StudySpec, plans: list[RunPlan], payload: dict,
            failed: list[JobResult], log: Callable[[str], None]) -> int:
    """Publish (``spec.publish``: the documents and the runs' archive), log the claims; the
    exit code."""
    if spec.publish:
        _publish(out, spec, plans, Path(spec.publish), log)
    log(f"wrote {out / 'study.md'}, {out / 'claims.md'}, {out / 'study.json'} and "
        f"{out / 'report'}/")
    for c in payload["claims"]:
        log(f"  claim {c['id']:3s} {c['verdict']:8s} {c['claim']}")
    if failed:
        log("failed runs: " + "; ".join(f"{r.plan.key} ({r.detail})" for r in failed))
        return 1
    return 0


def _publish(out: Path, spec: StudySpec, plans: list[RunPlan], dest: Path,
             log: Callable[[str], None]) -> None:
    """The documents into ``dest`` and the finished runs' numbers into the spec's archive
    (both relative to the working directory: the repository's root)."""
    publish(out, dest)
    files, lab = packable(out, spec, plans), lab_models(with_start(plans), out / "lab")
    archive = archive_path(spec)
    archive.parent.mkdir(parents=True, exist_ok=True)
    n = pack(out, files, archive, lab)
    log(f"published to {dest} (the runs' numbers, {n} files of the finished runs, in {archive})")


def report_study(spec_path: str | Path, *, quick: bool = False, out: str | Path | None = None,
                 recipes: str | Path | None = None, log: Callable[[str], None] = print) -> int:
    """``explorl study SPEC --report``: the documents of the runs finished so far, training
    nothing, marked partial (how many of the study's runs they are); with ``publish``, into
    its ``partial/`` folder, and the finished runs into the spec's archive."""
    spec_path = Path(spec_path)
    spec = load_spec(spec_path, quick=quick)
    _command_line(spec, None, recipes)
    out = Path(out) if out else Path("runs") / f"study-{spec.name}{'-quick' if quick else ''}"
    chosen = _chosen(spec, out) if out.is_dir() else None
    if chosen is None:
        raise C.ConfigError(f"--report: no finished run in {out} (no study there, or its tuning "
                            "is not finished)")
    plans = plan_runs(spec, spec_path, out, chosen)
    done = [p for p in plans if finished(p)]
    if not done:
        raise C.ConfigError(f"--report: no run of the study in {out} has finished yet")
    try:
        wall_s = float(json.loads((out / "wall.json").read_text())["wall_s"])
    except (OSError, ValueError, KeyError):
        wall_s = 0.0
    payload = analyse(out, spec, spec_path, quick, plans, [], wall_s, None, wall_jobs(out))
    note = mark_partial(out, len(done), len(plans), progress(spec, spec_path, out))
    log(note)
    if spec.publish:
        _publish(out, spec, plans, Path(spec.publish) / "partial", log)
    for c in payload["claims"]:
        log(f"  claim {c['id']:3s} {c['verdict']:8s} {c['claim']}")
    return 0


def mark_partial(out: Path, done: int, runs: int, how_far: str) -> str:
    """Say at the top of ``study.md`` and ``claims.md``, and in ``study.json``, that the
    documents hold ``done`` of the study's ``runs`` runs; the line said."""
    seeds = how_far.rpartition("(")[2].rstrip(")")  # "seeds with every row finished: …"
    note = (f"**Partial: {done} of {runs} runs finished** ({seeds}); every number below is of "
            "those runs only.")
    for name in ("study.md", "claims.md"):
        lines = (out / name).read_text().split("\n")
        lines[1:1] = ["", note]
        write_text_atomic(out / name, "\n".join(lines))
    data = json.loads((out / "study.json").read_text())
    data["partial"] = {"finished": done, "runs": runs}
    write_text_atomic(out / "study.json", json.dumps(data, indent=1) + "\n")
    return note


def pack_study(spec_path: str | Path, archive: str | Path, *, quick: bool = False,
               out: str | Path | None = None, recipes: str | Path | None = None,
               log: Callable[[str], None] = print) -> int:
    """``explorl study SPEC --pack FILE``: write the finished runs of the study in ``out`` to
    ``FILE`` (``explorl.study.data``) so that it continues elsewhere (``--from FILE``); trains
    nothing."""
    spec_path = Path(spec_path)
    spec = load_spec(spec_path, quick=quick)
    if recipes is not None:
        spec.recipe_dir = str(Path(recipes).resolve())
    out = Path(out) if out else Path("runs") / f"study-{spec.name}{'-quick' if quick else ''}"
    if not out.is_dir():
        raise C.ConfigError(f"--pack: no study in {out} (--out names it)")
    chosen = _chosen(spec, out)
    plans = plan_runs(spec, spec_path, out, chosen) if chosen is not None else []
    files = packable(out, spec, plans)
    tuning = plan_tuning(spec, spec_path, out) if spec.tune else []
    trained = [p for p in with_start(tuning + plans)  # the models they were built from
               if (p.out / "summary.json").exists()]
    pack(out, files, Path(archive), lab_models(trained, out / "lab"))
    runs = len({f.parent for f in files if f.name == "summary.json"})
    log(f"packed {runs} finished runs ({len(files)} files, "
        f"{Path(archive).stat().st_size / 1e6:.1f} MB) into {archive}; continue elsewhere with "
        f"explorl study {builtin.display(spec_path, 'study')} --from {archive}")
    return 0


def _chosen(spec: StudySpec, out: Path) -> dict | None:
    """The tuned values of the study in ``out`` (``{}`` with no tuning), or None while tuning is
    not finished."""
    if not spec.tune:
        return {}
    path = out / "tune" / "choices.json"
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    return {n: next(p["value"] for p in pts if p["chosen"]) for n, pts in table.items()}


def progress(spec: StudySpec, spec_path: Path, out: Path) -> str:
    """How far the study in ``out`` has got: tuning (its grid runs finished, or the choices
    made) and the final runs finished, whole seeds first."""
    chosen = _chosen(spec, out)
    if chosen is None:
        runs = [d for d in (out / "tune" / "runs").glob("*") if d.is_dir()]
        done = sum((d / "eval" / "eval.json").exists() for d in runs)
        return (f"progress in {out}: tuning, {done} grid runs evaluated (of {len(runs)} started; "
                "a grid extended at an edge adds runs)")
    plans = plan_runs(spec, spec_path, out, chosen)
    done = {(p.name, p.seed) for p in plans if finished(p)}
    whole = [s for s in spec.seeds if all((p.name, s) in done for p in plans if p.seed == s)]
    tuned = "tuning finished; " if spec.tune else ""
    return (f"progress in {out}: {tuned}{len(done)} of {len(plans)} final runs finished "
            f"(seeds with every row finished: {', '.join(map(str, whole)) or 'none'})")
