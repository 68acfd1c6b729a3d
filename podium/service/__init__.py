"""What every Podium service shares: the app lifecycle, its consumer shell, its health server.

* :mod:`podium.service.standalone` — the :class:`App` protocol and ``python -m <svc>``:
  :func:`run_standalone` / :func:`serve` (signals, graceful stop, exit codes, the health
  server on ``PODIUM_HEALTH_PORT``, the Prometheus endpoint on ``PODIUM_METRICS_PORT``:
  :func:`start_metrics`), :func:`standalone_loader` (config, logging, tracing, bus).
* :mod:`podium.service.shell` — :class:`ServiceShell`: an app's consumers, each run in a
  task, stopped within one :class:`Deadline`.
* :mod:`podium.service.health` — :class:`HealthServer`: ``grpc.health.v1`` on its own port.

Every name is importable from ``podium.service`` itself.
"""

from podium.service.health import HealthServer, health_status
from podium.service.shell import Deadline, ServiceShell, Worker
from podium.service.standalone import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    STOP_SIGNALS,
    App,
    default_instance_name,
    health_port_of,
    ports_of,
    run_standalone,
    serve,
    setup_logging,
    standalone_loader,
    start_metrics,
)

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_OK",
    "STOP_SIGNALS",
    "App",
    "Deadline",
    "HealthServer",
    "ServiceShell",
    "Worker",
    "default_instance_name",
    "health_port_of",
    "health_status",
    "ports_of",
    "run_standalone",
    "serve",
    "setup_logging",
    "standalone_loader",
    "start_metrics",
]
