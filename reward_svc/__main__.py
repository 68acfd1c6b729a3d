"""``python -m reward_svc``: run the reward service until SIGTERM or SIGINT.

Settings come from environment variables (:class:`reward_svc.config.RewardServiceConfig`); it
runs through :func:`podium.service.run_standalone` like every service: a missing or bad
setting exits 2 with a message naming the variable, before anything connects; SIGTERM lets
the batch in hand finish its transaction (or abort it, if the broker fails) and exits 0; a
failure while running (broker unreachable, fenced) exits 1 with the reason.
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from podium.bus.base import Bus
from podium.errors import ConfigError
from podium.rewards import RewardConfig, default_config, load_config
from podium.service import App, run_standalone, standalone_loader
from reward_svc.app import RewardApp
from reward_svc.config import SERVICE, RewardServiceConfig


def reward_function(config: RewardServiceConfig) -> RewardConfig:
    """The reward config named by ``PODIUM_REWARD_CONFIG`` (the packaged default if unset);
    an invalid file is a :class:`ConfigError` naming the variable."""
    if not config.reward_config:
        return default_config()
    try:
        return load_config(config.reward_config)
    except ConfigError as exc:
        raise ConfigError(f"PODIUM_REWARD_CONFIG={config.reward_config!r}: {exc}") from exc


def build(config: RewardServiceConfig, bus: Bus, tracer_provider: TracerProvider) -> App:
    """The app, once the config is read and the bus built (the tracer provider is global)."""
    del tracer_provider  # spans go through the global provider the loader installed
    return RewardApp(config, reward_function(config), bus)


def main() -> int:
    """Entry point; returns the exit status."""
    return run_standalone(SERVICE, standalone_loader(SERVICE, RewardServiceConfig, build))


if __name__ == "__main__":
    raise SystemExit(main())
