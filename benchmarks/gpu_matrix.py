"""explorl vs TRL's GRPOTrainer on a GPU, on a random-init model of Qwen2.5-0.5B's shape in bf16
(figures only, no assertions).

    python benchmarks/gpu_matrix.py                       # 8/16/32/64 prompts × R 8/32/64
    python benchmarks/gpu_matrix.py --prompts 8 32 --lengths 32 --reps 1
    python benchmarks/gpu_matrix.py --precision           # bf16 mixed-precision step checks only

Nothing is downloaded: the model is a ``LlamaForCausalLM`` built from a config with the shape of
Qwen2.5-0.5B (24 layers, hidden 896, 14 query / 2 key-value heads, MLP 4864, vocabulary
151,936, tied embeddings; 494M parameters): Qwen2 is Llama with q/k/v biases; Llama's
``attention_bias`` also gives o_proj one (21.5K parameters more) and keeps AutoTokenizer from
swapping in Qwen2's BPE class. Random weights (seed 0), saved with a word-level tokenizer
whose 151,936 entries are ``w0 … w151933`` plus EOS and PAD. Prompts are 32 random words;
the reward is a deterministic hash of the response in [0, 1] (so groups have signal).

A cell is P prompts × 8 samples with every response exactly R tokens (EOS forbidden before R on
both sides, as ``matrix.py`` does), one optimizer step per batch, lr 1e-6, clip 0.2,
token-mean loss, no KL, grad clip 1.0; both sides keep float32 master weights and compute in
bf16 autocast (explorl: ``model.dtype=bfloat16``; TRL: ``bf16=True``), both generate with
Hugging Face ``generate``-style decoding on the GPU (explorl's own engine with a KV cache; TRL's
``model.generate``; no vLLM on either side). Each run is a fresh process; the sides alternate.
Figures: wall seconds per step (the GPU is not shared; CUDA is synchronised at step ends),
median over the timed steps, and peak GPU memory (``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("EXPLORL_BENCH_DEVICE", "cuda")
SAMPLES = 8
LR = 1e-6
PROMPT_WORDS = 32
QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


def sync() -> None:
    import torch

    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def peak_gb() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if DEVICE.startswith("cuda") else 0.0


def hash_reward(response: str, ground_truth: str) -> float:
    """A deterministic pseudo-random score of the response in [0, 1]."""
    return hashlib.sha256(response.encode()).digest()[0] / 255


TINY = dict(QWEN25_05B, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, vocab_size=1000)
"""``--tiny``: the same pipeline on a toy shape, to check the script on a CPU."""


def build(out: Path, shape: dict) -> None:
    """The random-init model, its tokenizer and a prompt file under ``out``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (out / "model" / "config.json").exists():
        return
    torch.manual_seed(0)
    n = shape["vocab_size"]
    vocab = {f"w{i}": i for i in range(n - 2)} | {"<eos>": n - 2, "<pad>": n - 1}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>")
    cfg = LlamaConfig(**shape, attention_bias=True, bos_token_id=None, eos_token_id=n - 2,
                      pad_token_id=n - 1)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    # Recorded as transformers 5 names it ("TokenizersBackend"), unknown to 4.x.
    tc = json.loads((out / "model" / "tokenizer_config.json").read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    (out / "model" / "tokenizer_config.json").write_text(json.dumps(tc, indent=1))
    rng = random.Random(0)
    with open(out / "prompts.jsonl", "w") as f:
        for i in range(4096):
            words = " ".join(f"w{rng.randrange(n - 2)}" for _ in range(PROMPT_WORDS))
            f.write(json.dumps({"prompt": words, "answer": str(i)}) + "\n")


def explorl_config(base: Path, prompts: int, steps: int, length: int, sets: list[str]):

    from explorl import validation
    return validation.load(
        "lab/grpo",
        [
            f"model.path={base / 'model'}",
            "model.use_chat_template=false",
            "model.dtype=bfloat16",
            f"model.device={DEVICE}",
            f"data.train=[{base / 'prompts.jsonl'}]",
            f"data.prompts_per_step={prompts}",
            f"rollout.n_samples={SAMPLES}",
            f"rollout.max_response_len={length}",
            f"reward.functions=[{{name: {__file__}:hash_reward}}]",
            f"optim.lr={LR:.1e}",
            "optim.mini_batches=1",
            "optim.ppo_epochs=1",
            "optim.warmup_steps=0",
            "algorithm.kl_coef=0.0",
            "algorithm.agg=token-mean",
            "eval.every=0",
            "log.progress=false",
            "log.plots=false",
            "log.checkpoint_every=0",
            "log.save_model=false",
            "reward.num_workers=1",
            *sets,
        ],
        max_steps=steps,
    )


def run_explorl(spec: dict) -> dict:

    from explorl.training.loop import Trainer

    base, R = Path(spec["base"]), spec["length"]
    cfg = explorl_config(base, spec["prompts"], spec["warmup"] + spec["steps"], R, spec["sets"])
    secs, rows = [], []
    with tempfile.TemporaryDirectory() as out:
        t = Trainer(cfg, out)
        o = t.cfg.optim  # the device plan's sizes (training/plan.py)
        plan = (f"{o.micro_batch_tokens or '—'} tokens / {o.micro_batch_size} rows per "
                f"micro-batch, old log-probs: {t.plan.old_logp}")
        # Every response exactly R tokens: EOS is an ordinary token to explorl's engine (its
        # stop list emptied; TRL's side forbids it with min_new_tokens). A logits hook would do
        # it too, but a hook switches the static decode path off (it would fire at capture only).
        t.engine.eos_ids = t.engine.eos_ids[:0]
        for i in range(spec["warmup"] + spec["steps"]):
            sync()
            t0 = time.perf_counter()
            row = t.train_step()
            sync()
            if i >= spec["warmup"]:
                secs.append(time.perf_counter() - t0)
            rows.append({k: v for k, v in row.items() if isinstance(v, (int, float))})
        t.pool.close()
        # which decode loop sampled (rollout.hf.static: auto is on for CUDA)
        plan += f", sampling: {'static path' if t.engine._decoders else 'eager loop'}"
    kept = rows[spec["warmup"]:]
    parts = {k: statistics.median(r.get(k, 0.0) for r in kept)
             for k in ("time/generate_s", "time/old_logp_s", "time/train_s")}
    return {"s": secs, "peak_gb": peak_gb(), "gen_s": parts["time/generate_s"], "parts": parts,
            "plan": plan}


def run_trl(spec: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    base, R, P = Path(spec["base"]), spec["length"], spec["prompts"]
    stamps: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            sync()
            stamps.append(time.perf_counter())

    rows = [json.loads(x) for x in open(base / "prompts.jsonl")]
    data = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["answer"]} for r in rows])

    def reward(completions, ground_truth, **kwargs):
        return [hash_reward(c, g) for c, g in zip(completions, ground_truth)]

    tok = AutoTokenizer.from_pretrained(base / "model")
    model = AutoModelForCausalLM.from_pretrained(base / "model", dtype=torch.float32)
    gen: list[float] = []
    generate = model.generate

    def timed_generate(*a, **k):
        sync()
        t0 = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            sync()
            gen.append(time.perf_counter() - t0)

    model.generate = timed_generate
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, max_steps=spec["warmup"] + spec["steps"], learning_rate=LR,
            lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
            per_device_train_batch_size=P * SAMPLES, gradient_accumulation_steps=1,
            num_generations=SAMPLES, steps_per_generation=1, num_iterations=1,
            max_completion_length=R, temperature=1.0, top_p=1.0, top_k=0, beta=0.0, epsilon=0.2,
            loss_type="dapo", scale_rewards="group", bf16=True, gradient_checkpointing=False,
            use_cpu=not DEVICE.startswith("cuda"),
            disable_dropout=True, logging_strategy="no", save_strategy="no", report_to="none",
            disable_tqdm=True, dataloader_num_workers=0, seed=0,
            generation_kwargs={"min_new_tokens": R},
        )
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                              processing_class=tok, callbacks=[StepClock()])
        trainer.train()
    kept = stamps[max(spec["warmup"], 1) - 1:]
    return {"s": [b - a for a, b in itertools.pairwise(kept)], "peak_gb": peak_gb(),
            "gen_s": statistics.median(gen[spec["warmup"]:]) if len(gen) > spec["warmup"] else 0}


def precision_checks(base: Path) -> None:
    """bf16 mixed-precision steps on the GPU: weights move at a small lr, the sampler's and the
    recomputed log-probs agree, no non-finite step; fp32 beside it."""
    import torch

    from explorl.training.loop import Trainer

    cases = [("bfloat16", "sampler", False), ("bfloat16", "recompute", False),
             ("bfloat16", "sampler", True), ("float32", "sampler", False)]
    for dtype, old_logp, pure in cases:
        cfg = explorl_config(base, 8, 3, 32, [f"model.dtype={dtype}",
                                              f"algorithm.old_logp={old_logp}",
                                              f"model.pure_low_precision={str(pure).lower()}"])
        with tempfile.TemporaryDirectory() as out:
            t = Trainer(cfg, out)
            before = [p.detach().clone() for p in t.policy.parameters()]
            rows = [t.train_step() for _ in range(3)]
            changed = sum((p.detach() != b).sum().item()
                          for p, b in zip(t.policy.parameters(), before))
            total = sum(b.numel() for b in before)
            dtypes = {str(p.dtype) for p in t.policy.parameters()}
            t.pool.close()
        keys = ["loss/clip_frac", "rollout/logp_diff_max", "rollout/logp_diff_mean",
                "entropy/mean", "train/skipped_steps", "loss/ratio_mean"]
        last = {k: rows[-1].get(k) for k in keys}
        print(f"precision {dtype:8s} old_logp={old_logp:9s} pure={pure!s:5s} "
              f"weights {sorted(dtypes)} "
              f"changed {changed / total:.4%} after 3 steps at lr {LR:g}; last step "
              + json.dumps({k: (round(v, 6) if isinstance(v, float) else v)
                            for k, v in last.items()}), flush=True)
        del t
        torch.cuda.empty_cache()


def worker(spec: dict) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    res = (run_trl if spec["side"] == "trl" else run_explorl)(spec)
    print("RESULT " + json.dumps(res), flush=True)


def measure(spec: dict) -> dict:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                          capture_output=True, text=True, check=False, env=env, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{spec['side']} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def mmm(xs: list[float], fmt: str = ".2f") -> str:
    return " / ".join(format(x, fmt) for x in (min(xs), statistics.median(xs), max(xs)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--lengths", type=int, nargs="+", default=[8, 32, 64])
    p.add_argument("--reps", type=int, default=1, help="alternating repetitions per cell")
    p.add_argument("--steps", type=int, default=3, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--sides", nargs="+", default=["explorl", "trl"])
    p.add_argument("--set", nargs="*", default=[], help="extra explorl overrides")
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "explorl-gpu-bench"))
    p.add_argument("--tiny", action="store_true", help="toy shape (check the script on a CPU)")
    p.add_argument("--precision", action="store_true", help="bf16 step checks, then stop")
    p.add_argument("--smoke", action="store_true", help="--tiny on the CPU, one cell, one step")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.smoke:
        global DEVICE
        DEVICE = os.environ["EXPLORL_BENCH_DEVICE"] = "cpu"  # the workers read it too
        args.tiny, args.prompts, args.lengths, args.steps, args.warmup = True, [2], [4], 1, 1
    sys.path.insert(0, str(ROOT / "src"))
    import torch
    import transformers

    base = Path(args.dir + ("-tiny" if args.tiny else ""))
    t0 = time.perf_counter()
    build(base, TINY if args.tiny else QWEN25_05B)
    name = torch.cuda.get_device_name() if DEVICE.startswith("cuda") else DEVICE
    print(f"{name}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}; model built/loaded in {time.perf_counter() - t0:.0f} s",
          flush=True)
    if args.precision:
        return precision_checks(base)
    try:
        import trl
        print(f"trl {trl.__version__}", flush=True)
    except ImportError:
        args.sides = [s for s in args.sides if s != "trl"]
    print("\n| prompts × R | explorl s/step | TRL s/step | TRL / explorl "
          "| generate s explorl / TRL | explorl old-logp / update s | peak GB explorl / TRL |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for R in args.lengths:
        for P in args.prompts:
            runs: dict[str, list[dict]] = {s: [] for s in args.sides}
            for _ in range(args.reps):
                for side in args.sides:
                    spec = {"side": side, "prompts": P, "length": R, "steps": args.steps,
                            "warmup": args.warmup, "base": str(base), "sets": args.set}
                    try:
                        runs[side].append(measure(spec))
                    except RuntimeError as e:
                        print(f"<!-- {P}×{R} {side}: {str(e)[-600:]} -->", flush=True)
            med = {s: [statistics.median(r["s"]) for r in rs] for s, rs in runs.items()}
            e, tr = med.get("explorl", []), med.get("trl", [])
            ratio = mmm([b / a for a, b in zip(e, tr)]) if e and tr else "—"
            gb = " / ".join(f"{max(r['peak_gb'] for r in runs[s]):.1f}" if runs.get(s) else "—"
                            for s in ("explorl", "trl"))
            gen = " / ".join(f"{statistics.median(r['gen_s'] for r in runs[s]):.2f}"
                             if runs.get(s) else "—" for s in ("explorl", "trl"))
            parts = " / ".join(
                f"{statistics.median(r['parts'][k] for r in runs['explorl']):.2f}"
                for k in ("time/old_logp_s", "time/train_s")) if runs.get("explorl") else "—"
            print(f"| {P} × {R} | {mmm(e) if e else '—'} | {mmm(tr) if tr else '—'} | {ratio} "
                  f"| {gen} | {parts} | {gb} |", flush=True)


if __name__ == "__main__":
    main()
