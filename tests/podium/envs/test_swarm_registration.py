"""The swarm environment in Gymnasium's registry: made by id, checked by Gymnasium's own env
checker, and trained on by Stable-Baselines3's PPO."""

from __future__ import annotations

import subprocess
import sys
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import podium.envs
from podium.envs import SWARM_ENV_ID
from podium.envs.swarm import EnvConfig, SwarmEnv, default_tasks, load_pool
from podium.envs.swarm.spec import default_pool_path
from podium.errors import ConfigError
from podium.observed import AgentStats

SMALL = ["layered-5", "login-system", "chain-8"]
"""Shipped tasks of at most 8 subtasks: small spaces keep the checks fast."""


def _make(**kwargs: object) -> gymnasium.Env:  # type: ignore[type-arg]
    return gymnasium.make(SWARM_ENV_ID, tasks=SMALL, config={"max_subtasks": 8}, **kwargs)


def test_made_by_id_with_kwargs_passed_through() -> None:
    stats = AgentStats()
    env = _make(stats=stats, pool="misadvertised")
    swarm = env.unwrapped
    assert isinstance(swarm, SwarmEnv)
    assert swarm.spec is not None and swarm.spec.id == SWARM_ENV_ID
    assert [t.name for t in swarm.tasks] == SMALL
    assert swarm.config == EnvConfig(max_subtasks=8) and swarm.stats is stats
    misadvertised = load_pool(default_pool_path().parent / "misadvertised.yaml")
    assert swarm.pool.agent_names == misadvertised.agent_names()
    assert swarm.true_pool is not None  # its hidden truth drives the outcomes
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    # The mask through Gymnasium's wrappers, as sb3-contrib's MaskablePPO reads it.
    mask = env.get_wrapper_attr("action_masks")()
    assert mask.shape == (env.action_space.n,) and mask.any()


def test_defaults_are_the_shipped_library_and_pool() -> None:
    swarm = gymnasium.make(SWARM_ENV_ID).unwrapped
    assert isinstance(swarm, SwarmEnv)
    assert {t.name for t in swarm.tasks} == {t.name for t in default_tasks()}
    assert swarm.config == EnvConfig()


def test_gymnasium_env_checker_passes() -> None:
    env = _make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    # The one warning is about the unbounded times in the observation, which are real.
    assert [str(w.message) for w in caught if "infinity" not in str(w.message)] == []


def test_same_seed_same_episode_through_make() -> None:
    def rollout(seed: int) -> list[float]:
        env = _make()
        env.reset(seed=seed)
        env.action_space.seed(seed)
        rewards = []
        for _ in range(30):
            mask = env.get_wrapper_attr("action_masks")()
            action = int(np.flatnonzero(mask)[0])
            _, reward, terminated, truncated, _ = env.step(action)
            rewards.append(float(reward))
            if terminated or truncated:
                break
        return rewards

    assert rollout(5) == rollout(5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"config": {"max_subtask": 8}}, "EnvConfig has no field 'max_subtask'"),
        ({"pool": "no-such-pool"}, "neither a shipped pool"),
        ({"tasks": ["no-such-task"]}, "neither a shipped task"),
        (
            {"tasks": ["layered-45"], "config": {"max_subtasks": 8}},
            "more than EnvConfig.max_subtasks=8",
        ),
    ],
)
def test_bad_kwargs_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        gymnasium.make(SWARM_ENV_ID, **kwargs)


def test_registration_is_idempotent_and_needs_no_prior_import() -> None:
    podium.envs.register_envs()
    assert gymnasium.registry[SWARM_ENV_ID].entry_point == "podium.envs.registration:make_swarm_env"
    # A fresh interpreter that imported nothing of Podium: Gymnasium's "module:id" form.
    code = (
        "import gymnasium; "
        "env = gymnasium.make('podium.envs:podium/Swarm-v0', tasks=['layered-5'], "
        "config={'max_subtasks': 8}); print(type(env.unwrapped).__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "SwarmEnv"


def test_stable_baselines3_ppo_learns_on_it() -> None:
    """A short PPO run of SB3 on the registered env, as is: no wrapper needed."""
    from stable_baselines3 import PPO

    env = _make()
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=64, n_epochs=2, seed=0, device="cpu")
    model.learn(total_timesteps=256)
    assert model.num_timesteps >= 256
    # SB3's Monitor saw whole episodes end (loops, completions or truncations).
    assert len(model.ep_info_buffer) > 0
    obs, _ = env.reset(seed=0)
    action, _ = model.predict(obs, deterministic=True)
    assert env.action_space.contains(int(action))
