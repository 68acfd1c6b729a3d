"""The deployment of one cycle-bench run: a broker, the services as processes, the operator.

* :func:`connection`: a local secured KRaft broker of the run's own (``work_dir/kafka``, fresh
  each time, stopped whatever happens) or the broker of ``--bus``; services log in as their
  own principals on the local broker, as the URL's user on ``--bus``;
* :class:`Deployment`: ``python -m`` processes (:class:`~podium_app.processes.ServiceProcesses`:
  SIGTERM, then SIGKILL after the grace) — orchestrator replicas on the learned policy under the
  controlled rollout with the statistics store on, the reward service, the rollout controller
  in compressed time, the learner (swarm mode, continuous run only), and the sub-agents with
  the drift scenario whose origin is placed so that it bites ``drift_at_s`` into the load;
* the initial policy is made live by the driver with the cold start's shared steps
  (:mod:`podium_app.bootstrap`: published with the learner's code and key, then the operator's
  override; the cold start serves ``rules:cpls``, and a behaviour clone ties it, so it would
  not pass shadow).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from podium import topics
from podium.bus import KafkaConfig
from podium.bus.kafka import SASL_PASSWORD_ENV
from podium.errors import PodiumError
from podium.v1 import rollout_pb2, rollout_pb2_grpc
from podium_app.cycle.config import CycleConfig
from podium_app.kafka_broker import KafkaBroker, free_port
from podium_app.processes import SERVICES_ROOT, ServiceProcesses
from podium_app.train.config import TrainConfig
from podium_app.train.services import RunTopics, learner_settings, settings_env

CONTROLLER_ENV = {
    "PODIUM_ROLLOUT_STAGES": "25,50,100",
    "PODIUM_ROLLOUT_BASELINE_BP": "1000",
    "PODIUM_ROLLOUT_STAGE_MIN_S": "0",
    "PODIUM_ROLLOUT_STAGE_MIN_SESSIONS": "12",
    "PODIUM_ROLLOUT_OFFLINE_SESSIONS": "20",
    "PODIUM_ROLLOUT_SHADOW_WINDOW": "40",
    "PODIUM_ROLLOUT_SHADOW_MIN_SESSIONS": "10",
    "PODIUM_ROLLOUT_SHADOW_MAX_SESSIONS": "200",
    "PODIUM_ROLLOUT_GUARDRAIL_MIN_SESSIONS": "15",
    "PODIUM_ROLLOUT_TICK_S": "0.5",
}
"""Compressed time (the rollout suite's, plus stages): no minimum stage length, a dozen canary
sessions per stage at 25 -> 50 -> 100 % (at 1 % a dozen canary sessions of random ids would
take a thousand sessions), a 10 % baseline arm, a 40-comparison shadow window; the cycle is
``--cycle-s``."""

SAMPLED_BY = "trainer"
"""``submitted_by`` of the exploring sessions: the orchestrator samples their actions (its
default ``PODIUM_POLICY_SAMPLE_FROM``); the learner trains only on sampled sessions."""
GREEDY_BY = "bench-cycle"
"""``submitted_by`` of the measured sessions: decided greedily, as users' sessions are."""


@dataclass(frozen=True)
class Connection:
    """How the driver and the services reach the broker."""

    admin: KafkaConfig
    """The driver's own connection (tail, load, topic creation)."""
    service_env: Callable[[str], dict[str, str]]
    """Kafka principal -> ``PODIUM_BUS`` and the password of a service logged in as it."""


@contextlib.asynccontextmanager
async def connection(config: CycleConfig, say: Callable[[str], None]) -> AsyncIterator[Connection]:
    """The broker of ``--bus``, or a fresh local secured one stopped on exit whatever happened."""
    if config.bus:
        password = os.environ.get(SASL_PASSWORD_ENV, "")

        def shared(_principal: str) -> dict[str, str]:
            return {"PODIUM_BUS": config.bus, SASL_PASSWORD_ENV: password}

        yield Connection(KafkaConfig.from_url(config.bus), shared)
        return
    run_dir = config.work_dir / "kafka"
    old = KafkaBroker(run_dir) if (run_dir / "state.json").exists() else None
    if old is not None:
        await asyncio.to_thread(old.stop)  # a broker a killed bench left behind
    shutil.rmtree(run_dir, ignore_errors=True)
    broker = KafkaBroker(run_dir)
    say(f"starting a local secured Kafka broker in {run_dir}")
    try:
        await asyncio.to_thread(broker.start, 180.0)
        admin = KafkaConfig.from_url(broker.client_url(), sasl_password=broker.passwords()["admin"])
        yield Connection(admin, broker.client_env)
    finally:
        await asyncio.to_thread(broker.stop)


def _base_env(conn: Connection, principal: str, name: str) -> dict[str, str]:
    """What every service process gets: the caller's environment without its ``PODIUM_*``
    settings (only this run's reach the services), the principal's connection, quiet health."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PODIUM_")}
    base["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SERVICES_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    return {
        **base,
        **conn.service_env(principal),
        "PODIUM_LOG_LEVEL": "INFO",
        "PODIUM_HEALTH_PORT": "0",
        "PODIUM_SHUTDOWN_TIMEOUT_S": "5",
        "PODIUM_INSTANCE": name,
    }


def learner_train_config(config: CycleConfig, run_dir: Path) -> TrainConfig:
    """The ``podium train`` settings the continuous run's learner is configured from (its
    loop and PPO settings, its signing key ``run_dir/keys``)."""
    return TrainConfig(
        run_dir=run_dir,
        seed=config.seed,
        pool=config.pool,
        iterations=200,
        episodes_per_iteration=config.learner_batch,
        # Live sessions are decided by the live version for a whole cycle: far more versions
        # behind the learner than a training run's staleness bound allows (docs/rollout.md).
        max_policy_lag=1000,
        critic_warmup_iterations=1,
    )


@dataclass
class Deployment:
    """The service processes of one run (see the module docstring)."""

    config: CycleConfig
    conn: Connection
    run_dir: Path
    """``work_dir/<run>``: logs, the learner's checkpoints."""
    trusted_key: Path
    """Public key orchestrators and the controller trust (the run's signing pair)."""
    processes: ServiceProcesses = field(init=False)
    rollout_port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        self.processes = ServiceProcesses(self.run_dir / "logs", self.config.stop_timeout_s)

    async def _start(self, name: str, module: str, principal: str, env: dict[str, str]) -> None:
        full = {**_base_env(self.conn, principal, name), **self._pool_env(), **env}
        await self.processes.start(name, self.config.python or sys.executable, module, full)

    def _pool_env(self) -> dict[str, str]:
        """Every service reads the same pool file (the sub-agents its truth, the others its
        advertisement); none = each one's shipped default."""
        pool = self.config.pool
        return {} if pool is None else {"PODIUM_POOL_SPEC": str(pool.resolve())}

    async def start_service(
        self, name: str, module: str, principal: str, env: dict[str, str]
    ) -> None:
        """``python -m module`` as process ``name``, logged in as ``principal``, with the
        run's base environment plus ``env`` (other benches' deployments on this one's
        broker and supervision: ``podium bench pipeline``)."""
        await self._start(name, module, principal, env)

    async def start_services(self, init: Path | None) -> None:
        """Everything but the sub-agents: orchestrators, reward, controller and (with
        ``init``, the continuous run) the learner starting from ``init``."""
        keys = str(self.trusted_key)
        for i in range(self.config.replicas):
            await self._start(
                f"orch-{i + 1}",
                "orchestrator_svc",
                "orchestrator",
                {
                    "PODIUM_GRPC_HOST": "127.0.0.1",
                    "PODIUM_GRPC_PORT": "0",
                    "PODIUM_POLICY": "learned",
                    "PODIUM_ROLLOUT": "controlled",
                    "PODIUM_AGENT_STATS": "true",
                    # Each run's store learns from its own sessions only, as the replayed
                    # references' do: one broker serves both runs, so a warm start would read
                    # the frozen run's trajectories (its post-drift ones) into the continuous.
                    "PODIUM_AGENT_STATS_WARM": "0",
                    "PODIUM_POLICY_TRUSTED_KEYS": keys,
                    "PODIUM_SESSION_TIMEOUT_S": "60",
                },
            )
        await self._start("reward", "reward_svc", "reward", {"PODIUM_REWARD_POLL_MS": "200"})
        await self._start(
            "controller",
            "learner_svc",
            "rollout",
            {
                "PODIUM_LEARNER_MODE": "rollout",
                "PODIUM_ROLLOUT_GRPC_HOST": "127.0.0.1",
                "PODIUM_ROLLOUT_GRPC_PORT": str(self.rollout_port),
                "PODIUM_POLICY_TRUSTED_KEYS": keys,
                "PODIUM_ROLLOUT_CYCLE_S": repr(self.config.cycle_s),
                **CONTROLLER_ENV,
            },
        )
        if init is not None:
            train = learner_train_config(self.config, self.run_dir)
            loop, algorithm = learner_settings(train, init, 16, RunTopics())
            await self._start(
                "learner",
                "learner_svc",
                "learner",
                {
                    **settings_env(loop),
                    **settings_env(algorithm),
                    "PODIUM_LEARNER_MODE": "swarm",
                    # Follow the registry: a rejected lineage resets to the live version.
                    "PODIUM_LEARNER_ROLLOUT_TOPIC": topics.ROLLOUT,
                },
            )

    async def start_subagents(self, drift_origin: float) -> None:
        """The sub-agent pool, drifting by ``--drift`` from ``drift_origin`` (unix seconds)."""
        await self._start(
            "subagent",
            "subagent_svc",
            "subagent",
            {
                "PODIUM_SUBAGENT_TIME_SCALE": repr(self.config.time_scale),
                "PODIUM_SUBAGENT_DRIFT": self.config.drift,
                "PODIUM_SUBAGENT_DRIFT_ORIGIN": repr(drift_origin),
            },
        )

    def logs_loaded(self, version: int) -> bool:
        """Whether every orchestrator replica's log says it loaded ``version``."""
        needle = f"v{version} ("
        return all(
            needle in self.processes.log_tail(n, 10**7)
            for n in self.processes.procs
            if n.startswith("orch")
        )

    def check(self) -> None:
        """Raise naming the service that died (with its log's end)."""
        self.processes.check()

    async def stop(self) -> dict[str, int]:
        return await self.processes.stop()


async def _rpc(address: str, method: str, request: object) -> Any:
    """RolloutService ``method`` on the loopback address (no token: the bench's controller
    serves only 127.0.0.1 and has no token table)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)  # type: ignore[no-untyped-call]
        return await getattr(stub, method)(request, timeout=30)


async def wait_controller(deploy: Deployment, timeout_s: float = 180.0) -> None:
    """Wait until RolloutService answers (the controller is up and has claimed the registry)."""
    address = f"127.0.0.1:{deploy.rollout_port}"
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        deploy.check()
        try:
            await _rpc(address, "GetStatus", rollout_pb2.GetStatusRequest())
            return
        except grpc.aio.AioRpcError as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise PodiumError(f"RolloutService never answered: {exc.details()}") from exc
            await asyncio.sleep(0.5)


__all__ = [
    "CONTROLLER_ENV",
    "GREEDY_BY",
    "SAMPLED_BY",
    "Connection",
    "Deployment",
    "connection",
    "learner_train_config",
    "wait_controller",
]
