"""The forking-token mask (docs/methods/wider-field.md §6c): worked example, padding, ties,
renormalisation, and a threshold that is global across ranks (in-process fake ranks and 2 real gloo
processes)."""

import math
import os

import pytest
import torch
import torch.multiprocessing as mp

from explorl.algorithms import aggregate
from explorl.algorithms.token_masks import forking_token_mask

PAD = 9.0  # padding entropy, higher than every valid token: it must never be kept


def example():
    # §6c: H = [0.1, 2.0, 0.5, 1.2, 0.05] over two rows with padding.
    h = torch.tensor([[0.1, 2.0, 0.5, PAD], [1.2, 0.05, PAD, PAD]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    return h, mask


def test_worked_example_keeps_the_top_two_and_never_padding():
    h, mask = example()
    out = forking_token_mask(h, mask, 0.4)  # k = ceil(0.4 · 5) = 2
    assert out.keep.tolist() == [[False, True, False, False], [True, False, False, False]]
    assert out.weight.tolist() == out.keep.float().tolist()
    m = out.metrics
    assert m["entropy/mask_threshold"].item() == pytest.approx(1.2)
    assert m["entropy/mask_kept_frac"].item() == pytest.approx(0.4)
    assert m["entropy/mask_kept_mean"].item() == pytest.approx(1.6)
    assert m["entropy/mask_dropped_mean"].item() == pytest.approx((0.1 + 0.5 + 0.05) / 3)


@pytest.mark.parametrize("rho, n, k", [(0.7, 10, 7), (0.2, 10, 2), (0.01, 10, 1), (1.0, 3, 3),
                                       (0.21, 10, 3)])
def test_k_is_max_one_ceil_rho_n(rho, n, k):
    h = torch.arange(n, dtype=torch.float32)[None]
    out = forking_token_mask(h, torch.ones(1, n, dtype=torch.bool), rho)
    assert int(out.keep.sum()) == k
    assert out.keep[0, n - k :].all()  # the k largest


def test_ties_at_the_threshold_are_broken_by_position():
    h = torch.tensor([[0.5, 1.0, 1.0], [1.0, 2.0, 1.0]])
    out = forking_token_mask(h, torch.ones(2, 3, dtype=torch.bool), 0.5)  # k = 3
    assert out.keep.tolist() == [[False, True, True], [False, True, False]]


def test_renorm_kept_turns_token_mean_into_a_mean_over_kept_tokens():
    h, mask = example()
    loss = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 5.0, 0.0, 0.0]])
    out = forking_token_mask(h, mask, 0.4, renorm_kept=True)
    assert out.weight[out.keep].tolist() == [2.5, 2.5]  # n_valid / k = 5 / 2
    assert aggregate(loss * out.weight, mask, "token-mean").item() == pytest.approx((2 + 4) / 2)
    plain = forking_token_mask(h, mask, 0.4)
    assert aggregate(loss * plain.weight, mask, "token-mean").item() == pytest.approx((2 + 4) / 5)


@pytest.mark.parametrize("seed", range(5))
def test_equals_a_sort_by_entropy_then_position(seed):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randint(0, 6, (4, 9), generator=gen).float() / 5  # many ties
    mask = torch.rand(4, 9, generator=gen) < 0.7
    out = forking_token_mask(h, mask, 0.3)
    valid = [(float(h[i, j]), i * 9 + j) for i in range(4) for j in range(9) if mask[i, j]]
    k = max(1, math.ceil(0.3 * len(valid) - 1e-9))
    chosen = {pos for _, pos in sorted(valid, key=lambda x: (-x[0], x[1]))[:k]}
    assert {i * 9 + j for i, j in out.keep.nonzero().tolist()} == chosen


def test_empty_batch_keeps_nothing_and_reports_zeros():
    h = torch.full((2, 3), PAD)
    out = forking_token_mask(h, torch.zeros(2, 3, dtype=torch.bool), 0.2)
    assert not out.keep.any() and (out.weight == 0).all()
    assert all(v.item() == 0.0 for v in out.metrics.values())


def test_rho_is_checked():
    h, mask = example()
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="rho"):
            forking_token_mask(h, mask, bad)


# --------------------------------------------------------------------------- across ranks


def split_batch():
    """9 valid tokens; at ρ = 0.4, k = 4: 2.0 and the first three of the four 1.0s, so the tie
    at the threshold straddles the ranks when rows split [:2] | [2:]; a split at 4 leaves
    rank 1 with no row, and one at 1 gives rank 0 a single row."""
    h = torch.tensor([[0.3, 1.0, 0.2], [1.0, 0.1, PAD], [1.0, 2.0, 1.0], [0.4, PAD, PAD]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    return h, mask


KEEP = [[False, True, False], [True, False, False], [True, True, False], [False, False, False]]


def fake_ranks(parts, rho, **kw):
    """Run the mask for each rank in turn with a gather that returns every rank's valid
    entropies (as the real collective would) and counts that every rank joined."""
    local_valid = [h.float()[m] for h, m in parts]
    calls = []

    def gather_for(r):
        def gather(x):
            calls.append(r)
            assert torch.equal(x, local_valid[r]) and x.device.type == "cpu"
            return list(local_valid)
        return gather

    outs = [forking_token_mask(h, m, rho, gather=gather_for(r), rank=r, **kw)
            for r, (h, m) in enumerate(parts)]
    assert calls == list(range(len(parts)))
    return outs


@pytest.mark.parametrize("cut", [2, 1, 4])  # rank 0 takes rows [:cut]; cut 4 leaves rank 1 empty
def test_two_fake_ranks_equal_one_process(cut):
    h, mask = split_batch()
    one = forking_token_mask(h, mask, 0.4)
    assert one.keep.tolist() == KEEP
    parts = [(h[:cut], mask[:cut]), (h[cut:], mask[cut:])]
    outs = fake_ranks(parts, 0.4, renorm_kept=True)
    assert torch.equal(torch.cat([o.keep for o in outs]), one.keep)
    for o in outs:
        for key, v in one.metrics.items():
            assert o.metrics[key].item() == pytest.approx(v.item())
    assert torch.cat([o.weight for o in outs])[one.keep].tolist() == [9 / 4] * 4


CUTS = (2, 4, 1)  # a straddling tie; rank 1 without rows; rank 0 with one row


def _worker(rank, world, store, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)

    def gather(x):
        got = [None] * world
        dist.all_gather_object(got, x)
        return got

    try:
        h, mask = split_batch()
        for cut in CUTS:
            rows = slice(0, cut) if rank == 0 else slice(cut, None)
            out = forking_token_mask(h[rows], mask[rows], 0.4, gather=gather, rank=rank)
            torch.save({"keep": out.keep, "metrics": out.metrics},
                       os.path.join(out_dir, f"{cut}-{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_get_the_one_process_threshold(tmp_path):
    """The threshold and mask are identical on 1 and 2 processes, also when one rank has no
    valid token (it still joins the collective: no hang as in TRL #4041)."""
    h, mask = split_batch()
    one = forking_token_mask(h, mask, 0.4)
    assert one.keep.tolist() == KEEP
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, 2, str(tmp_path / "store"), str(tmp_path)))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0, "a rank failed or hung"
    for cut in CUTS:
        res = [torch.load(tmp_path / f"{cut}-{r}.pt") for r in range(2)]
        assert torch.equal(torch.cat([r["keep"] for r in res]), one.keep)
        for r in res:
            for key, v in one.metrics.items():
                assert r["metrics"][key].item() == v.item()
