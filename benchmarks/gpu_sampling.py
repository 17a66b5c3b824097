"""Sampling speed of the ``hf`` engine on one GPU: the eager loop against the static decode path
(``rollout.hf.static``), beside the decode floor of the device's memory bandwidth.

    python benchmarks/gpu_sampling.py [--cells 16x8x256 64x8x256] [--budget-s 170]
                                      [--profile prof.txt] [--out rows.jsonl] [--smoke]

A model of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 kv heads, intermediate 4864,
vocabulary 151936, tied embeddings) with random weights, float32 master weights sampled under
bfloat16 autocast as the trainer does (``--pure-bf16``: weights stored in bfloat16). ``--arch
llama`` (default) is the model ``gpu_matrix.py`` and ``gpu_acceptance.py`` train (Llama with
attention biases), so the figures compare with theirs; ``--arch qwen2`` is Qwen2's own class.
Each cell P×G×R samples G responses to each of P random prompts of ``--prompt-len``
tokens, every response exactly R tokens (EOS is an id the model never draws). Per cell and path,
printed as each finishes: tokens/s, ms per decode step, the decode floor (bytes a step must read
— the matrices once and the rows' keys and values at the mean context length — over the
device-to-device copy bandwidth measured here with one large ``copy_``), the ratio to it, and for
the static path its speed-up over the eager loop and whether both drew the same tokens (on CUDA
the kernels differ, so log-probs agree to bf16 rounding, not bit for bit). The first static call
of a shape builds its buffers and captures its graphs: timed apart (``first_s``).

``--check`` first compares the two paths on small models whose rows end at EOS at different
lengths (compaction into smaller buckets, graphs replayed twice), in float32 and under bfloat16
autocast. ``--budget-s`` skips a run whose estimate would not fit in what is left (the check
counts); ``--profile FILE`` runs ``torch.profiler`` over one sampling call per path of the first
cell, cut to ``--profile-tokens`` tokens (default 32: a profiled call runs several times slower),
and writes (and prints) the top-20 ops by device time; ``--out FILE`` appends one JSON line
per row. ``--smoke``: a tiny model on the CPU, seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from explorl.rollout.hf import HFEngine  # noqa: E402

QWEN_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, intermediate_size=4864, vocab_size=151936)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=1000)


class _Tok:
    """Enough of a tokenizer for the engine (responses decoded as numbers)."""

    pad_token_id, eos_token_id = 0, None

    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(map(str, r[:4])) for r in rows]


def build_model(shape: dict, device: torch.device, dtype: torch.dtype, arch: str = "qwen2"):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if arch == "llama":  # gpu_matrix.py's model: Llama with q/k/v/o biases
        cfg = LlamaConfig(**shape, max_position_embeddings=4096, tie_word_embeddings=True,
                          attention_bias=True, attn_implementation="sdpa")
        cls = LlamaForCausalLM
    else:
        cfg = Qwen2Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True,
                          attn_implementation="sdpa")
        cls = Qwen2ForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(cfg).to(dtype).eval()
    return model


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second a large device-to-device ``copy_`` moves, reads and writes counted."""
    n = (1 << 28) if device.type == "cuda" else (1 << 22)  # 1 GiB of float32 on CUDA
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    del src, dst
    return 2 * n * 4 / best


def step_bytes(model, rows: int, context: float, dtype: torch.dtype) -> float:
    """Bytes one decode step must read: every matrix once (compute dtype) and the rows' keys and
    values at ``context`` tokens."""
    cfg, size = model.config, torch.finfo(dtype).bits // 8
    mats = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    d = cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * d * size
    return mats * size + rows * context * kv


def sample(engine, model, prompts, G, R, seed, amp):
    with amp():
        return engine.generate(model, prompts, [G] * len(prompts), 1.0, R,
                               seeds=[seed + i for i in range(len(prompts))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", nargs="+", default=["16x8x256", "64x8x256"],
                    help="P×G×R: prompts × samples per prompt × response tokens")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--budget-s", type=float, default=170.0)
    ap.add_argument("--pure-bf16", action="store_true", help="weights stored in bfloat16")
    ap.add_argument("--arch", choices=["llama", "qwen2"], default="llama")
    ap.add_argument("--profile", default=None, help="file for the profiler's top-20 table")
    ap.add_argument("--profile-tokens", type=int, default=32)
    ap.add_argument("--out", default=None, help="append one JSON line per row to this file")
    ap.add_argument("--check", action="store_true", help="static = eager on small models first")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU: it runs")
    args = ap.parse_args()
    start = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    shape = TINY if args.smoke else QWEN_05B
    if args.smoke:
        args.cells, args.prompt_len = ["2x4x8"], 5
    compute = torch.bfloat16 if cuda else torch.float32
    weights = compute if args.pure_bf16 or not cuda else torch.float32
    model = build_model(shape, device, weights, args.arch)
    V = model.config.vocab_size

    def amp():
        return torch.autocast(device.type, dtype=compute, enabled=weights != compute)

    if args.check:
        check(device)
    bw = copy_bandwidth(device)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"# {name}, torch {torch.__version__}; {args.arch}; weights {weights}, "
          f"compute {compute}; "
          f"copy bandwidth {bw / 1e9:.0f} GB/s (read+write)", flush=True)
    print(f"{'cell':>12} {'path':>6} {'tok/s':>9} {'ms/step':>8} {'floor ms':>8} {'x floor':>7} "
          f"{'speedup':>7} {'first_s':>7} {'same':>5}", flush=True)
    rate = {"eager": 6e3, "static": 30e3}  # tokens/s guesses until measured
    g = torch.Generator().manual_seed(1)
    for ci, cell in enumerate(args.cells):
        P, G, R = (int(x) for x in cell.lower().split("x"))
        prompts = torch.randint(1, V, (P, args.prompt_len), generator=g).tolist()
        floor_s = step_bytes(model, P * G, args.prompt_len + R / 2, compute) / bw
        results = {}
        for path, static in (("eager", False), ("static", True)):
            left = args.budget_s - (time.perf_counter() - start)
            runs = 2  # a first call (static: build + capture; eager: warm-up), then the timed one
            estimate = runs * P * G * R / rate[path] + 2
            if estimate > left:
                print(f"{cell:>12} {path:>6}  skipped: ~{estimate:.0f} s, {left:.0f} s left",
                      flush=True)
                continue
            engine = HFEngine(_Tok(), batch_size=P * G, eos_ids=[V], static=static)
            first = None
            if static:
                t0 = time.perf_counter()
                sample(engine, model, prompts, G, R, 10_000, amp)
                sync(device)
                first = time.perf_counter() - t0
            else:  # warm-up at every context length the timed call meets: kernels, the
                # allocator, and attention plans built per new shape (cuDNN's), which the
                # training loop pays at its first step only
                sample(engine, model, prompts, G, R, 10_000, amp)
            sync(device)
            t0 = time.perf_counter()
            ro = sample(engine, model, prompts, G, R, 0, amp)
            sync(device)
            dt = time.perf_counter() - t0
            n_tok = int(ro.response_mask.sum())
            rate[path] = n_tok / dt
            row = {"cell": cell, "path": path, "device": name, "weights": str(weights),
                   "tokens_per_s": n_tok / dt, "ms_per_step": 1e3 * dt / R,
                   "floor_ms": 1e3 * floor_s, "x_floor": dt / R / floor_s, "first_s": first,
                   "sampling_s": dt, "copy_gbps": bw / 1e9}
            if static and "eager" in results:
                ref = results["eager"][1]
                row["speedup"] = rate["static"] / rate["eager"]
                same = (ro.response_ids == ref.response_ids).all(-1)
                row["same_rows"] = float(same.float().mean())
                lead = (ro.response_ids == ref.response_ids).cumprod(-1).bool()  # before 1st diff
                diff = (ro.old_logp - ref.old_logp)[lead].abs()
                row["logp_diff_max"] = float(diff.max()) if diff.numel() else None
            results[path] = (row, ro)
            print(f"{cell:>12} {path:>6} {row['tokens_per_s']:>9.0f} {row['ms_per_step']:>8.2f} "
                  f"{row['floor_ms']:>8.3f} {row['x_floor']:>7.1f} "
                  f"{row.get('speedup', float('nan')):>7.2f} "
                  f"{first if first is not None else float('nan'):>7.2f} "
                  f"{row.get('same_rows', float('nan')):>5.2f}", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
            if args.profile and ci == 0:
                n = min(R, args.profile_tokens)
                profile(args.profile, f"{path}, {P}x{G}x{n}",
                        lambda e=engine: sample(e, model, prompts, G, n, 0, amp), device)
    print(f"# total {time.perf_counter() - start:.1f} s", flush=True)


def check(device: torch.device) -> None:
    """Static against eager on small Llama/Qwen2 models with a likely EOS: the share of rows
    drawn the same, the largest log-prob gap before a row's first difference, the graphs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    class Tok(_Tok):
        eos_token_id = 2

    prompts = [[1, 5, 9], [1, 7], [1, 3, 3, 8], [1, 4, 4, 4, 4, 6], [1, 9]] * 4
    budgets, seeds = [3, 5, 4, 2, 1] * 4, list(range(20))
    shape = dict(TINY, vocab_size=400)
    for arch, amp_dtype in (("llama", None), ("qwen2", None), ("qwen2", torch.bfloat16)):
        if arch == "llama":
            torch.manual_seed(0)
            with torch.device(device):
                model = LlamaForCausalLM(LlamaConfig(**shape, pad_token_id=0)).eval()
        else:
            model = build_model(shape, device, torch.float32)
        with torch.no_grad():
            model.lm_head.weight[2] += 0.8
        amp = torch.autocast(device.type, dtype=amp_dtype or torch.float32,
                             enabled=amp_dtype is not None)
        for T in (1.0, 0.7, 0.0):
            with amp:
                ref = HFEngine(Tok(), static=False).generate(model, prompts, budgets, T, 40,
                                                             seeds=seeds)
                engine = HFEngine(Tok(), static=True)
                engine.static_min_rows = 1
                ro = engine.generate(model, prompts, budgets, T, 40, seeds=seeds)
                again = engine.generate(model, prompts, budgets, T, 40, seeds=seeds)
            dec = engine._decoders.get(id(model))
            w = min(ro.response_ids.shape[1], ref.response_ids.shape[1])
            eq = ro.response_ids[:, :w] == ref.response_ids[:, :w]
            lead = eq.cumprod(-1).bool()
            diff = (ro.old_logp[:, :w] - ref.old_logp[:, :w])[lead].abs()
            lengths = ref.response_mask.sum(-1)
            print(f"# check {arch} autocast={amp_dtype} T={T}: same rows "
                  f"{float(eq.all(-1).float().mean()):.3f}, logp gap "
                  f"{float(diff.max()) if diff.numel() else float('nan'):.1e}, lengths "
                  f"{int(lengths.min())}-{int(lengths.max())}, repeat equal "
                  f"{torch.equal(ro.response_ids, again.response_ids)}, graphs "
                  f"{None if dec is None else sorted(b for b, _ in dec.graphs)}", flush=True)


def profile(path: str, label: str, call, device: torch.device) -> None:
    """The top-20 ops and kernels of one sampling call by their own device time (CPU time off
    CUDA), appended to ``path`` and printed."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    try:
        with prof(activities=acts) as p:
            call()
            sync(device)
        table = p.key_averages().table(sort_by=key, row_limit=20)
    except Exception as e:  # noqa: BLE001 - a profiler problem must not cost the timings
        table = f"profiler failed: {type(e).__name__}: {e}"
    text = f"## {label}: top-20 by {key}\n{table}\n"
    with open(path, "a") as f:
        f.write(text)
    print(text, flush=True)


if __name__ == "__main__":
    main()
