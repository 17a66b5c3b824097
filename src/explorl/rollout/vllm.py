"""The ``vllm`` rollout engine: sampling with vLLM, weights pushed from the training model.

The engine keeps its own copy of the weights (vLLM's layout: fused projections, repacked for
its kernels). ``sync_weights(model, version)`` pushes the training model's weights into it
(``reload_weights`` on vLLM's worker, then the prefix cache is dropped); the trainer calls it
before every sampling call with a ``version`` that changes whenever the weights do, and a push
is skipped when the version did not change. ``generate(model, ...)`` also checks a checksum of
``model``'s weights against the last push and pushes again when they differ (EEPO's unlearned
copy, a caller that forgot to sync). A push that raises rebuilds the engine and pushes again.
Every sampling call also scores a fixed probe sequence with both vLLM and ``model``: a gap
above ``sync_check_tol`` (a push that loaded only part of the weights, a broken engine)
discards the samples, rebuilds the engine, pushes and samples again; a second failure raises.
The engine never returns samples from stale weights.

What a response gets, compared with the ``hf`` engine (tests/test_rollout_vllm.py):

- One vLLM request per response, seeded with explorl's own per-sample seed
  ``mix_seed(seeds[i], j)`` (``explorl.rollout.seeding``): a response depends on its seed only,
  not on the batch, so a resumed run samples the same responses. (vLLM's ``n=G`` would give the
  children seed + j, overlapping between prompts.) The draws differ from the ``hf`` engine's
  (other noise); greedy rows (temperature 0) are the same.
- ``old_logp``: vLLM's sampled-token log-probs at the sampling temperature
  (``logprobs_mode="processed_logprobs"``; vLLM's default is before temperature). vLLM reports
  no entropy. With ``recompute`` (the default) one no-grad forward of ``model`` (the model
  that sampled: the policy, or EEPO's unlearned copy) over the responses
  (``explorl.policy.forward.response_logprobs``, the trainer's layout, under the caller's
  autocast)
  replaces old_logp and gives the entropy, so the engine ``logprobs_match_trainer`` and the
  trainer's ``algorithm.old_logp: auto`` needs no second pass in float32; the gap to vLLM's
  own log-probs is reported by ``pop_metrics``. Without ``recompute`` ``entropy`` is NaN and
  the trainer must recompute both (``algorithm.old_logp: auto``/``recompute``; the config
  refuses ``sampler`` and EEPO, whose stage-2 rows keep the engine's values).
- Responses stop at EOS or another of ``eos_ids`` (vLLM ``stop_token_ids``: a tool call's end
  with ``rollout.tools``), the stop token included as in the ``hf`` engine, or at
  ``max_new_tokens``.

``vllm.LLM``'s arguments come from ``rollout.vllm_settings.engine_kwargs`` (by device; docs/
gpu-vllm.md). With ``sleep_level`` (CUDA) the engine sleeps after sampling and wakes before the
next push (``rollout.vllm_process.SleepCycle``). The rollouts carry vLLM's own log-probs as
``engine_logp`` for the rollout correction.

In-process mode (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) pushes tensors directly. vLLM then
resets the global RNGs when it builds its engine and sets torch's thread count to 1 (and, on
CPU, replaces ``torch.set_num_threads`` with a no-op): the engine saves and restores all
three. Child-process mode pushes through a safetensors file in /dev/shm.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import importlib.util
import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import torch

from explorl.adapters import is_adapted, merged_weights, plain
from explorl.config.sections import VLLMConfig
from explorl.policy.forward import response_logprobs
from explorl.rollout.hf import left_pad
from explorl.rollout.seeding import mix_seed
from explorl.rollout.types import Rollouts
from explorl.rollout.vllm_process import SleepCycle, preserved_process_state, quiet_vllm_logs
from explorl.rollout.vllm_settings import ModelShape, cpu_head_sizes, engine_kwargs

PROBE_LEN = 16  # tokens of the probe sequence scored after every push


def weights_of(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(checkpoint name, tensor)`` of every parameter, the tied output embedding included.

    ``named_parameters`` lists a tied ``lm_head.weight`` once, under the input embedding's
    name; vLLM's reload then leaves its output head as it was, so it is added explicitly. An
    adapted model (LoRA) gives its base's names with the adapters merged in (``merged_weights``).
    """
    if is_adapted(model):
        out, model = merged_weights(model), plain(model)
    else:
        out = [(n, p.detach()) for n, p in model.named_parameters()]
    names = {n for n, _ in out}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and "lm_head.weight" not in names:
        prefix = [n for n, m in model.named_modules() if m is head]
        if prefix and prefix[0]:
            out.append((f"{prefix[0]}.weight", head.weight.detach()))
    return out


def weights_checksum(model: torch.nn.Module) -> torch.Tensor:
    """Per-tensor sum and sum of squares (2 × tensors, float64): changes when any weight does."""
    parts = []
    for p in model.parameters():
        d = p.detach()
        parts += [d.sum(dtype=torch.float64), d.double().square().sum()]
    return torch.stack(parts).cpu() if parts else torch.zeros(0, dtype=torch.float64)  # host


class VLLMEngine:
    """The ``vllm`` rollout engine (module docstring). ``model_path``: the HF model directory
    vLLM loads at start-up (its config, tokenizer and initial weights); every later push comes
    from the model passed to ``sync_weights``/``generate``.

    ``dtype``: vLLM's dtype (``float32``, ``bfloat16``, ``float16``, or ``auto`` = the
    checkpoint's). ``settings``: ``rollout.vllm`` (``VLLMConfig``; ``vllm.LLM``'s arguments come
    from ``vllm_settings.engine_kwargs`` for ``device_type``, None: cuda where available);
    keyword ``overrides`` replace its fields (``kv_cache_gib=0.25``, ``in_process=False``...).
    ``recompute``: old_logp and entropy from a forward of ``model`` (see the module docstring),
    in batches of ``score_batch_size`` responses. ``sync_check_tol``: largest probe gap after a
    push (None: 1e-3 in float32, else 0.1). ``world_size``: training processes, each with its
    own engine.
    """

    def __init__(
        self,
        model_path: str | Path,
        tokenizer,
        *,
        dtype: str = "auto",
        settings: VLLMConfig | None = None,
        seed: int = 0,
        eos_ids: list[int] | None = None,
        score_batch_size: int = 256,
        device_type: str | None = None,
        world_size: int = 1,
        **overrides: Any,
    ):
        v = dataclasses.replace(settings or VLLMConfig(), **overrides)
        self.settings = v
        self.model_path = str(model_path)
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.in_process = v.in_process
        self.recompute = v.recompute
        self.sync_check_tol = v.sync_check_tol
        self.device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
        self.world_size = world_size
        self.sleep = SleepCycle(v.sleep_level)
        self.seed = seed
        self.score_batch_size = score_batch_size
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        eos = eos_ids if eos_ids is not None else [tokenizer.eos_token_id]
        self.eos_ids = [int(e) for e in eos if e is not None]
        self._version: Any = None  # version of the last push (None: nothing pushed yet)
        self._checksum: torch.Tensor | None = None  # of the weights last pushed
        self._shm: Path | None = None  # child-process mode: where pushed weights are written
        self._metrics: dict[str, float] = {}
        # Under a launcher an in-process engine shares torch.distributed's default group, which
        # vLLM's shutdown destroys: such an engine stops only at exit (before the trainer's group).
        self._shares_group = (v.in_process and torch.distributed.is_available()
                              and torch.distributed.is_initialized())
        self.llm = None
        self._build()
        atexit.register(_close_at_exit, weakref.ref(self))

    @classmethod
    def from_config(cls, cfg, tokenizer, model_path, dtype: torch.dtype,
                    device: torch.device | None = None,
                    eos_ids: list[int] | None = None) -> VLLMEngine:
        """The engine ``rollout.engine: vllm`` builds (``rollout.base.ENGINES``): ``rollout.vllm``
        on the trainer's ``device``, one engine per training process; ``dtype``: the training
        model's, for ``rollout.vllm.dtype: auto``; ``eos_ids``: its stop tokens (None: EOS)."""
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(
                "rollout.engine=vllm needs vLLM: `make setup-vllm` (CPU, its own venv) or "
                "`pip install -e '.[vllm]'` (CUDA); README \"Rollout engines\"")
        v = cfg.rollout.vllm
        name = str(dtype).removeprefix("torch.") if v.dtype == "auto" else v.dtype
        dist = torch.distributed.is_available() and torch.distributed.is_initialized()
        return cls(model_path, tokenizer, dtype=name, settings=v, seed=cfg.seed, eos_ids=eos_ids,
                   score_batch_size=cfg.rollout.batch_size,
                   device_type=None if device is None else torch.device(device).type,
                   world_size=torch.distributed.get_world_size() if dist else 1)

    @property
    def logprobs_match_trainer(self) -> bool:
        """True with ``recompute``: old_logp and entropy come from the trainer's forward."""
        return self.recompute

    # ------------------------------------------------------------------ engine life cycle

    def _build(self) -> None:
        """Start vLLM (10–20 s on CPU for a small model)."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self.in_process else "1"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # not INFO lines at every push
        import transformers
        import vllm
        import vllm.envs
        import vllm.logger  # configures vLLM's console handler (``import vllm`` is lazy)

        quiet_vllm_logs(vllm.logger.DEFAULT_LOGGING_CONFIG)
        vllm.envs.disable_envs_cache()  # a previous engine may have cached the mode above
        shape = ModelShape.from_hf_config(transformers.AutoConfig.from_pretrained(self.model_path))
        self.llm_kwargs = engine_kwargs(self.settings, model=self.model_path, dtype=self.dtype,
                                        seed=self.seed, device_type=self.device_type, shape=shape,
                                        world_size=self.world_size,
                                        head_sizes=cpu_head_sizes(self.device_type))
        with preserved_process_state():
            self.llm = vllm.LLM(**self.llm_kwargs)
        self.max_len = self.llm.llm_engine.model_config.max_model_len
        self._version, self._checksum = None, None
        self.sleep.asleep.clear()

    def _restart(self, reason: str) -> None:
        """A fresh engine (after a failed push or a failed probe check)."""
        if self._shares_group:
            raise RuntimeError(f"{reason}; an in-process vLLM engine cannot be restarted under "
                               "torch.distributed (its shutdown destroys the process group): use "
                               "rollout.vllm.in_process: false under a launcher")
        self._shutdown()
        self._build()

    def _shutdown(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()

    def close(self) -> None:
        """Stop the engine and remove the /dev/shm weights file (child-process mode)."""
        self._shutdown()
        if self._shm is not None:
            shutil.rmtree(self._shm, ignore_errors=True)
            self._shm = None

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------------ weights

    def sync_weights(self, model: torch.nn.Module, version: Any) -> float:
        """Push ``model``'s weights unless ``version`` equals the last pushed one; seconds spent.

        ``version`` identifies the weights (the optimizer step count; EEPO's unlearned copy
        another value). A new version whose weights have the checksum of the last push (an
        automatic push by ``generate`` got there first) is recorded without pushing. A push
        that raises rebuilds the engine and pushes again; a second failure raises ``RuntimeError``.
        """
        if self.llm is not None and self.sleep.wake(self.llm, "weights"):
            self._version, self._checksum = None, None  # level 2: the weights are gone
        if version is not None and version == self._version:
            return 0.0
        t0 = time.perf_counter()
        checksum = weights_checksum(model)
        if self._checksum is not None and torch.equal(checksum, self._checksum):
            self._version = version
            return time.perf_counter() - t0
        return self._push(model, version, checksum)

    def _push(
        self, model: torch.nn.Module, version: Any, checksum: torch.Tensor | None = None
    ) -> float:
        t0 = time.perf_counter()
        checksum = weights_checksum(model) if checksum is None else checksum
        try:
            self._load(model)
        except Exception as first:  # noqa: BLE001 - any failure: rebuild once, then give up
            self._restart(f"vLLM weight push failed ({type(first).__name__}: {first})")
            try:
                self._load(model)
            except Exception as second:
                raise RuntimeError(
                    f"vLLM weight push failed twice ({type(first).__name__}: {first}; after a "
                    f"rebuild: {type(second).__name__}: {second}); not sampling from stale weights"
                ) from second
        self._version, self._checksum = version, checksum
        self._add("rollout/weight_pushes", 1.0)
        return time.perf_counter() - t0

    def _load(self, model: torch.nn.Module) -> None:
        """Reload vLLM's weights from ``model`` (tensors in-process, a file otherwise)."""
        if self.llm is None:
            raise RuntimeError("the vLLM engine is not running")
        weights = weights_of(model)
        with preserved_process_state():
            if self.in_process:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            else:
                path = str(self._write(weights))
                self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
            self.llm.reset_prefix_cache()

    def _write(self, weights: list[tuple[str, torch.Tensor]]) -> Path:
        """Weights as one safetensors file in /dev/shm (child-process mode); its directory."""
        from safetensors.torch import save_file

        if self._shm is None:
            root = "/dev/shm" if os.path.isdir("/dev/shm") else None
            self._shm = Path(tempfile.mkdtemp(prefix="explorl-vllm-", dir=root))
        tmp = self._shm / "model.safetensors.tmp"
        save_file({n: t.to("cpu", copy=True).contiguous() for n, t in weights}, str(tmp))
        tmp.replace(self._shm / "model.safetensors")
        return self._shm

    def _probe(self, model: torch.nn.Module) -> list[int]:
        """A fixed token sequence scored by both vLLM and ``model`` at every sampling call."""
        vocab = model.get_output_embeddings().weight.shape[0]
        n = max(2, min(PROBE_LEN, self.max_len - 1))
        return [(7 * k + 3) % vocab for k in range(n)]

    def _probe_gap(self, model: torch.nn.Module, probe: list[int], out) -> float:
        """Largest |log-prob| gap between vLLM's prompt log-probs ``out`` and ``model``'s."""
        engine = torch.tensor(  # host: moved next to the model's log-probs below
            [float(d[t].logprob) for d, t in zip(out.prompt_logprobs[1:], probe[1:])]
        )
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([probe], device=device)).logits[0, :-1].float()
        model.train(was_training)
        ref = torch.log_softmax(logits, -1).gather(
            -1, torch.tensor(probe[1:], device=device)[:, None]
        )
        return float((engine - ref[:, 0].cpu()).abs().max())

    def _tolerance(self, model: torch.nn.Module) -> float:
        if self.sync_check_tol is not None:
            return self.sync_check_tol
        fp32 = (
            self.llm.llm_engine.model_config.dtype == torch.float32
            and _dtype(model) == torch.float32
        )
        return 1e-3 if fp32 else 0.1

    # ------------------------------------------------------------------ sampling

    @torch.no_grad()
    def generate(
        self,
        model: torch.nn.Module,
        prompt_ids: list[list[int]],
        n_samples: list[int],
        temperature: float,
        max_new_tokens: int,
        generator: torch.Generator | None = None,
        seeds: list[int] | None = None,
    ) -> Rollouts:
        """The engine interface (``rollout.base``). ``seeds``: response j of prompt i is seeded
        ``mix_seed(seeds[i], j)``; without them, seeds are drawn from ``generator`` (or torch's
        global RNG). Pushes ``model``'s weights first when they differ from the last push."""
        from vllm import SamplingParams

        if len(prompt_ids) != len(n_samples):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(n_samples)} sample counts")
        rows = [i for i, n in enumerate(n_samples) for _ in range(n)]  # response -> prompt
        if seeds is not None:
            row_seeds = [mix_seed(s, j) for s, n in zip(seeds, n_samples) for j in range(n)]
        else:
            g_dev = generator.device if generator is not None else "cpu"
            row_seeds = torch.randint(
                0, 2**62, (len(rows),), generator=generator, device=g_dev
            ).tolist()
        greedy = temperature == 0
        requests, params = [], []
        for i, s in zip(rows, row_seeds):
            room = self.max_len - len(prompt_ids[i])
            if room < 1:
                raise ValueError(f"prompt {i} has {len(prompt_ids[i])} tokens: no room left in the "
                                 f"engine's max_model_len={self.max_len}")
            requests.append({"prompt_token_ids": list(prompt_ids[i])})
            params.append(SamplingParams(
                temperature=0.0 if greedy else float(temperature), seed=None if greedy else int(s),
                max_tokens=min(max_new_tokens, room), logprobs=0, detokenize=False,
                stop_token_ids=self.eos_ids))
        # One more request scores the probe sequence: the weights are checked in the same call.
        probe = self._probe(model)
        requests.append({"prompt_token_ids": probe})
        params.append(
            SamplingParams(
                max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False, seed=0
            )
        )
        for attempt in range(2):
            if self.sleep.wake(self.llm, "weights"):
                self._version, self._checksum = None, None
            if self._checksum is None or not torch.equal(weights_checksum(model), self._checksum):
                self._push(model, None)
            self.sleep.wake(self.llm, "kv_cache")
            with preserved_process_state():
                outs = self.llm.generate(requests, params, use_tqdm=False)
            gap, tol = self._probe_gap(model, probe, outs[-1]), self._tolerance(model)
            if gap <= tol:
                break
            if attempt == 1:
                raise RuntimeError(
                    f"the vLLM engine's log-probs differ from the model's by {gap:.3g} > "
                    f"rollout.vllm.sync_check_tol={tol:g} on a probe sequence, "
                    "also after a rebuild "
                    "and a fresh weight push: its weights do not follow the model's"
                )
            # Stale or broken weights: start over, push, sample again.
            self._restart(
                f"the vLLM engine's log-probs differ from the model's by {gap:.3g} > {tol:g}"
            )
        self.sleep.sleep(self.llm)  # GPU memory back to the trainer until the next push
        outs = outs[:-1]
        toks = [list(o.outputs[0].token_ids) for o in outs]
        lps = [[float(d[t].logprob) for d, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
               for o in outs]
        return self._rollouts(model, prompt_ids, rows, toks, lps, temperature)

    def _rollouts(self, model, prompt_ids, rows, toks, lps, temperature) -> Rollouts:
        device = next(model.parameters()).device
        N, R = len(rows), max([len(t) for t in toks], default=0)
        p_ids, p_mask = left_pad([prompt_ids[i] for i in rows] or [[]], self.pad_id, device)
        p_ids, p_mask = p_ids[:N], p_mask[:N]
        # host: filled row by row from Python lists, then moved to the model's device at once
        r_ids = torch.full((N, R), self.pad_id, dtype=torch.long)  # host
        r_mask = torch.zeros((N, R), dtype=torch.bool)  # host
        v_logp = torch.zeros((N, R))  # host
        for k, (t, lp) in enumerate(zip(toks, lps)):
            r_ids[k, : len(t)] = torch.as_tensor(t, dtype=torch.long)  # host
            r_mask[k, : len(t)] = True
            v_logp[k, : len(t)] = torch.as_tensor(lp)  # host
        r_ids, r_mask, v_logp = r_ids.to(device), r_mask.to(device), v_logp.to(device)
        truncated = torch.as_tensor(
            [not t or t[-1] not in self.eos_ids for t in toks], dtype=torch.bool, device=device
        )
        if self.recompute and N:
            logp, ent = self._score(model, p_ids, p_mask, r_ids, r_mask, temperature)
            diff = (logp - v_logp).abs()[r_mask]
            if diff.numel():
                key = "rollout/vllm_logp_diff_max"
                self._metrics[key] = max(self._metrics.get(key, 0.0), float(diff.max()))
                self._add("rollout/vllm_logp_diff_sum", float(diff.double().sum()))
                self._add("rollout/vllm_logp_diff_n", float(diff.numel()))
        else:
            logp, ent = (
                v_logp,
                torch.full((N, R), float("nan"), device=device).masked_fill(~r_mask, 0.0),
            )
        texts = self.tokenizer.batch_decode([t for t in toks], skip_special_tokens=True)
        return Rollouts(
            prompt_ids=p_ids, prompt_mask=p_mask, response_ids=r_ids, response_mask=r_mask,
            old_logp=logp, entropy=ent,
            prompt_index=torch.as_tensor(rows, dtype=torch.long, device=device), texts=texts,
            temperature=temperature, truncated=truncated, engine_logp=v_logp)

    def _score(self, model, p_ids, p_mask, r_ids, r_mask, temperature):
        """old_logp and entropy (N, R) from ``model``'s forward, ``score_batch_size`` rows at a
        time."""
        was_training = model.training
        model.eval()
        logps, ents = [], []
        for s in range(0, len(r_ids), self.score_batch_size):
            sl = slice(s, s + self.score_batch_size)
            lp, h = response_logprobs(
                model, p_ids[sl], p_mask[sl], r_ids[sl], r_mask[sl], temperature
            )
            logps.append(lp.float())
            ents.append(h.float())
        model.train(was_training)
        return torch.cat(logps), torch.cat(ents)

    # ------------------------------------------------------------------ metrics

    def _add(self, key: str, value: float) -> None:
        self._metrics[key] = self._metrics.get(key, 0.0) + value

    def pop_metrics(self) -> dict[str, float]:
        """Metrics since the last call (docs/metrics.md): the number of weight pushes (explicit
        and automatic), with ``recompute`` the largest and mean |vLLM − forward| log-prob
        gap of the sampled tokens, and with sleep mode the seconds spent putting the engine to
        sleep and waking it (``rollout/vllm_sleep_s``). (``sync_weights`` returns its seconds to
        the caller.)"""
        m, self._metrics = self._metrics, {}
        if self.sleep.level:
            m["rollout/vllm_sleep_s"], self.sleep.seconds = self.sleep.seconds, 0.0
        n = m.pop("rollout/vllm_logp_diff_n", 0.0)
        total = m.pop("rollout/vllm_logp_diff_sum", 0.0)
        if n:
            m["rollout/vllm_logp_diff_mean"] = total / n
        return m


def _close_at_exit(ref: weakref.ref) -> None:
    engine = ref()
    if engine is not None:
        engine.close()


def _dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype
