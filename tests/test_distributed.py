"""Data-parallel training: 2 CPU processes (gloo) equal 1 process with the same global batch.

Each 2-process scenario runs the real CLI under a launcher (``accelerate launch`` with the shipped
``accelerate/cpu_2proc.yaml``, or ``torchrun``) and is compared step by step with an
in-process single-process run. Batch composition changes float round-off only: metrics agree
to ~2e-6 (relative). Weights agree to ~2e-6 except a rare coordinate whose gradient is ~0, where
Adam's m/√v amplifies round-off (seen: 3e-5): hence a looser weight tolerance. A gradient scale
error would not show in Adam's weights but does in ``grad/norm``, which is compared at 1e-4.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from safetensors.torch import load_file

from explorl import config as C
from explorl.config import builtin
from explorl.outputs.checkpoint import latest_checkpoint
from explorl.outputs.runlog import read_metrics
from explorl.rollout.seeding import NoiseStream, gumbel_sample, row_keys
from explorl.training.distributed import Single
from explorl.training.loop import TIME_KEYS, Trainer

ROOT = Path(__file__).resolve().parents[1]
REL, ABS = 1e-4, 1e-5  # metrics
W_REL, W_ABS = 1e-3, 1e-4  # weights

# Exercise what crosses ranks: global mini-batches (2 per step), validation sharding, a mid-run
# checkpoint (resumed at N = 1 below).
BASE = {
    "max_steps": 3,
    "optim": {"mini_batches": 2},
    "eval": {"every": 2},
    "log": {"checkpoint_every": 2},
}
# The E3 controllers with EEPO, DAPO dynamic sampling and uneven micro-batches (3 rows or 24
# tokens, in the update and the old-log-prob recompute, over several rounds): budgets over the
# global batch (n_min 2 so they differ per prompt after the first epoch), the temperature
# scheduler on the global entropy, the EEPO gate and its unlearning step (alpha = 10 keeps it
# open), ranks keeping different numbers of groups and running idle passes.
CONTROLLERS = {
    "max_steps": 4,
    "data": {"max_train_prompts": 8},
    "eval": {"every": 2},
    "control": {
        "temperature": {"enabled": True},
        "budget": {"enabled": True, "n_min_limit": 2, "n_max_limit": 8},
        "eepo": {"enabled": True, "alpha": 10.0},
    },
    "algorithm": {"dynamic_sampling": True, "old_logp": "recompute"},
    "optim": {"mini_batches": 2, "micro_batch_size": 3, "micro_batch_tokens": 24},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(launcher: str, cfg: C.RunConfig, out: Path, *sets: str) -> None:
    """``explorl train`` on 2 processes, as the README says to run it."""
    recipe = out.parent / f"{out.name}.yaml"
    C.save(cfg, recipe)
    if launcher == "accelerate":
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(builtin.folder("recipe") / "accelerate" / "cpu_2proc.yaml"),
            "--main_process_port",
            str(_free_port()),
        ]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
        ]
    cmd += ["-m", "explorl", "train", str(recipe), "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-2000:]}\n{res.stderr[-6000:]}"
    assert "run eagerly" not in res.stderr + res.stdout  # model.compile's fallback warning


def _assert_same_run(one: Path, other: Path) -> None:
    a, b = read_metrics(one), read_metrics(other)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        keys = {k for k in ra if not k.startswith(TIME_KEYS)}
        assert keys == {k for k in rb if not k.startswith(TIME_KEYS)}
        for k in sorted(keys):
            if ra[k] is None or rb[k] is None:
                assert ra[k] == rb[k], (ra["step"], k)
            else:
                assert rb[k] == pytest.approx(ra[k], rel=REL, abs=ABS), (
                    ra["step"],
                    k,
                    ra[k],
                    rb[k],
                )
    ca, cb = (run / "checkpoints" / f"step-{rows[-1]['step']}" for run, rows in ((one, a),
                                                                                (other, b)))
    name = "model.safetensors" if (ca / "model.safetensors").exists() else (
        "adapter_model.safetensors")  # LoRA runs checkpoint their adapters only
    wa, wb = load_file(ca / name), load_file(cb / name)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=W_REL, atol=W_ABS)


def _resume_at_one_process(cfg: C.RunConfig, run: Path, copy: Path) -> None:
    """Continue ``run`` in this process from its mid-run checkpoint (the last one removed)."""
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / f"step-{cfg.max_steps}")
    Trainer(cfg, copy, resume=True).train()


# Plain GRPO with DDP (the README's accelerate command); FSDP with the Entropy Scheduling adaptive
# clip controller (its entropy window must be global) and an entropy bonus; DDP over compiled
# decoder layers (model.compile).
ADAPTIVE = {
    "control": {"adaptive": {"enabled": True, "warmup": 1}},
    "algorithm": {"entropy_coef": 0.01},
}


@pytest.mark.parametrize(
    "launcher,strategy,extra",
    [("accelerate", "ddp", {}), ("torchrun", "fsdp", ADAPTIVE),
     ("torchrun", "ddp", {"model": {"compile": True}})],
    ids=["grpo-ddp-accelerate", "adaptive-fsdp-torchrun", "compiled-ddp-torchrun"],
)
def test_two_processes_equal_one_and_resume_at_one(tiny_model, tmp_path, launcher, strategy, extra):
    cfg = tiny_config(tiny_model, {**BASE, **extra})
    _launch(launcher, cfg, tmp_path / "two", f"dist.strategy={strategy}")
    Trainer(cfg, tmp_path / "one").train()
    _assert_same_run(tmp_path / "one", tmp_path / "two")
    _resume_at_one_process(cfg, tmp_path / "two", tmp_path / "resumed")
    _assert_same_run(tmp_path / "one", tmp_path / "resumed")


def test_controllers_two_processes_equal_one(tiny_model, tmp_path):
    cfg = tiny_config(tiny_model, CONTROLLERS)
    _launch("torchrun", cfg, tmp_path / "two")
    Trainer(cfg, tmp_path / "one").train()
    _assert_same_run(tmp_path / "one", tmp_path / "two")
    rows = [r for r in read_metrics(tmp_path / "two") if r["step"] >= 1]  # 0: pre-RL validation
    # the run really exercised what it is meant to
    assert any(r["rollout/budget_min"] < r["rollout/budget_max"] for r in rows)
    assert any(r["eepo/active"] == 1.0 for r in rows) and any(
        r["rollout/filtered_frac"] > 0 for r in rows
    )
    assert rows[-1]["control/temperature"] != rows[0]["control/temperature"]


def _rank_pid(out: Path, rank: int) -> int | None:
    """The pid of the ``explorl train`` worker of ``rank`` writing into ``out``."""
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(out).encode() in cmd and b"torch.distributed.run" not in cmd and (
                f"RANK={rank}".encode() in env):
            return int(proc.name)
    return None


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_a_signal_to_one_rank_stops_both_after_the_same_step(tiny_model, tmp_path):
    """SIGUSR1 to rank 1 only: the stop request rides on the step's reduction, so rank 0 stops
    after the same step and both write the checkpoint (a launcher reports a worker's 75 as a
    failure of its own)."""
    cfg = tiny_config(tiny_model, {"max_steps": 6, "eval": {"every": 0},
                                   "log": {"checkpoint_every": 0}})
    out = tmp_path / "two"
    recipe = tmp_path / "two.yaml"
    C.save(cfg, recipe)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "explorl", "train", str(recipe), "--out", str(out)]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not read_metrics(out) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = _rank_pid(out, 1)
    assert pid is not None
    os.kill(pid, signal.SIGUSR1)
    log, _ = proc.communicate(timeout=300)
    steps = [r["step"] for r in read_metrics(out)]
    assert steps and steps[-1] < 6 and "stopped by SIGUSR1" in log, log[-3000:]
    assert latest_checkpoint(out) == out / "checkpoints" / f"step-{steps[-1]}"
    assert "exitcode  : 75" in log  # torchrun's failure report; the workers ended alike


# ----------------------------------------------------------------------------- pieces, in-process


@pytest.mark.parametrize("name", ["cpu_2proc", "single_node_ddp", "multi_node_ddp", "fsdp"])
def test_shipped_accelerate_configs_load(name):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(builtin.folder("recipe") / "accelerate" / f"{name}.yaml"))
    assert cfg.num_processes >= 2 and cfg.num_processes % cfg.num_machines == 0
    if name == "fsdp":  # what explorl supports (see explorl.training.distributed)
        assert (
            cfg.fsdp_config["fsdp_version"] == 1
            and cfg.fsdp_config["fsdp_use_orig_params"] is False
        )


def test_shards_are_contiguous_and_cover_the_batch():
    for n in (4, 5, 7):
        parts = []
        for rank in range(3):
            d = Single()
            d.rank, d.world_size = rank, 3
            parts.append(d.shard(n))
        assert [i for s in parts for i in range(s.start, s.stop)] == list(range(n))
        assert max(s.stop - s.start for s in parts) - min(s.stop - s.start for s in parts) <= 1


@pytest.mark.parametrize("V", [4, 300])  # Gumbel-max with MT noise; inverse CDF beyond 227
def test_counter_based_sampling_ignores_the_batch_and_samples_p(V):
    keys = row_keys([11, 22, 33], [2, 3, 1])  # 6 responses
    logp = torch.randn(6, V).log_softmax(-1)

    def draw(rows, t):
        return NoiseStream(keys[rows], V, max_len=10).sample(logp[rows], t)

    whole = draw(slice(None), 4)
    assert torch.equal(draw(slice(2, 5), 4), whole[2:5])  # another batch, same draws
    assert torch.equal(draw([5, 0, 3], 4), whole[[5, 0, 3]])
    assert not torch.equal(torch.stack([draw(slice(None), t) for t in range(5, 9)]),
                           whole.expand(4, -1))  # later positions draw afresh
    p = torch.zeros(V)
    p[:4] = torch.tensor([0.5, 0.25, 0.125, 0.125])
    many = row_keys([7], [20000])
    got = NoiseStream(many, V, max_len=1).sample(p.log().expand(20000, V), 0)
    freq = torch.bincount(got, minlength=V) / 20000
    assert torch.allclose(freq[:4], p[:4], atol=0.015) and freq[4:].sum() == 0
    assert torch.equal(gumbel_sample(logp, keys, 4), whole) == (V <= 227)


def test_cov_loss_selection_pre_pass_on_two_processes(tiny_model, tmp_path):
    """KL-Cov over mini-batches split into uneven micro-batches (3 rows or 24 tokens): the
    selection pre-pass
    runs as many forwards on every rank as the busiest one, so FSDP's collectives stay matched.
    Selecting every token (ratio 1) makes the selection independent of how rows are sharded, so
    2 processes must train exactly as 1 (with a partial ratio each rank selects over its share,
    as the README says)."""
    cfg = tiny_config(
        tiny_model,
        {
            **BASE,
            "algorithm": {"loss": "kl_cov", "kl_cov_ratio": 1.0},
            "optim": {"mini_batches": 2, "ppo_epochs": 2, "micro_batch_size": 3,
                      "micro_batch_tokens": 24},
        },
    )
    _launch("torchrun", cfg, tmp_path / "two", "dist.strategy=fsdp")
    Trainer(cfg, tmp_path / "one").train()
    a, b = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a[1:], b[1:]):  # a[0]: the step-0 validation
        assert ra["loss/cov_selected_frac"] == pytest.approx(1.0) and rb[
            "loss/cov_selected_frac"
        ] == pytest.approx(1.0)
        for k in ["reward/mean", "loss/policy", "grad/norm", "loss/ratio_mean"]:
            assert rb[k] == pytest.approx(ra[k], rel=REL, abs=ABS), (ra["step"], k)
    wa = load_file(tmp_path / "one" / "checkpoints" / "step-3" / "model.safetensors")
    wb = load_file(tmp_path / "two" / "checkpoints" / "step-3" / "model.safetensors")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=W_REL, atol=W_ABS)


def test_forking_mask_entropic_and_shaping_two_processes_equal_one(tiny_model, tmp_path):
    """Issue 18's cross-rank statistics: the forking mask's threshold over the mini-batch's valid
    tokens of every rank (a gather per mini-batch, uneven micro-batches), EntroPIC's global
    confident-token denominator and α from the global entropy, the shaping metrics' global means.
    2 processes train as 1, threshold included."""
    methods = {"algorithm": {"entropy_mask_ratio": 0.3, "entropy_shaping_alpha": 0.4},
               "control": {"entropic": {"enabled": True, "target": 0.5}},
               "optim": {"mini_batches": 2, "micro_batch_size": 3}}
    cfg = tiny_config(tiny_model, {**BASE, **methods})
    _launch("torchrun", cfg, tmp_path / "two")
    Trainer(cfg, tmp_path / "one").train()
    _assert_same_run(tmp_path / "one", tmp_path / "two")
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    train = [(a, b) for a, b in zip(one, two) if a["step"] > 0]
    assert all(b["entropy/mask_threshold"] == pytest.approx(a["entropy/mask_threshold"], rel=1e-5)
               and b["entropy/mask_kept_frac"] == a["entropy/mask_kept_frac"] for a, b in train)
    assert all(a["control/pos_neg_weight"] != 0 for a, _ in train)
