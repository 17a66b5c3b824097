"""Loss aggregation modes against hand computation (docs/methods/baseline.md §0)."""

import pytest
import torch

from explorl.algorithms import AGG_MODES, aggregate

# Padding holds 100 and NaN: neither may leak into any mode.
LOSS = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, float("nan"), 100.0]])
MASK = torch.tensor([[True, True, True, False], [True, True, False, False]])


def agg(mode, loss=LOSS, mask=MASK, **kw):
    return aggregate(loss, mask, mode, **kw).item()


def test_token_mean():
    assert agg("token-mean") == pytest.approx((1 + 2 + 3 + 4 + 5) / 5)
    assert agg("token-mean", token_denom=10) == pytest.approx(15 / 10)  # global count
    assert agg("token-mean", token_denom=torch.tensor(7.5)) == pytest.approx(15 / 7.5)


def test_seq_mean_token_mean():
    # per-sequence means 6/3 = 2 and 9/2 = 4.5
    assert agg("seq-mean-token-mean") == pytest.approx((2 + 4.5) / 2)
    assert agg("seq-mean-token-mean", seq_denom=4) == pytest.approx(6.5 / 4)


def test_seq_mean_token_sum_norm():
    assert agg("seq-mean-token-sum-norm", max_len=4) == pytest.approx(15 / 4 / 2)
    assert agg("seq-mean-token-sum-norm", max_len=4, seq_denom=3) == pytest.approx(15 / 4 / 3)
    with pytest.raises(ValueError, match="max_len"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm")


def test_all_padding_row_does_not_count_in_default_seq_denom():
    loss = torch.cat([LOSS, torch.full((1, 4), 9.0)])
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=torch.bool)])
    assert agg("seq-mean-token-mean", loss, mask) == pytest.approx(6.5 / 2)
    assert agg("seq-mean-token-sum-norm", loss, mask, max_len=4) == pytest.approx(15 / 4 / 2)
    assert agg("token-mean", loss, mask) == pytest.approx(3.0)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_empty_mask_gives_zero_and_finite_gradient(mode):
    loss = torch.ones(2, 3, requires_grad=True)
    out = aggregate(loss, torch.zeros(2, 3, dtype=torch.bool), mode, max_len=3)
    out.backward()
    assert out.item() == 0.0 and torch.isfinite(loss.grad).all()


def test_explicit_zero_denominator_gives_zero():
    assert agg("token-mean", token_denom=0) == 0.0
    assert agg("seq-mean-token-mean", seq_denom=0) == 0.0


def test_gradients_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 5.0, 0.0, 0.0]], requires_grad=True)
    aggregate(loss, MASK, "token-mean").backward()
    torch.testing.assert_close(loss.grad, MASK.float() / 5)
    loss.grad = None
    aggregate(loss, MASK, "seq-mean-token-mean").backward()
    torch.testing.assert_close(
        loss.grad, torch.tensor([[1 / 6] * 3 + [0.0], [1 / 4] * 2 + [0.0] * 2])
    )


def test_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(LOSS, MASK, "mean")
