"""``python -m reward_svc``: run the reward service until SIGTERM or SIGINT.

Settings come from environment variables (see :class:`reward_svc.config.ServiceConfig`); it
runs through :func:`podium.service.run_standalone` like every service: a missing or bad
setting exits 2 with a message naming the variable, before anything connects; SIGTERM lets
the batch in hand finish its transaction (or abort it, if the broker fails) and exits 0; a
failure while running (broker unreachable, fenced) exits 1 with the reason.
"""

from __future__ import annotations

from podium.bus import connect
from podium.bus.base import Bus
from podium.errors import ConfigError
from podium.rewards import default_config, load_config
from podium.service import App, run_standalone, setup_logging
from reward_svc.app import SERVICE, RewardApp
from reward_svc.config import from_env


def load() -> tuple[App, Bus]:
    """Config from the environment (fails fast naming the variable), then the app and bus."""
    config = from_env()
    setup_logging(config.log_level)
    try:
        reward = load_config(config.reward_config) if config.reward_config else default_config()
    except ConfigError as exc:
        raise ConfigError(f"PODIUM_REWARD_CONFIG={config.reward_config!r}: {exc}") from exc
    bus = connect(config.bus_url)
    return RewardApp(config, reward, bus), bus


def main() -> int:
    """Entry point; returns the exit status."""
    return run_standalone(SERVICE, load)


if __name__ == "__main__":
    raise SystemExit(main())
