"""explorl's GPU acceptance run: one command on a one-GPU machine, one table, row by row.

    python benchmarks/gpu_acceptance.py                 # one CUDA GPU (an H100: ~6–9 min)
    python benchmarks/gpu_acceptance.py --budget-s 240  # what fits in 4 minutes, the rest skipped
    python benchmarks/gpu_acceptance.py --smoke         # CPU, tiny shapes, seconds: the script runs

Each row is printed (and appended to ``--out`` as a JSON line) as soon as it is measured, so a
run cut off by a time limit still shows what it measured. ``--budget-s``: a row whose estimated
cost no longer fits in what is left is skipped with a line saying so, and a row that runs over
what is left is stopped (its worker process is killed).

Needs torch, transformers, accelerate and peft; TRL's side also needs trl, datasets and
math-verify, which a machine without internet installs from wheels copied in beside it:

    pip install --no-index --find-links wheels/ trl datasets math-verify

Nothing is downloaded: the model is ``gpu_matrix.py``'s random-init model of Qwen2.5-0.5B's shape
(hidden 896, 24 layers, 14 query / 2 key-value heads, MLP 4864, vocabulary 151,936; built from a
config and a word-level tokenizer on first use, under ``--dir``). Rows of the table:

- **bf16 master weights**: two explorl steps in bf16 autocast at lr 1e-6: the weights stay
  float32 and ≥ 99% of them move (pure bf16 weights would keep ~2% of the updates), no step
  skipped as non-finite.
- **step P × 8 × R** for P in 16, 64 and R in 32, 256: explorl at its defaults (the device plan:
  docs/gpu.md; only the model, data, lengths and the benchmark's lr/loss settings are set) vs TRL's
  ``GRPOTrainer`` (bf16, no vLLM, one optimizer step per batch), each in a fresh process, every
  response exactly R tokens; median wall seconds per step after a warm-up step, peak GPU memory
  (``torch.cuda.max_memory_allocated``). Goal: ≥ 1.0× TRL's speed at ≤ TRL's memory.
- **sampler**: explorl's engine (counter-based draws, as the trainer samples) vs
  ``model.generate(do_sample=True)`` at the 151,936 vocabulary, 64 prompts × 8 samples × 128
  tokens, bf16 autocast over float32 weights on both: generated tokens per second, explorl's
  beside the decode floor (the matrices once and the rows' keys and values per step, over the
  device's measured copy bandwidth: ``gpu_sampling.py``), and which decode loop ran (the static
  path is on by default on CUDA).
- **LoRA step**: peak memory of one 16 × 8 × 256 step with ``model.lora`` on, when this
  version's config has that section (the row says so when it has not).

Figures and their machine and date: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CELLS = ["16x32", "64x32", "16x256", "64x256"]
SMOKE_CELLS = ["2x4"]
LR = 1e-6
# Seconds one worker process took on an H100 (model load and warm-up included), to skip a row
# that would not fit in --budget-s. Keys: (kind, prompts × length) or kind alone.
ESTIMATE_S = {("explorl", 16 * 32): 35, ("explorl", 64 * 32): 45, ("explorl", 16 * 256): 60,
              ("explorl", 64 * 256): 90, ("trl", 16 * 32): 40, ("trl", 64 * 32): 55,
              ("trl", 16 * 256): 90, ("trl", 64 * 256): 120, "precision": 40, "sampler": 60}
HEADER = ("| check | setting | explorl | TRL | explorl vs TRL | goal | result |\n"
          "|---|---|---|---|---|---|---|")


def _device() -> str:
    return os.environ.get("EXPLORL_BENCH_DEVICE", "cuda")


def _sync() -> None:
    import torch

    if _device().startswith("cuda"):
        torch.cuda.synchronize()


def precision_check(spec: dict) -> dict:
    """Two bf16 steps over float32 master weights (the trainer's defaults on a bf16 GPU)."""
    import gpu_matrix as gm
    import torch

    from explorl.training.loop import Trainer

    cfg = gm.explorl_config(Path(spec["base"]), spec["prompts"], 2, spec["length"], [])
    with tempfile.TemporaryDirectory() as out:
        t = Trainer(cfg, out)
        before = [p.detach().clone() for p in t.policy.parameters()]
        rows = [t.train_step() for _ in range(2)]
        changed = sum(int((p.detach() != b).sum()) for p, b in zip(t.policy.parameters(), before))
        total = sum(b.numel() for b in before)
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in t.policy.parameters()})
        t.pool.close()
    del t
    if _device().startswith("cuda"):
        torch.cuda.empty_cache()
    return {"changed": changed / total, "dtypes": dtypes,
            "skipped": rows[-1].get("train/skipped_steps", 0.0)}


def sampler_speed(spec: dict) -> dict:
    """Generated tokens per second: explorl's engine vs ``model.generate`` on the same model."""
    import torch

    from explorl.config import ModelConfig
    from explorl.models import load_model, load_tokenizer
    from explorl.rollout.hf import HFEngine, left_pad

    base, device = Path(spec["base"]), torch.device(_device())
    P, G, R = spec["prompts"], spec["samples"], spec["length"]
    mcfg = ModelConfig(dtype="bfloat16", use_chat_template=False)
    tok = load_tokenizer(base / "model", mcfg)
    model = load_model(base / "model", mcfg, device).eval()
    eos = tok.eos_token_id
    texts = [json.loads(x)["prompt"] for x in open(base / "prompts.jsonl")][:P]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    # Every response exactly R tokens on both sides: no stop token for explorl's engine (EOS is
    # an ordinary token to it), min_new_tokens for generate. A logits hook would forbid EOS on
    # both, but a hook switches the static decode path off (it would fire at capture only).
    engine = HFEngine(tok, batch_size=P * G, eos_ids=[])

    def explorl_call(i: int) -> int:
        ro = engine.generate(model, ids, [G] * P, 1.0, R, seeds=[i * P + j for j in range(P)])
        return int(ro.response_mask.sum())

    def generate_call(i: int) -> int:
        x, m = left_pad([p for p in ids for _ in range(G)], tok.pad_token_id, device)
        with torch.no_grad():
            out = model.generate(input_ids=x, attention_mask=m.long(), do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=R,
                                 min_new_tokens=R, pad_token_id=tok.pad_token_id,
                                 eos_token_id=eos)
        return int((out.shape[1] - x.shape[1]) * len(x))

    from gpu_sampling import copy_bandwidth, step_bytes

    res = {}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    context = sum(map(len, ids)) / len(ids) + R / 2  # mean keys per row over the response
    res["floor_tps"] = P * G / (step_bytes(model, P * G, context, dtype) / copy_bandwidth(device))
    with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
        for name, call in (("explorl", explorl_call), ("generate", generate_call)):
            call(1000)  # warm-up
            _sync()
            t0, n = time.perf_counter(), 0
            for i in range(spec["calls"]):
                n += call(i)
            _sync()
            res[name] = n / (time.perf_counter() - t0)
    res["static"] = bool(engine._decoders)  # which decode loop explorl's side ran
    return res


def lora_sets() -> list[str] | None:
    """Overrides that turn LoRA on, if this version's config has ``model.lora``; else None."""
    from explorl.config import ModelConfig

    field = {f.name: f for f in dataclasses.fields(ModelConfig)}.get("lora")
    if field is None:
        return None
    lora = field.default_factory() if callable(field.default_factory) else field.default
    names = {f.name for f in dataclasses.fields(lora)} if dataclasses.is_dataclass(lora) else set()
    if "enabled" in names:
        return ["model.lora.enabled=true"]
    if "r" in names:
        return ["model.lora.r=16"]
    return None


def worker(spec: dict) -> None:
    import gpu_matrix as gm

    kind = spec["kind"]
    if kind in ("explorl", "trl"):
        res = (gm.run_trl if kind == "trl" else gm.run_explorl)(spec)
    else:
        res = {"precision": precision_check, "sampler": sampler_speed}[kind](spec)
    print("RESULT " + json.dumps(res), flush=True)


class Budget:
    """Seconds left of ``--budget-s`` (None: no budget)."""

    def __init__(self, seconds: float | None) -> None:
        self.end = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        return None if self.end is None else self.end - time.monotonic()

    def skip(self, spec: dict) -> str | None:
        """Why ``spec`` is skipped (its estimate does not fit), or None to run it."""
        left = self.left()
        if left is None or spec.get("smoke"):
            return None
        key = (spec["kind"], spec.get("prompts", 0) * spec.get("length", 0))
        est = ESTIMATE_S.get(key, ESTIMATE_S.get(spec["kind"], 60))
        if est > left:
            return f"skipped: ~{est} s would not fit in the {max(left, 0):.0f} s left of --budget-s"
        return None


def measure(spec: dict, timeout: float | None = None) -> dict:
    """``spec``'s run in a fresh process (its own GPU memory peak); in this one under --smoke."""
    import subprocess

    if spec.get("smoke"):
        import gpu_matrix as gm

        if spec["kind"] in ("explorl", "trl"):
            return (gm.run_trl if spec["kind"] == "trl" else gm.run_explorl)(spec)
        return {"precision": precision_check, "sampler": sampler_speed}[spec["kind"]](spec)

    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(HERE),
                                          os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                              capture_output=True, text=True, check=False, env=env, cwd=ROOT,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"stopped after {timeout:.0f} s: the rest of --budget-s") from None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{spec['kind']} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


BUDGET = Budget(None)
SKIP: set[str] = set()  # --skip: rows not to run


def _try(spec: dict) -> dict | str:
    if spec.get("row") in SKIP:
        return "skipped: --skip"
    why = BUDGET.skip(spec)
    if why:
        return why
    left = BUDGET.left()
    try:
        return measure(spec, timeout=None if left is None else max(left, 1.0))
    except RuntimeError as e:
        return "error: " + str(e).strip().splitlines()[-1][:200]


def emit(row: tuple[str, ...], out: str | None) -> None:
    """Print one table row now (and append it to ``out`` as a JSON line)."""
    print("| " + " | ".join(row) + " |", flush=True)
    if out:
        keys = ("check", "setting", "explorl", "trl", "vs_trl", "goal", "result")
        with open(out, "a") as f:
            f.write(json.dumps({"table": "acceptance", **dict(zip(keys, row))}) + "\n")


def main() -> None:
    global BUDGET
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, one step: seconds")
    p.add_argument("--cells", nargs="+", help=f"PROMPTSxLENGTH, 8 samples each (default {CELLS})")
    p.add_argument("--steps", type=int, default=2, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--no-trl", action="store_true", help="explorl's side only")
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "explorl-gpu-bench"))
    p.add_argument("--budget-s", type=float, help="seconds for the whole run (default: no limit)")
    p.add_argument("--out", help="append each row to this file as a JSON line")
    p.add_argument("--skip", nargs="+", default=[], choices=["precision", "sampler", "lora"],
                   help="rows not to run (each printed as skipped)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.smoke:
        os.environ["EXPLORL_BENCH_DEVICE"] = "cpu"
    sys.path[:0] = [str(ROOT / "src"), str(HERE)]
    if args.worker:
        return worker(json.loads(args.worker))
    BUDGET = Budget(args.budget_s)
    SKIP.update(args.skip)
    import gpu_matrix as gm
    import torch
    import transformers

    if not args.smoke and not torch.cuda.is_available():
        sys.exit("gpu_acceptance.py needs a CUDA GPU (or --smoke, to check the script on a CPU)")
    cells = args.cells or (SMOKE_CELLS if args.smoke else CELLS)
    steps, warmup = (1, 1) if args.smoke else (args.steps, args.warmup)
    base = Path(args.dir + ("-tiny" if args.smoke else ""))
    gm.build(base, gm.TINY if args.smoke else gm.QWEN25_05B)
    try:
        import trl
        versions = f", trl {trl.__version__}"
    except ImportError:
        trl, versions = None, ", trl not installed (its side skipped)"
    use_trl = trl is not None and not args.no_trl
    name = torch.cuda.get_device_name() if not args.smoke else "CPU (--smoke, tiny shapes)"
    print(f"{name}; {datetime.date.today()}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}{versions}\n", flush=True)
    print(HEADER, flush=True)

    def add(row: tuple[str, ...]) -> None:
        emit(row, args.out)
    common = {"base": str(base), "steps": steps, "warmup": warmup, "sets": [],
              "smoke": args.smoke}

    r = _try({**common, "kind": "precision", "row": "precision",
              "prompts": 2 if args.smoke else 8, "length": 4 if args.smoke else 32})
    ok = isinstance(r, dict) and r["dtypes"] == ["float32"] and r["changed"] >= 0.99 \
        and r["skipped"] == 0
    add(("bf16 over fp32 master weights", "2 steps, lr 1e-6",
         r if isinstance(r, str) else
         f"weights {'/'.join(r['dtypes'])}, {r['changed']:.2%} moved, "
         f"{r['skipped']:.0f} skipped", "—", "—", "float32, ≥ 99% moved",
         "skipped" if str(r).startswith("skipped") else "pass" if ok else "FAIL"))

    lora_cell = (2, 4) if args.smoke else (16, 256)
    peaks: dict[tuple[int, int], float] = {}
    verdict = (lambda ok: "— (smoke)") if args.smoke else (lambda ok: "pass" if ok else "FAIL")
    for cell in cells:
        P, R = (int(x) for x in cell.split("x"))
        got = {side: _try({**common, "kind": side, "prompts": P, "length": R})
               for side in (["explorl", "trl"] if use_trl else ["explorl"])}
        e, t = got["explorl"], got.get("trl", "not run")
        es = statistics.median(e["s"]) if isinstance(e, dict) else None
        ts = statistics.median(t["s"]) if isinstance(t, dict) else None
        if es:
            peaks[(P, R)] = e["peak_gb"]
        ratio = f"{ts / es:.2f}× speed" if es and ts else "—"
        mem = (f"{e['peak_gb']:.1f} / {t['peak_gb']:.1f} GB" if es and ts else
               f"{e['peak_gb']:.1f} GB" if es else "—")
        ok = es and ts and ts / es >= 1.0 and e["peak_gb"] <= t["peak_gb"]
        add((f"step {P} × 8 × {R}", e.get("plan", "") if es else "",
             f"{es:.2f} s/step" if es else str(e), f"{ts:.2f} s/step" if ts else str(t),
             f"{ratio}; {mem}", "≥ 1.0×, ≤ TRL's GB",
             "skipped" if str(e).startswith("skipped") else
             "—" if es and not ts else verdict(ok)))

    P, G, R = (2, 2, 4) if args.smoke else (64, 8, 128)
    r = _try({**common, "kind": "sampler", "row": "sampler", "prompts": P, "samples": G,
              "length": R, "calls": 1 if args.smoke else 3})
    if isinstance(r, dict):
        ratio = r["explorl"] / r["generate"]
        path = "static path" if r["static"] else "eager loop"
        add((f"sampler, vocab {gm.TINY['vocab_size'] if args.smoke else 151936:,}",
             f"{P} × {G} × {R} tokens ({path})",
             f"{r['explorl']:,.0f} tokens/s ({r['floor_tps'] / r['explorl']:.0f}× the decode "
             f"floor's {r['floor_tps']:,.0f})",
             f"generate {r['generate']:,.0f} tokens/s", f"{ratio:.2f}×", "≥ 1.0×",
             verdict(ratio >= 1.0)))
    else:
        add(("sampler", f"{P} × {G} × {R}", r, "—", "—", "≥ 1.0×",
             "skipped" if r.startswith("skipped") else "FAIL"))

    sets = lora_sets()
    if sets is None:
        add(("LoRA step", "model.lora is not in this version's config", "—", "—", "—",
             "less than the full step", "—"))
    else:
        P, R = lora_cell
        full_peak = peaks.get(lora_cell)
        r = _try({**common, "kind": "explorl", "row": "lora", "prompts": P, "length": R,
                  "sets": sets})
        ok = isinstance(r, dict) and full_peak is not None and r["peak_gb"] < full_peak
        add(("LoRA step", f"{P} × 8 × {R}, {' '.join(sets)}",
             f"{r['peak_gb']:.1f} GB peak" if isinstance(r, dict) else r, "—",
             f"full step {full_peak:.1f} GB" if full_peak is not None else "—",
             "less than the full step",
             "skipped" if str(r).startswith("skipped") else verdict(ok)))



if __name__ == "__main__":
    main()
