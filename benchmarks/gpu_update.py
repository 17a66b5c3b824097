"""The update on a GPU: time, peak memory, MFU and a kernel-family profile of one update with and
without the fused log-probs and the packed layouts, at a Qwen2.5-0.5B shape.

    python benchmarks/gpu_update.py --out runs/gpu_update.jsonl --profile runs/gpu_update.txt
    python benchmarks/gpu_update.py --smoke        # CPU, tiny shapes: the script runs

Model: Qwen2.5-0.5B's configuration (hidden 896, 24 layers, 14 heads with 2 key/value heads,
MLP 4864, vocabulary 151,936, tied embeddings; 494M parameters) with random weights built from
its config (nothing downloaded), float32 master weights under bf16 autocast, as the trainer's
default on CUDA. Batch: P prompts × 8 responses of ≤ 256 tokens (``update_memory.batch``: prompts
of 40–100 tokens, responses of 8–256), cells 16 × 8 × 256 and 64 × 8 × 256. An update: the
trainer's loss pass (``forward.response_logprobs``) over micro-batches of the device plan's token
budget (``plan.token_budget`` on the memory free with the weights in place), a GRPO token-mean
loss with an entropy bonus, its backward, and a fused AdamW step. Median of ``--reps`` timed
updates after ``--warmup``, synchronised.

Variants: ``fused`` (``algorithm.fused_logprobs``, the default) or ``logits`` (the full
logits); ``packed`` (shared prompts under a block mask: the default with sdpa), ``varlen``
(sequences told apart by positions: the default with flash attention; run when flash-attn
imports), ``padded``.

MFU = 6 · P · T / (t · peak): P the parameters (494M, the tied embedding counted once, as the
output layer), T the prompt + response tokens of every row (each prompt counted once per
response, as a padding-free unshared layout would process them), t the update's seconds, peak
the chip's dense bf16 rate (989 TFLOP/s for the H100 SXM and H200; ``--peak-tflops`` for
others). Attention's own FLOPs (~4·L·H·context per token, ≤ 3% at these lengths) are left out,
as prompt sharing removes work the formula counts: the figure is a rate of useful work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "src"), str(HERE)]

QWEN05 = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
              num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
              max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=True,
              rms_norm_eps=1e-6)
TINY = dict(QWEN05, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}
"""Dense bf16 tensor-core peak by chip (NVIDIA's data sheets, without sparsity)."""
FAMILIES = (("gemm", ("gemm", "matmul", "mm", "linear", "addmm", "cutlass", "sm90_xmma",
                      "ampere", "cublas")),
            ("attention", ("attention", "flash", "sdpa", "fmha", "efficient")),
            ("softmax/logsumexp", ("softmax", "logsumexp", "exp", "log_")),
            ("reduce", ("reduce", "sum", "amax", "mean")),
            ("optimizer", ("adam", "foreach", "multi_tensor")),
            ("copy/cast", ("copy", "cast", "to_copy", "contiguous", "cat", "index")),
            ("elementwise", ("elementwise", "vectorized", "mul", "add", "div", "silu", "rsqrt",
                             "pow", "neg", "where", "fill")))
"""Kernel families of the profile: the first whose keywords a kernel's name holds."""


def family(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other"


def build(spec: dict, device, attn: str):
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(**spec["model"])
    cfg._attn_implementation = attn
    return transformers.Qwen2ForCausalLM(cfg).to(device).float().train()


def one_update(model, opt, data, adv, sizes, variant, spec, amp):
    """Forward, backward and AdamW step over the micro-batches ``sizes`` of ``data``."""
    import torch

    from explorl.policy.forward import response_logprobs

    fused, layout = variant
    pack = False if layout == "padded" else None
    varlen = layout == "varlen" if layout != "padded" else None
    pids, pmask, rids, rmask = data
    n = rmask.sum()
    start = 0
    for m in sizes:
        sl = slice(start, start + m)
        start += m
        with amp():
            logp, ent = response_logprobs(model, pids[sl], pmask[sl], rids[sl], rmask[sl], 1.0,
                                          chunk_size=spec["chunk"], fused=fused, pack=pack,
                                          varlen=varlen)
        ratio = torch.exp(logp - logp.detach())
        loss = (-(adv[sl, None] * ratio * rmask[sl]).sum() - 1e-3 * (ent * rmask[sl]).sum()) / n
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def measure(spec: dict, cell: tuple[int, int], variant: tuple[bool, str], device, prof_file):
    import contextlib

    import torch
    from update_memory import batch

    from explorl.policy.forward import pack_length, takes_custom_mask
    from explorl.training import plan as P
    from explorl.training.optim import micro_batch_sizes

    cuda = device.type == "cuda"
    layout = variant[1]
    attn = "flash_attention_2" if layout == "varlen" else "sdpa"
    model = build(spec, device, attn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=cuda)
    prompts, length = cell
    data = batch(dict(prompts=prompts, samples=8, prompt_len=(40, 100), min_response=8,
                      max_response=length), model.config.vocab_size)
    data = tuple(x.to(device) for x in data)
    adv = torch.randn(len(data[0]), generator=torch.Generator().manual_seed(1)).to(device)
    rows_tokens = (data[1].sum(-1) + data[3].sum(-1)).tolist()
    if cuda:
        pack = pack_length(model) if takes_custom_mask(model) else 0
        shape = P.ModelShape.of(model, pack, variant[0])
        budget = P.token_budget(P.free_bytes(device), shape, compute_bytes=2, master_bytes=4,
                                checkpointing=False, logprob_chunk=spec["chunk"]).tokens
        sizes = micro_batch_sizes(rows_tokens, budget, budget)
    else:
        sizes = [len(rows_tokens)]
    amp = ((lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda
           else contextlib.nullcontext)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for _ in range(spec["warmup"]):
        one_update(model, opt, data, adv, sizes, variant, spec, amp)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(spec["reps"]):
        sync()
        t0 = time.perf_counter()
        one_update(model, opt, data, adv, sizes, variant, spec, amp)
        sync()
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    n_params = sum(p.numel() for p in model.parameters())
    tokens = int(sum(rows_tokens))
    flop = 6 * n_params * tokens
    peak = spec["peak_tflops"] * 1e12
    row = {"cell": f"{prompts}x8x{length}", "fused": variant[0], "layout": layout,
           "micro_batches": len(sizes), "update_s": t, "tokens": tokens,
           "response_tokens": int(data[3].sum()),
           "tflops": flop / t / 1e12, "mfu": flop / t / peak if cuda else None,
           "peak_gb": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None}
    if prof_file is not None:
        row["families"] = profile(model, opt, data, adv, sizes, variant, spec, amp, device,
                                  prof_file, row)
    del model, opt
    if cuda:
        torch.cuda.empty_cache()
    return row


def profile(model, opt, data, adv, sizes, variant, spec, amp, device, prof_file, row) -> dict:
    """One update under torch.profiler: device time per kernel family (ms) and the top ops."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=acts) as prof:
        one_update(model, opt, data, adv, sizes, variant, spec, amp)
    key = "device_time_total" if cuda else "self_cpu_time_total"
    fams: dict[str, float] = {}
    events = prof.key_averages()
    for e in events:
        if cuda and getattr(e, "device_type", None) is not None and str(e.device_type).endswith(
                "CPU"):
            continue  # the kernels' own time is on the device side
        us = getattr(e, "self_device_time_total" if cuda else "self_cpu_time_total", 0.0)
        if us:
            fams[family(e.key)] = fams.get(family(e.key), 0.0) + us / 1e3
    with open(prof_file, "a") as f:
        f.write(f"\n== {row['cell']} fused={row['fused']} layout={row['layout']}: "
                f"{row['update_s'] * 1e3:.0f} ms, families (ms): "
                + ", ".join(f"{k} {v:.1f}" for k, v in sorted(fams.items(), key=lambda x: -x[1]))
                + "\n")
        f.write(events.table(sort_by=key, row_limit=20) + "\n")
    return {k: round(v, 2) for k, v in fams.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", nargs="+", default=["16x256", "64x256"],
                   help="PROMPTSxLENGTH (8 responses per prompt)")
    p.add_argument("--variants", nargs="+",
                   default=["fused-packed", "logits-packed", "fused-padded", "fused-varlen"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--chunk", type=int, default=512, help="algorithm.logprob_chunk")
    p.add_argument("--peak-tflops", type=float, help="the chip's dense bf16 peak")
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--out", help="append one JSON line per row here")
    p.add_argument("--profile", help="append the profiler's tables here (one update per row)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: the script runs")
    args = p.parse_args()
    import torch

    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        sys.exit("gpu_update.py needs a CUDA GPU (or --smoke)")
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name() if cuda else "CPU (--smoke)"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), 989.4)
    spec = dict(model=TINY if args.smoke else QWEN05, chunk=args.chunk, reps=args.reps,
                warmup=args.warmup, peak_tflops=peak)
    cells = [tuple(int(x) for x in c.split("x")) for c in args.cells]
    if args.smoke:
        torch.set_num_threads(1)
        spec.update(reps=1, warmup=0, chunk=16)
        cells = [(2, 16)]
    try:
        import flash_attn  # noqa: F401
        has_flash = cuda
    except ImportError:
        has_flash = False
    print(f"{name}; peak {peak:.0f} TFLOP/s (bf16 dense); torch {torch.__version__}; "
          f"flash-attn {'yes' if has_flash else 'no'}", flush=True)
    end = time.monotonic() + args.budget_s
    for cell in cells:
        for v in args.variants:
            fused, layout = v.split("-")
            if layout == "varlen" and not has_flash:
                print(f"{cell[0]}x8x{cell[1]} {v}: skipped (flash-attn does not import)")
                continue
            if time.monotonic() > end:
                print(f"{cell[0]}x8x{cell[1]} {v}: skipped (--budget-s spent)")
                continue
            try:
                row = measure(spec, cell, (fused == "fused", layout), device, args.profile)
            except torch.OutOfMemoryError as e:
                row = {"cell": f"{cell[0]}x8x{cell[1]}", "fused": fused == "fused",
                       "layout": layout, "error": f"out of memory: {str(e)[:80]}"}
                torch.cuda.empty_cache()
            row["device"] = name
            mfu = f", MFU {row['mfu']:.1%}" if row.get("mfu") is not None else ""
            mem = f", peak {row['peak_gb']:.1f} GiB" if row.get("peak_gb") is not None else ""
            text = row.get("error") or (f"{row['update_s'] * 1e3:.0f} ms ({row['micro_batches']}"
                                        f" micro-batches), {row['tflops']:.1f} TFLOP/s{mfu}{mem}")
            print(f"{row['cell']} {v}: {text}", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
