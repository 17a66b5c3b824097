"""Per-step CPU-time overhead vs GRPO of each method added by issue 18, on the lab.

    .venv/bin/python benchmarks/method_overhead.py [--steps 20] [--reps 2] [--threads 1]

Each method runs as its lab recipe (recipes/lab/<name>.yaml = grpo.yaml + the method), plus
variants that force a method's costly path where the recipe's first steps would skip it: the
entropy coefficient with a target above any entropy (the bonus, with its entropy pass, on every
step) and Knapsack budgets on a 16-prompt epoch (success rates known from step 3, bounds open).
Overheads are ratios of mean CPU seconds per step (this process and its verifier workers:
``_common.cpu_seconds``; a mean, as the clock ticks in 10 ms, a lab step's order of size), which
barely move with machine load, unlike wall-clock ratios; ``update`` is the median
``time/train_s`` (wall). Variants alternate within each repetition.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _common import machine, step_times

VARIANTS = {
    "grpo": ("grpo", []),
    "gspo": ("gspo", []),
    "cispo": ("cispo", []),
    "forking (rho 0.2)": ("forking", []),
    "passk (k 4)": ("passk", []),
    "entropy_shaping": ("entropy_shaping", []),
    "es_pi": ("es_pi", []),
    "entropic": ("entropic", []),
    "entropy_coef": ("entropy_coef", []),
    "entropy_coef (bonus on)": ("entropy_coef", ["control.entropy_coef.target=10.0",
                                                 "control.entropy_coef.init=0.001"]),
    "knapsack": ("knapsack", []),
    "knapsack (rates known)": ("knapsack", ["data.max_train_prompts=16", "control.budget.widen=8",
                                            "control.budget.n_min_limit=2"]),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cpu = {k: [] for k in VARIANTS}
    wall = {k: [] for k in VARIANTS}
    train = {k: [] for k in VARIANTS}
    for _ in range(args.reps):
        for name, (recipe, sets) in VARIANTS.items():
            t, rows = step_times(f"recipes/lab/{recipe}.yaml", sets, args.steps, cpu=cpu[name])
            wall[name] += t
            train[name] += [r["time/train_s"] for r in rows]
    print(f"machine: {machine()}")
    base = statistics.fmean(cpu["grpo"])
    print(f"{'method':24s} {'CPU ms/step':>12s} {'vs GRPO':>9s} {'wall ms/step':>13s} {'update ms':>10s}")
    for name in VARIANTS:
        c, w, u = statistics.fmean(cpu[name]), statistics.median(wall[name]), statistics.median(train[name])
        print(f"{name:24s} {c * 1000:12.1f} {100 * (c / base - 1):+8.1f}% {w * 1000:13.1f} {u * 1000:10.1f}")


if __name__ == "__main__":
    main()
