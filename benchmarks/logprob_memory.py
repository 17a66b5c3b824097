"""Peak memory of chunked vs naive log-prob + entropy, forward + backward.

Each measurement runs in its own subprocess and reports its peak resident set size
(``resource.getrusage(...).ru_maxrss``), so runs don't inherit each other's peaks and an
out-of-memory naive run only fails its own row. Every worker gets an ``RLIMIT_DATA``
cap (``--mem-limit-gb``): an allocation over it raises instead of waking the kernel's
OOM killer on a shared machine.

    python benchmarks/logprob_memory.py            # Qwen2.5-0.5B-like: V=151936, T=2048, B=4, D=896
    python benchmarks/logprob_memory.py --small    # seconds
    python benchmarks/logprob_memory.py --batch 1 --length 1024 --paths hidden logits

Paths: ``hidden`` = final hidden states (N, T, D) + lm_head weight (V, D), as in the
trainer (naive builds the full logits; chunked never does). ``logits`` = logits (N, T, V)
given as input (both hold the logits and their gradient; chunked saves the float32
intermediates). The loss is -Σ logp - 0.01·Σ H, so the entropy gradient is included.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

QWEN = {"vocab": 151936, "length": 2048, "batch": 4, "hidden": 896}
SMALL = {"vocab": 32000, "length": 256, "batch": 2, "hidden": 128}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(spec: dict) -> dict:
    limit = int(spec["mem_limit_gb"] * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    import torch
    import torch.nn.functional as F

    from explorl.algorithms import logprobs_from_hidden, logprobs_from_logits, naive_logprobs

    # Warm up kernels on a tiny problem so "time" is not first-call overhead.
    x = torch.randn(1, 8, 64, requires_grad=True)
    logprobs_from_logits(x, torch.zeros(1, 8, dtype=torch.long), chunk_size=4)[0].sum().backward()
    naive_logprobs(x, torch.zeros(1, 8, dtype=torch.long))[0].sum().backward()

    torch.manual_seed(0)
    B, T, V, D = spec["batch"], spec["length"], spec["vocab"], spec["hidden"]
    dtype = getattr(torch, spec["dtype"])
    temperature, chunk = spec["temperature"], spec["chunk"]
    labels = torch.randint(0, V, (B, T))
    if spec["path"] == "hidden":
        hidden = torch.randn(B, T, D, dtype=dtype).requires_grad_(True)
        weight = (torch.randn(V, D, dtype=dtype) * D**-0.5).requires_grad_(True)
    else:
        logits = torch.randn(B, T, V, dtype=dtype).requires_grad_(True)
    baseline = peak_rss_mb()  # torch + inputs

    t0 = time.perf_counter()
    if spec["path"] == "hidden" and chunk:
        logp, ent = logprobs_from_hidden(hidden, weight, labels, temperature, chunk_size=chunk)
    elif spec["path"] == "hidden":
        logp, ent = naive_logprobs(F.linear(hidden, weight), labels, temperature)
    elif chunk:
        logp, ent = logprobs_from_logits(logits, labels, temperature, chunk_size=chunk)
    else:
        logp, ent = naive_logprobs(logits, labels, temperature)
    loss = -logp.sum() - 0.01 * ent.sum()
    loss.backward()
    seconds = time.perf_counter() - t0
    return {
        "baseline_mb": baseline,
        "peak_mb": peak_rss_mb(),
        "seconds": seconds,
        "check": f"{logp.sum().item():.6g}/{ent.sum().item():.6g}",
    }


def run(spec: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    if "can't allocate memory" in proc.stderr or "MemoryError" in proc.stderr:
        err = f"out of memory (over the {spec['mem_limit_gb']:g} GB cap)"
    return {"error": err[:120]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help=f"quick run: {SMALL}")
    p.add_argument("--vocab", type=int)
    p.add_argument("--length", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument(
        "--chunks", type=int, nargs="+", default=[2048, 512], help="chunk sizes (tokens) to measure"
    )
    p.add_argument("--paths", nargs="+", default=["hidden"], choices=["hidden", "logits"])
    p.add_argument("--impls", nargs="+", default=["chunked", "naive"], choices=["chunked", "naive"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument(
        "--mem-limit-gb",
        type=float,
        default=14.0,
        help="per-worker RLIMIT_DATA; an allocation over it fails the row cleanly",
    )
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition: it runs")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.smoke:
        args.small, args.chunks, args.vocab, args.length = True, [64], 1000, 32

    size = dict(SMALL if args.small else QWEN)
    for k in size:
        if getattr(args, k) is not None:
            size[k] = getattr(args, k)
    n_tok = size["batch"] * size["length"]
    full_gb = n_tok * size["vocab"] * 4 / 2**30
    print(
        f"B={size['batch']} T={size['length']} V={size['vocab']} D={size['hidden']} "
        f"dtype={args.dtype}  (one float32 (B,T,V) tensor = {full_gb:.2f} GB)"
    )
    print(f"{'path':7} {'impl':13} {'peak RSS MB':>12} {'above inputs':>13} {'time s':>8}  check")
    for path in args.paths:
        impls = [("chunked", c) for c in args.chunks] if "chunked" in args.impls else []
        impls += [("naive", 0)] if "naive" in args.impls else []
        for impl, chunk in impls:
            spec = dict(
                size,
                path=path,
                chunk=chunk,
                dtype=args.dtype,
                temperature=args.temperature,
                mem_limit_gb=args.mem_limit_gb,
            )
            r = run(spec)
            name = f"{impl}@{chunk}" if chunk else impl
            if "error" in r:
                print(f"{path:7} {name:13} {'-':>12} {'-':>13} {'-':>8}  {r['error']}")
            else:
                above = r["peak_mb"] - r["baseline_mb"]
                print(
                    f"{path:7} {name:13} {r['peak_mb']:12.0f} {above:13.0f}"
                    f" {r['seconds']:8.1f}  {r['check']}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
