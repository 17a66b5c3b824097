"""Entropy advantage shaping and EntroPIC's confident-token term (docs/methods/wider-field.md §6e,
§6f) against hand-computed values."""

import math

import pytest
import torch

from explorl.algorithms.regularisers import entropic_confident_term
from explorl.algorithms.shaping import entropy_advantage_shaping

# --------------------------------------------------------------------------- §6e


def test_worked_examples():
    # A = 1, H = 0.5 -> 1 + min(0.2, 0.5) = 1.2; A = −1, H = 3 -> −1 + min(1.2, 0.5) = −0.5.
    adv = torch.tensor([1.0, -1.0])
    h = torch.tensor([[0.5], [3.0]])
    out, m = entropy_advantage_shaping(adv, h, torch.ones(2, 1, dtype=torch.bool), 0.4, 2.0)
    torch.testing.assert_close(out, torch.tensor([[1.2], [-0.5]]))
    assert m["adv/entropy_shaping_mean"].item() == pytest.approx((0.2 + 0.5) / 2)
    assert m["adv/entropy_shaping_capped_frac"].item() == pytest.approx(1 / 2)


def test_sign_is_kept_zero_stays_zero_and_padding_is_untouched():
    adv = torch.tensor([[2.0, -2.0, 0.0, 5.0]])
    h = torch.tensor([[100.0, 100.0, 100.0, 1.0]])  # huge entropy: the cap binds
    mask = torch.tensor([[True, True, True, False]])
    out, m = entropy_advantage_shaping(adv, h, mask, 0.4, 2.0)
    torch.testing.assert_close(out, torch.tensor([[3.0, -1.0, 0.0, 5.0]]))  # ±|A|/κ; A = 0 stays
    assert m["adv/entropy_shaping_capped_frac"].item() == 1.0
    assert m["adv/entropy_shaping_mean"].item() == pytest.approx((1 + 1 + 0) / 3)


def test_entropy_carries_no_gradient():
    h = torch.tensor([[0.5, 0.2]], requires_grad=True)
    out, _ = entropy_advantage_shaping(torch.tensor([1.0]), h, torch.ones(1, 2, dtype=torch.bool),
                                       0.4, 2.0)
    assert not out.requires_grad


# --------------------------------------------------------------------------- §6f actuator


def test_entropic_term_by_hand():
    # probs [0.99, 0.5, 0.97 (padding)], [0.96, 0.9]; ratios e^0.1, 1, -, e^-0.2, 1; A = [2, −1].
    p = torch.tensor([[0.99, 0.5, 0.97], [0.96, 0.9, 0.5]])
    logp = p.log().requires_grad_(True)
    old = logp.detach() - torch.tensor([[0.1, 0.0, 0.0], [-0.2, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    adv = torch.tensor([2.0, -1.0])
    term, m = entropic_confident_term(logp, old, adv, mask)
    # confident: (0,0) and (1,0): mean of −ratio·|A| = (−2e^0.1 − e^−0.2)/2
    assert term.item() == pytest.approx((-2 * math.exp(0.1) - math.exp(-0.2)) / 2, rel=1e-6)
    assert m["loss/entropic_confident_frac"].item() == pytest.approx(2 / 4)
    (g,) = torch.autograd.grad(term, logp)
    expected = torch.tensor([[-2 * math.exp(0.1) / 2, 0, 0], [-math.exp(-0.2) / 2, 0, 0]])
    torch.testing.assert_close(g, expected)  # both signs of A pushed up: sharpening for α > 0
    term8, _ = entropic_confident_term(logp, old, adv, mask, token_denom=8)  # a global count
    assert term8.item() == pytest.approx(term.item() * 2 / 8, rel=1e-6)


def test_entropic_term_without_confident_tokens_is_zero_not_nan():
    logp = torch.full((1, 3), math.log(0.5), requires_grad=True)
    term, m = entropic_confident_term(logp, logp.detach(), torch.tensor([1.0]),
                                      torch.ones(1, 3, dtype=torch.bool))
    assert term.item() == 0.0 and m["loss/entropic_confident_frac"].item() == 0.0
    (g,) = torch.autograd.grad(term, logp)
    assert torch.isfinite(g).all()
