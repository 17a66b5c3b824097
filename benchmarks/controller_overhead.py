"""Per-step time overhead of each exploration controller relative to plain GRPO on the lab.

    .venv/bin/python benchmarks/controller_overhead.py [--steps 20] [--reps 3]

Goals (issue 4): ≤ 2% for temperature, budgets and adaptive clip; ≤ 25% for EEPO. The
controllers' own bookkeeping is also timed directly (their hooks), since on the tiny lab model a
step's time is dominated by sampling noise; both figures are printed.
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
    args = p.parse_args()
    times = {k: [] for k in VARIANTS}
    hooks = {k: [] for k in VARIANTS}
    for _ in range(args.reps):
        for name, sets in VARIANTS.items():
            t, rows = step_times("recipes/lab/grpo.yaml", sets, args.steps)
            times[name] += t
            hooks[name] += [r["time/control_s"] for r in rows]
    print(f"machine: {machine()}")
    base = statistics.median(times["grpo"])
    for name in VARIANTS:
        m = statistics.median(times[name])
        h = statistics.median(hooks[name])
        print(f"{name:16s} {m * 1000:7.1f} ms/step  overhead {100 * (m / base - 1):+6.1f}%   "
              f"controller hooks {h * 1e6:7.1f} us/step ({100 * h / base:.3f}% of a GRPO step)")


if __name__ == "__main__":
    main()
