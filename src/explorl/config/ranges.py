"""Every number's allowed interval (``RANGES``), in one table, and the check that reads it.

The controller sections declare their own intervals beside their fields (each section's
``RANGES`` in ``control_sections``); ``section_ranges`` gathers them into the table. The fields
of a policy loss or an advantage estimator have theirs in its spec
(``explorl.algorithms.METHOD_RANGES``), which ``validation`` checks with this table.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any

from explorl.config.coerce import _fail, field_of
from explorl.config.control_sections import ControlConfig
from explorl.config.intervals import SAMPLES as _SAMPLES
from explorl.config.intervals import SEED as _SEED
from explorl.config.intervals import STEPS as _STEPS
from explorl.config.intervals import TEMPERATURE as _TEMPERATURE
from explorl.config.intervals import TOKENS as _TOKENS
from explorl.config.sections import RunConfig

# ----------------------------------------------------------------------------- validation


def section_ranges(cls: type, prefix: str) -> dict[str, str]:
    """``prefix + field -> interval`` from the ``RANGES`` of ``cls`` and of its nested sections,
    in field order; a ``RANGES`` key that is not a field of its section is an error."""
    own: dict[str, str] = getattr(cls, "RANGES", {})
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    stray = sorted(set(own) - set(names))
    if stray:
        raise TypeError(f"{cls.__name__}.RANGES names no field: {stray}")
    out: dict[str, str] = {}
    for name in names:
        if dataclasses.is_dataclass(hints[name]):
            out |= section_ranges(hints[name], f"{prefix}{name}.")
        elif name in own:
            out[f"{prefix}{name}"] = own[name]
    return out


RANGES: dict[str, str] = {
    "seed": _SEED,
    "max_steps": _STEPS,
    "lab.split_seed": _SEED,
    "lab.n_train": "[1, 10000000]",
    "lab.n_val": "[0, 10000000]",
    "lab.n_test": "[0, 10000000]",
    "data.max_train_prompts": "[1, 1000000000]",
    "data.prompts_per_step": "[1, 1048576]",
    "data.max_prompt_len": _TOKENS,
    "rollout.n_samples": _SAMPLES,
    "rollout.temperature": _TEMPERATURE,
    "rollout.max_response_len": _TOKENS,
    "rollout.batch_size": "[1, 1048576]",
    "rollout.max_turns": "[1, 64]",
    "rollout.arpo.initial_rollouts": "[1, 4096]",
    "rollout.arpo.beam_size": "[1, 64]",
    "rollout.arpo.branch_probability": "[0, 1]",
    "rollout.arpo.entropy_weight": "[0, 100]",
    "rollout.arpo.entropy_window": "[1, 4096]",
    "rollout.arpo.branch_penalty": "[0, 1]",
    "rollout.arpo.budget_sharpness": "[0, 100]",
    "rollout.tool_result_max_chars": "[1, 10000000]",
    "rollout.env_observation_max_chars": "[0, 10000000]",
    "rollout.env_state_max_bytes": "[1, 1073741824]",
    "rollout.vllm.kv_cache_gib": "(0, 1048576]",
    "rollout.vllm.max_model_len": "[2, 1048576]",
    "rollout.vllm.sync_check_tol": "(0, inf)",
    "rollout.vllm.gpu_memory_utilization": "(0, 1]",
    "rollout.vllm.tensor_parallel_size": "[1, 1024]",
    "algorithm.rollout_correction.upper": "(1, inf)",
    "algorithm.rollout_correction.lower": "(0, 1)",
    "algorithm.rollout_correction.veto": "(0, 1)",
    "reward.num_workers": "[0, 1024]",
    "reward.timeout_s": "(0, 86400]",
    "reward.step_timeout_s": "(0, 604800]",
    "reward.overlong_buffer": "[0, 1048576]",
    "reward.overlong_penalty": "[0, inf)",
    "reward.accuracy_threshold": "(-inf, inf)",
    "algorithm.agg_max_len": _TOKENS,
    "algorithm.entropy_coef": "[0, inf)",
    "algorithm.kl_coef": "[0, inf)",
    "algorithm.max_gen_rounds": "[1, 1000]",
    "algorithm.logprob_chunk": _TOKENS,
    "algorithm.entropy_mask_ratio": "[0, 1]",  # 0 = off
    "algorithm.entropy_shaping_alpha": "[0, inf)",  # 0 = off
    "algorithm.entropy_shaping_kappa": "[1, inf)",  # κ ≥ 1 keeps the sign of A
    "algorithm.aepo_adv_weight": "[0, inf)",  # 0 = off
    "model.cpu_threads": "[1, 4096]",
    "rollout.async.max_staleness": "[0, 64]",
    "model.lora.rank": "[1, 65536]",
    "model.lora.alpha": "(0, inf)",
    "model.lora.dropout": "[0, 1)",
    "optim.lr": "(0, inf)",
    "optim.weight_decay": "[0, inf)",
    "optim.beta1": "[0, 1)",
    "optim.beta2": "[0, 1)",
    "optim.warmup_steps": "[0, 100000000]",
    "optim.max_grad_norm": "[0, inf)",
    "optim.ppo_epochs": "[1, 1000]",
    "optim.mini_batches": "[1, 1048576]",
    "optim.micro_batch_size": "[1, 1048576]",
    "optim.micro_batch_tokens": "[1, 2147483647]",
    "optim.max_bad_steps": "[1, 1000000]",
    "optim.max_bad_frac": "(0, 1]",
    "watch.collapse_entropy": "[0, inf)",
    "watch.collapse_steps": "[2, 100000000]",
    "watch.collapse_min_gain": "[0, 1]",
    "watch.reward_fail_steps": "[1, 100000000]",
    "watch.reward_fail_frac": "(0, 1]",
    "watch.reward_fail_window": "[1, 100000000]",
    "watch.signal_steps": "[0, 100000000]",
    "watch.signal_zero_frac": "(0, 1]",
    **section_ranges(ControlConfig, "control."),
    "eval.every": "[0, 100000000]",
    "eval.n_samples": _SAMPLES,
    "eval.k": _SAMPLES,
    "eval.max_problems": "[1, 1000000000]",
    "eval.temperature": "[0, 100]",  # 0 = greedy
    "log.checkpoint_every": "[0, 100000000]",
    "log.checkpoint_every_minutes": "[0, 1000000]",
    "log.keep_checkpoints": "[1, 1000000]",
    "log.completions_every": "[0, 100000000]",
    "log.completions_per_step": "[1, 1000000]",
    "log.progress_every_s": "(0, 86400]",
}
"""Allowed interval of every numeric field (of each item for a list) but those of the losses and
advantage estimators (their specs'); ``None`` always passes. Every number must also be finite.
Relations between fields are ``_cross_checks``."""

# The field holding each knob the adaptive controller can drive: its range bounds the
# controller's init/min/max.
ADAPTIVE_KNOB_FIELDS = {
    "eps_high": "algorithm.eps_high",
    "entropy_coef": "algorithm.entropy_coef",
    "kl_coef": "algorithm.kl_coef",
    "temperature": "rollout.temperature",
}


@dataclass(frozen=True)
class Interval:
    """A closed, open or half-open interval written as in mathematics: ``"(0, 1]"``."""

    lo: float
    hi: float
    lo_closed: bool
    hi_closed: bool

    @classmethod
    def parse(cls, text: str) -> Interval:
        left, lo, hi, right = text[0], *text[1:-1].split(","), text[-1]
        return cls(float(lo), float(hi), left == "[", right == "]")

    def __contains__(self, x: float) -> bool:
        above = x >= self.lo if self.lo_closed else x > self.lo
        below = x <= self.hi if self.hi_closed else x < self.hi
        return above and below

    def describe(self) -> str:
        lo, hi = _num(self.lo), _num(self.hi)
        if math.isinf(self.lo) and math.isinf(self.hi):
            return "a finite number"
        if math.isinf(self.hi):
            return f"{'≥' if self.lo_closed else '>'} {lo}"
        return f"in {'[' if self.lo_closed else '('}{lo}, {hi}{']' if self.hi_closed else ')'}"


def _num(x: float) -> str:
    return str(int(x)) if math.isfinite(x) and x.is_integer() else repr(x)


def _get(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = getattr(cfg, field_of(part))
    return cfg


def _check_ranges(cfg: RunConfig, ranges: dict[str, str] = RANGES) -> None:
    """Every number of ``cfg`` in its interval of ``ranges`` (path -> interval)."""
    for path, text in ranges.items():
        value = _get(cfg, path)
        items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        interval = Interval.parse(text)
        for i, v in items:
            where = path if i is None else f"{path}[{i}]"
            if v is None:
                continue
            if not math.isfinite(v):
                _fail(where, f"must be a finite number, got {v}")
            if v not in interval:
                _fail(where, f"must be {interval.describe()}, got {v!r}")


