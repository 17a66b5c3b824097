"""explorl's rollout-and-update loop vs TRL's GRPOTrainer, side by side (steps/s, figures only).

    .venv/bin/pip install 'trl==1.16.0'          # the `bench` extra: never a runtime dependency
    .venv/bin/python benchmarks/vs_trl.py [--reps 5] [--steps 20] [--warmup 3] [--threads 1]

Both sides train the same lab model (float32, CPU) on the lab's addition prompts with the same
settings: P prompts × G samples per step, ≤ 8 response tokens, temperature 1, lr 2e-5 constant,
one optimizer step per batch (no PPO epochs, no mini-batches), no KL term, clip 0.2, token-mean
loss, group-normalised advantages, grad-norm clip 1.0, the same addition verifier and the same
number of torch threads. TRL is configured fairly: ``use_cpu=True``, ``bf16=False``,
``gradient_checkpointing=False``, logging and saving off, its default (fused) AdamW. explorl
keeps its entropy metrics on (they come from the sampling pass).

Every measurement is a fresh subprocess; the sides alternate (A B A B …) so neither gets warmer
caches or a quieter stretch of a shared machine. Each run times ``--steps`` steps after
``--warmup`` steps; a repetition's figures are steps per wall second over those steps and steps
per CPU second of the process tree (less sensitive to other load on the machine). Printed per
size: median ± half-range of each side and of the per-repetition ratio, the generation share
of a step and peak memory; the last line is

    explorl/TRL steps-per-second ratio: <median at 8x8> (8x8), <median at 32x8> (32x8)

``--ref-src DIR`` adds a third side: explorl imported from another source tree (before/after).
Figures and the machine they were measured on: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LR = 2e-5
MAX_NEW = 8  # lab/grpo recipe: rollout.max_response_len


def peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its descendants (explorl's verifier workers)."""
    import psutil
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # exited meanwhile
            pass
    return total


def children_rss_mb() -> float:
    """Resident memory of this process's descendants now (explorl's verifier workers)."""
    import psutil
    total = 0
    for proc in psutil.Process().children(recursive=True):
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def stamp() -> tuple[float, float]:
    return time.perf_counter(), cpu_seconds()


def rates(ends: list[tuple[float, float]], warmup: int, gen: list[float]) -> dict:
    """Steps per wall second and per CPU second over the steps after warm-up."""
    steps = len(ends) - warmup
    (w0, c0), (w1, c1) = ends[warmup - 1], ends[-1]
    return {"steps_per_s": steps / (w1 - w0), "steps_per_cpu_s": steps / (c1 - c0),
            "gen_s": statistics.median(gen[warmup:]), "peak_rss_mb": peak_rss_mb(),
            "workers_rss_mb": children_rss_mb()}


def timed(fn, box: list):
    """Wrap ``fn`` so each call's wall time is appended to ``box``."""
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            box.append(time.perf_counter() - t0)
    return wrapper


def explorl_config(prompts: int, samples: int, steps: int, max_new: int = MAX_NEW):
    """The explorl run: the lab GRPO recipe at the benchmark's settings."""

    from explorl import validation
    return validation.load(
        "lab/grpo",
        [
            f"data.prompts_per_step={prompts}",
            f"rollout.n_samples={samples}",
            f"rollout.max_response_len={max_new}",
            f"optim.lr={LR:.1e}",
            "optim.mini_batches=1",
            "optim.ppo_epochs=1",
            f"optim.micro_batch_size={prompts * samples}",
            "optim.warmup_steps=0",
            "algorithm.kl_coef=0.0",
            "algorithm.agg=token-mean",
            "model.dtype=float32",
            "model.device=cpu",
            "eval.every=0",
            "log.progress=false",
            "log.plots=false",
            "log.checkpoint_every=0",
            "log.save_model=false",
        ],
        max_steps=steps,
    )


def run_explorl(prompts: int, samples: int, steps: int, warmup: int, src: str) -> dict:
    sys.path.insert(0, src)
    from explorl.training.loop import Trainer

    cfg = explorl_config(prompts, samples, warmup + steps)
    with tempfile.TemporaryDirectory() as out:
        t = Trainer(cfg, out)
        gen: list[float] = []
        t.engine.generate = timed(t.engine.generate, gen)
        ends = []
        for _ in range(warmup + steps):
            row = t.train_step()
            t.outputs.log(row)  # what ``Trainer.train`` does per step, minus the progress bar
            ends.append(stamp())
        assert "entropy/mean" in row
        t.outputs.close()
        t.pool.close()
    return rates(ends, warmup, gen)


def trl_trainer(
    prompts: int,
    samples: int,
    steps: int,
    out: str,
    callbacks: list,
    max_new: int = MAX_NEW,
    min_new: int | None = None,
):
    """TRL's ``GRPOTrainer`` on the same model, prompts and settings as ``explorl_config``.

    ``min_new``: no EOS before this many tokens (``min_new_tokens``), to force response lengths.
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from explorl.data.sources import load_split
    from explorl.models import load_tokenizer, resolve_model_path
    from explorl.rewards import VERIFIERS

    cfg = explorl_config(
        prompts, samples, steps, max_new
    )  # the same model and prompts as explorl's run
    path = resolve_model_path(cfg.model.path, cfg.lab)
    tok = load_tokenizer(path, cfg.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    train = load_split(cfg.data.train, cfg, "train")
    data = Dataset.from_list([{"prompt": r.prompt, "ground_truth": r.ground_truth} for r in train])
    verify = VERIFIERS["addition"]

    def addition_reward(completions, ground_truth, **kwargs):
        return [verify(c, g) for c, g in zip(completions, ground_truth)]

    args = GRPOConfig(
        output_dir=out,
        max_steps=steps,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=prompts * samples,
        gradient_accumulation_steps=1,
        num_generations=samples,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=max_new,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        disable_dropout=True,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
        generation_kwargs={"min_new_tokens": min_new} if min_new else None,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=addition_reward, args=args, train_dataset=data,
                          processing_class=tok, callbacks=callbacks)
    return trainer, model


def run_trl(prompts: int, samples: int, steps: int, warmup: int, src: str) -> dict:
    from transformers import TrainerCallback

    sys.path.insert(0, src)
    ends: list[tuple[float, float]] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(stamp())

    with tempfile.TemporaryDirectory() as out:
        trainer, model = trl_trainer(prompts, samples, warmup + steps, out, [StepClock()])
        gen: list[float] = []
        model.generate = timed(model.generate, gen)
        trainer.train()
    return rates(ends, warmup, gen)


def worker(spec: dict) -> None:
    import torch
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    run = run_trl if spec["side"] == "trl" else run_explorl
    res = run(spec["prompts"], spec["samples"], spec["steps"], spec["warmup"], spec["src"])
    print("RESULT " + json.dumps(res), flush=True)


def measure(side: str, prompts: int, samples: int, args) -> dict:
    src = args.ref_src if side == "explorl-ref" else str(ROOT / "src")
    spec = dict(side=side, prompts=prompts, samples=samples, steps=args.steps, warmup=args.warmup,
                threads=args.threads, src=str(Path(src).resolve()))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=ROOT,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{side} worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def spread(xs: list[float]) -> str:
    """median ± half the range, and the half-range as a percentage of the median."""
    med = statistics.median(xs)
    half = (max(xs) - min(xs)) / 2
    return f"{med:6.2f} ± {half:4.2f} (±{100 * half / med:3.0f}%)"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=5, help="alternating A/B repetitions per size")
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads on both sides (1: on a shared 2-core machine, 2 threads make OpenMP "
        "barriers wait on descheduled threads and every step many times slower)",
    )
    p.add_argument("--sizes", nargs="+", default=["8x8", "32x8"], help="PROMPTSxSAMPLES per step")
    p.add_argument(
        "--ref-src",
        help="also time explorl from this source tree (e.g. an older commit's src/), "
        "as a third side 'explorl-ref'",
    )
    p.add_argument("--smoke", action="store_true",
                   help="2x2, one repetition of one warm-up and one timed step: the script runs")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.smoke:
        args.reps, args.steps, args.warmup, args.sizes = 1, 1, 1, ["2x2"]

    import platform

    import torch
    import transformers
    try:
        import trl
    except ImportError:  # the `bench` extra is missing: explorl's side only
        trl = None
    sides = ["explorl"] + (["trl"] if trl else []) + (["explorl-ref"] if args.ref_src else [])
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average "
        f"{os.getloadavg()[0]:.1f} at start; python {platform.python_version()}, "
        f"torch {torch.__version__}, "
        f"transformers {transformers.__version__}, "
        f"{f'trl {trl.__version__}' if trl else 'trl not installed (its side skipped)'}; "
        f"{args.threads} torch thread(s) per side"
    )
    print(
        f"{args.reps} alternating repetitions of {' / '.join(sides)}, each {args.warmup} warm-up + "
        f"{args.steps} timed steps in a fresh process"
    )
    medians = {}
    for size in args.sizes:
        P, G = (int(x) for x in size.split("x"))
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        for rep in range(args.reps):
            for side in sides:
                r = measure(side, P, G, args)
                runs[side].append(r)
                print(
                    f"  {size} rep {rep + 1} {side:11s} {r['steps_per_s']:6.2f} steps/s  "
                    f"{r['steps_per_cpu_s']:6.2f} steps/CPU-s  "
                    f"generate {r['gen_s'] * 1000:5.1f} ms/step  "
                    f"peak RSS {r['peak_rss_mb']:4.0f} MB  (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        print(
            f"{size} ({P} prompts x {G} samples = {P * G} responses per step, "
            f"median ± half-range over reps):"
        )
        for side in sides:
            rs = runs[side]
            gen_share = statistics.median(r["gen_s"] * r["steps_per_s"] for r in rs)
            print(f"  {side:11s} steps/s {spread([r['steps_per_s'] for r in rs])}   "
                  f"steps/CPU-s {spread([r['steps_per_cpu_s'] for r in rs])}   "
                  f"generation {100 * gen_share:3.0f}% of a step   "
                  f"peak RSS {max(r['peak_rss_mb'] for r in rs):4.0f} MB"
                  f" (+{max(r['workers_rss_mb'] for r in rs):3.0f} MB in subprocesses)")
        for other in sides[1:]:
            wall = [
                e["steps_per_s"] / o["steps_per_s"] for e, o in zip(runs["explorl"], runs[other])
            ]
            cpu = [
                e["steps_per_cpu_s"] / o["steps_per_cpu_s"]
                for e, o in zip(runs["explorl"], runs[other])
            ]
            if other == "trl":
                medians[size] = statistics.median(wall)
            print(
                f"  explorl/{other} steps/s ratio {spread(wall)} "
                f"(per rep: {', '.join(f'{x:.2f}' for x in wall)})"
                f";  per CPU-second {spread(cpu)}"
            )
    if medians:
        print("explorl/TRL steps-per-second ratio: "
              + ", ".join(f"{medians[s]:.2f} ({s})" for s in args.sizes))


if __name__ == "__main__":
    main()
