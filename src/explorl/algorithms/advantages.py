"""Group-relative advantage estimators (docs/methods/baseline.md §0) and pass@k estimators
(docs/methods/wider-field.md §6d).

Each estimator is registered once, by its ``spec.AdvantageSpec`` in ``ADVANTAGE_SPECS`` (what
it takes besides the rewards, the fields it reads and their intervals, its docs); the other
tables here are derived from it. Every estimator has one signature,
``fn(rewards, group_index, eps) -> advantages`` (the pass@k ones in ``TAKES_K`` also take a
keyword ``k``, the REINFORCE++ ones in ``TAKES_LENGTHS`` a keyword ``lengths``):
``rewards`` is (N,) float, ``group_index`` is (N,) long with arbitrary group ids (not
necessarily contiguous or sorted; groups may have unequal sizes). All statistics are
computed with ``index_add_`` / ``scatter_reduce`` over groups, never a Python loop.

Shared rule **(ours)**: a response whose group has size 1 or identical rewards gets exactly
A = 0. Such a group carries no learning signal, and the rule keeps us from dividing by a
std of ~0 (or of a single sample, where the unbiased std is undefined). The exceptions follow
verl where its names are used: ``reinforce_plus_plus`` has no group baseline at all and
``reinforce_plus_plus_baseline`` whitens over the batch's tokens, so a constant group gets the
batch-level shift −μ/σ, as in verl.

The pass@k estimators (``READS_CORRECTNESS``) optimise the chance that one of k responses is
*correct*: the trainer feeds them the verifier's correctness (``reward.accuracy``'s rule, 0/1),
never the shaped reward (a format credit or the overlong penalty would otherwise count as
"correct", or turn a correct answer into a wrong one).
"""

from __future__ import annotations

import torch

from explorl.algorithms.spec import AdvantageSpec, owned_ranges

ZERO_TOL = 1e-8
"""|A| below this counts as a zero advantage in the ``adv/*zero*`` metrics."""


def group_inverse(group_index: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids to contiguous ids 0..G-1; returns (inverse (N,), G)."""
    ids, inverse = torch.unique(group_index, return_inverse=True)  # (G,), (N,)
    return inverse, ids.numel()


def _group_sum(values: torch.Tensor, inverse: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Per-group sum of ``values`` (N,) -> (G,)."""
    return values.new_zeros(num_groups).index_add_(0, inverse, values)


def degenerate_groups(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """True (N,) for responses whose group has size 1 or all-equal rewards (DAPO's filter)."""
    return _degenerate(rewards.float(), *group_inverse(group_index))


def _degenerate(r: torch.Tensor, inverse: torch.Tensor, G: int) -> torch.Tensor:
    gmax = r.new_full((G,), -torch.inf).scatter_reduce(0, inverse, r, "amax")  # (G,)
    gmin = r.new_full((G,), torch.inf).scatter_reduce(0, inverse, r, "amin")  # (G,)
    # max == min is exact for equal rewards, unlike std < tol (a float mean of equal
    # values can differ from them by one ulp, which std/eps would blow up).
    return (gmax == gmin)[inverse]  # (N,)


def _group_mean_count(rewards: torch.Tensor, group_index: torch.Tensor):
    """Per-response group mean, group size and the degenerate mask, all (N,)."""
    inverse, G = group_inverse(group_index)
    r = rewards.float()
    count = _group_sum(torch.ones_like(r), inverse, G)  # (G,)
    mean = _group_sum(r, inverse, G) / count  # (G,)
    return r, inverse, G, mean[inverse], count[inverse], _degenerate(r, inverse, G)


def grpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor, eps: float) -> torch.Tensor:
    """GRPO (DeepSeekMath §4.1.2, outcome supervision): A_i = (r_i − mean_g) / (std_g + eps).

    std is the unbiased (n − 1) sample std, as ``torch.std`` in verl and TRL.
    """
    r, inverse, G, mean, count, degenerate = _group_mean_count(rewards, group_index)
    centred = r - mean  # (N,)
    var = _group_sum(centred**2, inverse, G)[inverse] / (count - 1).clamp(min=1)  # (N,)
    adv = centred / (var.sqrt() + eps)
    return torch.where(degenerate, torch.zeros_like(adv), adv)


def dr_grpo_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, eps: float
) -> torch.Tensor:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero"): A_i = r_i − mean_g, no std division.

    ``eps`` is unused (one signature for all estimators).
    """
    r, _, _, mean, _, degenerate = _group_mean_count(rewards, group_index)
    adv = r - mean  # (N,)
    return torch.where(degenerate, torch.zeros_like(adv), adv)


def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor, eps: float) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): A_i = r_i − mean of the other n − 1 rewards (eps unused)."""
    r, _, _, mean, count, degenerate = _group_mean_count(rewards, group_index)
    # (sum − r_i)/(n − 1); size-1 groups are degenerate, the clamp only avoids 0/0.
    loo_mean = (mean * count - r) / (count - 1).clamp(min=1)  # (N,)
    adv = r - loo_mean
    return torch.where(degenerate, torch.zeros_like(adv), adv)


def reinforce_pp_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, eps: float
) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025), whitened per response: x = r − mean_g, then
    (x − mean(x)) / (std(x) + eps), constant groups kept at 0.

    Mean and unbiased std are over all N responses of the batch (one weight per response).
    verl's and OpenRLHF's form whitens over tokens: ``reinforce_plus_plus_baseline``; plain
    REINFORCE++ (no group baseline) is ``reinforce_plus_plus``.
    """
    r, _, _, mean, _, degenerate = _group_mean_count(rewards, group_index)
    x = torch.where(degenerate, torch.zeros_like(r), r - mean)  # (N,)
    n = x.numel()
    if n == 0:
        return x
    centred = x - x.mean()
    std = (centred.pow(2).sum() / max(n - 1, 1)).sqrt()  # N = 1: std 0, not torch.std's NaN
    adv = centred / (std + eps)
    # Σx = 0 by construction, so this only removes float noise from the no-signal groups.
    return torch.where(degenerate, torch.zeros_like(adv), adv)


def _whiten(x: torch.Tensor, weights: torch.Tensor, eps: float) -> torch.Tensor:
    """(x − μ)/(σ + eps) with μ and the unbiased σ weighted by ``weights`` (tokens per response:
    the whitening over every valid token of the batch, x being constant along a response)."""
    w = weights.double()
    n = w.sum()
    if x.numel() == 0 or n <= 0:
        return torch.zeros_like(x)
    xd = x.double()
    mean = (w * xd).sum() / n
    var = (w * (xd - mean) ** 2).sum() / (n - 1).clamp(min=1)  # one token: σ 0, not NaN
    return ((xd - mean) / (var.sqrt() + eps)).to(x.dtype)


def reinforce_plus_plus_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, eps: float, *,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain REINFORCE++ (Hu et al. 2025; verl ``reinforce_plus_plus``, outcome reward, γ = 1):
    the return G_t = R at every token, whitened over all valid tokens of the batch,
    A_i = (R_i − μ)/(σ + eps) with μ, σ (unbiased) token-weighted by ``lengths`` (None: one
    weight per response). No group baseline: groups are ignored, size 1 included (verl adds 1e-8
    to σ² instead of eps to σ)."""
    r = rewards.float()
    w = torch.ones_like(r) if lengths is None else lengths.to(r.device)
    return _whiten(r, w, eps)


def reinforce_plus_plus_baseline_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, eps: float, *,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """REINFORCE++-baseline as verl ``reinforce_plus_plus_baseline``: x_i = R_i − mean_g (a
    group of one keeps x = R, verl's mean 0), then whitened over all valid tokens of the batch
    like ``reinforce_plus_plus``. Differs from ``reinforce_pp`` (one weight per response, and
    constant groups kept at 0)."""
    r, _, _, mean, count, _ = _group_mean_count(rewards, group_index)
    x = torch.where(count > 1, r - mean, r)  # (N,)
    w = torch.ones_like(r) if lengths is None else lengths.to(r.device)
    return _whiten(x, w, eps)


def grpo_batch_std_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, eps: float
) -> torch.Tensor:
    """GRPO with batch-level scaling (TRL ``scale_rewards="batch"``): A_i = (r_i − mean_g) /
    (std over every reward of the step + eps), the unbiased std of all N rewards (all ranks:
    the estimator sees the global batch). Constant groups get 0 (the shared rule)."""
    r, _, _, mean, _, degenerate = _group_mean_count(rewards, group_index)
    n = r.numel()
    if n == 0:
        return r
    std = ((r - r.mean()).pow(2).sum() / max(n - 1, 1)).sqrt()
    adv = (r - mean) / (std + eps)
    return torch.where(degenerate, torch.zeros_like(adv), adv)


# --------------------------------------------------------------------------- pass@k (§6d)
# Binomial ratios C(a, b)/C(n, k) go through lgamma in float64: C(64, 32) ≈ 1.8e18 already
# loses integers in float64, while the log form stays accurate to ~1e-13 for any group size.


def _log_comb(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log C(a, b) in float64; −inf where the binomial is 0 (b < 0, b > a)."""
    a, b = a.double(), b.double()
    ok = (b >= 0) & (b <= a)
    a_, b_ = torch.where(ok, a, 0.0), torch.where(ok, b, 0.0)
    out = torch.lgamma(a_ + 1) - torch.lgamma(b_ + 1) - torch.lgamma(a_ - b_ + 1)
    return torch.where(ok, out, -torch.inf)


def _comb_ratio(a, b, n, k) -> torch.Tensor:
    """C(a, b) / C(n, k) elementwise (float64), 0 where C(a, b) = 0; needs C(n, k) > 0."""
    # host: a tensor keeps its device; a Python number becomes a 0-d tensor (any device's peer)
    a, b, n, k = (torch.as_tensor(x, dtype=torch.float64) for x in (a, b, n, k))  # host
    return torch.exp(_log_comb(a, b) - _log_comb(n, k))


def _check_k(k: int, count: torch.Tensor, strict: bool, name: str) -> None:
    smallest = int(count.min()) if count.numel() else k + 1
    if k < 1 or (k >= smallest if strict else k > smallest):
        need = "k < n" if strict else "1 ≤ k ≤ n"
        raise ValueError(
            f"{name}: needs {need} for every group; got k = {k}, smallest n = {smallest}"
        )


def passk_training_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, eps: float, *, k: int
) -> torch.Tensor:
    """Pass@k Training's analytic advantages (arXiv 2508.10751, RUCAIBox; §6d (a)).

    Per group of N responses, c correct (r > 0: the ±1 convention's −1 counts as wrong):
    R̄ = ρ(N, c, k) = 1 − C(N−c, k)/C(N, k), σ = sqrt(R̄(1 − R̄)),
    A_pos = (1 − R̄)/(σ + eps), A_neg = (1 − R̄ − C(N−c−1, k−1)/C(N−1, k−1))/(σ + eps).
    Zero-sum per group; c = 0 or N − c < k (every k-subset passes) gives all 0. k ≤ N for
    every group (ours: an error, not the reference code's silent 0). The code's eps is 1e-6.
    """
    inverse, G = group_inverse(group_index)
    correct = (rewards > 0).double()  # (N,)
    n = _group_sum(torch.ones_like(correct), inverse, G)  # (G,)
    c = _group_sum(correct, inverse, G)  # (G,)
    _check_k(k, n, strict=False, name="passk_training")
    active = (c > 0) & (n - c >= k)  # (G,)
    r_bar = 1 - _comb_ratio(n - c, k, n, k)  # (G,)
    sigma = (r_bar * (1 - r_bar)).clamp(min=0).sqrt()
    a_pos = (1 - r_bar) / (sigma + eps)
    a_neg = (1 - r_bar - _comb_ratio(n - c - 1, k - 1, n - 1, k - 1)) / (sigma + eps)
    adv = torch.where(correct > 0, a_pos[inverse], a_neg[inverse])  # (N,)
    adv = torch.where(active[inverse], adv, torch.zeros_like(adv))
    return adv.to(rewards.float().dtype)


def _sorted_groups(rewards: torch.Tensor, group_index: torch.Tensor):
    """Responses sorted by (group, reward ascending): returns (order, g, grp, i, n, start) with
    ``g`` (N,) the sorted rewards in float64, ``grp`` contiguous group ids, ``i`` the 1-based
    position inside the group, ``n`` the group size (all (N,)) and ``start`` (G,) the index of
    each group's first response in sorted order. Ties keep any order: every formula below
    gives tied rewards the same value."""
    inverse, G = group_inverse(group_index)
    by_reward = torch.argsort(rewards.double(), stable=True)
    order = by_reward[torch.argsort(inverse[by_reward], stable=True)]  # (N,)
    grp = inverse[order]
    count = _group_sum(torch.ones_like(rewards, dtype=torch.float64), inverse, G)  # (G,)
    start = torch.cumsum(count, 0) - count  # (G,)
    i = torch.arange(len(order), dtype=torch.float64, device=rewards.device) - start[grp] + 1
    return order, rewards.double()[order], grp, i, count[grp], start.long()


def _segment_sums(values: torch.Tensor, grp: torch.Tensor, start: torch.Tensor):
    """Per element of a group-sorted array: (Σ of the group's earlier values, Σ of its later)."""
    cs = torch.cumsum(values, 0)  # (N,)
    before_group = (cs - values)[start]  # (G,) running sum before each group's first element
    prefix = cs - values - before_group[grp]  # exclusive
    total = values.new_zeros(len(start)).index_add_(0, grp, values)  # (G,)
    return prefix, total[grp] - prefix - values


def _unsort(values: torch.Tensor, order: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(values)
    out[order] = values
    return out.to(like.float().dtype)


def pkpo_s(rewards: torch.Tensor, group_index: torch.Tensor, k: int) -> torch.Tensor:
    """PKPO's unbiased pass@k (max_g@k) gradient weights, no baseline (Walder & Karkhanis 2025,
    arXiv 2505.15201 Eq. 19): s_i = C(n,k)⁻¹ Σ_{|I|=k, I∋i} max_I g, from the sorted form
    s_(i) = C(n,k)⁻¹ [g_(i)·C(i−1, k−1) + Σ_{j>i} g_(j)·C(j−2, k−2)] (ascending order, 1-based).
    Binary g: k/n if correct, (k/n)·ρ(n−1, c, k−1) if wrong. No zero rule (see ``pkpo_advantages``).
    """
    order, g, grp, i, n, start = _sorted_groups(rewards, group_index)
    _check_k(k, n, strict=False, name="pkpo")
    own = g * _comb_ratio(i - 1, k - 1, n, k)  # I's max is i itself
    _, later = _segment_sums(g * _comb_ratio(i - 2, k - 2, n, k), grp, start)  # j > i is the max
    return _unsort(own + later, order, rewards)


def _zero_degenerate(adv, rewards, group_index):
    return torch.where(degenerate_groups(rewards, group_index), torch.zeros_like(adv), adv)


def pkpo_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, eps: float, *, k: int
) -> torch.Tensor:
    """PKPO's s_i (``pkpo_s``) as advantages; eps unused. Shared zero rule **(ours)**: a size-1
    or constant group gets 0 (s alone would push every response of an all-correct group up)."""
    return _zero_degenerate(pkpo_s(rewards, group_index, k), rewards, group_index)


def pkpo_loo_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, eps: float, *, k: int
) -> torch.Tensor:
    """PKPO s^(loo) (Eq. 29): s_i − (n−1)⁻¹ Σ_{j≠i} S(j, k, [n]∖i), needs k < n; eps unused.

    Σ_{j∈X} S(j, k, X) = k·ρ_k(X), so the baseline is k/(n−1) times the unbiased max_g@k of
    the other n − 1 rewards: ρ_k([n]∖i) = C(n−1, k)⁻¹ [Σ_{j<i} g_(j) C(j−1, k−1) +
    Σ_{j>i} g_(j) C(j−2, k−1)]. Zero rule for size-1 and constant groups **(ours)**.
    """
    order, g, grp, i, n, start = _sorted_groups(rewards, group_index)
    _check_k(k, n, strict=True, name="pkpo_loo")
    own = g * _comb_ratio(i - 1, k - 1, n, k)
    _, later = _segment_sums(g * _comb_ratio(i - 2, k - 2, n, k), grp, start)
    before, _ = _segment_sums(g * _comb_ratio(i - 1, k - 1, n - 1, k), grp, start)
    _, after = _segment_sums(g * _comb_ratio(i - 2, k - 1, n - 1, k), grp, start)
    adv = own + later - k / (n - 1) * (before + after)
    return _zero_degenerate(_unsort(adv, order, rewards), rewards, group_index)


def pkpo_loo_minus_one_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, eps: float, *, k: int
) -> torch.Tensor:
    """PKPO s^(loo−1) (Eq. 33), the paper's recommended transform; eps unused.

    s_i = C(n,k)⁻¹ Σ_{|I|=k, I∋i} (max_I g − max_{I∖i} g); sorted form
    C(n,k)⁻¹ [g_(i) C(i−1, k−1) − Σ_{j<i} g_(j) C(j−1, k−2)]. Binary g: C(n−c, k−1)/C(n, k)
    if correct, 0 if wrong. k = 1 has no k−1 baseline: raw r minus the mean of the other
    rewards (RLOO), as docs/methods/wider-field.md §6d says. Zero rule for size-1 and constant
    groups.
    """
    if k == 1:
        return rloo_advantages(rewards, group_index, eps)
    order, g, grp, i, n, start = _sorted_groups(rewards, group_index)
    _check_k(k, n, strict=False, name="pkpo_loo_minus_one")
    own = g * _comb_ratio(i - 1, k - 1, n, k)
    before, _ = _segment_sums(g * _comb_ratio(i - 1, k - 2, n, k), grp, start)
    return _zero_degenerate(_unsort(own - before, order, rewards), rewards, group_index)


def grpo_passk_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, eps: float, *, norm_by_std: bool = True
) -> torch.Tensor:
    """verl's ``grpo_passk`` (after arXiv 2503.19595; §6d (c)).

    Only each group's best response gets an advantage: (r_max − r_2nd)/(std + eps), std the
    unbiased (n − 1) std of the group (``norm_by_std=False``: r_max − r_2nd); all others 0.
    Ties for the best give 0. Equals ``pkpo_loo_minus_one`` with k = n (without the std). Every
    group needs ≥ 2 responses (verl raises too). A true advantage, not a reward: EasyR1 #585
    wrote it into the reward tensor, so the non-best kept their raw reward and training collapsed.
    """
    inverse, G = group_inverse(group_index)
    r = rewards.double()
    count = _group_sum(torch.ones_like(r), inverse, G)  # (G,)
    if G and int(count.min()) < 2:
        raise ValueError("grpo_passk needs at least 2 responses in every group")
    gmax = r.new_full((G,), -torch.inf).scatter_reduce(0, inverse, r, "amax")  # (G,)
    idx = torch.arange(len(r), device=r.device)
    # the best response: the first (lowest batch index) reaching the group's max
    cand = torch.where(r == gmax[inverse], idx, len(r))
    best = torch.full_like(gmax, len(r), dtype=torch.long).scatter_reduce(0, inverse, cand, "amin")
    is_best = idx == best[inverse]  # (N,)
    rest = torch.where(is_best, -torch.inf, r)
    second = r.new_full((G,), -torch.inf).scatter_reduce(0, inverse, rest, "amax")  # (G,)
    gap = gmax - second  # (G,)
    if norm_by_std:
        mean = _group_sum(r, inverse, G) / count
        var = _group_sum((r - mean[inverse]) ** 2, inverse, G) / (count - 1)
        gap = gap / (var.sqrt() + eps)
    adv = torch.where(is_best, gap[inverse], torch.zeros_like(r))
    return adv.to(rewards.float().dtype)


BASELINE_DOCS = "methods/baseline.md#formulas-0"
PASSK_DOCS = ("methods/wider-field.md"
              "#6d-passk-advantages-binary-rewards-group-of-n-with-c-correct-1-k-n")
EPS = {"adv_eps": "(0, 1]"}  # 0 divides 0 by 0 for a group of equal rewards
PASSK_K = {"passk_k": "[1, 4096]"}  # responses per prompt (config.intervals.SAMPLES)


def _spec(name, fn, docs=BASELINE_DOCS, ranges=EPS, **kw) -> AdvantageSpec:
    return AdvantageSpec(name=name, fn=fn, docs=docs, ranges=ranges, **kw)


def _passk(name, fn, ranges=PASSK_K, **kw) -> AdvantageSpec:
    return _spec(name, fn, PASSK_DOCS, ranges, reads_correctness=True, **kw)


ADVANTAGE_SPECS: dict[str, AdvantageSpec] = {s.name: s for s in (
    _spec("grpo", grpo_advantages),
    _spec("dr_grpo", dr_grpo_advantages, ranges={}),  # eps unused
    _spec("rloo", rloo_advantages, ranges={}),
    _spec("reinforce_pp", reinforce_pp_advantages),
    _spec("reinforce_plus_plus", reinforce_plus_plus_advantages, takes_lengths=True),
    _spec("reinforce_plus_plus_baseline", reinforce_plus_plus_baseline_advantages,
          takes_lengths=True),
    _spec("grpo_batch_std", grpo_batch_std_advantages),
    _passk("passk_training", passk_training_advantages, {**PASSK_K, **EPS}, takes_k=True),
    _passk("pkpo", pkpo_advantages, takes_k=True),
    _passk("pkpo_loo", pkpo_loo_advantages, takes_k=True),
    _passk("pkpo_loo_minus_one", pkpo_loo_minus_one_advantages, takes_k=True),
    _passk("grpo_passk", grpo_passk_advantages, EPS),
)}
"""``algorithm.advantage`` -> its spec: the one registration of each estimator."""

ADVANTAGES = {name: s.fn for name, s in ADVANTAGE_SPECS.items()}
"""Name -> estimator."""

TAKES_K = frozenset(n for n, s in ADVANTAGE_SPECS.items() if s.takes_k)
"""Estimators that optimise pass@k for a given k (``compute_advantages(..., k=)``)."""

READS_CORRECTNESS = frozenset(n for n, s in ADVANTAGE_SPECS.items() if s.reads_correctness)
"""Pass@k estimators: they read correctness (0/1, ``compute_advantages(..., correct=)``), not
the reward."""

TAKES_LENGTHS = frozenset(n for n, s in ADVANTAGE_SPECS.items() if s.takes_lengths)
"""Estimators that whiten over tokens (``compute_advantages(..., lengths=)``)."""

ADVANTAGE_RANGES = owned_ranges(ADVANTAGE_SPECS.values())
"""``algorithm.<field>`` -> interval of every field an estimator reads (checked at load)."""


def compute_advantages(
    name: str,
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    eps: float = 1e-6,
    k: int | None = None,
    *,
    correct: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Advantages by estimator ``name`` (docs/methods/baseline.md §0, §7c,
    docs/methods/wider-field.md §6d) plus zero-advantage metrics.

    ``k`` is the pass@k target of the ``TAKES_K`` estimators (required there, ignored by the
    others). ``correct`` (N,) 0/1: what the pass@k estimators (``READS_CORRECTNESS``) read
    instead of ``rewards`` (the trainer passes the verifier's correctness; None: ``rewards``).
    ``lengths`` (N,): valid tokens per response, the whitening weights of ``TAKES_LENGTHS``
    (None: one per response). The pass@k estimators see whole groups: call this before
    sharding (§6j).

    Metrics (0-dim tensors):
      ``adv/zero_frac``: fraction of responses with |A| < 1e-8;
      ``adv/zero_group_frac``: fraction of groups whose advantages are all |A| < 1e-8.
    """
    if name not in ADVANTAGE_SPECS:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {sorted(ADVANTAGES)}")
    spec = ADVANTAGE_SPECS[name]
    if spec.reads_correctness and correct is not None:
        rewards = correct.float()
    if spec.takes_lengths:
        adv = spec.fn(rewards, group_index, eps, lengths=lengths)  # (N,)
    elif spec.takes_k:
        if k is None:
            raise ValueError(f"advantage estimator {name!r} needs k (the pass@k it optimises)")
        adv = spec.fn(rewards, group_index, eps, k=k)  # (N,)
    else:
        adv = spec.fn(rewards, group_index, eps)  # (N,)
    zero = (adv.abs() < ZERO_TOL).float()  # (N,)
    inverse, G = group_inverse(group_index)
    nonzero_per_group = _group_sum(1.0 - zero, inverse, G)  # (G,)
    metrics = {
        "adv/zero_frac": zero.mean() if zero.numel() else zero.new_zeros(()),
        "adv/zero_group_frac": (nonzero_per_group == 0).float().mean() if G else zero.new_zeros(()),
    }
    return adv, metrics
