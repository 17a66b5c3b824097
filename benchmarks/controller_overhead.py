"""Per-step time overhead of each exploration controller relative to plain GRPO on the lab.

    .venv/bin/python benchmarks/controller_overhead.py [--steps 20] [--reps 3]

Goals: ≤ 2% for temperature, budgets and adaptive clip; ≤ 25% for EEPO. Overheads
are ratios of median *CPU* seconds per step (this process and its verifier workers), which
stay put on a loaded machine where wall-clock ratios swing; wall-clock figures are printed
beside them. The controllers' own bookkeeping is also timed directly (their hooks). Variants
alternate within each repetition, so a load change hits them all alike.
"""

from __future__ import annotations

import argparse
import statistics

from _common import machine, step_times

VARIANTS = {
    "grpo": [],
    "temperature": ["control.temperature.enabled=true"],
    "budget": ["control.budget.enabled=true", "data.max_train_prompts=400"],
    "adaptive": ["control.adaptive.enabled=true"],
    "eepo (gate on)": ["control.eepo.enabled=true", "control.eepo.alpha=100"],
    "eepo (gate off)": ["control.eepo.enabled=true", "control.eepo.alpha=0"],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition: it runs")
    args = p.parse_args()
    if args.smoke:
        args.steps, args.reps = 1, 1
    times = {k: [] for k in VARIANTS}
    cpu = {k: [] for k in VARIANTS}
    hooks = {k: [] for k in VARIANTS}
    for _ in range(args.reps):
        for name, sets in VARIANTS.items():
            t, rows = step_times("src/explorl/recipes/lab/grpo.yaml", sets, args.steps,
                                 cpu=cpu[name])
            times[name] += t
            hooks[name] += [r["time/control_s"] for r in rows]
    print(f"machine: {machine()}")
    base, base_cpu = statistics.median(times["grpo"]), statistics.median(cpu["grpo"])
    print(f"{'variant':16s} {'CPU ms/step':>12s} {'CPU overhead':>13s} {'wall ms/step':>13s} "
          f"{'wall overhead':>14s}  controller hooks")
    for name in VARIANTS:
        m, c, h = (
            statistics.median(times[name]),
            statistics.median(cpu[name]),
            statistics.median(hooks[name]),
        )
        print(
            f"{name:16s} {c * 1000:12.1f} {100 * (c / base_cpu - 1):+12.1f}% {m * 1000:13.1f} "
            f"{100 * (m / base - 1):+13.1f}%  {h * 1e6:7.1f} us/step "
            f"({100 * h / base:.3f}% of a GRPO step)"
        )


if __name__ == "__main__":
    main()
