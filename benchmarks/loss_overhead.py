"""Per-step time of each policy loss relative to `ppo` on the lab (figures, not assertions).

    .venv/bin/python benchmarks/loss_overhead.py [--steps 20]

Runs are interleaved (ppo, clip_cov, kl_cov, ppo, ...) so machine noise hits all alike.
"""

from __future__ import annotations

import argparse
import statistics

from _common import machine, step_times

LOSSES = {
    "ppo": [],
    "clip_cov": [
        "algorithm.loss=clip_cov",
        "algorithm.clip_cov_ratio=0.02",
        "algorithm.clip_cov_lb=0.1",
    ],
    "kl_cov": ["algorithm.loss=kl_cov", "algorithm.kl_cov_ratio=0.02"],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition: it runs")
    args = p.parse_args()
    if args.smoke:
        args.steps, args.reps = 1, 1
    train = {k: [] for k in LOSSES}
    step = {k: [] for k in LOSSES}
    for _ in range(args.reps):
        for name, sets in LOSSES.items():
            times, rows = step_times("src/explorl/recipes/lab/grpo.yaml", sets, args.steps)
            step[name] += times
            train[name] += [r["time/train_s"] for r in rows]
    print(f"machine: {machine()}")
    base_step, base_train = statistics.median(step["ppo"]), statistics.median(train["ppo"])
    for name in LOSSES:
        s, t = statistics.median(step[name]), statistics.median(train[name])
        print(f"{name:9s} step {s * 1000:6.1f} ms ({s / base_step:5.2f}x ppo)   "
              f"update {t * 1000:6.1f} ms ({t / base_train:5.2f}x ppo)")


if __name__ == "__main__":
    main()
