"""explorl's GPU check: one prepared command for a one-GPU machine that proves the CUDA path.

    make gpu-check                                # on the GPU machine (~6–8 min on one H100)
    python benchmarks/gpu_check.py --budget-s 420 --out results/
    python benchmarks/gpu_check.py --smoke        # CPU, tiny lab model: the script runs
    python benchmarks/gpu_check.py --build-only   # build the lab models it needs, then stop

Sections, in this order, each printed (and appended to ``<out>/gpu_check.jsonl``) as soon as it
finishes, so a run cut off by a time limit still shows what it measured:

1. **recipes**: every built-in lab recipe (and the quickstart) trains 3 steps on CUDA in this one
   process through ``explorl.train``, with a validation pass at step 3: pass, or FAIL with the
   error and where it was raised.
2. **resume**: ``lab/combined`` (every controller of the four papers) 6 steps straight vs 3
   steps, a stop, and a resume for the other 3: the metrics of steps 4–6 compared; a second
   straight run measures what the GPU's own run-to-run nondeterminism gives (atomics in some
   backward kernels), so a difference can be told apart from a resume bug.
3. **lora**: ``explorl train lab/grpo_lora``, ``explorl eval`` and ``explorl export`` on CUDA
   through the command line, each a fresh process.
4. **sampling**: ``gpu_sampling.py --check --profile``: the static decode path against the eager
   loop (same tokens on small models with EOS; tokens/s beside the decode floor at 16 and 64 ×
   8 × 256; the profiler's top ops per path), with up to 40% of what is left.
5. **update**: ``gpu_update.py --profile``: one update at the Qwen2.5-0.5B shape, 16 and 64 × 8
   × 256, with and without the fused log-probs and the packed layouts (varlen where flash-attn
   imports): time, peak memory, MFU (the formula in that script) and the profiler's device time
   per kernel family, with up to 35% of what is left.
6. **acceptance**: ``gpu_acceptance.py`` (bf16 master weights, explorl vs TRL per cell, the
   sampler, a LoRA step's memory) with what is left of ``--budget-s``.

On a machine without internet, two things travel with the checkout: the lab models (build them
here with ``EXPLORL_LAB_CACHE=.labcache python benchmarks/gpu_check.py --build-only`` and carry
``.labcache``), and the wheels of the packages the GPU image lacks (TRL's side and explorl's
own requirements: ``trl``, ``datasets``, ``math-verify`` and their small dependencies). There:

    pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site EXPLORL_LAB_CACHE=.labcache make gpu-check

Results and their machine and date: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECTIONS = ("recipes", "resume", "lora", "sampling", "update", "acceptance")
RESUME_RECIPE = "lab/combined"
LORA_RECIPE = "lab/grpo_lora"
# what a section needs at least, in seconds on an H100, to be started (else skipped, saying so)
MIN_S = {"recipes": 60, "resume": 40, "lora": 40, "sampling": 60, "update": 60,
         "acceptance": 60}
# The smoke run's lab model: 1-digit addition, trained for seconds (the tests' tiny model).
TINY_LAB = {"n_train": 30, "n_val": 10, "n_test": 10, "params": {"max_digits": 1}}
TINY_BUILD = dict(size="tiny", max_digits=1, n_train=30, n_val=10, n_test=10, max_steps=100,
                  check_every=1000, hidden_size=64, num_layers=2, intermediate_size=128,
                  num_heads=2)
# The tool recipes' smoke model: the multiply task's own alphabet has the tool-call markers.
TOOL_RECIPES = ("lab/tools", "lab/arpo", "lab/aepo")
TINY_TOOL_LAB = {"n_train": 64, "n_val": 16, "n_test": 16,
                 "params": {"a_digits": 2, "b_digits": 1, "tool_frac": 0.5}}


class Report:
    """Prints each result line now and appends it to ``<out>/gpu_check.jsonl``."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "gpu_check.jsonl"
        self.start = time.monotonic()

    def line(self, section: str, text: str, **fields) -> None:
        print(f"[{time.monotonic() - self.start:6.1f}s] {section}: {text}", flush=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"section": section, "text": text, **fields}) + "\n")


def _where(exc: BaseException) -> str:
    """``ExcType: message`` and the innermost explorl frame that raised it."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "explorl" in f.filename]
    at = ""
    if frames:
        f = frames[-1]
        at = f" at {Path(f.filename).relative_to(Path(f.filename).parents[2])}:{f.lineno}"
    msg = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {msg}{at}"


def lab_recipes() -> list[str]:
    from explorl.config import builtin

    return ["quickstart"] + [n for n in builtin.names("recipe") if n.startswith("lab/")]


def run_overrides(device: str, smoke: bool, steps: int, name: str = "") -> dict:
    """What the check sets on every recipe: the device, a few steps, a small validation pass,
    no checkpoints or plots (the methods, batch sizes and lengths stay the recipe's)."""
    o = {"model.device": device, "max_steps": steps, "log.checkpoint_every": 0,
         "log.plots": False, "log.progress": False, "eval.every": steps,
         "eval.n_samples": 4, "eval.k": [1, 4], "eval.max_problems": 16}
    if smoke:
        from explorl.lab import lab_model_path

        o.update({"model.path": str(lab_model_path("addition", **TINY_BUILD)),
                  "lab": dict(TINY_LAB), "data.prompts_per_step": 2, "rollout.n_samples": 4,
                  "rollout.max_response_len": 6, "eval.max_problems": 4, "eval.every": 0,
                  "data.max_train_prompts": None, "reward.num_workers": 1})
        if name in TOOL_RECIPES:
            o.update({"model.path": str(lab_model_path(
                "multiply", size="tiny", **TINY_TOOL_LAB["params"],
                **{k: v for k, v in TINY_TOOL_LAB.items() if k != "params"})),
                "lab": dict(TINY_TOOL_LAB), "rollout.max_response_len": 24})
    return o


def _peak_gb(device: str) -> float:
    import torch

    if device != "cuda":
        return 0.0
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return peak


def check_recipes(rep: Report, work: Path, device: str, smoke: bool, deadline: float) -> None:
    import explorl

    names = lab_recipes()
    steps = 1 if smoke else 3
    passed = 0
    for i, name in enumerate(names):
        if time.monotonic() > deadline:
            rep.line("recipes", f"{len(names) - i} recipes not run: the budget is spent "
                     f"({', '.join(names[i:])})", skipped=names[i:])
            break
        t0 = time.monotonic()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                summary = explorl.train(name, out=work / name.replace("/", "_"),
                                        overrides=run_overrides(device, smoke, steps, name),
                                        force=True)
            ok = summary.get("steps") == steps
            status = "pass" if ok else f"FAIL: ran {summary.get('steps')} of {steps} steps"
        except Exception as e:  # noqa: BLE001 - every failure is a result to report
            ok, status = False, "FAIL: " + _where(e)
        passed += ok
        rep.line("recipes", f"{name:<22} {status} ({time.monotonic() - t0:.1f} s, "
                 f"peak {_peak_gb(device):.2f} GB)", recipe=name, ok=ok)
    rep.line("recipes", f"{passed} of {len(names)} recipes passed", passed=passed,
             total=len(names))


def _stripped(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _max_diff(a: list[dict], b: list[dict]) -> tuple[float, str]:
    """Largest |a − b| over the numeric metrics of matching rows, and its key."""
    worst, key = 0.0, ""
    for ra, rb in zip(a, b):
        for k in ra.keys() | rb.keys():
            x, y = ra.get(k), rb.get(k)
            if isinstance(x, (int, float)) and isinstance(y, (int, float)):
                d = abs(x - y) if math.isfinite(x) and math.isfinite(y) else float(x != y)
                if d > worst:
                    worst, key = d, k
            elif x != y:
                return math.inf, k
    if len(a) != len(b):
        return math.inf, "rows"
    return worst, key


def check_resume(rep: Report, work: Path, device: str, smoke: bool) -> None:
    from explorl import validation
    from explorl.config import set_path, to_dict
    from explorl.outputs.runlog import read_metrics
    from explorl.training.loop import Trainer

    cfg = to_dict(validation.load(RESUME_RECIPE, env=False))
    for k, v in {**run_overrides(device, smoke, 6), "eval.every": 0}.items():
        set_path(cfg, k, v)
    cfg = validation.from_dict(cfg)

    def straight(name: str) -> list[dict]:
        with contextlib.redirect_stdout(io.StringIO()):
            Trainer(cfg, work / name).train()
        return _stripped(read_metrics(work / name))

    t0 = time.monotonic()
    try:
        ref = straight("resume_a")
        with contextlib.redirect_stdout(io.StringIO()):
            t = Trainer(cfg, work / "resume_b")
            step = t.train_step

            def step_then_stop():  # a stop request arriving during step 3 (Ctrl-C, a signal)
                out = step()
                if t.step >= 3:
                    t._stop = True
                return out

            t.train_step = step_then_stop
            t.train()
            Trainer(cfg, work / "resume_b", resume=True).train()
        resumed = _stripped(read_metrics(work / "resume_b"))
        noise, noise_key = _max_diff(ref, straight("resume_c"))
    except Exception as e:  # noqa: BLE001
        rep.line("resume", f"{RESUME_RECIPE} FAIL: {_where(e)}", ok=False)
        return
    diff, key = _max_diff(ref, resumed)
    exact = diff == 0.0
    ok = exact or diff <= noise
    verdict = ("pass: bit-equal" if exact else
               f"pass: within the GPU's run-to-run noise (largest {diff:.3g} at {key})" if ok else
               f"FAIL: largest difference {diff:.3g} at {key}, above the run-to-run "
               f"{noise:.3g}")
    rep.line("resume", f"{RESUME_RECIPE}, 6 steps vs 3 + resume 3: {verdict}; two straight runs "
             f"differ by {noise:.3g}{f' at {noise_key}' if noise else ''} "
             f"({time.monotonic() - t0:.1f} s)", ok=ok, diff=diff, noise=noise, key=key)


def _cli(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "explorl", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout, check=False)


def check_lora(rep: Report, work: Path, device: str, smoke: bool, deadline: float) -> None:
    run, ev, exp = work / "lora_run", work / "lora_eval", work / "lora_export"
    sets = [a for k, v in run_overrides(device, smoke, 3).items()
            for a in ("--set", f"{k}={json.dumps(v)}")]
    steps = [
        ("train", ["train", LORA_RECIPE, "--out", str(run), "--force", *sets]),
        ("eval", ["eval", str(run), "--data", "lab:addition", "--n", "4", "--k", "1", "4",
                  "--max-problems", "16", "--out", str(ev), "--set", f"model.device={device}"]
         + (["--set", f"lab={json.dumps(TINY_LAB)}"] if smoke else [])),
        ("export", ["export", str(run), "--out", str(exp), "--force"]),
    ]
    for name, args in steps:
        t0 = time.monotonic()
        try:
            proc = _cli(args, timeout=max(10.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rep.line("lora", f"{name} FAIL: stopped at the end of the budget", ok=False)
            return
        if proc.returncode != 0:
            err = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
            rep.line("lora", f"{name} FAIL (exit {proc.returncode}): {err}", ok=False)
            return
        detail = ""
        if name == "eval" and (ev / "eval.json").is_file():
            e = json.loads((ev / "eval.json").read_text()).get("overall", {})
            detail = ", " + ", ".join(f"{k} {v:.3f}" for k, v in e.items()
                                      if k.startswith("pass@") and isinstance(v, float))
        if name == "export":
            detail = f", {sum(1 for _ in exp.iterdir())} files in the exported model"
        rep.line("lora", f"{name} pass ({time.monotonic() - t0:.1f} s{detail})", ok=True)


def check_acceptance(rep: Report, out: Path, smoke: bool, deadline: float, cells) -> None:
    left = deadline - time.monotonic()
    args = [sys.executable, str(HERE / "gpu_acceptance.py"), "--out",
            str(out / "gpu_acceptance.jsonl")]
    args += ["--smoke"] if smoke else ["--budget-s", f"{left:.0f}"]
    if cells:
        args += ["--cells", *cells]
    rep.line("acceptance", f"gpu_acceptance.py with {left:.0f} s left; its rows follow")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(args, env=env, cwd=ROOT, check=False,
                          timeout=None if smoke else left + 30)
    rep.line("acceptance", f"gpu_acceptance.py exit {proc.returncode}",
             ok=proc.returncode == 0)


def check_sampling(rep: Report, out: Path, smoke: bool, end: float) -> None:
    left = end - time.monotonic()
    args = [sys.executable, str(HERE / "gpu_sampling.py"), "--out",
            str(out / "gpu_sampling.jsonl"), "--profile", str(out / "gpu_sampling_profile.txt")]
    # --check on a CPU takes minutes (small models, every temperature): the smoke skips it
    args += ["--smoke"] if smoke else ["--check", "--budget-s", f"{max(30.0, left - 20):.0f}"]
    rep.line("sampling", f"gpu_sampling.py with {left:.0f} s; its rows follow")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run(args, env=env, cwd=ROOT, check=False,
                              timeout=None if smoke else left + 10)
        rep.line("sampling", f"gpu_sampling.py exit {proc.returncode}", ok=proc.returncode == 0)
    except subprocess.TimeoutExpired:
        rep.line("sampling", "gpu_sampling.py stopped at the end of its share", ok=False)


def check_update(rep: Report, out: Path, smoke: bool, end: float) -> None:
    left = end - time.monotonic()
    args = [sys.executable, str(HERE / "gpu_update.py"), "--out", str(out / "gpu_update.jsonl"),
            "--profile", str(out / "gpu_update_profile.txt")]
    args += ["--smoke"] if smoke else ["--budget-s", f"{max(30.0, left - 30):.0f}"]
    rep.line("update", f"gpu_update.py with {left:.0f} s; its rows follow")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run(args, env=env, cwd=ROOT, check=False,
                              timeout=None if smoke else left + 10)
        rep.line("update", f"gpu_update.py exit {proc.returncode}", ok=proc.returncode == 0)
    except subprocess.TimeoutExpired:
        rep.line("update", "gpu_update.py stopped at the end of its share", ok=False)


def build_models(smoke: bool) -> None:
    """Every lab model the check trains, built (once) into the lab cache."""
    from explorl import validation
    from explorl.lab import lab_model_path
    from explorl.models import resolve_model_path

    if smoke:
        lab_model_path("addition", **TINY_BUILD)
        return
    for name in lab_recipes():
        cfg = validation.load(name, env=False)
        print(f"{name}: {resolve_model_path(cfg.model.path, cfg.lab)}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, the tiny lab model, 1 step each")
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="seconds for the whole check (default 480)")
    p.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu_check",
                   help="results folder (default $OUT, else runs/gpu_check)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, help="these sections only")
    p.add_argument("--cells", nargs="+", help="gpu_acceptance.py's cells (default its own)")
    p.add_argument("--build-only", action="store_true",
                   help="build the lab models the check trains, then stop")
    args = p.parse_args()
    sys.path[:0] = [str(ROOT / "src"), str(HERE)]
    deadline = time.monotonic() + args.budget_s
    if args.build_only:
        return build_models(args.smoke)
    import torch
    import transformers

    if not args.smoke and not torch.cuda.is_available():
        sys.exit("gpu_check.py needs a CUDA GPU (or --smoke, to check the script on a CPU)")
    device = "cpu" if args.smoke else "cuda"
    out = Path(args.out)
    rep = Report(out)
    versions = {m: __import__(m).__version__ for m in ("torch", "transformers")}
    for m in ("accelerate", "peft", "trl", "datasets", "math_verify"):
        try:
            versions[m] = getattr(__import__(m), "__version__", "?")
        except ImportError:
            versions[m] = "not installed"
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU (--smoke)"
    rep.line("machine", f"{gpu}; {datetime.date.today()}; "
             + ", ".join(f"{k} {v}" for k, v in versions.items()), **versions)
    del transformers
    if args.smoke:
        build_models(True)
    sections = args.only or SECTIONS
    with tempfile.TemporaryDirectory(prefix="explorl-gpu-check-") as tmp:
        work = Path(tmp)
        for name in sections:
            left = deadline - time.monotonic()
            if not args.smoke and left < MIN_S[name]:
                rep.line(name, f"skipped: {left:.0f} s left of --budget-s, it needs "
                         f"~{MIN_S[name]} s", skipped=True)
                continue
            share = {"recipes": 0.45, "lora": 0.5, "sampling": 0.4, "update": 0.35}.get(name, 1.0)
            end = time.monotonic() + left * share
            if name == "recipes":
                check_recipes(rep, work, device, args.smoke, end)
            elif name == "resume":
                check_resume(rep, work, device, args.smoke)
            elif name == "lora":
                check_lora(rep, work, device, args.smoke, end)
            elif name == "sampling":
                check_sampling(rep, out, args.smoke, end)
            elif name == "update":
                check_update(rep, out, args.smoke, end)
            else:
                check_acceptance(rep, out, args.smoke, deadline, args.cells)
    rep.line("done", f"results in {rep.path}")


if __name__ == "__main__":
    main()
