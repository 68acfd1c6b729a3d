"""``python -m reward_svc``: run the reward service until SIGTERM or SIGINT.

Settings come from environment variables (see :class:`reward_svc.config.ServiceConfig`);
a missing or bad one exits with status 2 and a message naming it. SIGTERM lets the batch in
hand finish its transaction (or abort it, if the broker fails) before the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from podium.errors import ConfigError, PodiumError
from podium.rewards import RewardConfig, default_config, load_config
from reward_svc.config import ServiceConfig, from_env


async def _run(config: ServiceConfig, reward: RewardConfig) -> None:
    loop = asyncio.get_running_loop()
    if config.is_kafka:
        from reward_svc.kafka_loop import KafkaRewardService

        service = KafkaRewardService(config, reward)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.request_stop)
        await service.run()
        return
    from podium.bus import connect
    from reward_svc.bus_loop import BusRewardService

    bus = connect(config.bus_url)
    await bus.start()
    try:
        bus_service = BusRewardService(bus, config, reward)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        task = asyncio.create_task(bus_service.run())
        await stop.wait()
        await bus_service.stop()
        await task
    finally:
        await bus.stop()


def main() -> int:
    """Entry point; returns the exit status."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        config = from_env()
        reward = load_config(config.reward_config) if config.reward_config else default_config()
    except ConfigError as exc:
        print(f"reward_svc: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_run(config, reward))
    except PodiumError as exc:
        print(f"reward_svc: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
