"""The cold start of a deployment, written once: ``podium rollout bootstrap`` (the Kubernetes
Job ``bootstrap``, k8s/base/bootstrap.yaml), ``podium deploy local`` and ``podium bench cycle``
all run it.

Why a deployment needs one: the learner trains only on sessions a learned version sampled,
the rollout serves ``rules:cpls`` until a learned version is live, and a behaviour clone of
cpls ties cpls, so shadow never promotes it. Hence, with no human step:

1. **Whether** (:func:`decide`, pure, on the rollout registry read whole, :func:`read_registry`):
   nothing when a learned version is live (a pause the bootstrap left behind is resumed) or a
   learned version was ever proposed by anyone else (the loop is past its cold start); the
   rest of its own work when the bootstrap proposed a version before (a Job killed halfway and
   retried); else a new version.
2. **Published** (:func:`publish_initial`): the initial policy (a behaviour clone of cpls made
   by ``podium train`` with no PPO iteration, :func:`behaviour_clone`, or a given file) written
   by the learner's own code and settings (``SwarmPPO.publish``: safetensors + sha256 under the
   artifacts root, ONNX into the model repository, signed with the learner's key) as version
   ``B``, one above every version in the artifacts root and the model repository
   (:func:`next_version`), and announced on the policy topic.
3. **Made live** (:func:`make_live`): the operator override through RolloutService, each step
   recorded on the registry with :data:`REASON`: pause, propose ``B`` (retried until the
   controller has read its announcement), promote until live, resume.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from podium import codec, topics
from podium.bus.base import Bus, Record
from podium.bus.consumer import EventPublisher, is_retriable
from podium.bus.read import read_committed
from podium.config import env, parse_bus_url, positive_float
from podium.errors import DecodeError, PodiumError
from podium.policy.signing import announcement_event_id
from podium.policy.swarm import MODEL_NAME
from podium.policy.versions import is_version_number
from podium.v1 import reward_pb2, rollout_pb2, rollout_pb2_grpc

Say = Callable[[str], None]

REASON = "cold start: the initial policy made live by podium rollout bootstrap"
"""The reason of every transition the bootstrap causes: how :func:`decide` tells its own work
from an operator's or the controller's."""

IDLE = rollout_pb2.ROLLOUT_STAGE_IDLE
PROPOSED = rollout_pb2.TRANSITION_KIND_CANDIDATE_PROPOSED
PAUSES = (rollout_pb2.TRANSITION_KIND_PAUSED, rollout_pb2.TRANSITION_KIND_RESUMED)
REJECTIONS = (
    rollout_pb2.TRANSITION_KIND_OFFLINE_FAILED,
    rollout_pb2.TRANSITION_KIND_SHADOW_FAILED,
    rollout_pb2.TRANSITION_KIND_ROLLED_BACK,
)
TRANSITION_PREFIX = "transition:"
"""Key prefix of the registry's transitions (learner_svc/rollout/evidence.py)."""


@dataclass(frozen=True, slots=True)
class BootstrapSettings:
    """The bootstrap's own settings (the Job's env; flags of ``podium rollout bootstrap``
    override them). The learner's settings (artifacts, model repository, signing key, pool)
    are ``learner_svc``'s ``SwarmSettings``, read from the same env."""

    bus: str = env("PODIUM_BUS", parse=parse_bus_url)
    """The broker (``kafka://...``, as the learner's principal: it reads the rollout registry
    and announces on the policy topic)."""
    init: str = env("PODIUM_BOOTSTRAP_INIT", default="")
    """A swarm policy file (safetensors) to publish as the initial version; empty = a behaviour
    clone of cpls made here (``podium train`` with no PPO iteration, about 15 s on a CPU)."""
    work_dir: str = env("PODIUM_BOOTSTRAP_WORK_DIR", default="/tmp/podium-bootstrap")
    """Where the behaviour clone is trained (scratch: an emptyDir in the Job)."""
    timeout_s: float = env("PODIUM_BOOTSTRAP_TIMEOUT_S", default=600.0, parse=positive_float)
    """How long to wait for the broker (reachable) and the rollout controller (up, then the
    version read and live)."""
    seed: int = env("PODIUM_BOOTSTRAP_SEED", default=0)
    """Seed of the behaviour clone's tasks and network."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`decide` concluded."""

    action: str
    """``publish`` (a new version), ``finish`` (make ``version`` live: the bootstrap proposed
    it before), ``resume`` (``version`` is live; the bootstrap's pause is left), ``none``."""
    version: str
    """The version it concerns (empty for ``publish``: not numbered yet)."""
    why: str
    live: bool = False
    """Whether ``version`` is live already."""


def read_transitions(records: Sequence[Record]) -> list[rollout_pb2.RolloutTransition]:
    """Every transition of the registry's records, in seq order (unreadable ones skipped:
    the controller logs them)."""
    out: dict[int, rollout_pb2.RolloutTransition] = {}
    for record in records:
        if not (record.key or b"").startswith(TRANSITION_PREFIX.encode()):
            continue
        try:
            t = codec.decode_event(record.value, rollout_pb2.RolloutTransition)[1]
        except DecodeError:
            continue
        out[t.seq] = t
    return [out[s] for s in sorted(out)]


async def read_registry(
    bus: Bus, topic: str = topics.ROLLOUT
) -> list[rollout_pb2.RolloutTransition]:
    """The registry's transitions as committed now (no consumer group)."""
    return read_transitions(await read_committed(bus, topic))


def decide(transitions: Sequence[rollout_pb2.RolloutTransition]) -> Decision:
    """What the bootstrap does on a registry of ``transitions`` (module docstring, step 1)."""
    state = transitions[-1].state if transitions else rollout_pb2.RolloutState()
    live = state.live_version
    if is_version_number(live):
        pauses = [t for t in transitions if t.kind in PAUSES]
        ours = state.paused and bool(pauses) and pauses[-1].reason == REASON
        why = f"learned version {live} is live"
        return Decision("resume" if ours else "none", live, why, live=True)
    proposed = [t for t in transitions if t.kind == PROPOSED]
    learned = [t for t in proposed if is_version_number(t.state.candidate_version)]
    others = [t.state.candidate_version for t in learned if t.reason != REASON]
    if others:
        return Decision(
            "none", others[-1], f"learned version {others[-1]} was proposed: past the cold start"
        )
    if learned:
        mine = learned[-1]
        version = mine.state.candidate_version
        if any(t.seq > mine.seq and t.kind in REJECTIONS for t in transitions):
            return Decision("none", version, f"version {version} was rejected after its proposal")
        return Decision("finish", version, f"version {version} was proposed by a bootstrap")
    return Decision("publish", "", "no learned version was ever live or proposed")


def _versions(root: str) -> list[int]:
    model = Path(root) / MODEL_NAME if root else None
    if model is None or not model.is_dir():
        return []
    return [int(p.name) for p in model.iterdir() if p.name.isdigit()]


def next_version(artifacts_dir: str, model_repository: str = "") -> int:
    """One above every version in the artifacts root and the model repository (at least 1:
    Triton's versions start at 1)."""
    return max([0, *_versions(artifacts_dir), *_versions(model_repository)]) + 1


def behaviour_clone(work_dir: Path, seed: int, say: Say, pool: Path | None = None) -> Path:
    """A behaviour clone of cpls: ``podium train`` with no PPO iteration on small tasks of
    every kind (its ``best_checkpoint``), for ``pool`` (a pool spec file; None = the shipped
    default)."""
    from podium_app.train.config import TrainConfig
    from podium_app.train.job import train

    run_dir = work_dir / "init"
    shutil.rmtree(run_dir, ignore_errors=True)
    say("behaviour-cloning cpls (podium train, 0 PPO iterations)")
    config = TrainConfig(
        run_dir=run_dir,
        seed=seed,
        pool=pool,
        suite_size=60,
        sizes=(5, 10),
        test_suite_size=6,
        test_sizes=(5, 10),
        curriculum=(10,),
        bc_demos_per_task=2,
        iterations=0,
        num_envs=8,
        validation_seeds=1,
        test_episodes=1,
    )
    return asyncio.run(train(config)).best_checkpoint


def publish_initial(learner: Any, init: Path, version: int) -> reward_pb2.PolicyUpdated:
    """``init`` written as ``version`` by the learner's own code (``learner``: its
    ``SwarmSettings``): weights, ONNX export when a model repository is set, signature."""
    from learner_svc.algorithms.swarm import SwarmPPO

    settings = dataclasses.replace(learner, init=str(init))
    return SwarmPPO.from_settings(settings).publish(version, 0, {"bootstrap": 1.0})


async def announce(
    bus: Bus, event: reward_pb2.PolicyUpdated, topic: str = topics.POLICY_UPDATES
) -> None:
    """``event`` on the policy topic, with the event id the learner gives it."""
    await EventPublisher(bus, producer_name="podium-bootstrap").publish(
        topic, event, key=MODEL_NAME, event_id=announcement_event_id(event)
    )


async def start_bus(bus: Bus, timeout_s: float, say: Say) -> None:
    """Start ``bus``, retrying while the broker is not reachable yet (a Job starts beside a
    Kafka cluster still coming up); a refusal that retrying cannot cure (credentials, ACLs)
    is raised at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await bus.start()
            return
        except Exception as exc:
            if not is_retriable(exc) or time.monotonic() > deadline:
                raise
            say(f"broker not reachable yet ({exc}); retrying")
            await asyncio.sleep(2.0)


async def _retry(call: Callable[[], Awaitable[Any]], deadline: float) -> Any:
    """``call()`` until it does not fail with UNAVAILABLE (a controller still starting, or not
    yet the registry's writer)."""
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def make_live(channel: grpc.aio.Channel, version: str, timeout_s: float) -> None:
    """The operator's override on ``channel`` (RolloutService, operator role): pause, propose
    ``version`` until the controller has read it, promote until it is live, resume."""
    stub = rollout_pb2_grpc.RolloutServiceStub(channel)  # type: ignore[no-untyped-call]
    command = rollout_pb2.RolloutCommand
    deadline = time.monotonic() + timeout_s
    pause = rollout_pb2.PauseRequest(command=command(reason=REASON))
    await _retry(lambda: stub.Pause(pause, timeout=10), deadline)
    while True:
        state = (await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=10)).state
        if state.live_version == version and state.stage == IDLE:
            break
        if time.monotonic() > deadline:
            raise PodiumError(f"version {version} could not be made live; state: {state}")
        try:
            if state.stage == IDLE:
                propose = rollout_pb2.ProposeRequest(version=version, reason=REASON)
                await stub.Propose(propose, timeout=10)
            else:
                cmd = command(reason=REASON, rollout_id=state.rollout_id)
                await stub.Promote(rollout_pb2.PromoteRequest(command=cmd), timeout=10)
        except grpc.aio.AioRpcError:
            pass  # the announcement not read yet / a stage moved under us: look again
        await asyncio.sleep(0.5)
    await resume(channel, deadline)


async def resume(channel: grpc.aio.Channel, deadline: float) -> None:
    """Resume automatic transitions (the bootstrap's pause ends)."""
    stub = rollout_pb2_grpc.RolloutServiceStub(channel)  # type: ignore[no-untyped-call]
    request = rollout_pb2.ResumeRequest(command=rollout_pb2.RolloutCommand(reason=REASON))
    await _retry(lambda: stub.Resume(request, timeout=10), deadline)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What :func:`bootstrap` did."""

    decision: Decision
    version: str
    """The learned version live at the end (empty when nothing was done and none is)."""


async def bootstrap(
    bus: Bus,
    channel: grpc.aio.Channel,
    learner: Any,
    make_init: Callable[[], Path],
    timeout_s: float,
    say: Say,
    policy_topic: str = topics.POLICY_UPDATES,
) -> Outcome:
    """The three steps of the module docstring. ``bus`` is started; ``learner`` the learner's
    ``SwarmSettings``; ``make_init`` gives the initial policy file (called only if a version
    is to be published)."""
    decision = decide(await read_registry(bus))
    say(f"registry: {decision.why}")
    deadline = time.monotonic() + timeout_s
    if decision.action == "none":
        return Outcome(decision, decision.version if decision.live else "")
    if decision.action == "resume":
        await resume(channel, deadline)
        say("resumed the rollout the bootstrap paused")
        return Outcome(decision, decision.version)
    version = decision.version
    if decision.action == "publish":
        init = await asyncio.to_thread(make_init)
        number = next_version(learner.artifacts_dir, learner.model_repository)
        event = await asyncio.to_thread(publish_initial, learner, init, number)
        await announce(bus, event, policy_topic)
        version = str(number)
        say(f"published and announced version {version} ({event.uri})")
    await make_live(channel, version, max(deadline - time.monotonic(), 1.0))
    say(f"version {version} made live through RolloutService")
    return Outcome(decision, version)


__all__ = [
    "REASON",
    "BootstrapSettings",
    "Decision",
    "Outcome",
    "announce",
    "behaviour_clone",
    "bootstrap",
    "decide",
    "make_live",
    "next_version",
    "publish_initial",
    "read_registry",
    "read_transitions",
    "resume",
    "start_bus",
]
