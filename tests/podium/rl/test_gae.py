"""GAE against a hand-computed case and a slow, independently written reference."""

from __future__ import annotations

import pytest
import torch

from podium.errors import ProcessingError
from podium.rl.ppo import compute_gae


def _reference_gae(
    rewards: list[list[float]],
    values: list[list[float]],
    next_values: list[list[float]],
    terminated: list[list[bool]],
    dones: list[list[bool]],
    gamma: float,
    lam: float,
) -> list[list[float]]:
    """Direct definition: A_t = sum_k (gamma * lam)^k * delta_{t+k}, summed up to and including
    the first step whose episode ends (or the end of the rollout). No recursion shared with
    the implementation under test."""
    t_len, n = len(rewards), len(rewards[0])
    out = [[0.0] * n for _ in range(t_len)]
    for i in range(n):
        for t in range(t_len):
            total, weight = 0.0, 1.0
            for k in range(t, t_len):
                bootstrap = 0.0 if terminated[k][i] else gamma * next_values[k][i]
                delta = rewards[k][i] + bootstrap - values[k][i]
                total += weight * delta
                if dones[k][i]:
                    break
                weight *= gamma * lam
            out[t][i] = total
    return out


def _t(rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64).unsqueeze(1)


def test_hand_computed_no_done() -> None:
    # delta = [0.86, 0.87, 0.88]; gamma * lambda = 0.72.
    adv, ret = compute_gae(
        _t([1.0, 1.0, 1.0]),
        _t([0.5, 0.4, 0.3]),
        _t([0.4, 0.3, 0.2]),
        _t([0, 0, 0]).bool(),
        _t([0, 0, 0]).bool(),
        gamma=0.9,
        gae_lambda=0.8,
    )
    expected = [0.86 + 0.72 * (0.87 + 0.72 * 0.88), 0.87 + 0.72 * 0.88, 0.88]
    assert adv.squeeze(1).tolist() == pytest.approx(expected)
    assert adv.squeeze(1).tolist() == pytest.approx([1.942592, 1.5036, 0.88])
    assert ret.squeeze(1).tolist() == pytest.approx([1.942592 + 0.5, 1.5036 + 0.4, 0.88 + 0.3])


def test_hand_computed_termination_and_truncation() -> None:
    common = {
        "rewards": _t([1.0, 1.0, 1.0]),
        "values": _t([0.5, 0.4, 0.3]),
        "next_values": _t([0.4, 0.3, 0.2]),
        "gamma": 0.9,
        "gae_lambda": 0.8,
    }
    ended = _t([0, 1, 0]).bool()
    # Terminated at t=1: no bootstrap (delta_1 = 1 - 0.4) and nothing flows back from t=2.
    adv, _ = compute_gae(terminated=ended, dones=ended, **common)  # type: ignore[arg-type]
    assert adv.squeeze(1).tolist() == pytest.approx([0.86 + 0.72 * 0.6, 0.6, 0.88])
    # Truncated at t=1: bootstraps from V(final obs) = 0.3 but still cuts the recursion.
    adv, _ = compute_gae(terminated=_t([0, 0, 0]).bool(), dones=ended, **common)  # type: ignore[arg-type]
    assert adv.squeeze(1).tolist() == pytest.approx([0.86 + 0.72 * 0.87, 0.87, 0.88])


@pytest.mark.parametrize("seed", range(5))
def test_matches_reference_on_random_rollouts(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    t_len, n = 37, 5
    rewards = torch.randn(t_len, n, generator=g, dtype=torch.float64)
    values = torch.randn(t_len, n, generator=g, dtype=torch.float64)
    next_values = torch.randn(t_len, n, generator=g, dtype=torch.float64)
    terminated = torch.rand(t_len, n, generator=g) < 0.1
    truncated = (torch.rand(t_len, n, generator=g) < 0.1) & ~terminated
    dones = terminated | truncated
    assert terminated.any() and truncated.any()  # the draw exercises both kinds of ending
    gamma, lam = 0.97, 0.9
    adv, ret = compute_gae(rewards, values, next_values, terminated, dones, gamma, lam)
    expected = _reference_gae(
        rewards.tolist(),
        values.tolist(),
        next_values.tolist(),
        terminated.tolist(),
        dones.tolist(),
        gamma,
        lam,
    )
    assert torch.allclose(adv, torch.tensor(expected, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(ret, adv + values)


def test_lambda_one_gives_discounted_return_to_go() -> None:
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.3], [0.2], [0.1]])
    next_values = torch.tensor([[0.2], [0.1], [10.0]])
    no = torch.zeros(3, 1, dtype=torch.bool)
    _, ret = compute_gae(rewards, values, next_values, no, no, gamma=0.5, gae_lambda=1.0)
    # Monte-Carlo return bootstrapped from the last next value.
    assert ret[:, 0].tolist() == pytest.approx(
        [1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 10, 2 + 0.5 * 3 + 0.25 * 10, 3 + 0.5 * 10]
    )


def test_shape_mismatch_is_a_clear_error() -> None:
    x = torch.zeros(4, 2)
    with pytest.raises(ProcessingError, match="next_values"):
        compute_gae(x, x, torch.zeros(4, 3), x.bool(), x.bool(), 0.99, 0.95)
