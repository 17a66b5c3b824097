"""A study's numbers in one archive: ``explorl study SPEC --pack FILE`` writes it, ``--from FILE``
restores it, and a published study carries it in its spec's ``archive`` (the built-in ones:
``study-data/``).

The archive holds what the analysis reads of every *finished* run (tuning and final: trained and
every evaluation done) and of the base model's evaluations: ``config.yaml``, ``summary.json``,
``metrics.jsonl`` and each evaluation's ``eval.json`` with its ``problems.jsonl`` cut to the
per-problem counts (``n_correct``, ``n_samples``: the responses are dropped). No weights,
checkpoints or completions: a study continues on another machine from it (the finished runs are
skipped, the rest train there) and a published study is re-analysed from it without training.

The lab models the runs started from go in too (``lab/<build>/``, up to ``LAB_PACK_MAX`` bytes
each; a larger one as its ``lab.json`` and weights' SHA-256 only): a build is reproducible on
one machine but its float sums, hence its stopping step, may differ on another CPU, and runs
that continue elsewhere must start from the same base model as those already finished.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

from explorl.errors import ConfigError
from explorl.files import write_bytes_atomic
from explorl.lab.build import cache_root
from explorl.models import resolve_model_path
from explorl.study.plan import (
    RunPlan,
    base_folders,
    eval_done,
    eval_done_at,
    policy_evals,
    run_state,
    tuning_eval,
)
from explorl.study.spec import StudySpec

RUN_FILES = ("config.yaml", "summary.json", "metrics.jsonl")
EVAL_FILES = ("eval.json", "problems.jsonl")
PROBLEM_FIELDS = ("index", "data_source", "prompt", "ground_truth", "n_correct", "n_samples",
                  "tool_calls")  # with tools: the calls of each response (a few bytes a row)
LAB_PACK_MAX = 8_000_000  # bytes: the ~0.9M-parameter lab model (3.4 MB) goes in, 9.6M does not
WEIGHTS = "model.safetensors"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lab_models(plans: list[RunPlan], kept: Path | None = None) -> dict[str, Path]:
    """The archive entries of the lab models ``plans`` start from: ``lab/<build>/<file>`` →
    the cached file (every file of a build up to ``LAB_PACK_MAX`` bytes, else its ``lab.json``),
    plus ``lab/<build>/model.sha256`` (the weights' digest, written by ``pack``). Nothing is
    built: a model absent from the cache is taken from ``kept`` (``<study>/lab``: what
    ``unpack`` kept of an archive's build too large to pack) or left out."""
    out: dict[str, Path] = {}
    for d in sorted({resolve_model_path(p.cfg.model.path, p.cfg.lab, build=False) for p in plans
                     if p.cfg.model.path.startswith("lab:")}):
        if not (d / WEIGHTS).exists():
            record = kept / d.name if kept is not None else None
            if record is not None and (record / "model.sha256").exists():
                out |= {f"lab/{d.name}/{f.name}": f for f in sorted(record.iterdir())}
            continue
        files = sorted(f for f in d.iterdir() if f.is_file())
        small = sum(f.stat().st_size for f in files) <= LAB_PACK_MAX
        for f in files if small else [d / "lab.json"]:
            out[f"lab/{d.name}/{f.name}"] = f
        out[f"lab/{d.name}/model.sha256"] = d / WEIGHTS
    return out


def counts_only(problems_jsonl: bytes) -> bytes:
    """``problems.jsonl`` with each row's responses replaced by their number (``n_samples``); a
    tool run's per-response ``tool_calls`` stay."""
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
    evaluation of the base model, the finished ``start`` run (with its weights' digest,
    ``model.sha256``), and ``wall.json`` and ``tune/choices.json`` where they
    exist."""
    files: list[Path] = []
    for run in sorted((out / "tune" / "runs").glob("*")) if spec.tune else []:
        if _tuned(run, spec):
            files += [run / f for f in RUN_FILES] + [run / "eval" / f for f in EVAL_FILES]
    for p in plans:
        if _finished(p):
            files += [p.out / f for f in RUN_FILES]
            files += [p.out / folder / f for folder, _ in p.evals for f in EVAL_FILES]
    for name, p in base_folders(plans).items():
        for folder, e in policy_evals(p.evals):
            if eval_done_at(out / name / folder, e):
                files += [out / name / folder / f for f in EVAL_FILES]
    if spec.start is not None and complete(out / "start"):  # its numbers and its weights' digest
        files += [out / "start" / f for f in (*RUN_FILES, "model.sha256")]
    files += [f for f in (out / "wall.json", out / "tune" / "choices.json") if f.exists()]
    return sorted({f.relative_to(out) for f in files if f.exists()})


def pack(out: Path, files: list[Path], archive: Path, lab: dict[str, Path] | None = None) -> int:
    """Write ``files`` (relative to ``out``) and the ``lab`` entries (``lab_models``) to
    ``archive`` (.tar.xz), problems.jsonl cut to the counts; reproducible (sorted, no times or
    owners), written atomically. Returns the number of run files."""
    entries = {rel.as_posix(): out / rel for rel in files} | (lab or {})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        for name in sorted(entries):
            src = entries[name]
            if name.endswith("/model.sha256"):  # a digest kept by ``unpack``, or the weights
                data = src.read_bytes() if src.name == "model.sha256" else (
                    sha256(src) + "\n").encode()
            else:
                data = src.read_bytes()
            if name.endswith("/problems.jsonl"):
                data = counts_only(data)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    archive.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(archive, buf.getvalue())
    return len(files)


def _unit(rel: Path) -> Path:
    """The folder restored as a whole: a run (``runs/x``, ``tune/runs/x``, ``start``), a base
    evaluation (``base/eval``, ``base-grpo_large/eval``), or the file itself (``wall.json``)."""
    parts = rel.parts
    if parts[0] == "start":  # the start run: one folder
        return Path(parts[0])
    if parts[0] in ("runs", "lab") or parts[0] == "base" or parts[0].startswith("base-"):
        return Path(*parts[:2]) if len(parts) > 2 else rel
    if parts[:2] == ("tune", "runs"):
        return Path(*parts[:3]) if len(parts) > 3 else rel
    return rel


def complete(folder: Path) -> bool:
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
        restored = [u.as_posix() for u in _install_lab(
            tar, {u: g for u, g in units.items() if u.parts[0] == "lab"}, out / "lab")]
        units = {u: g for u, g in units.items() if u.parts[0] != "lab"}
        for unit, group in sorted(units.items()):
            target = out / unit
            if target.exists() and (target.is_file() or complete(target)):
                continue
            if target.is_dir():
                shutil.rmtree(target)
            if len(group) == 1 and Path(group[0].name) == unit:  # a file: wall.json, …
                write_bytes_atomic(target, tar.extractfile(group[0]).read())
            else:  # a folder, whole or absent: written beside, then renamed
                tmp = target.with_name(f".{target.name}.restore")
                shutil.rmtree(tmp, ignore_errors=True)
                for m in group:
                    dest = tmp / Path(m.name).relative_to(unit)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(tar.extractfile(m).read())
                tmp.rename(target)
            restored.append(unit.as_posix())
    return restored


def _install_lab(tar: tarfile.TarFile, units: dict[Path, list[tarfile.TarInfo]],
                 kept: Path) -> list[Path]:
    """Put each packed lab model into the lab cache where it is missing; a cached build whose
    weights differ from the packed runs' is an error (the study would mix base models). Of a
    build too large to pack (its ``lab.json`` and digest only) that the cache lacks, the two
    files are kept in ``kept/<build>/``: a re-analysis republishes them without building it."""
    installed = []
    for unit, group in sorted(units.items()):
        files = {Path(m.name).name: m for m in group}
        want = tar.extractfile(files["model.sha256"]).read().decode().strip()
        target = cache_root() / unit.name
        if (target / WEIGHTS).exists():
            got = sha256(target / WEIGHTS)
            if got != want:
                raise ConfigError(
                    f"the lab model {target} differs from the one the packed runs started from "
                    f"(weights SHA-256 {got[:12]}… ≠ {want[:12]}…: built on another CPU); "
                    + ("move it away so the packed build is installed"
                       if WEIGHTS in files else "the packed runs cannot be continued here"))
            continue
        if WEIGHTS not in files:  # too large to pack: built here when a run needs it, its
            record = kept / unit.name  # digest checked then
            record.mkdir(parents=True, exist_ok=True)
            for name, m in files.items():
                write_bytes_atomic(record / name, tar.extractfile(m).read())
            continue
        tmp = target.with_name(f".{target.name}.restore")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, m in files.items():
            if name != "model.sha256":
                (tmp / name).write_bytes(tar.extractfile(m).read())
        if sha256(tmp / WEIGHTS) != want:
            shutil.rmtree(tmp)
            raise ValueError(f"the packed lab model {unit} does not match its own digest")
        tmp.rename(target)
        installed.append(unit)
    return installed
