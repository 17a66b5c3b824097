"""DAPO dynamic-sampling filter and soft overlong punishment by hand."""

import torch

from explorl.algorithms import informative_groups, overlong_penalty


def test_informative_groups():
    # group 0 = [1, 0] mixed; 5 = [1, 1] and 9 = [0, 0] constant; 3 = [1] size one
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 5, 9, 5, 0, 9, 3])
    assert informative_groups(rewards, groups).tolist() == [
        True,
        False,
        False,
        False,
        True,
        False,
        False,
    ]


def test_overlong_penalty():
    lengths = torch.tensor([50, 80, 85, 90, 100, 120])
    # expected length 100 - 20 = 80; linear to -1 at 100; capped beyond
    torch.testing.assert_close(
        overlong_penalty(lengths, 100, 20, 1.0), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    )
    torch.testing.assert_close(
        overlong_penalty(lengths, 100, 20, 0.5), torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5, -0.5])
    )
    assert (overlong_penalty(lengths, 100, 0, 1.0) == 0).all()  # buffer 0 = off
