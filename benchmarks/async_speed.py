"""Per-step wall-clock of a recipe run synchronously and with asynchronous rollouts
(``rollout.async``, max_staleness 1), side by side, and their ratio (figures, not assertions).

    .venv/bin/python benchmarks/async_speed.py [--recipe quickstart] [--steps 20] [--seeds 1]

Each setup runs in this process, one after the other, after warm-up steps; the ratio is the
median async step over the median synchronous step. Also printed: the sampler's and the
trainer's idle seconds per step and, for contrast, the async run without the π_prox recompute
(``algorithm.old_logp: sampler``: the clip on π_θ/μ, ALGORITHMS §8). On a shared machine the
wall-clock swings with the load: the script prints the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics

from _common import machine, step_times

RECIPES = {"quickstart": "src/explorl/recipes/quickstart.yaml",
           "lab/grpo": "src/explorl/recipes/lab/grpo.yaml"}
ASYNC = ["rollout.async.enabled=true", "rollout.async.max_staleness=1"]
SETUPS = {"sync": [], "async s=1": ASYNC,
          "async s=1, old_logp sampler": [*ASYNC, "algorithm.old_logp=sampler"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--recipe", choices=sorted(RECIPES), action="append")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seeds", type=int, default=1, help="repetitions (seed 0, 1, …) per setup")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition: it runs")
    args = p.parse_args()
    recipes = args.recipe or ["quickstart", "lab/grpo"]
    warmup = 2
    if args.smoke:
        recipes, args.steps, args.seeds, warmup = ["quickstart"], 2, 1, 1
    print(f"machine: {machine()}; {os.cpu_count()} cores; load average {os.getloadavg()}")
    for name in recipes:
        med: dict[str, float] = {}
        for setup, sets in SETUPS.items():
            times, rows = [], []
            for seed in range(args.seeds):
                t, r = step_times(RECIPES[name], [*sets, f"seed={seed}"], args.steps,
                                  warmup=warmup)
                times += t
                rows += r
            med[setup] = statistics.median(times)
            idle = ""
            if "time/trainer_idle_s" in rows[0]:
                waits = [statistics.median(r[f"time/{who}_idle_s"] for r in rows) * 1000
                         for who in ("trainer", "sampler")]
                idle = f"; idle per step: trainer {waits[0]:.0f} ms, sampler {waits[1]:.0f} ms"
            gen = statistics.median(r["time/generate_s"] + r["time/score_s"] for r in rows)
            train = statistics.median(r["time/train_s"] + r.get("time/old_logp_s", 0.0)
                                      for r in rows)
            print(f"{name:10s} {setup:28s} {med[setup] * 1000:7.1f} ms/step (median of "
                  f"{len(times)}; sample+score {gen * 1000:.0f} ms, update {train * 1000:.0f} ms"
                  f"{idle})")
        for setup in list(SETUPS)[1:]:
            print(f"{name:10s} {setup:28s} ratio to sync: {med[setup] / med['sync']:.2f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
