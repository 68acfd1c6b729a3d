"""orchestrator_svc: task intake over gRPC, scheduling sessions over the bus, trajectories.

See :mod:`orchestrator_svc.app` for the service and :mod:`orchestrator_svc.session` for how
a session drives the swarm environment with sub-agent results arriving from the bus.
"""

from orchestrator_svc.app import OrchestratorApp
from orchestrator_svc.config import OrchestratorConfig

__all__ = ["OrchestratorApp", "OrchestratorConfig"]
