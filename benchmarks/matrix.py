"""explorl vs TRL's GRPOTrainer over prompts per step × response length, in CPU time, with each
step's FLOP floor (figures only, no assertions).

    .venv/bin/pip install 'trl==1.16.0'           # the `bench` extra; torch stays as it is
    .venv/bin/python benchmarks/matrix.py          # 8 and 32 prompts × length 8 and 32 (~6 min)
    .venv/bin/python benchmarks/matrix.py --full   # 8/16/32/64 prompts × length 8/32/64, 3 reps
    .venv/bin/python benchmarks/matrix.py --quickstart [--ref-src DIR]  # the quickstart recipe

A cell is P prompts × 8 samples per step with every response exactly R tokens long: both sides
forbid EOS before R tokens (TRL through ``min_new_tokens``, explorl through a hook on the
sampling forward's output layer; the loss pass does not use that layer's forward) and stop at
R. Everything else is ``vs_trl.py``'s setting, judged fair there: the lab addition model and
prompts, lr 2e-5 constant, one optimizer step per batch, no KL, clip 0.2, token-mean loss,
grad clip 1.0, float32, one torch thread on both sides, TRL's default fused AdamW, explorl's
defaults (fused AdamW on CPU as well since the fourth pass; ``optim.fused``).

Method. The machine this was written on is shared (2 cores, load 5–10), so wall-clock is
meaningless: every figure is CPU time (user + system, with explorl's verifier workers) per
step, after warm-up steps, each run a fresh process with one torch thread, and the sides
alternate (explorl, TRL, explorl, TRL, …) so both see the same stretches of load. Per cell:
min / median / max over repetitions of each side's median step, and of the per-repetition
ratio TRL / explorl (> 1: explorl is faster); peak RSS of the training process.

FLOP floor. The matmul FLOPs a step cannot avoid, on explorl's own samples: sampling encodes
each distinct prompt once and feeds each generated token once (projections, attention over
its context, the output layer where a distribution is needed); each optimizer step runs the
forward and backward (3× the forward's matmuls) over its mini-batch, each prompt once per
mini-batch, each response token once. Elementwise work (norms, softmax, AdamW) counts as free.
The floor's time divides these FLOPs by this machine's single-thread matmul rate measured in
the same process right after the timed steps, at the model's own weight shapes and the step's
row counts (decode: one row per response; training: the tokens of a mini-batch), best of 5.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = 8
QUICKSTART = "src/explorl/recipes/quickstart.yaml"
"""The quickstart recipe, relative to ROOT (a file every source tree of --ref-src can read)."""


# ------------------------------------------------------------------------------- FLOPs


def model_dims(model) -> dict:
    """Sizes the FLOP count needs, read from the model itself (any Llama-like causal LM)."""
    import torch

    cfg = model.config
    layers = model.get_decoder().layers if hasattr(model, "get_decoder") else model.model.layers
    shapes = [tuple(m.weight.shape) for m in layers.modules() if isinstance(m, torch.nn.Linear)]
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    head = model.get_output_embeddings().weight
    return {
        "linear_shapes": shapes,
        "layer_params": sum(o * i for o, i in shapes),
        "layers": cfg.num_hidden_layers,
        "attn_width": heads * head_dim,
        "head_params": head.numel(),
        "head_shape": tuple(head.shape),
    }


def token_flops(dims: dict, ctx: int, logits: bool) -> int:
    """Forward matmul FLOPs of one token attending to ``ctx`` positions (itself included)."""
    attention = dims["layers"] * 4 * ctx * dims["attn_width"]  # q·k and p·v over ctx keys
    return 2 * dims["layer_params"] + attention + (2 * dims["head_params"] if logits else 0)


def sequence_flops(dims: dict, start: int, n: int, logits: bool) -> int:
    """Forward FLOPs of feeding tokens at positions start … start + n − 1 of one sequence."""
    return sum(token_flops(dims, start + j + 1, logits) for j in range(n))


def step_flops(
    dims: dict, calls: list[list[tuple[int, list[int]]]], mini_batches: int
) -> tuple[int, int]:
    """(sampling, training) FLOPs of a step from its generate calls, each a list of
    (prompt length, response lengths) per distinct prompt."""
    sample = train = 0
    for call in calls:
        for p, responses in call:
            sample += sequence_flops(dims, 0, p - 1, False) + token_flops(dims, p, True)  # prefill
            train += min(mini_batches, len(responses)) * sequence_flops(dims, 0, p, False)
            for r in responses:  # r − 1 fed tokens; r scored tokens (3× for forward + backward)
                sample += sequence_flops(dims, p, r - 1, True)
                train += sequence_flops(dims, p, r - 1, False) + r * 2 * dims["head_params"]
    return sample, 3 * train


def matmul_rate(dims: dict, rows: int, backward: bool, reps: int = 5) -> float:
    """Best FLOP/s of one thread over the model's weight shapes at ``rows`` rows: forward
    ``x @ Wᵀ``; with ``backward`` also ``g @ W`` and ``gᵀ @ x`` (the two backward matmuls)."""
    import torch
    import torch.nn.functional as F

    rows = max(1, int(rows))
    shapes = dims["linear_shapes"] + [dims["head_shape"]]
    ws = [torch.randn(s) for s in shapes]
    xs = [torch.randn(rows, w.shape[1]) for w in ws]
    gs = [torch.randn(rows, w.shape[0]) for w in ws]

    def once():
        for w, x, g in zip(ws, xs, gs):
            F.linear(x, w)
            if backward:
                torch.mm(g, w)
                torch.mm(g.t(), x)

    flops = sum(2 * rows * w.numel() for w in ws) * (3 if backward else 1)
    once()
    inner = max(1, int(2e8 // flops))  # ~0.2 GFLOP per timing
    best = float("inf")
    for _ in range(reps):
        c0 = time.process_time()
        for _ in range(inner):
            once()
        best = min(best, (time.process_time() - c0) / inner)
    return flops / best


# ------------------------------------------------------------------------------- workers


def run_explorl(spec: dict) -> dict:
    """One explorl run: CPU seconds of each timed step, its FLOPs and floor, peak RSS."""
    import torch
    from _common import cpu_seconds, peak_rss_mb, validation
    from vs_trl import children_rss_mb, explorl_config

    from explorl.training.loop import Trainer

    if spec.get("recipe"):
        cfg = validation.load(
            ROOT / spec["recipe"],
            [
                "log.progress=false",
                "log.plots=false",
                "eval.every=0",
                "log.checkpoint_every=0",
                "log.save_model=false",
                *spec.get("sets", []),
            ],
            max_steps=spec["warmup"] + spec["steps"],
        )
    else:
        cfg = explorl_config(
            spec["prompts"], SAMPLES, spec["warmup"] + spec["steps"], spec["length"]
        )
    cpu, calls, gen_cpu = [], [], []  # gen_cpu: this process's CPU s in sampling, per step
    with tempfile.TemporaryDirectory() as out:
        t = Trainer(cfg, out)
        if spec.get("length"):  # no EOS before the length limit: every response is R tokens
            eos = t.engine.eos_ids.tolist()

            def no_eos(module, inputs, logits):
                logits[..., eos] = -1e4  # probability 0 in float32; -inf would make 0·log 0 = nan
                return logits

            t.policy.get_output_embeddings().register_forward_hook(no_eos)
        generate = t.engine.generate

        def recording(*a, **k):
            c0 = time.process_time()
            ro = generate(*a, **k)
            gen_cpu[-1] += time.process_time() - c0
            p_len, r_len = ro.prompt_mask.sum(-1).tolist(), ro.response_mask.sum(-1).tolist()
            groups: dict[int, tuple[int, list[int]]] = {}
            for i, g in enumerate(ro.prompt_index.tolist()):
                groups.setdefault(g, (p_len[i], []))[1].append(r_len[i])
            calls[-1].append(list(groups.values()))
            return ro

        t.engine.generate = recording
        for i in range(spec["warmup"] + spec["steps"]):
            calls.append([])
            gen_cpu.append(0.0)
            c0 = cpu_seconds()
            t.train_step()
            if i >= spec["warmup"]:
                cpu.append(cpu_seconds() - c0)
        t.pool.close()
        dims = model_dims(t.policy)
        mb = cfg.optim.mini_batches
    kept = calls[spec["warmup"]:]
    flops = [step_flops(dims, c, mb) for c in kept]
    rows = statistics.median(sum(len(r) for _, r in call) for c in kept for call in c)
    tokens = statistics.median(sum(p + sum(r) for p, r in call) / mb for c in kept for call in c)
    rate_sample, rate_train = matmul_rate(dims, rows, False), matmul_rate(dims, tokens, True)
    floor = [s / rate_sample + tr / rate_train for s, tr in flops]
    floor_sample = [s / rate_sample for s, _ in flops]
    resp = [r for c in kept for call in c for _, rs in call for r in rs]
    return {
        "cpu_s": cpu,
        "flops": [s + tr for s, tr in flops],
        "floor_s": floor,
        "floor_sample_s": floor_sample,
        "sample_cpu_s": gen_cpu[spec["warmup"]:],
        "rate_gflops": [rate_sample / 1e9, rate_train / 1e9],
        "mean_response": statistics.mean(resp),
        "peak_rss_mb": peak_rss_mb(),
        "workers_rss_mb": children_rss_mb(),
        "threads": torch.get_num_threads(),
    }


def run_trl(spec: dict) -> dict:
    import torch
    from _common import cpu_seconds, peak_rss_mb
    from transformers import TrainerCallback
    from vs_trl import trl_trainer

    stamps: list[float] = []  # CPU seconds at each step's end: a step is all between two ends

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(cpu_seconds())

    with tempfile.TemporaryDirectory() as out:
        R = spec["length"]
        trainer, _ = trl_trainer(
            spec["prompts"],
            SAMPLES,
            spec["warmup"] + spec["steps"],
            out,
            [StepClock()],
            max_new=R,
            min_new=R,
        )
        trainer.train()
    kept = stamps[max(spec["warmup"], 1) - 1:]
    return {"cpu_s": [b - a for a, b in itertools.pairwise(kept)], "peak_rss_mb": peak_rss_mb(),
            "threads": torch.get_num_threads()}


def worker(spec: dict) -> None:
    sys.path.insert(0, spec["src"])  # explorl from this tree or the --ref-src one, before _common
    import explorl  # noqa: F401

    sys.path.insert(0, str(Path(__file__).parent))
    import _common  # noqa: F401  (it puts this tree's src/ first on sys.path)

    # The verifier workers (forkserver) import explorl through sys.path: the side's tree first
    # again, or an older tree's pool would run this tree's worker code (and fail, and restart).
    sys.path.insert(0, spec["src"])
    res = (run_trl if spec["side"] == "trl" else run_explorl)(spec)
    print("RESULT " + json.dumps(res), flush=True)


def measure(spec: dict) -> dict:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TRANSFORMERS_VERBOSITY": "error",
        "PYTHONPATH": spec["src"],
    }
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
    raise RuntimeError(
        f"{spec['side']} worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    )


# ------------------------------------------------------------------------------- report


def mmm(xs: list[float], scale: float = 1.0, fmt: str = ".1f") -> str:
    """min / median / max."""
    return " / ".join(format(x * scale, fmt) for x in (min(xs), statistics.median(xs), max(xs)))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--prompts", type=int, nargs="+", default=[8, 32], help="prompts per step (× 8 samples)"
    )
    p.add_argument(
        "--lengths", type=int, nargs="+", default=[8, 32], help="response lengths (tokens)"
    )
    p.add_argument("--reps", type=int, default=2, help="alternating repetitions per cell")
    p.add_argument("--steps", type=int, default=3, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    p.add_argument("--full", action="store_true", help="8/16/32/64 × 8/32/64, 3 reps, 3 steps")
    p.add_argument(
        "--quickstart",
        action="store_true",
        help="the quickstart recipe (natural lengths) instead of the matrix, explorl only",
    )
    p.add_argument(
        "--ref-src",
        nargs="+",
        default=[],
        help="with --quickstart: also time explorl from these source trees (explorl-ref1, …)",
    )
    p.add_argument(
        "--variant",
        nargs="+",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --quickstart: also time this tree with these overrides (e.g. optim.fused=true);"
        " repeat for more sides",
    )
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition: it runs")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.smoke:
        args.prompts, args.lengths, args.reps, args.steps, args.warmup = [2], [4], 1, 1, 1
    if args.full:
        args.prompts, args.lengths, args.reps = [8, 16, 32, 64], [8, 32, 64], max(args.reps, 3)

    import torch
    import transformers
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f}; python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}; one torch thread per process; CPU time per step"
    )
    src = str(ROOT / "src")
    if args.quickstart:
        return quickstart(args, src)

    try:
        import trl
    except ImportError:  # the `bench` extra is missing: explorl's side only
        trl = None
    print(
        f"trl {trl.__version__ if trl else 'not installed (its side skipped)'}; "
        f"{args.reps} alternating reps of {args.warmup} warm-up + "
        f"{args.steps} timed "
        f"steps per side and cell; {SAMPLES} samples per prompt, every response exactly R tokens\n"
    )
    print(
        "| prompts × R | explorl ms/step | TRL ms/step | TRL / explorl | explorl / floor "
        "| floor ms "
        "(GFLOP) | peak RSS explorl / TRL |"
    )
    print("|---|---|---|---|---|---|---|")
    for R in args.lengths:
        for P in args.prompts:
            runs: dict[str, list[dict]] = {"explorl": [], **({"trl": []} if trl else {})}
            for _ in range(args.reps):
                for side, got in runs.items():
                    got.append(
                        measure(
                            {
                                "side": side,
                                "prompts": P,
                                "length": R,
                                "steps": args.steps,
                                "warmup": args.warmup,
                                "src": src,
                            }
                        )
                    )
            e = [statistics.median(r["cpu_s"]) for r in runs["explorl"]]
            tr = [statistics.median(r["cpu_s"]) for r in runs.get("trl", [])] or [float("nan")]
            floor = [statistics.median(r["floor_s"]) for r in runs["explorl"]]
            gflop = statistics.median(f for r in runs["explorl"] for f in r["flops"]) / 1e9
            print(
                f"| {P} × {R} | {mmm(e, 1e3)} | {mmm(tr, 1e3)} | "
                f"{mmm([b / a for a, b in zip(e, tr)], 1, '.2f')} "
                f"| {mmm([a / f for a, f in zip(e, floor)], 1, '.1f')} | "
                f"{statistics.median(floor) * 1e3:.1f} "
                f"({gflop:.2f}) | {max(r['peak_rss_mb'] for r in runs['explorl']):.0f} / "
                f"{max((r['peak_rss_mb'] for r in runs.get('trl', [])), default=0):.0f} MB |",
                flush=True,
            )
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


PINNED = ["rollout.max_response_len=8"]
"""Settings every --quickstart side gets, so older trees run the same step: recipes before
the lab task's own length limit (8 for addition) fall back to the 256-token default."""


def quickstart(args, src: str) -> None:
    """The quickstart recipe's step in CPU time beside its floor; with --ref-src, before/after."""
    sides = {
        "explorl": (src, []),
        **{f"explorl-ref{i + 1}": (str(Path(r).resolve()), []) for i, r in enumerate(args.ref_src)},
        **{" ".join(v): (src, v) for v in args.variant},
    }
    steps = max(args.steps, 10)
    print(
        f"the quickstart recipe: {args.reps} alternating reps of {args.warmup} warm-up + "
        f"{steps} timed "
        f"steps per side\n"
    )
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for rep in range(args.reps):
        for side, (path, sets) in sides.items():
            r = measure({"side": side, "recipe": QUICKSTART, "steps": steps,
                         "warmup": args.warmup, "src": path, "sets": [*PINNED, *sets]})
            runs[side].append(r)
            print(
                f"  rep {rep + 1} {side:17s} CPU ms/step {mmm(r['cpu_s'], 1e3)}  floor "
                f"{statistics.median(r['floor_s']) * 1e3:.1f} ms  (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    print(
        "\n| side | CPU ms/step (min / median / max of rep medians) | floor ms | GFLOP/step "
        "| matmul GFLOP/s "
        "(sample, train) | step / floor | sampling ms / floor | rest ms / floor | peak RSS |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for side, rs in runs.items():
        med = [statistics.median(r["cpu_s"]) for r in rs]
        floor = [statistics.median(r["floor_s"]) for r in rs]
        rates = [statistics.median(r["rate_gflops"][k] for r in rs) for k in (0, 1)]
        gflop = statistics.median(f for r in rs for f in r["flops"]) / 1e9
        if all("sample_cpu_s" in r for r in rs):  # the step split into sampling and the rest
            samp = statistics.median(statistics.median(r["sample_cpu_s"]) for r in rs)
            f_samp = statistics.median(statistics.median(r["floor_sample_s"]) for r in rs)
            rest = statistics.median(med) - samp
            split = (f"{samp * 1e3:.1f} / {f_samp * 1e3:.1f} ({samp / f_samp:.1f}×) | "
                     f"{rest * 1e3:.1f} / {(statistics.median(floor) - f_samp) * 1e3:.1f} "
                     f"({rest / (statistics.median(floor) - f_samp):.1f}×)")
        else:
            split = "— | —"
        print(
            f"| {side} | {mmm(med, 1e3)} | {statistics.median(floor) * 1e3:.1f} | {gflop:.2f} | "
            f"{rates[0]:.0f}, {rates[1]:.0f} | "
            f"{mmm([m / f for m, f in zip(med, floor)], 1, '.1f')} | {split} | "
            f"{max(r['peak_rss_mb'] for r in rs):.0f} MB |"
        )


if __name__ == "__main__":
    main()
