"""``load``, ``from_dict`` and ``validate``: ranges, relations between fields, names against their
registries, controller conflicts and (with ``env``) paths, devices and importable references,
before any work starts."""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

from explorl import model_store
from explorl.algorithms import AGG_MODES, KL_ESTIMATORS
from explorl.algorithms.advantages import ADVANTAGE_SPECS
from explorl.algorithms.contract import METHOD_RANGES
from explorl.algorithms.losses import LOSS_SPECS
from explorl.config.coerce import _fail, build, to_dict
from explorl.config.ranges import RANGES, _check_ranges
from explorl.config.recipes import HISTORY_KEY, _if_dir, read_recipe
from explorl.config.sections import RolloutConfig, RunConfig
from explorl.control.contract import check_knob_contract
from explorl.control.registry import CONTROLLER_SPECS, check_control_config
from explorl.control.spec import check_choice
from explorl.data.files import EXTENSIONS
from explorl.errors import ExplorlError
from explorl.outputs.trackers import TRACKERS
from explorl.rollout.vllm_settings import (
    check_engine_settings,
    launcher_world_size,
    visible_gpus,
)
from explorl.validation.references import check_references, fill_defaults


def _smallest_group(c: RunConfig) -> int:
    """The fewest responses a prompt can get: n_samples, a curriculum's, the budget's floor."""
    ctl, n = c.control, c.rollout.n_samples
    sizes = [n]
    if ctl.curriculum.enabled and ctl.curriculum.n_samples is not None:
        sizes.append(ctl.curriculum.n_samples)
    if ctl.budget.enabled:  # the budget floor never goes below min(n_min_limit, n_default)
        sizes += [min(ctl.budget.n_min_limit, s) for s in list(sizes)]
    return min(sizes)


AEPO_ONLY = ("branch_penalty", "dynamic_initial", "budget_sharpness")
"""``rollout.arpo`` fields only AEPO's rollout (``mode: aepo``) reads."""


def _cross_checks(c: RunConfig) -> list[tuple[str, bool, str]]:
    """(path, predicate, message) checks of relations between fields, run after the ranges;
    the first one that fails is reported."""
    return [*_data_checks(c), *_engine_checks(c), *_tool_checks(c), *_update_checks(c),
            *_count_checks(c), *_model_checks(c)]


def _data_checks(c: RunConfig) -> list[tuple[str, bool, str]]:
    """The run's name, its training data and the reward's limits."""
    r = c.rollout
    return [
        ("name", bool(c.name.strip()) and "/" not in c.name and "\\" not in c.name,
         f"must be a non-empty name without '/' (it names the run directory), got {c.name!r}"),
        ("data.train", len(c.data.train) >= 1, "needs at least one dataset"),
        ("data.max_train_prompts",
         c.data.max_train_prompts is None or c.data.max_train_prompts >= c.data.prompts_per_step,
         "must be ≥ data.prompts_per_step"),
        ("reward.overlong_buffer", c.reward.overlong_buffer < r.max_response_len,
         "must be < rollout.max_response_len"),
        ("reward.step_timeout_s",
         c.reward.step_timeout_s is None or c.reward.step_timeout_s >= c.reward.timeout_s,
         "must be ≥ reward.timeout_s (one response's limit)"),
    ]


def _engine_checks(c: RunConfig) -> list[tuple[str, bool, str]]:
    """Settings the chosen rollout engine must be able to honour."""
    a, r, e = c.algorithm, c.rollout, c.control.eepo
    stale = r.async_.enabled and r.async_.max_staleness > 0
    return [
        ("rollout.vllm.recompute", r.engine != "vllm" or r.vllm.recompute
         or (a.old_logp != "sampler" and not e.enabled and not r.arpo.enabled),
         "false leaves entropy unknown (vLLM reports none): it needs algorithm.old_logp auto or "
         "recompute, no EEPO (its stage-2 rows keep the engine's values) and no ARPO (it "
         "branches on each turn's entropy while sampling)"),
        ("algorithm.rollout_correction.mode",
         r.engine != "hf" or a.rollout_correction.mode in ("auto", "off") or stale,
         f"{a.rollout_correction.mode!r} corrects for the engine's own log-probs, but "
         "rollout.engine: hf samples with the trained model and gives none (one distribution, "
         "nothing to correct); use auto/off, rollout.engine: vllm, or rollout.async (the "
         "sampler's stale log-probs)"),
        ("rollout.hf.static", r.engine == "hf" or r.hf.static == "auto",
         f"is a setting of the hf engine, and rollout.engine is {r.engine!r}: nothing reads it "
         "(leave it at auto, or use rollout.engine: hf)"),
    ]


def _tool_checks(c: RunConfig) -> list[tuple[str, bool, str]]:
    """Multi-turn tool rollouts and environments, ARPO and AEPO: what each needs, what cannot
    run beside them, and their settings left at the defaults when nothing reads them."""
    r, e = c.rollout, c.control.eepo
    arpo_defaults = {f.name: f.default for f in dataclasses.fields(r.arpo)}
    tools = bool(r.tools or r.environment)  # multi-turn tool rollouts
    tools_key = "rollout.tools" if r.tools else "rollout.environment"
    return [
        *[(f"rollout.{k}", tools or getattr(r, k) == getattr(RolloutConfig, k),
           "is a setting of multi-turn tool rollouts, and rollout.tools is empty (no "
           f"rollout.environment): nothing reads it (leave it at {getattr(RolloutConfig, k)!r}, "
           "or name tools in rollout.tools)")
          for k in ("max_turns", "tool_format", "tool_result_max_chars")],
        *[(f"rollout.{k}", r.environment or getattr(r, k) == getattr(RolloutConfig, k),
           f"is a limit of rollout.environment, which is null: nothing reads it (leave it at "
           f"{getattr(RolloutConfig, k)!r}, or name an environment)")
          for k in ("env_observation_max_chars", "env_state_max_bytes")],
        ("rollout.environment", not (r.environment and r.engine != "hf"),
         f"environments run on the hf engine, and rollout.engine is {r.engine!r}; set "
         "rollout.engine: hf (rollout.tools alone also run on vllm)"),
        (tools_key, not (tools and r.async_.enabled),
         "multi-turn tool rollouts do not run in the asynchronous rollout worker yet; set "
         "rollout.async.enabled: false"),
        ("rollout.arpo.enabled", not r.arpo.enabled or tools,
         "ARPO branches after tool results: it needs rollout.tools or rollout.environment"),
        ("rollout.arpo.enabled", not (r.arpo.enabled and e.enabled),
         "cannot run with control.eepo.enabled: EEPO splits each prompt's budget into two stages "
         "sampled by two models, ARPO into turn-1 rollouts and branches of them; set one false"),
        *[(f"rollout.arpo.{f.name}", r.arpo.enabled or getattr(r.arpo, f.name) == f.default,
           f"is a setting of ARPO, and rollout.arpo.enabled is false: nothing reads it (leave "
           f"it at {f.default!r}, or enable ARPO)")
          for f in dataclasses.fields(r.arpo) if f.name != "enabled"],
        *[(f"rollout.arpo.{k}", r.arpo.mode == "aepo" or getattr(r.arpo, k) == d,
           f"is a setting of AEPO's rollout, and rollout.arpo.mode is 'arpo': nothing reads it "
           f"(leave it at {d!r}, or set rollout.arpo.mode: aepo)")
          for k, d in arpo_defaults.items() if k in AEPO_ONLY],
        ("rollout.arpo.budget_sharpness",
         r.arpo.dynamic_initial or r.arpo.budget_sharpness == arpo_defaults["budget_sharpness"],
         "is the slope of entropy pre-monitoring, and rollout.arpo.dynamic_initial is false: "
         f"nothing reads it (leave it at {arpo_defaults['budget_sharpness']!r}, or set "
         "dynamic_initial: true)"),
    ]


def _update_checks(c: RunConfig) -> list[tuple[str, bool, str]]:
    """The policy update (advantage shaping, rollout correction, clipping) and the asynchronous
    worker: methods that cannot run together, bounds only some modes read."""
    a, r, e = c.algorithm, c.rollout, c.control.eepo
    return [
        ("algorithm.aepo_adv_weight", not (a.aepo_adv_weight and a.entropy_shaping_alpha),
         "cannot run with algorithm.entropy_shaping_alpha: both reshape each token's advantage "
         "from its entropy (AEPO scales it, Cheng et al. add to it); set one to 0"),
        ("rollout.async.enabled", not (r.async_.enabled and e.enabled),
         "cannot run with control.eepo.enabled: EEPO's stage 2 samples from a copy unlearned on "
         "stage 1 between the two halves of one batch, which a worker sampling ahead of the "
         "trainer cannot interleave; set rollout.async.enabled: false or control.eepo.enabled: "
         "false"),
        ("rollout.async.max_staleness", not (r.async_.enabled and a.dynamic_sampling
                                             and r.async_.max_staleness > 1),
         "> 1 with algorithm.dynamic_sampling: the worker's refill rounds would draw prompts "
         "while the trainer draws the next batches; use max_staleness 0 or 1"),
        ("algorithm.rollout_correction.lower",
         a.rollout_correction.lower is None or a.rollout_correction.mode.endswith("-mask"),
         "is the lower bound of the mask modes; the truncate modes (and auto) read none"),
        ("algorithm.clip_c", a.clip_c is None or a.loss != "clip_cov",
         ("Clip-Cov has no dual clip (neither the authors' code nor verl's has one, and a "
          "dual-clipped token could not be a Clip-Cov candidate); set algorithm.clip_c: null "
          "with loss clip_cov")),
        ("algorithm.clip_cov_ub", a.clip_cov_ub > a.clip_cov_lb, "must be > algorithm.clip_cov_lb"),
    ]


def _count_checks(c: RunConfig) -> list[tuple[str, bool, str]]:
    """Counts against each other: eval's k's, trackers named once, pass@k's k and the
    advantage's needs against the smallest group of responses."""
    a = c.algorithm
    pk, n_group = a.passk_k, _smallest_group(c)
    return [
        ("eval.k", all(k <= c.eval.n_samples for k in c.eval.k),
         "every k must be ≤ eval.n_samples"),
        ("log.report_to", len(set(c.log.report_to)) == len(c.log.report_to),
         "names a tracker twice"),
        ("algorithm.passk_k", pk is None or pk <= n_group,
         f"must be ≤ {n_group}: k ≤ n in every group (the smallest has {n_group} responses)"),
        ("algorithm.passk_k", pk is None or a.advantage != "pkpo_loo" or pk < n_group,
         f"pkpo_loo needs k < n in every group (the smallest group has {n_group} responses)"),
        ("algorithm.advantage", a.advantage != "grpo_passk" or n_group >= 2,
         "grpo_passk needs at least 2 responses in every group"),
    ]


def _model_checks(c: RunConfig) -> list[tuple[str, bool, str]]:
    """LoRA and torch.compile against the precision and the distributed strategy."""
    return [
        ("model.lora.enabled", not (c.model.lora.enabled and c.model.pure_low_precision),
         "LoRA keeps the frozen base in model.dtype already and its adapters are float32 master "
         "weights; model.pure_low_precision would round the adapters' small updates away: set "
         "it to false"),
        ("model.lora.target_modules", bool(c.model.lora.target_modules)
         and all(m.strip() for m in c.model.lora.target_modules),
         "needs at least one module name (or all-linear), without empty names"),
        ("model.compile", not (c.model.compile and c.dist.strategy == "fsdp"),
         "is not supported with dist.strategy: fsdp (FSDP's flat parameters under compiled "
         "layers); use ddp or model.compile: false"),
    ]


def _check_each_controller(cfg: RunConfig) -> None:
    """Each controller's own checks (its spec's ``check``, beside its class in ``control/``)."""
    for spec in CONTROLLER_SPECS.values():
        if spec.check is not None:
            spec.check(cfg)


def _check_controllers(cfg: RunConfig) -> None:
    """Every knob a controller moves reaches the loss (``control.contract``), each knob has one
    owner, and two entropy trackers never run together."""
    check_knob_contract(cfg)
    if sum(getattr(cfg.control, f.name).enabled for f in dataclasses.fields(cfg.control)) < 2:
        return
    check_control_config(cfg.control)  # a ControlError, printed like a ConfigError


def _closest(value: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


ALL_RANGES: dict[str, str] = {**RANGES, **METHOD_RANGES}
"""Every numeric field's interval: the config's table and the losses' and estimators' specs'."""


def _check_names(cfg: RunConfig) -> None:
    """Plug-point names are checked against the dicts that define them (no copied lists)."""
    a = cfg.algorithm
    adv, loss = ADVANTAGE_SPECS.get(a.advantage), LOSS_SPECS.get(a.loss)
    if adv is not None and adv.takes_k and a.passk_k is None:
        _fail("algorithm.passk_k",
              f"advantage {a.advantage!r} optimises pass@k: set k (≤ rollout.n_samples)")
    if loss is not None and a.agg in AGG_MODES and a.agg not in loss.aggs:
        _fail("algorithm.agg", f"loss {a.loss!r} needs agg {loss.agg!r}, got {a.agg!r} "
              f"({loss.agg_why})")
    rc_mode = a.rollout_correction.mode
    modes = loss.correction_modes if loss is not None else None
    if modes is not None and rc_mode not in ("auto", "off", *modes):
        _fail("algorithm.rollout_correction.mode",
              f"loss {a.loss!r} folds the rollout correction into its sequence weight, token by "
              f"token; {rc_mode!r} would count the response's weight twice: use "
              f"{' or '.join(modes)} (or auto, off)")
    for path, value, table, kind in [
        ("algorithm.loss", a.loss, LOSS_SPECS, "loss"),
        ("algorithm.advantage", a.advantage, ADVANTAGE_SPECS, "advantage estimator"),
        *([("algorithm.agg", a.agg, AGG_MODES, "aggregation mode")] if a.agg is not None else []),
        ("algorithm.kl_estimator", a.kl_estimator, KL_ESTIMATORS, "KL estimator"),
        *[
            (f"log.report_to[{i}]", name, TRACKERS, "tracker")
            for i, name in enumerate(cfg.log.report_to)
        ],
    ]:
        check_choice(path, value, table, kind)


def _check_sources(cfg: RunConfig, env: bool) -> None:
    """With ``env``, that model and data paths exist. Task specs (``lab:<task>``,
    ``rg:<task>``) are checked by ``explorl.validation.references.check_references``."""
    def lab_task(path: str, spec: str) -> bool:
        return spec.startswith(("lab:", "rg:"))

    if not cfg.model.path.strip():
        _fail("model.path", "is empty; give a local model directory, a .gguf file, a model "
              "name or lab:<task>")
    if not lab_task("model.path", cfg.model.path) and env and not _model_source(cfg.model.path):
        p = Path(cfg.model.path).expanduser()
        if not p.is_dir():
            _fail("model.path", f"{cfg.model.path!r} is not a local directory; explorl loads "
                  "models with from_pretrained(local_path) (download them beforehand), a .gguf "
                  f"file, a name ({', '.join(model_store.KNOWN)}) or lab:<task>")
        if not (p / "config.json").is_file():
            _fail("model.path", f"{cfg.model.path!r} holds no config.json: not a Hugging Face "
                  "model directory")
    for key in ("train", "val", "anneal"):
        for i, spec in enumerate(getattr(cfg.data, key)):
            path = f"data.{key}[{i}]"
            if lab_task(path, spec) or not env:
                continue
            p = Path(spec).expanduser()
            if not p.is_file():
                _fail(path, f"data file {spec!r} not found" + _if_dir(p))
            if p.suffix.lower() not in EXTENSIONS:
                _fail(path, f"{spec!r}: unsupported file type {p.suffix or '(none)'!r} "
                      f"(expected {', '.join(EXTENSIONS)})")


def _model_source(spec: str) -> bool:
    """Whether ``model.path`` is a registered name or a GGUF file, checked (fetched; readable,
    of a supported quantisation and architecture) before any model loads."""
    try:
        return model_store.check(spec)
    except ExplorlError as e:
        _fail("model.path", str(e))


def _check_device(device: str) -> None:
    """``model.device`` names a device this machine has."""
    if device in ("auto", "cpu"):
        return
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        _fail("model.device", f"{device!r} is not a torch device (e.g. auto, cpu, cuda, cuda:1)")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            _fail("model.device", f"{device!r}: CUDA is not available here (torch "
                  f"{torch.__version__}, CUDA build {torch.version.cuda}); use auto or cpu")
        if d.index is not None and d.index >= torch.cuda.device_count():
            _fail("model.device", f"{device!r}: this machine has {torch.cuda.device_count()} "
                  "CUDA device(s)")
    elif d.type == "mps" and not torch.backends.mps.is_available():
        _fail("model.device", f"{device!r}: MPS is not available here; use auto or cpu")


def _check_vllm(cfg: RunConfig) -> None:
    """``rollout.vllm`` against this machine: sleep mode needs CUDA, tensor parallelism GPUs."""
    import torch

    dev = cfg.model.device
    device_type = ("cuda" if torch.cuda.is_available() else "cpu") if dev == "auto" else (
        torch.device(dev).type)
    check_engine_settings(cfg.rollout.vllm, device_type, gpus=visible_gpus(),
                          world_size=launcher_world_size())


def validate(cfg: RunConfig, *, env: bool = True) -> RunConfig:
    """Check a config before any work starts; return it (types re-checked after edits).

    Always: types, the range of every number (``ALL_RANGES``: finite, inside its interval),
    relations between fields, controller conflicts, plug-point names, lab task names and
    built-in verifier names. With ``env`` (the default) also what depends on this machine:
    the model directory and data files exist, ``model.device`` is present, and a
    ``module:function`` verifier imports. ``explorl config`` and recipe templates whose
    paths are placeholders pass ``env=False``.
    """
    cfg = build(RunConfig, to_dict(cfg))
    fill_defaults(cfg, env)
    _check_ranges(cfg, ALL_RANGES)
    for path, ok, msg in _cross_checks(cfg):
        if not ok:
            _fail(path, msg)
    _check_each_controller(cfg)
    _check_sources(cfg, env)  # these import no torch: a typo fails in about a second
    # Lab and reasoning-gym tasks, reward functions and verifiers: loaded (with env) and checked.
    check_references(cfg, env)
    _check_names(cfg)
    _check_controllers(cfg)
    if env:
        _check_device(cfg.model.device)
        if cfg.rollout.engine == "vllm":
            _check_vllm(cfg)
    return cfg


def from_dict(data: dict | None, *, env: bool = True) -> RunConfig:
    """Build and validate a config from nested plain data (a parsed recipe)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        _fail("", f"a recipe must be a mapping of keys, got {type(data).__name__}")
    _migrate(data)
    data.pop(HISTORY_KEY, None)  # a run's record of its resumes, not a setting
    return validate(build(RunConfig, data), env=env)


# lab keys of configs written before lab tasks became plugins (run directories' config.yaml),
# as the lab.params entry each became, with the old default that meant "not set".
_OLD_LAB_KEYS = {"min_digits": ("min_digits", 1), "max_digits": ("max_digits", 2),
                 "countdown_numbers": ("n_numbers", 3)}


def _migrate(data: dict) -> None:
    """Move old lab keys into ``lab.params`` and read ``optim.fused``'s first spelling
    (auto/on/off), in place, so old runs still resume."""
    optim = data.get("optim")
    if isinstance(optim, dict) and optim.get("fused") in ("auto", "on", "off"):
        optim["fused"] = {"auto": None, "on": True, "off": False}[optim["fused"]]
    lab = data.get("lab")
    if not isinstance(lab, dict):
        return
    for old, (new, default) in _OLD_LAB_KEYS.items():
        if old in lab:
            value = lab.pop(old)
            if value != default:
                lab.setdefault("params", {})[new] = value




def load(recipe: str | Path | None = None, overrides: list[str] | None = None, *, env: bool = True,
         **top) -> RunConfig:
    """Load a YAML recipe, apply ``--set`` overrides and top-level keyword overrides, and
    validate (``env``: see ``validate``). A recipe may say ``base: other.yaml`` (relative to
    itself) to start from another recipe."""
    return from_dict(read_recipe(recipe, overrides, **top), env=env)
