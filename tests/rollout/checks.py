"""What the rollout suite checks after a scenario, on the log read back from the broker
(tests/faults/audit.py's :func:`read_all`: every topic, read_committed).

* :func:`rollout_log`: the rollout topic in order: the transitions (each with the state it
  produced) and the checkpoints, as the one writer wrote them;
* :func:`arm_audit`: every trajectory records an arm; the version that decided is the arm's;
  and the arm is exactly what :func:`podium.rollout.route` gives for its session id under the
  state of the seq it records: what *every* replica that applied that state would choose, so
  two replicas agree on every session's arm;
* :func:`walk_audit`: one writer's history: seqs strictly increasing, no step taken twice
  (two STAGE_ADVANCED from the same stage of a rollout, two PROMOTED of one rollout);
* :func:`replica_propagation`: from the replicas' own logs, when each applied each state
  (its "rollout state seq N" line) minus the state's ``changed_at``.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from audit import Log

from podium import codec, topics
from podium.rollout import route
from podium.v1 import rollout_pb2, trajectory_pb2

STAGED = rollout_pb2.ROLLOUT_STAGE_STAGED
R = trajectory_pb2.ArmRole


@dataclass
class RolloutLog:
    """The rollout topic as written, in offset order."""

    transitions: list[rollout_pb2.RolloutTransition] = field(default_factory=list)
    checkpoints: list[rollout_pb2.ControllerCheckpoint] = field(default_factory=list)
    states: dict[int, rollout_pb2.RolloutState] = field(default_factory=dict)
    """Seq -> state (from the transitions, which carry every state; the ``state`` key itself
    is compacted to the last one)."""

    def kinds(self) -> list[str]:
        return [kind_name(t.kind) for t in self.transitions]

    def of_kind(self, name: str) -> list[rollout_pb2.RolloutTransition]:
        want = rollout_pb2.TransitionKind.Value(f"TRANSITION_KIND_{name}")
        return [t for t in self.transitions if t.kind == want]


def kind_name(value: int) -> str:
    return rollout_pb2.TransitionKind.Name(value).removeprefix("TRANSITION_KIND_")


def rollout_log(log: Log) -> RolloutLog:
    """The rollout topic of ``log``."""
    out = RolloutLog()
    for envelope in log.envelopes.get(topics.ROLLOUT, []):
        msg = codec.unpack(envelope)
        if isinstance(msg, rollout_pb2.RolloutTransition):
            out.transitions.append(msg)
            out.states.setdefault(msg.seq, msg.state)
        elif isinstance(msg, rollout_pb2.ControllerCheckpoint):
            out.checkpoints.append(msg)
        elif isinstance(msg, rollout_pb2.RolloutState):
            out.states.setdefault(msg.seq, msg)
    return out


def trajectories(log: Log, wanted: set[str]) -> dict[str, trajectory_pb2.Trajectory]:
    """The (first) trajectory of each wanted session."""
    out: dict[str, trajectory_pb2.Trajectory] = {}
    for envelope in log.envelopes.get(topics.TRAJECTORIES, []):
        traj = codec.unpack(envelope)
        if isinstance(traj, trajectory_pb2.Trajectory) and traj.session_id in wanted:
            out.setdefault(traj.session_id, traj)
    return out


@dataclass(frozen=True)
class ArmAudit:
    """Per-session arm checks (all must be 0 but ``sessions`` and ``by_arm``)."""

    sessions: int
    no_arm: int
    """Trajectories without an arm (role unspecified)."""
    other_version: int
    """Trajectories whose ``policy_version`` is not their arm's version."""
    misrouted: int
    """Arms that differ from :func:`route` under the state of their seq (a replica routed
    otherwise than every other would, or fell back to a version it had not loaded)."""
    unknown_seq: int
    """Arms naming a seq the rollout topic has no state for."""
    by_arm: dict[str, int]
    """``role:version`` -> sessions."""
    examples: list[str]


def arm_audit(
    trajs: Mapping[str, trajectory_pb2.Trajectory], states: Mapping[int, rollout_pb2.RolloutState]
) -> ArmAudit:
    """Check every trajectory's arm (see the module docstring)."""
    no_arm = other = misrouted = unknown = 0
    by_arm: Counter[str] = Counter()
    examples: list[str] = []
    for sid, traj in trajs.items():
        arm = traj.arm
        by_arm[f"{R.Name(arm.role).removeprefix('ARM_ROLE_').lower()}:{arm.policy_version}"] += 1
        if arm.role == R.ARM_ROLE_UNSPECIFIED:
            no_arm += 1
            examples.append(f"{sid}: no arm")
            continue
        if traj.policy_version != arm.policy_version:
            other += 1
            examples.append(f"{sid}: arm {arm.policy_version}, decided by {traj.policy_version}")
        state = states.get(arm.rollout_seq) if arm.rollout_seq else None
        if arm.rollout_seq and state is None:
            unknown += 1
            continue
        expected = route(sid, state).arm()
        if expected != arm:
            misrouted += 1
            examples.append(f"{sid}: arm {arm} but route says {expected}")
    return ArmAudit(len(trajs), no_arm, other, misrouted, unknown, dict(by_arm), examples[:5])


@dataclass(frozen=True)
class WalkAudit:
    """The writer's history (all must be 0/True but the counts)."""

    transitions: int
    seq_not_increasing: int
    """Transitions whose seq is not one more than the previous transition's."""
    repeated_steps: list[str]
    """Steps taken twice: STAGE_ADVANCED from one stage of one rollout, PROMOTED of one
    rollout, SHADOW_PASSED of one rollout."""
    epochs: list[int]
    """Writer epochs in order of their claims (WRITER_CLAIMED)."""


def _step_key(t: rollout_pb2.RolloutTransition) -> str | None:
    """What makes a step unique: the rollout it belongs to and the stage it left."""
    name = kind_name(t.kind)
    if name in ("STAGE_ADVANCED", "OPERATOR_PROMOTED"):
        return f"advance {t.previous.rollout_id} from {stage_label(t.previous)}"
    if name in ("PROMOTED", "SHADOW_PASSED", "OFFLINE_PASSED", "ROLLED_BACK"):
        return f"{name} {t.previous.rollout_id}"
    return None


def walk_audit(rlog: RolloutLog) -> WalkAudit:
    seqs = [t.seq for t in rlog.transitions]
    bad = sum(1 for a, b in itertools.pairwise(seqs) if b != a + 1)
    keys = Counter(k for t in rlog.transitions if (k := _step_key(t)) is not None)
    repeated = [f"{k} x{n}" for k, n in keys.items() if n > 1]
    epochs = [t.state.writer_epoch for t in rlog.of_kind("WRITER_CLAIMED")]
    return WalkAudit(len(seqs), bad, repeated, epochs)


def stage_label(state: rollout_pb2.RolloutState) -> str:
    """``idle``, ``offline_check``, ``shadow``, ``staged 5%``."""
    name = rollout_pb2.RolloutStage.Name(state.stage).removeprefix("ROLLOUT_STAGE_").lower()
    return f"staged {state.canary_percent}%" if state.stage == STAGED else name


_APPLIED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO orchestrator_svc\.arms: rollout state seq (\d+):"
)


def replica_applied(log_text: str) -> dict[int, float]:
    """Seq -> when (unix seconds) a replica's log says it applied that state."""
    out: dict[int, float] = {}
    for line in log_text.splitlines():
        m = _APPLIED.match(line)
        if m:
            when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.setdefault(int(m.group(2)), when)
    return out


def replica_propagation(
    logs: Mapping[str, str], states: Mapping[int, rollout_pb2.RolloutState], since: float
) -> tuple[list[float], int]:
    """Per state change after ``since`` (unix seconds: the replicas were up): milliseconds
    from its ``changed_at`` until the *last* replica applied it (every replica routes by it
    from then on); and how many changes some replica never logged."""
    applied = {name: replica_applied(text) for name, text in logs.items()}
    delays: list[float] = []
    missing = 0
    for seq, state in sorted(states.items()):
        if state.changed_at.ToMilliseconds() / 1000.0 < since:
            continue
        times = [a[seq] for a in applied.values() if seq in a]
        if not times:
            continue
        if len(times) < len(applied):
            # A state superseded before a replica read it is skipped there (routing jumps to
            # the newer one); count it apart, do not call it a delay.
            missing += 1
            continue
        delays.append((max(times) - state.changed_at.ToMilliseconds() / 1000.0) * 1000.0)
    return delays, missing


def shares(trajs: Sequence[trajectory_pb2.Trajectory]) -> dict[int, float]:
    """Observed share of sessions per role."""
    counts = Counter(t.arm.role for t in trajs)
    total = sum(counts.values()) or 1
    return {role: n / total for role, n in counts.items()}
