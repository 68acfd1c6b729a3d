"""The rollout controller as a service app (``PODIUM_LEARNER_MODE=rollout``).

Three parts on one event loop: the policy-updates follower (:class:`Candidates`, a group of
its own per instance, ``<group>.policy.<instance>``, read from the beginning), the writer loop
(:class:`RolloutController`) and RolloutService (:class:`RolloutServer`).
"""

from __future__ import annotations

import logging

from learner_svc.rollout.config import ControllerSettings
from learner_svc.rollout.controller import Clock, RolloutController, utc_now
from learner_svc.rollout.service import RolloutServer
from learner_svc.rollout.twins import Candidates, TwinRunner
from podium.bus import Bus, EventConsumer
from podium.envs.swarm.spec import PoolSpec, default_pool, load_pool
from podium.errors import ConfigError, PodiumError
from podium.policy.signing import TrustedKeys
from podium.service import ServiceShell

_log = logging.getLogger(__name__)

SERVICE = "learner_svc"


def pool_of(settings: ControllerSettings) -> PoolSpec:
    """The pool twins simulate (``PODIUM_POOL_SPEC``, the orchestrator's)."""
    try:
        return load_pool(settings.pool_spec) if settings.pool_spec else default_pool()
    except (OSError, PodiumError, ValueError) as exc:
        raise ConfigError(f"PODIUM_POOL_SPEC={settings.pool_spec!r}: {exc}") from exc


def trusted_of(settings: ControllerSettings) -> TrustedKeys | None:
    """The keys announcements must be signed by; None (rule versions only) when unset."""
    if not settings.trusted_keys:
        _log.warning("PODIUM_POLICY_TRUSTED_KEYS is not set: only rule engines can be candidates")
        return None
    return TrustedKeys.load(settings.trusted_keys)


class RolloutApp:
    """The controller, its candidates follower and RolloutService."""

    name = SERVICE

    def __init__(
        self,
        settings: ControllerSettings,
        bus: Bus,
        *,
        instance: str,
        shutdown_timeout_s: float = 30.0,
        clock: Clock = utc_now,
        serve_grpc: bool = True,
    ) -> None:
        self.settings = settings
        self.instance = instance
        self.candidates = Candidates(trusted_of(settings))
        self.runner = TwinRunner(pool_of(settings), self.candidates, batch=settings.twin_batch)
        self.shell = ServiceShell(SERVICE, shutdown_timeout_s=shutdown_timeout_s)
        self.follower = self.shell.add(
            EventConsumer(
                bus,
                [settings.policy_topic],
                f"{settings.group_id}.policy.{instance}",
                self.candidates.on_event,
                producer_name=instance,
            )
        )
        self.controller = self.shell.add(
            RolloutController(settings, bus, self.runner, instance=instance, clock=clock)
        )
        self.grpc = RolloutServer(self.controller, settings) if serve_grpc else None

    @property
    def grpc_port(self) -> int:
        """The bound RolloutService port (0 before start, or without gRPC)."""
        return self.grpc.port if self.grpc is not None else 0

    async def start(self) -> None:
        await self.shell.start()
        if self.grpc is not None:
            port = await self.grpc.start()
            _log.info("%s: RolloutService on %s:%d", self.instance, self.settings.grpc_host, port)

    async def stop(self) -> None:
        deadline = self.shell.deadline()
        if self.grpc is not None:
            await self.grpc.stop(grace_s=min(deadline.left(), 5.0))
        await self.shell.stop(deadline=deadline)

    async def wait(self) -> None:
        await self.shell.wait()
