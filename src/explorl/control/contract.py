"""The knob contract, controller side (docs/methods/combining.md §7d): every knob a controller moves
must reach the loss, and start from the recipe's value on the loss's scale.

Each controller's spec (``control.spec.ControllerSpec``, registered in ``CONTROLLER_SPECS``)
declares the actuators it writes (``writes``: the class's ``actuators``; the adaptive
controller's is ``control.adaptive.actuator``) and the range of a loss-side knob it owns
(``knob_range``); ``algorithms.contract.knobs_read`` says which knobs the configured loss and
advantage estimator read. ``check_knob_contract`` refuses, before
anything is built:

- a controller whose knob nothing reads (Entropy Scheduling's eps_high with CISPO or KL-Cov, a
  kl_coef controller with the KL in the reward and a pass@k estimator), naming the actuators
  that would work;
- a controller whose range does not hold the recipe's own value of its knob (GSPO's eps_high
  4e-4 or Clip-Cov's 1.0 under the adaptive controller's default [0.2, 0.4]): the controller
  owns the knob from the first step and would silently replace it;
- a KL setting nothing reads or that has no gradient: ``kl_in_reward`` without a KL
  coefficient or with a pass@k estimator, and ``k1`` as a loss term (its expected gradient is 0).
"""

from __future__ import annotations

from explorl.algorithms.advantages import READS_CORRECTNESS
from explorl.algorithms.contract import LOSS_KNOBS, knobs_read, why_not_read
from explorl.algorithms.regularisers import ZERO_GRADIENT_KL
from explorl.config import RunConfig
from explorl.config.ranges import ADAPTIVE_KNOB_FIELDS
from explorl.control.adaptive import ACTUATOR_DEFAULTS
from explorl.control.registry import CONTROLLER_SPECS
from explorl.control.registry import controller_writes as _writes
from explorl.control.spec import fail as _fail

SAMPLER_READS = frozenset({"temperature", "budgets", "unlearn", "curriculum"})
"""Actuators the sampling side always reads (whatever the loss): the sampling temperature,
per-prompt budgets, EEPO's unlearning gate, the curriculum's data/samples/length."""


def controller_writes(cfg: RunConfig) -> dict[str, tuple[str, ...]]:
    """Enabled controller name -> the actuators it writes (its spec's ``writes``)."""
    return _writes(cfg.control)


RECIPE_FIELD = {**ADAPTIVE_KNOB_FIELDS}
"""Knob -> the recipe field that holds its configured value."""


def _recipe_value(cfg: RunConfig, knob: str) -> float:
    section, _, field = RECIPE_FIELD[knob].partition(".")
    return getattr(getattr(cfg, section), field)


def _check_kl(cfg: RunConfig, writes: dict[str, tuple[str, ...]]) -> None:
    a = cfg.algorithm
    kl_on = a.kl_coef > 0 or any("kl_coef" in w for w in writes.values())
    if a.kl_in_reward and not kl_on:
        _fail("algorithm.kl_in_reward", "is on but algorithm.kl_coef is 0 and no controller "
              "drives kl_coef: nothing would enter the reward; set kl_coef > 0 or turn it off")
    if a.kl_in_reward and a.advantage in READS_CORRECTNESS:
        _fail("algorithm.kl_in_reward", f"advantage {a.advantage!r} reads correctness, not the "
              "reward, so a KL penalty in the reward never reaches it; use the KL as a loss "
              "term (kl_in_reward: false)")
    if kl_on and not a.kl_in_reward and a.kl_estimator in ZERO_GRADIENT_KL:
        _fail("algorithm.kl_estimator", f"{a.kl_estimator!r} as a loss term has zero expected "
              "gradient (no regularisation at all); use k2 (reverse KL), k3 or low_var_kl "
              "(forward KL), or put k1 in the reward (algorithm.kl_in_reward: true)")


def check_knob_contract(cfg: RunConfig) -> None:
    """Refuse a controller whose knob the loss does not read or whose range replaces the
    recipe's value, and KL settings nothing reads (see the module docstring). ConfigError."""
    a, writes = cfg.algorithm, controller_writes(cfg)
    reads = knobs_read(a)
    for name, actuators in writes.items():
        spec = CONTROLLER_SPECS[name]
        path = f"control.{name}.{spec.knob_key}"
        for act in actuators:
            if act not in LOSS_KNOBS:
                continue  # budgets, unlearn, curriculum: read by the sampling side
            if act not in reads and act not in SAMPLER_READS:
                working = [k for k in ACTUATOR_DEFAULTS if k in reads or k in SAMPLER_READS]
                _fail(path, f"control.{name} drives {act}, which nothing reads with loss "
                      f"{a.loss!r} and advantage {a.advantage!r} ({why_not_read(a, act)}); "
                      f"actuators that would work: {', '.join(working)}")
            rng = None if spec.knob_range is None else spec.knob_range(spec.section(cfg.control))
            if rng is None or act not in RECIPE_FIELD:
                continue
            start, lo, hi = rng
            value = _recipe_value(cfg, act)
            if not lo <= value <= hi:
                _fail(path, f"control.{name} owns {act} from the first step, starting at "
                      f"{start} within [{lo}, {hi}], which would replace {RECIPE_FIELD[act]} = "
                      f"{value} (loss {a.loss!r}); set control.{name}.init, min and max on "
                      f"that scale (e.g. init: {value})")
    _check_kl(cfg, writes)
