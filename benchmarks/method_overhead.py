"""Per-step CPU-time overhead vs GRPO of each method of the wider field, on the lab.

    .venv/bin/python benchmarks/method_overhead.py [--steps 20] [--reps 2] [--threads 1]

Each method runs as its lab recipe (lab/<name>.yaml = grpo.yaml + the method), plus
variants that force a method's costly path where the recipe's first steps would skip it: the
entropy coefficient with a target above any entropy (the bonus, with its entropy pass, on every
step) and Knapsack budgets on a 16-prompt epoch (success rates known from step 3, bounds open).
Overheads are ratios of mean CPU seconds per step (this process and its verifier workers:
``_common.cpu_seconds``; a mean, as the clock ticks in 10 ms, a lab step's order of size), which
barely move with machine load, unlike wall-clock ratios; ``update`` is the median
``time/train_s`` (wall). Variants alternate within each repetition.

Whole-step ratios cannot resolve a few percent on the lab (their run-to-run spread is ~±10%), so
the script also times each method's added math alone on a lab-sized step (64 responses × 8
tokens, 2 mini-batches): µs per training step, beside GRPO's (the estimator and a PPO
forward + backward of the loss on the same tensors).
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from types import SimpleNamespace

import torch
from _common import machine, step_times

from explorl.algorithms import (
    compute_advantages,
    entropic_confident_term,
    entropy_advantage_shaping,
    forking_token_mask,
    knapsack_budgets,
)
from explorl.algorithms.losses import LOSSES

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


def components(n: int = 64, t: int = 8, repeat: int = 200) -> dict[str, float]:
    """µs per lab step of each method's own computation (2 mini-batches of n/2 responses)."""
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(n, t, generator=g) < 0.8
    ent = torch.rand(n, t, generator=g) * 2
    old = -torch.rand(n, t, generator=g)
    reward = (torch.rand(n, generator=g) < 0.5).float()
    group = torch.arange(n) // 8
    adv = compute_advantages("grpo", reward, group)[0]
    cfg = SimpleNamespace(eps_low=0.2, eps_high=0.2, clip_c=None, agg="seq-mean-token-mean",
                          cispo_w_max=1.2, cispo_mask=False)
    half = [torch.arange(n // 2), torch.arange(n // 2, n)]

    def loss(name):
        def run():
            for rows in half:
                logp = (old[rows] + 0.01).requires_grad_()
                per_tok, _ = LOSSES[name](logp, old[rows], adv[rows], mask[rows], cfg)
                per_tok.sum().backward()
        return run

    def entropic():
        for rows in half:
            logp = (old[rows] + 0.01).requires_grad_()
            term, _ = entropic_confident_term(logp, old[rows], adv[rows], mask[rows],
                                              confident=old[rows].exp() > 0.95)
            term.backward()

    rates = [0.0, 0.25, 0.5, 1.0, None, 0.125, 0.875, 0.5]
    work = {
        "grpo: advantages": lambda: compute_advantages("grpo", reward, group),
        "grpo: ppo loss fwd+bwd": loss("ppo"),
        "gspo loss fwd+bwd": loss("gspo"),
        "cispo loss fwd+bwd": loss("cispo"),
        "passk advantages (k 4)": lambda: compute_advantages("passk_training", reward, group, k=4),
        "forking mask": lambda: [forking_token_mask(ent[r], mask[r], 0.2) for r in half],
        "entropy shaping": lambda: entropy_advantage_shaping(adv, ent, mask, 0.4, 2.0),
        "entropic term fwd+bwd": entropic,
        "knapsack budgets": lambda: knapsack_budgets(rates, 8, 4, 12, 0.9),
    }
    return {k: min(timeit.repeat(f, number=repeat // 10, repeat=10)) / (repeat // 10) * 1e6
            for k, f in work.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--components-only", action="store_true", help="skip the training runs")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition: it runs")
    args = p.parse_args()
    if args.smoke:
        args.steps, args.reps = 1, 1
    torch.set_num_threads(args.threads)
    if args.components_only:
        for name, us in components().items():
            print(f"{name:32s} {us:8.1f} µs/step")
        return
    cpu = {k: [] for k in VARIANTS}
    wall = {k: [] for k in VARIANTS}
    train = {k: [] for k in VARIANTS}
    for _ in range(args.reps):
        for name, (recipe, sets) in VARIANTS.items():
            t, rows = step_times(f"src/explorl/recipes/lab/{recipe}.yaml", sets, args.steps,
                                 cpu=cpu[name])
            wall[name] += t
            train[name] += [r["time/train_s"] for r in rows]
    print(f"machine: {machine()}")
    base = statistics.fmean(cpu["grpo"])
    print(f"{'method':24s} {'CPU ms/step':>12s} {'vs GRPO':>9s} {'wall ms/step':>13s} "
          f"{'update ms':>10s}")
    for name in VARIANTS:
        c = statistics.fmean(cpu[name])
        w, u = statistics.median(wall[name]), statistics.median(train[name])
        print(f"{name:24s} {c * 1000:12.1f} {100 * (c / base - 1):+8.1f}% {w * 1000:13.1f} "
              f"{u * 1000:10.1f}")
    print(f"\n{'computation alone (lab step)':32s} {'µs/step':>8s} {'of a GRPO step':>15s}")
    for name, us in components(repeat=10 if args.smoke else 200).items():
        print(f"{name:32s} {us:8.1f} {100 * us / (base * 1e6):14.2f}%")


if __name__ == "__main__":
    main()
