"""A study's numbers in one archive: ``explorl study SPEC --pack FILE`` writes it, ``--from FILE``
restores it, and a published study carries it as ``data.tar.xz``.

The archive holds what the analysis reads of every *finished* run (tuning and final: trained and
every evaluation done) and of the base model's evaluations: ``config.yaml``, ``summary.json``,
``metrics.jsonl`` and each evaluation's ``eval.json`` with its ``problems.jsonl`` cut to the
per-problem counts (``n_correct``, ``n_samples``: the responses are dropped). No weights,
checkpoints or completions: a study continues on another machine from it (the finished runs are
skipped, the rest train there) and a published study is re-analysed from it without training.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

from explorl.files import write_bytes_atomic
from explorl.study.plan import RunPlan, eval_done, eval_done_at, run_state, tuning_eval
from explorl.study.spec import StudySpec

RUN_FILES = ("config.yaml", "summary.json", "metrics.jsonl")
EVAL_FILES = ("eval.json", "problems.jsonl")
PROBLEM_FIELDS = ("index", "data_source", "prompt", "ground_truth", "n_correct", "n_samples")


def counts_only(problems_jsonl: bytes) -> bytes:
    """``problems.jsonl`` with each row's responses replaced by their number (``n_samples``)."""
    rows = []
    for line in problems_jsonl.decode().splitlines():
        if line.strip():
            r = json.loads(line)
            r.setdefault("n_samples", len(r.get("responses", ())))
            rows.append(json.dumps({k: r[k] for k in PROBLEM_FIELDS if k in r}))
    return ("\n".join(rows) + "\n").encode() if rows else b""


def _finished(plan: RunPlan) -> bool:
    try:
        return run_state(plan) == "done" and eval_done(plan)
    except Exception:  # noqa: BLE001 — another configuration in the folder: not this study's
        return False


def _tuned(run: Path, spec: StudySpec) -> bool:
    """Whether a tuning run's folder holds a finished run with its evaluation."""
    try:
        s = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return not s.get("interrupted") and eval_done_at(run / "eval", tuning_eval(spec))


def packable(out: Path, spec: StudySpec, plans: list[RunPlan]) -> list[Path]:
    """The files to pack, relative to ``out``: each finished tuning run under ``out/tune/runs``
    and each finished run of ``plans`` (its run files and its evaluations' files), each finished
    evaluation of the base model, and ``wall.json`` and ``tune/choices.json`` where they
    exist."""
    files: list[Path] = []
    for run in sorted((out / "tune" / "runs").glob("*")) if spec.tune else []:
        if _tuned(run, spec):
            files += [run / f for f in RUN_FILES] + [run / "eval" / f for f in EVAL_FILES]
    for p in plans:
        if _finished(p):
            files += [p.out / f for f in RUN_FILES]
            files += [p.out / folder / f for folder, _ in p.evals for f in EVAL_FILES]
    base = out / "base"
    for folder, e in (plans[0].evals if plans else []):
        if eval_done_at(base / folder, e):
            files += [base / folder / f for f in EVAL_FILES]
    files += [f for f in (out / "wall.json", out / "tune" / "choices.json") if f.exists()]
    return sorted({f.relative_to(out) for f in files if f.exists()})


def pack(out: Path, files: list[Path], archive: Path) -> int:
    """Write ``files`` (relative to ``out``) to ``archive`` (.tar.xz), problems.jsonl cut to the
    counts; reproducible (sorted, no times or owners), written atomically. Returns the count."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        for rel in sorted(files):
            data = (out / rel).read_bytes()
            if rel.name == "problems.jsonl":
                data = counts_only(data)
            info = tarfile.TarInfo(rel.as_posix())
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    archive.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(archive, buf.getvalue())
    return len(files)


def _unit(rel: Path) -> Path:
    """The folder restored as a whole: a run (``runs/x``, ``tune/runs/x``), a base evaluation
    (``base/eval``), or the file itself (``wall.json``)."""
    parts = rel.parts
    if parts[0] == "runs" or parts[0] == "base":
        return Path(*parts[:2]) if len(parts) > 2 else rel
    if parts[:2] == ("tune", "runs"):
        return Path(*parts[:3]) if len(parts) > 3 else rel
    return rel


def _complete(folder: Path) -> bool:
    """Whether a local run or evaluation folder already holds a finished result."""
    if (folder / "config.yaml").exists():
        s = folder / "summary.json"
        try:
            return s.exists() and not json.loads(s.read_text()).get("interrupted")
        except ValueError:
            return False
    return (folder / "eval.json").exists()


def unpack(archive: Path, out: Path) -> list[str]:
    """Restore into ``out`` every run and evaluation of ``archive`` that ``out`` lacks or holds
    unfinished (a partial local run is replaced by the finished one; a finished local one is
    kept). Returns the restored folders' names, relative to ``out``."""
    if not archive.is_file():
        raise FileNotFoundError(f"--from {archive}: no such file")
    with tarfile.open(archive, mode="r:xz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        units: dict[Path, list[tarfile.TarInfo]] = {}
        for m in members:
            rel = Path(m.name)
            if rel.is_absolute() or ".." in rel.parts:
                raise ValueError(f"{archive}: member {m.name!r} points outside the study folder")
            units.setdefault(_unit(rel), []).append(m)
        restored = []
        for unit, group in sorted(units.items()):
            target = out / unit
            if target.exists() and (target.is_file() or _complete(target)):
                continue
            if target.is_dir():
                shutil.rmtree(target)
            for m in group:
                dest = out / m.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(tar.extractfile(m).read())
            restored.append(unit.as_posix())
    return restored
