"""Sampling speed: explorl's engine vs a plain ``model.generate`` at equal settings (figures only).

    .venv/bin/python benchmarks/generation_speed.py [--reps 5] [--calls 20] [--threads 1]
    .venv/bin/python benchmarks/generation_speed.py --model smollm2-135m --task chat_addition \
        --max-new 64 --sizes 8x8 --calls 2 --reps 2 --threads 2     # a real model (~10 min)

Each variant samples P prompts × G responses from the lab model (or ``--model``: a local HF
model directory or a name of ``explorl models``, prompted with ``--task``'s problems through its
chat template; float32, CPU) at temperature 1 with
no top-k/top-p, ≤ ``--max-new`` tokens, stopping at EOS, from the same left-padded prompt
batches. ``model.generate`` gets the G copies of each prompt as rows, as TRL passes them;
explorl's engine gets the prompts and the counts, and also returns each token's log-prob and
entropy (the trainer's old log-probs and entropy metrics). Tokens are the generated tokens up
to and including each row's EOS. Each measurement is a fresh process; the variants alternate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "explorl": "explorl engine, counter-based seeds (as the trainer samples)",
    "explorl-static": "explorl engine, static decode path (rollout.hf.static: true)",
    "explorl-multinomial": "explorl engine, torch.multinomial with one generator",
    "generate": "model.generate(do_sample=True)",
}


def worker(spec: dict) -> dict:
    import resource

    import torch
    torch.set_num_threads(spec["threads"])
    sys.path.insert(0, str(ROOT / "src"))
    from explorl.config import ModelConfig
    from explorl.lab import lab_model_path, make_splits
    from explorl.models import load_model, load_tokenizer, render_prompt, resolve_model_path
    from explorl.rollout.hf import HFEngine, left_pad

    model_spec = spec.get("model") or "lab:addition"
    path = (lab_model_path("addition") if model_spec == "lab:addition"
            else resolve_model_path(model_spec))
    tok = load_tokenizer(path, ModelConfig())
    model = load_model(path, ModelConfig(dtype="float32"), torch.device("cpu")).eval()
    train = make_splits(spec.get("task") or "addition", seed=0, n_train=256, n_val=0,
                        n_test=0)["train"]
    P, G, max_new, variant = spec["prompts"], spec["samples"], spec["max_new"], spec["variant"]
    engine = HFEngine(tok, batch_size=P * G, static=variant == "explorl-static")
    generator = torch.Generator().manual_seed(0)

    def call(i: int) -> int:
        prompts = [
            render_prompt(tok, train[(i * P + j) % len(train)].prompt, True) for j in range(P)
        ]
        if variant.startswith("explorl"):
            seeds = [i * P + j for j in range(P)] if variant != "explorl-multinomial" else None
            ro = engine.generate(
                model, prompts, [G] * P, 1.0, max_new, generator=generator, seeds=seeds
            )
            return int(ro.response_mask.sum())
        ids, mask = left_pad(
            [p for p in prompts for _ in range(G)], tok.pad_token_id, torch.device("cpu")
        )
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask.long(),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        done = out[:, ids.shape[1]:] == tok.eos_token_id  # (N, R)
        first = torch.where(
            done.any(1), done.int().argmax(1) + 1, torch.full((len(done),), done.shape[1])
        )
        return int(first.sum())

    for i in range(spec.get("warmup", 3)):  # warm-up
        call(10_000 + i)
    tokens, w0, c0 = 0, time.perf_counter(), time.process_time()
    for i in range(spec["calls"]):
        tokens += call(i)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return {"tokens_per_s": tokens / wall if wall > 0 else float("nan"),
            "tokens_per_cpu_s": tokens / cpu if cpu > 0 else float("nan"),
            "ms_per_call": 1000 * wall / spec["calls"], "tokens_per_call": tokens / spec["calls"],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(spec: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "TRANSFORMERS_VERBOSITY": "error"}
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
    raise RuntimeError(f"worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def spread(xs: list[float], fmt: str = "6.0f") -> str:
    med, half = statistics.median(xs), (max(xs) - min(xs)) / 2
    return f"{med:{fmt}} ± {half:{fmt}} (±{100 * half / med:2.0f}%)"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--calls", type=int, default=20, help="timed generate calls per measurement")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-new", type=int, default=8)
    p.add_argument("--sizes", nargs="+", default=["8x8", "32x8"], help="PROMPTSxSAMPLES per call")
    p.add_argument("--model", help="a local HF model dir or an `explorl models` name "
                   "(default: the lab's addition model)")
    p.add_argument("--task", help="the lab task whose prompts are sampled (default addition; "
                   "chat_addition for a chat model)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first, per measurement")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition: it runs")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    if args.smoke:
        args.reps, args.calls, args.max_new, args.sizes = 1, 1, 4, ["2x2"]

    import platform

    import torch
    import transformers

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at start; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; "
        f"{args.threads} torch thread(s); {args.model or 'lab addition model'}, T=1, "
        f"≤{args.max_new} new tokens"
    )
    for size in args.sizes:
        P, G = (int(x) for x in size.split("x"))
        runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for _ in range(args.reps):
            for v in VARIANTS:
                runs[v].append(
                    measure(
                        dict(
                            variant=v,
                            prompts=P,
                            samples=G,
                            max_new=args.max_new,
                            calls=args.calls,
                            threads=args.threads,
                            model=args.model,
                            task=args.task,
                            warmup=args.warmup,
                        )
                    )
                )
        print(
            f"{size} ({P * G} rows per call, median ± half-range over "
            f"{args.reps} alternating reps):"
        )
        for v, label in VARIANTS.items():
            rs = runs[v]
            print(f"  {v:20s} tokens/s {spread([r['tokens_per_s'] for r in rs])}  "
                  f"tokens/CPU-s {spread([r['tokens_per_cpu_s'] for r in rs])}  "
                  f"{statistics.median(r['ms_per_call'] for r in rs):5.1f} ms/call  "
                  f"peak RSS {max(r['peak_rss_mb'] for r in rs):4.0f} MB   [{label}]")
        ratio = [
            e["tokens_per_s"] / g["tokens_per_s"] for e, g in zip(runs["explorl"], runs["generate"])
        ]
        cpu = [
            e["tokens_per_cpu_s"] / g["tokens_per_cpu_s"]
            for e, g in zip(runs["explorl"], runs["generate"])
        ]
        print(f"  explorl/generate tokens-per-second ratio {spread(ratio, '4.2f')}; per CPU-second "
              f"{spread(cpu, '4.2f')}")
        static = [s["tokens_per_s"] / e["tokens_per_s"]
                  for s, e in zip(runs["explorl-static"], runs["explorl"])]
        print(f"  static/eager tokens-per-second ratio {spread(static, '4.2f')}")


if __name__ == "__main__":
    main()
