"""Learner checkpoints: weights, optimizer, schedule state, step and consumed offsets, together.

A checkpoint is two files in the checkpoint directory:

* ``state-<step>.safetensors``: every tensor (``model.*`` parameters, ``optim.<param>.<key>``
  Adam moments and step counters, ``rng.torch`` the minibatch-shuffling generator state);
* ``checkpoint.json``: everything else (format, step, policy version, schedule position,
  optimizer hyperparameters, consumed offsets per topic and partition, counters, the ledger of
  trained trajectory ids, the trajectory ids of the last updates that a restarted learner
  refuses to train on again, the lineage: the live version it last reset to, when, how many
  resets, and the last rollout transition applied) plus the name and sha256 of the tensor
  file.

No pickle anywhere. The tensor file is written first under a new name, then ``checkpoint.json``
is replaced atomically (temp file, fsync, :func:`os.replace`): that rename is the commit point.
A crash before it leaves the previous checkpoint intact; after it, the new one is complete.
Weights and offsets therefore always describe the same moment, which is what lets a restarted
learner skip exactly the records its weights already contain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

from podium.errors import ArtifactError
from podium.policy.artifacts import atomic_write, sha256_bytes

FORMAT = "podium.learner.checkpoint/1"
"""Value of the ``format`` field; loading refuses anything else."""
POINTER = "checkpoint.json"
"""Name of the JSON file whose atomic replacement commits a checkpoint."""


@dataclass(slots=True)
class LearnerState:
    """The non-tensor half of a checkpoint (JSON)."""

    step: int = 0
    """PPO updates done."""
    policy_version: int = 0
    """Latest policy version published (0: none yet)."""
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    """topic -> partition -> next offset to consume (every record below it is in the weights,
    was dropped as stale, or was dead-lettered)."""
    trained: int = 0
    """Scored trajectories trained on."""
    dropped_stale: int = 0
    """Scored trajectories dropped for exceeding the policy-lag bound."""
    dead_lettered: int = 0
    """Records that could not be used (malformed) and went to the dead-letter topic."""
    skipped_redelivered: int = 0
    """Redelivered records skipped because the weights already contain them."""
    skipped_off_policy: int = 0
    """Trajectories that are not on-policy samples of a learned version (rule-engine or argmax
    sessions): read, accounted for, never trained on."""
    ledger: list[str] = field(default_factory=list)
    """Trajectory ids trained on, in order (kept when the learner's ``keep_ledger`` is set)."""
    skipped_duplicate: int = 0
    """Records dropped because their trajectory id was already trained on (or already in the
    batch in hand): defence in depth against duplicates upstream (a re-scored trajectory)."""
    recent_trained: list[list[str]] = field(default_factory=list)
    """Trajectory ids of the last updates, one list per update, oldest first, at most the
    loop's ``dedupe_updates`` of them: what a restarted learner still recognises as trained.
    Bounded, unlike :attr:`ledger`, and kept whether or not the ledger is."""
    rollout_seq: int = 0
    """Seq of the last rollout transition (``podium.rollout.v1``) the learner has applied; a
    restarted learner reads the rollout topic from its beginning and skips every transition
    up to here, so a reset is neither redone nor missed."""
    reset_from: int = -1
    """The learned version whose weights the learner last reset to (the live version after
    its candidate was rejected or rolled back); -1: never reset."""
    reset_at: int = -1
    """:attr:`policy_version` when it reset: versions above it descend from
    :attr:`reset_from`; -1: never reset (every version from 0 is in the lineage)."""
    resets: int = 0
    """Resets to the live version so far."""

    def remember_update(self, ids: list[str], keep: int) -> None:
        """Record the trajectory ids of one update, forgetting updates older than the last
        ``keep`` (the memory of trained ids stays bounded)."""
        self.recent_trained.append(list(ids))
        del self.recent_trained[: max(len(self.recent_trained) - keep, 0)]

    def trained_ids(self) -> set[str]:
        """The trajectory ids of the remembered updates (:attr:`recent_trained`)."""
        return {tid for update in self.recent_trained for tid in update}

    def next_offset(self, topic: str, partition: int) -> int:
        """First offset not yet accounted for in ``topic``/``partition`` (0 if none)."""
        return self.offsets.get(topic, {}).get(partition, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "policy_version": self.policy_version,
            # JSON keys are strings; partitions are turned back into ints on load.
            "offsets": {t: {str(p): o for p, o in ps.items()} for t, ps in self.offsets.items()},
            "trained": self.trained,
            "dropped_stale": self.dropped_stale,
            "dead_lettered": self.dead_lettered,
            "skipped_redelivered": self.skipped_redelivered,
            "skipped_off_policy": self.skipped_off_policy,
            "ledger": list(self.ledger),
            "skipped_duplicate": self.skipped_duplicate,
            "recent_trained": [list(ids) for ids in self.recent_trained],
            "rollout_seq": self.rollout_seq,
            "reset_from": self.reset_from,
            "reset_at": self.reset_at,
            "resets": self.resets,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LearnerState:
        return cls(
            step=int(data["step"]),
            policy_version=int(data["policy_version"]),
            offsets={
                str(t): {int(p): int(o) for p, o in ps.items()} for t, ps in data["offsets"].items()
            },
            trained=int(data["trained"]),
            dropped_stale=int(data["dropped_stale"]),
            dead_lettered=int(data["dead_lettered"]),
            skipped_redelivered=int(data["skipped_redelivered"]),
            # Absent in checkpoints written before the swarm learner existed.
            skipped_off_policy=int(data.get("skipped_off_policy", 0)),
            ledger=[str(i) for i in data["ledger"]],
            skipped_duplicate=int(data.get("skipped_duplicate", 0)),
            recent_trained=_recent_trained(data),
            # Absent in checkpoints written before the learner followed the rollout.
            rollout_seq=int(data.get("rollout_seq", 0)),
            reset_from=int(data.get("reset_from", -1)),
            reset_at=int(data.get("reset_at", -1)),
            resets=int(data.get("resets", 0)),
        )


def _recent_trained(data: dict[str, Any]) -> list[list[str]]:
    """``recent_trained`` of a checkpoint's state; a checkpoint written before it existed
    gives its ledger as one update, so the restarted learner still knows what it trained."""
    if "recent_trained" in data:
        return [[str(i) for i in ids] for ids in data["recent_trained"]]
    ledger = [str(i) for i in data["ledger"]]
    return [ledger] if ledger else []


@dataclass(slots=True)
class Checkpoint:
    """A loaded checkpoint, ready to restore."""

    state: LearnerState
    """Counters, offsets and ledger."""
    model: dict[str, Tensor]
    """Model state dict."""
    optimizer: dict[str, Any]
    """Optimizer state dict (torch format, tensors restored)."""
    rng_state: Tensor
    """State of the minibatch-shuffling generator."""
    path: Path
    """The ``checkpoint.json`` it was read from."""


def _optimizer_to_parts(opt_state: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for param_id, entry in opt_state["state"].items():
        for key, value in entry.items():
            if isinstance(value, Tensor):
                tensors[f"optim.{param_id}.{key}"] = value.detach().cpu().contiguous().clone()
            else:
                scalars.setdefault(str(param_id), {})[key] = value
    groups = []
    for g in opt_state["param_groups"]:
        groups.append({k: list(v) if isinstance(v, tuple) else v for k, v in g.items()})
    return tensors, {"param_groups": groups, "scalars": scalars}


def _optimizer_from_parts(tensors: dict[str, Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if not name.startswith("optim."):
            continue
        _, param_id, key = name.split(".", 2)
        state.setdefault(int(param_id), {})[key] = value
    for param_id, entry in meta["scalars"].items():
        state.setdefault(int(param_id), {}).update(entry)
    groups = []
    for g in meta["param_groups"]:
        # Adam's betas must be a tuple again; lists elsewhere (params) stay lists.
        groups.append({k: tuple(v) if k == "betas" else v for k, v in g.items()})
    return {"state": state, "param_groups": groups}


def save_checkpoint(
    directory: str | Path,
    state: LearnerState,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    *,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint atomically; returns the path of ``checkpoint.json``.

    ``extra`` is stored as-is in the JSON (e.g. the learner's settings, for humans).
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    opt_tensors, opt_meta = _optimizer_to_parts(optimizer.state_dict())
    tensors = {
        f"model.{k}": v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()
    }
    tensors.update(opt_tensors)
    tensors["rng.torch"] = generator.get_state().clone()
    data = st_save(tensors)
    tensor_file = f"state-{state.step:09d}.safetensors"
    atomic_write(root / tensor_file, data)
    doc = {
        "format": FORMAT,
        "tensors_file": tensor_file,
        "tensors_sha256": sha256_bytes(data),
        "optimizer": opt_meta,
        "state": state.to_json(),
        "extra": extra or {},
    }
    pointer = root / POINTER
    atomic_write(pointer, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
    # Older tensor files are unreachable now; a crash before this cleanup only wastes disk.
    for old in root.glob("state-*.safetensors"):
        if old.name != tensor_file:
            old.unlink(missing_ok=True)
    return pointer


def load_checkpoint(directory: str | Path) -> Checkpoint | None:
    """The latest checkpoint in ``directory``, or None when there is none yet.

    Raises :class:`ArtifactError` naming the file when it is unreadable, of another format,
    or when the tensor file's sha256 differs from the one recorded.
    """
    pointer = Path(directory) / POINTER
    if not pointer.exists():
        return None
    try:
        doc = json.loads(pointer.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{pointer}: unreadable checkpoint ({exc})") from None
    if doc.get("format") != FORMAT:
        raise ArtifactError(f"{pointer}: format {doc.get('format')!r}, expected {FORMAT!r}")
    tensor_path = pointer.parent / str(doc["tensors_file"])
    try:
        data = tensor_path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read {tensor_path}: {exc.strerror or exc}") from None
    actual = sha256_bytes(data)
    if actual != doc["tensors_sha256"]:
        raise ArtifactError(
            f"{tensor_path}: sha256 mismatch, expected {doc['tensors_sha256']}, actual {actual}"
        )
    tensors = st_load(data)
    model = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    try:
        state = LearnerState.from_json(doc["state"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{pointer}: malformed state ({exc!r})") from None
    return Checkpoint(
        state=state,
        model=model,
        optimizer=_optimizer_from_parts(tensors, doc["optimizer"]),
        rng_state=tensors["rng.torch"],
        path=pointer,
    )
