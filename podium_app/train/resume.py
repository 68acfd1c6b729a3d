"""The driver's checkpoint of a ``podium train`` run, so ``--resume RUN_DIR`` continues it.

The learner checkpoints its own half (weights, optimizer moments, update counter, minibatch
generator, policy version: :mod:`learner_svc.checkpoint`, under ``<run_dir>/learner``) and a
restarted learner resumes from it by itself. What only the driver knows is here, in
``<run_dir>/driver.json``, rewritten atomically after every iteration: the iteration reached
(the TensorBoard step of the driver's curves), its random streams (tasks and seeds, pools,
the actor's sampling, torch's global generator), each pool's statistics store, the learning
curve, the cloning history, the rule engine's validation figures and the version validation
prefers so far. The session of the starting network shown in the report ("before") is kept
beside it once, as ``driver-before.pb``.

The two halves are written at different moments, so a crash can leave the learner one update
ahead of the driver (it checkpointed version N + 1; the driver had not recorded it):
:func:`start_iteration` then counts that update as done, since its trajectories are in the
weights, and the driver goes on from there.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from podium.errors import ConfigError
from podium.observed import AgentStats
from podium.policy.artifacts import atomic_write
from podium.v1 import reward_pb2, trajectory_pb2
from podium_app.train.config import IterationLog

FORMAT = "podium.train.driver/1"
"""The ``format`` of ``driver.json``; loading refuses anything else."""
STATE_FILE = "driver.json"
BEFORE_FILE = "driver-before.pb"


@dataclass(slots=True)
class DriverState:
    """What the driver needs to go on with a run (see the module docstring)."""

    iteration: int
    """PPO iterations done (the learner's policy version after them)."""
    rng: dict[str, Any]
    """State of the stream of tasks and session seeds (a numpy bit generator's)."""
    pool_rng: dict[str, Any]
    """State of the stream of each session's pool."""
    actor_generator: bytes
    """The actor's sampling generator (torch)."""
    torch_rng: bytes
    """torch's global generator."""
    stores: list[dict[str, Any] | None]
    """Each pool's statistics store (``AgentStats.to_dict``; None without stores)."""
    cpls_val_ratio: float
    cpls_val_completion: float
    history: list[IterationLog] = field(default_factory=list)
    bc_history: list[dict[str, float]] = field(default_factory=list)
    best: tuple[float, int, reward_pb2.PolicyUpdated] | None = None
    """(validation latency/bound, version, its announcement) of the preferred version."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (bytes as base64)."""
        best = None
        if self.best is not None:
            ratio, version, event = self.best
            best = {"ratio": ratio, "version": version, "event": _b64(event.SerializeToString())}
        return {
            "format": FORMAT,
            "iteration": self.iteration,
            "rng": self.rng,
            "pool_rng": self.pool_rng,
            "actor_generator": _b64(self.actor_generator),
            "torch_rng": _b64(self.torch_rng),
            "stores": self.stores,
            "cpls_val_ratio": self.cpls_val_ratio,
            "cpls_val_completion": self.cpls_val_completion,
            "history": [asdict(h) for h in self.history],
            "bc_history": self.bc_history,
            "best": best,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DriverState:
        """The state :meth:`to_json` wrote; ConfigError for another format."""
        if data.get("format") != FORMAT:
            raise ConfigError(f"driver state format {data.get('format')!r} is not {FORMAT}")
        best = data["best"]
        return cls(
            iteration=int(data["iteration"]),
            rng=data["rng"],
            pool_rng=data["pool_rng"],
            actor_generator=base64.b64decode(data["actor_generator"]),
            torch_rng=base64.b64decode(data["torch_rng"]),
            stores=data["stores"],
            cpls_val_ratio=float(data["cpls_val_ratio"]),
            cpls_val_completion=float(data["cpls_val_completion"]),
            history=[IterationLog(**h) for h in data["history"]],
            bc_history=data["bc_history"],
            best=None
            if best is None
            else (
                float(best["ratio"]),
                int(best["version"]),
                reward_pb2.PolicyUpdated.FromString(base64.b64decode(best["event"])),
            ),
        )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def capture(
    rng: np.random.Generator,
    pool_rng: np.random.Generator,
    actor_generator: torch.Generator,
    stores: list[AgentStats | None],
) -> dict[str, Any]:
    """The random streams and stores of a run, copied as they are now (the rest of a
    :class:`DriverState` is the run's iteration and figures)."""
    return {
        "rng": rng.bit_generator.state,
        "pool_rng": pool_rng.bit_generator.state,
        "actor_generator": bytes(actor_generator.get_state().numpy().tobytes()),
        "torch_rng": bytes(torch.get_rng_state().numpy().tobytes()),
        "stores": [s.to_dict() if s is not None else None for s in stores],
    }


def restore_streams(
    state: DriverState,
    rng: np.random.Generator,
    pool_rng: np.random.Generator,
    actor_generator: torch.Generator,
) -> None:
    """Put the random streams back where ``state`` left them."""
    rng.bit_generator.state = state.rng
    pool_rng.bit_generator.state = state.pool_rng
    actor_generator.set_state(_byte_tensor(state.actor_generator))
    torch.set_rng_state(_byte_tensor(state.torch_rng))


def _byte_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def restored_stores(state: DriverState) -> list[AgentStats | None]:
    """Each pool's statistics store as the run left it."""
    return [AgentStats.from_dict(s) if s is not None else None for s in state.stores]


def save(run_dir: Path, state: DriverState) -> None:
    """Write ``driver.json`` atomically (the previous one stays whole until the rename)."""
    atomic_write(run_dir / STATE_FILE, json.dumps(state.to_json()).encode())


def save_before(run_dir: Path, before: trajectory_pb2.Trajectory) -> None:
    """Keep the starting network's session for the report of a resumed run."""
    atomic_write(run_dir / BEFORE_FILE, before.SerializeToString())


def load(run_dir: Path) -> tuple[DriverState, trajectory_pb2.Trajectory]:
    """The driver's state and "before" session of ``run_dir``; ConfigError naming what is
    missing (a run that ended before its first version has nothing to resume)."""
    path = run_dir / STATE_FILE
    try:
        data = json.loads(path.read_text())
        before = trajectory_pb2.Trajectory.FromString((run_dir / BEFORE_FILE).read_bytes())
    except FileNotFoundError as exc:
        raise ConfigError(
            f"--resume {run_dir}: no {Path(exc.filename).name}: not a podium train run, or it "
            "stopped before its first version (start it again)"
        ) from None
    except (ValueError, OSError) as exc:
        raise ConfigError(f"--resume {run_dir}: unreadable {path.name}: {exc}") from None
    return DriverState.from_json(data), before


def start_iteration(state: DriverState, learner_version: int) -> int:
    """The iterations done when a run resumes: the driver's, or one more when the learner
    checkpointed an update the driver had not recorded; ConfigError when they cannot belong
    to one run."""
    if learner_version not in (state.iteration, state.iteration + 1):
        raise ConfigError(
            f"the learner's checkpoint is at version {learner_version} but the driver's at "
            f"iteration {state.iteration}: they are not one run's"
        )
    return learner_version


__all__ = [
    "BEFORE_FILE",
    "STATE_FILE",
    "DriverState",
    "capture",
    "load",
    "restore_streams",
    "restored_stores",
    "save",
    "save_before",
    "start_iteration",
]
