"""Where ``podium train`` runs the services that learn: in this process, or each its own process.

Both deployments run the same two services with the same settings: reward_svc (scores every
``Trajectory``) and learner_svc's learning loop with the swarm algorithm
(:class:`~learner_svc.loop.LearningLoop` + :class:`~learner_svc.algorithms.swarm.SwarmPPO`).

* :class:`EmbeddedServices` (``inproc://``, the zero-setup default): both as asyncio tasks on
  the in-process bus;
* :class:`ProcessServices` (``kafka://``): ``python -m reward_svc`` and ``python -m
  learner_svc`` as processes against the broker, configured through the same environment
  variables an operator sets, built from the same settings objects.

Either way the run makes its own Ed25519 key pair in ``<run_dir>/keys`` (:func:`run_key_pair`):
the learner signs its announcements with the private key, the actor trusts only the public one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from learner_svc.algorithms.swarm import CLONING_FIELDS, SwarmPPO, SwarmSettings
from learner_svc.config import LearnerConfig, LoopSettings
from learner_svc.loop import LearningLoop, LoopApp
from podium import rewards, topics
from podium.bus import Bus
from podium.bus.base import TopicSpec
from podium.bus.kafka import SASL_PASSWORD_ENV, KafkaBus
from podium.errors import ConfigError, PodiumError
from podium.policy.signing import KeyPair, ensure_key_pair
from podium.service import App
from podium_app.processes import SERVICES_ROOT, ServiceProcesses
from podium_app.train.config import TrainConfig
from reward_svc.app import RewardApp
from reward_svc.config import RewardServiceConfig


@dataclass(frozen=True, slots=True)
class RunTopics:
    """The topics a run's events travel on."""

    trajectories: str = topics.TRAJECTORIES
    """Sessions of the actor, scored by reward_svc."""
    scored: str = topics.SCORED_TRAJECTORIES
    """Scored sessions, learned from by learner_svc."""
    policy: str = topics.POLICY_UPDATES
    """Versions announced by learner_svc, followed by the actor."""

    @classmethod
    def private(cls, tag: str) -> RunTopics:
        """Topics of this run alone: on a shared broker, another run's (or a live
        deployment's) sessions must not reach this run's learner, nor its sessions theirs."""
        return cls(
            trajectories=f"{topics.TRAJECTORIES}.{tag}",
            scored=f"{topics.SCORED_TRAJECTORIES}.{tag}",
            policy=f"{topics.POLICY_UPDATES}.{tag}",
        )


def run_key_pair(config: TrainConfig) -> KeyPair:
    """The run's private signing pair, ``<run_dir>/keys/policy-signing.{pem,pub}``, made on
    first use: zero setup, and no other run's (or deployment's) key is trusted by this run."""
    return ensure_key_pair(config.run_dir.resolve() / "keys")


def learner_settings(
    config: TrainConfig, init: Path, max_subtasks: int, run_topics: RunTopics
) -> tuple[LoopSettings, SwarmSettings]:
    """The learner's loop and algorithm settings for a run (one PPO iteration per update)."""
    run = config.run_dir.resolve()
    loop = LoopSettings(
        checkpoint_dir=str(run / "learner"),
        in_topic=run_topics.scored,
        policy_topic=run_topics.policy,
        batch_trajectories=config.episodes_per_iteration,
        max_policy_lag=config.max_policy_lag,
        tensorboard_dir=str(run / "tb"),
    )
    ppo = config.ppo
    algorithm = SwarmSettings(
        artifacts_dir=str(run / "checkpoints"),
        model_repository=str(config.model_repository.resolve()) if config.model_repository else "",
        init=str(init.resolve()),
        signing_key=str(run_key_pair(config).private_path),
        # The run's base pool: the learner's layout when a trajectory names no agents.
        pool_spec=str(config.pool.resolve()) if config.pool else "",
        max_subtasks=max_subtasks,
        seed=config.seed,
        learning_rate=ppo.learning_rate,
        learning_rate_end=ppo.learning_rate_end,
        ent_coef_start=ppo.ent_coef_start,
        ent_coef_end=ppo.ent_coef_end,
        gae_lambda=ppo.gae_lambda,
        gamma=ppo.gamma,
        clip_coef=ppo.clip_coef,
        vf_coef=ppo.vf_coef,
        update_epochs=ppo.update_epochs,
        minibatch_size=ppo.minibatch_size,
        max_grad_norm=ppo.max_grad_norm,
        target_kl=ppo.target_kl,
        total_updates=config.iterations,
        critic_warmup_updates=config.critic_warmup_iterations,
        torch_threads=config.torch_threads,
        device=config.device,
    )
    # Behaviour cloning runs in the driver and reads the rest of TrainConfig.ppo itself; a
    # PPO setting the learner cannot be given must not be silently dropped.
    reaches = dataclasses.replace(
        algorithm.ppo(), **{name: getattr(ppo, name) for name in CLONING_FIELDS}
    )
    if reaches != ppo:
        lost = [
            f.name
            for f in dataclasses.fields(ppo)
            if getattr(ppo, f.name) != getattr(reaches, f.name)
        ]
        raise ConfigError(
            f"TrainConfig.ppo: {', '.join(lost)} cannot reach the learner (SwarmSettings has "
            "no such setting); leave them at their defaults"
        )
    return loop, algorithm


def settings_env(settings: Any) -> dict[str, str]:
    """The environment variables that reproduce ``settings`` (a config read with ``env()``)."""
    out = {}
    for f in dataclasses.fields(settings):
        var = f.metadata.get("env")
        if var is not None:
            value = getattr(settings, f.name)
            out[var] = repr(value) if isinstance(value, float) else str(value)
    return out


class Deployment(Protocol):
    """The learning services of one run."""

    topics: RunTopics
    """The topics they consume and produce."""

    async def start(
        self, bus: Bus, init: Path, max_subtasks: int, driver_groups: dict[str, list[str]]
    ) -> None:
        """Start reward_svc and the learner (which announces ``init`` as version 0).
        ``driver_groups``: the driver's own consumer groups, positioned like the services'."""
        ...

    def check(self) -> None:
        """Raise :class:`PodiumError` if a service has died."""
        ...

    async def stop(self) -> dict[str, int]:
        """Stop everything started (whatever happened); exit codes by service."""
        ...


class EmbeddedServices:
    """reward_svc and the learning loop as the apps their processes run, as asyncio tasks on
    the in-process bus."""

    def __init__(self, config: TrainConfig, tag: str) -> None:
        self.config = config
        self.tag = tag
        # A run's own topics even on a fresh in-process bus: a resumed learner's checkpoint
        # holds offsets of the previous process's topics, which must not apply to these.
        self.topics = RunTopics.private(tag)
        self._apps: dict[str, App] = {}
        self._waits: dict[str, asyncio.Task[None]] = {}

    async def start(
        self, bus: Bus, init: Path, max_subtasks: int, driver_groups: dict[str, list[str]]
    ) -> None:
        del driver_groups  # a fresh in-process bus holds no other run's events
        reward_cfg = RewardServiceConfig(
            bus_url="inproc://",
            instance=f"{self.tag}-reward",
            in_topic=self.topics.trajectories,
            out_topic=self.topics.scored,
            shutdown_timeout_s=self.config.stop_timeout_s,
        )
        loop_settings, settings = learner_settings(self.config, init, max_subtasks, self.topics)
        service = LearnerConfig(bus_url="inproc://", group_id=f"{self.tag}.learner")
        loop = LearningLoop(
            loop_settings.loop_config(service, f"{self.tag}-learner"),
            SwarmPPO.from_settings(settings),
            bus,
        )
        self._apps = {
            "reward_svc": RewardApp(reward_cfg, rewards.default_config(), bus),
            "learner_svc": LoopApp(loop, shutdown_timeout_s=self.config.stop_timeout_s),
        }
        for name, app in self._apps.items():
            await app.start()
            self._waits[name] = asyncio.create_task(app.wait(), name=name)

    def check(self) -> None:
        for name, task in self._waits.items():
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise PodiumError(f"{name} failed: {task.exception()!r}")

    async def stop(self) -> dict[str, int]:
        codes = {}
        for name, app in self._apps.items():
            with contextlib.suppress(Exception):
                await app.stop()
            task = self._waits[name]
            with contextlib.suppress(BaseException):
                await task
            codes[name] = 0 if task.done() and not task.cancelled() and not task.exception() else 1
        return codes


class ProcessServices:
    """``python -m reward_svc`` and ``python -m learner_svc`` as processes against Kafka."""

    def __init__(self, config: TrainConfig, tag: str) -> None:
        self.config = config
        self.tag = tag
        self.processes = ServiceProcesses(config.run_dir / "logs", config.stop_timeout_s)
        self.topics = RunTopics.private(tag)

    def groups(self) -> dict[str, list[str]]:
        """The services' consumer groups and their topics (positioned at the topics' ends
        before the processes start, so neither replays another run's events)."""
        return {
            f"{self.tag}.reward": [self.topics.trajectories],
            f"{self.tag}.learner": [self.topics.scored],
        }

    def environments(self, init: Path, max_subtasks: int) -> dict[str, dict[str, str]]:
        """Module and environment of every process, by service."""
        # None of the caller's PODIUM_* settings leak in, except the broker password: the bus
        # URL names the SASL user, and a password never travels in a URL.
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("PODIUM_") or k == SASL_PASSWORD_ENV
        }
        base["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(SERVICES_ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
        base["PODIUM_BUS"] = self.config.bus
        loop_settings, settings = learner_settings(self.config, init, max_subtasks, self.topics)
        reward = {
            "PODIUM_REWARD_GROUP": f"{self.tag}.reward",
            "PODIUM_REWARD_IN_TOPIC": self.topics.trajectories,
            "PODIUM_REWARD_OUT_TOPIC": self.topics.scored,
            "PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX": f"{self.tag}.reward",
            "PODIUM_INSTANCE": f"{self.tag}-reward",
        }
        learner = {
            "PODIUM_LEARNER_MODE": "swarm",
            "PODIUM_GROUP_ID": f"{self.tag}.learner",
            "PODIUM_INSTANCE": f"{self.tag}-learner",
            **settings_env(loop_settings),
            **settings_env(settings),
        }
        return {
            "reward_svc": {**base, **reward},
            "learner_svc": {**base, **learner},
        }

    async def start(
        self, bus: Bus, init: Path, max_subtasks: int, driver_groups: dict[str, list[str]]
    ) -> None:
        if not isinstance(bus, KafkaBus):
            raise PodiumError("service processes need a Kafka bus")
        partitions = bus.config.default_partitions
        own = (self.topics.trajectories, self.topics.scored, self.topics.policy)
        await bus.create_topics([TopicSpec(t, partitions) for t in own])
        await bus.position_groups_at_end({**self.groups(), **driver_groups})
        for name, env in self.environments(init, max_subtasks).items():
            await self.processes.start(name, self.config.python, name, env)

    def check(self) -> None:
        self.processes.check()

    async def stop(self) -> dict[str, int]:
        return await self.processes.stop()


__all__ = [
    "Deployment",
    "EmbeddedServices",
    "ProcessServices",
    "RunTopics",
    "learner_settings",
    "run_key_pair",
    "settings_env",
]
