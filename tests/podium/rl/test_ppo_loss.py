"""The PPO loss parts on tiny inputs where each can be computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from podium.errors import ConfigError, ProcessingError
from podium.rl.ppo import (
    MASKED_LOGIT,
    PPOConfig,
    PPOLossParts,
    categorical_logprob_entropy,
    cosine_schedule,
    linear_schedule,
    masked_logits,
    normalize_advantages,
    ppo_loss,
)


def _loss(new_logp: list[float], adv: list[float]) -> tuple[PPOLossParts, torch.Tensor]:
    """Loss of actions whose old log-probability is 0, values and entropy all zero."""
    new = torch.tensor(new_logp, requires_grad=True)
    zeros = torch.zeros(len(new_logp))
    parts = ppo_loss(
        new, zeros, torch.tensor(adv), zeros, zeros, zeros, zeros,
        clip_coef=0.2, ent_coef=0.0, vf_coef=0.5,
    )  # fmt: skip
    return parts, new


def test_ratio_one_is_plain_policy_gradient() -> None:
    parts, new = _loss([0.0, 0.0], [1.0, -3.0])
    assert float(parts.pg_loss.detach()) == pytest.approx(1.0)  # -mean([1, -3])
    assert float(parts.approx_kl) == pytest.approx(0.0)
    assert float(parts.clip_fraction) == 0.0
    parts.loss.backward()  # type: ignore[no-untyped-call]
    assert new.grad is not None
    assert new.grad.tolist() == pytest.approx([-0.5, 1.5])  # -A / B


@pytest.mark.parametrize(
    ("ratio", "adv", "loss", "has_grad"),
    [
        (1.5, 1.0, -1.2, False),  # good action already pushed up past 1+eps: clipped, no gradient
        (1.5, -1.0, 1.5, True),  # bad action made more likely: pessimistic unclipped term
        (0.5, 1.0, -0.5, True),  # good action made less likely: unclipped, still corrected
        (0.5, -1.0, 0.8, False),  # bad action already pushed down past 1-eps: clipped
        (1.1, 1.0, -1.1, True),  # inside the trust region: plain ratio * A
    ],
)
def test_clipping(ratio: float, adv: float, loss: float, has_grad: bool) -> None:
    parts, new = _loss([math.log(ratio)], [adv])
    assert float(parts.pg_loss.detach()) == pytest.approx(loss)
    assert float(parts.clip_fraction) == (1.0 if abs(ratio - 1) > 0.2 else 0.0)
    assert float(parts.approx_kl) == pytest.approx(
        (ratio - 1) - math.log(ratio), rel=1e-4, abs=1e-7
    )
    parts.pg_loss.backward()  # type: ignore[no-untyped-call]
    assert new.grad is not None
    assert (abs(float(new.grad[0])) > 1e-6) is has_grad


def test_clip_fraction_counts_samples_outside_the_band() -> None:
    parts, _ = _loss([math.log(r) for r in (1.0, 1.3, 0.7, 1.1)], [1.0] * 4)
    assert float(parts.clip_fraction) == pytest.approx(0.5)


def test_value_loss_plain_and_clipped() -> None:
    new_v = torch.tensor([1.0, 2.1], requires_grad=True)
    old_v = torch.tensor([0.0, 2.0])
    returns = torch.tensor([2.0, 3.0])
    zeros = torch.zeros(2)
    plain = ppo_loss(
        zeros, zeros, zeros, new_v, old_v, returns, zeros, clip_coef=0.2, ent_coef=0.0, vf_coef=1.0
    )
    assert float(plain.v_loss.detach()) == pytest.approx(0.5 * (1.0 + 0.81) / 2)
    clipped = ppo_loss(
        zeros, zeros, zeros, new_v, old_v, returns, zeros,
        clip_coef=0.2, ent_coef=0.0, vf_coef=1.0, vf_clip_coef=0.2,
    )  # fmt: skip
    # Sample 0 moved 1.0 from its old value: clipped to 0.2, error (0.2 - 2)^2 = 3.24 > 1.
    # Sample 1 moved 0.1 (inside the clip): its error 0.81 is unchanged.
    assert float(clipped.v_loss.detach()) == pytest.approx(0.5 * (3.24 + 0.81) / 2)
    clipped.v_loss.backward()  # type: ignore[no-untyped-call]
    assert new_v.grad is not None
    assert float(new_v.grad[0]) == 0.0  # the pessimistic branch is the clipped constant
    assert float(new_v.grad[1]) == pytest.approx(0.5 * 2 * (2.1 - 3.0) / 2)


def test_total_combines_parts_with_coefficients() -> None:
    logp = torch.tensor([math.log(1.1), math.log(0.95)])
    old = torch.zeros(2)
    adv = torch.tensor([1.0, -0.5])
    new_v = torch.tensor([0.5, 0.0])
    ret = torch.tensor([1.5, -1.0])
    ent = torch.tensor([0.6, 0.2])
    parts = ppo_loss(
        logp, old, adv, new_v, old, ret, ent, clip_coef=0.2, ent_coef=0.01, vf_coef=0.5
    )
    assert float(parts.entropy.detach()) == pytest.approx(0.4)
    assert float(parts.loss.detach()) == pytest.approx(
        float(parts.pg_loss.detach()) - 0.01 * 0.4 + 0.5 * float(parts.v_loss.detach())
    )
    assert float(parts.pg_loss.detach()) == pytest.approx(-(1.1 * 1.0 + 0.95 * -0.5) / 2)


def test_entropy_and_logprob_with_masks() -> None:
    logits = torch.zeros(2, 4)
    mask = torch.tensor([[True, True, True, True], [True, False, True, False]])
    masked = masked_logits(logits, mask)
    assert float(masked[1, 1]) == MASKED_LOGIT
    logp, ent = categorical_logprob_entropy(masked, torch.tensor([3, 2]))
    assert ent.tolist() == pytest.approx([math.log(4), math.log(2)])
    assert logp.tolist() == pytest.approx([-math.log(4), -math.log(2)])
    assert torch.isfinite(ent).all()


def test_masked_actions_are_never_sampled() -> None:
    logits = torch.tensor([[5.0, 0.0, -1.0]]).repeat(4000, 1)
    mask = torch.tensor([[False, True, True]]).repeat(4000, 1)
    probs = torch.softmax(masked_logits(logits, mask), -1)
    samples = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(0)).flatten()
    assert not (samples == 0).any()
    assert set(samples.tolist()) == {1, 2}


def test_bad_masks_are_clear_errors() -> None:
    with pytest.raises(ProcessingError, match="no action at all"):
        masked_logits(torch.zeros(2, 3), torch.tensor([[True, False, False], [False] * 3]))
    with pytest.raises(ProcessingError, match="does not match"):
        masked_logits(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))


def test_normalize_advantages() -> None:
    a = normalize_advantages(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert float(a.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(a.std()) == pytest.approx(1.0, abs=1e-4)
    assert normalize_advantages(torch.tensor([5.0])).tolist() == [0.0]


def test_schedules() -> None:
    assert cosine_schedule(1e-3, 1e-5, 0.0) == pytest.approx(1e-3)
    assert cosine_schedule(1e-3, 1e-5, 0.5) == pytest.approx((1e-3 + 1e-5) / 2)
    assert cosine_schedule(1e-3, 1e-5, 1.0) == pytest.approx(1e-5)
    assert cosine_schedule(1e-3, 1e-5, 2.0) == pytest.approx(1e-5)
    assert linear_schedule(0.01, 0.001, 0.5) == pytest.approx(0.0055)
    assert linear_schedule(0.01, 0.001, 1.0) == pytest.approx(0.001)


def test_config_defaults_and_validation() -> None:
    cfg = PPOConfig()
    assert (cfg.gae_lambda, cfg.ent_coef_start, cfg.ent_coef_end) == (0.95, 0.01, 0.001)
    assert cfg.batch_size == cfg.num_envs * cfg.num_steps
    with pytest.raises(ConfigError, match="num_minibatches"):
        PPOConfig(num_envs=8, num_steps=32, num_minibatches=3)
    with pytest.raises(ConfigError, match="gae_lambda"):
        PPOConfig(gae_lambda=1.5)
    with pytest.raises(ConfigError, match="target_kl"):
        PPOConfig(target_kl=0.0)
    with pytest.raises(ConfigError, match="update_epochs"):
        PPOConfig(update_epochs=0)
