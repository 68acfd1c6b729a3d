"""The cold start's decision, read from the rollout registry (podium_app.bootstrap.decide): a new
version only when no learned version was ever live or proposed; nothing once the loop is past
its cold start; the rest of its own work after a retry; a version number above every version
on disk; ``podium rollout bootstrap``'s settings errors. The whole bootstrap runs as the
``bootstrap`` Job in tests/k8s/test_local_deployment.py (real broker, controller, V2 server)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from podium.policy.swarm import MODEL_NAME
from podium.v1 import rollout_pb2
from podium_app.bootstrap import REASON, decide, next_version, read_transitions
from podium_app.commands import rollout as rollout_cmd

K = rollout_pb2


def _t(
    seq: int,
    kind: int,
    *,
    live: str = "rules:cpls",
    candidate: str = "",
    reason: str = "",
    paused: bool = False,
    previous_candidate: str = "",
) -> rollout_pb2.RolloutTransition:
    stage = K.ROLLOUT_STAGE_OFFLINE_CHECK if candidate else K.ROLLOUT_STAGE_IDLE
    state = K.RolloutState(
        seq=seq, live_version=live, candidate_version=candidate, stage=stage, paused=paused
    )
    previous = K.RolloutState(candidate_version=previous_candidate)
    return K.RolloutTransition(seq=seq, kind=kind, state=state, previous=previous, reason=reason)  # type: ignore[arg-type]


CLAIMED = _t(1, K.TRANSITION_KIND_WRITER_CLAIMED)


def test_a_new_deployment_publishes() -> None:
    assert decide([]).action == "publish"
    assert decide([CLAIMED]).action == "publish"
    # A rule engine proposed is no learned version.
    greedy = _t(2, K.TRANSITION_KIND_CANDIDATE_PROPOSED, candidate="rules:greedy")
    assert decide([CLAIMED, greedy]).action == "publish"


def test_a_learned_version_live_or_proposed_by_anyone_else_means_nothing_to_do() -> None:
    live = decide([CLAIMED, _t(5, K.TRANSITION_KIND_OPERATOR_PROMOTED, live="3")])
    assert (live.action, live.version, live.live) == ("none", "3", True)
    by_controller = decide(
        [CLAIMED, _t(2, K.TRANSITION_KIND_CANDIDATE_PROPOSED, candidate="4", reason="cycle 1")]
    )
    assert (by_controller.action, by_controller.version, by_controller.live) == ("none", "4", False)
    # Then rejected: still nothing (the loop is past its cold start; an operator decides).
    rejected = decide(
        [
            CLAIMED,
            _t(2, K.TRANSITION_KIND_CANDIDATE_PROPOSED, candidate="4", reason="operator"),
            _t(3, K.TRANSITION_KIND_OFFLINE_FAILED, previous_candidate="4"),
        ]
    )
    assert rejected.action == "none"


def test_a_retried_bootstrap_finishes_its_own_work() -> None:
    paused = _t(2, K.TRANSITION_KIND_PAUSED, reason=REASON, paused=True)
    proposed = _t(
        3, K.TRANSITION_KIND_CANDIDATE_PROPOSED, candidate="1", reason=REASON, paused=True
    )
    retried = decide([CLAIMED, paused, proposed])
    assert (retried.action, retried.version, retried.live) == ("finish", "1", False)
    # Killed after the promotion, before resuming: resume, nothing else.
    promoted = _t(4, K.TRANSITION_KIND_OPERATOR_PROMOTED, live="1", reason=REASON, paused=True)
    assert decide([CLAIMED, paused, proposed, promoted]).action == "resume"
    # An operator's own pause is not the bootstrap's to lift.
    theirs = _t(5, K.TRANSITION_KIND_PAUSED, live="1", reason="incident 42", paused=True)
    assert decide([CLAIMED, paused, proposed, promoted, theirs]).action == "none"
    # Its own proposal rolled back by an operator: not re-imposed.
    rolled = _t(4, K.TRANSITION_KIND_ROLLED_BACK, reason="operator", previous_candidate="1")
    assert decide([CLAIMED, paused, proposed, rolled]).action == "none"


def test_transitions_are_read_from_the_registry_records_in_seq_order() -> None:
    from podium.bus.base import Record
    from podium.codec import encode_event

    def record(key: str, message: object, offset: int) -> Record:
        _, value = encode_event(message, producer="t")  # type: ignore[arg-type]
        return Record("podium.rollout.v1", 0, offset, key.encode(), value, {}, 0)

    late = _t(3, K.TRANSITION_KIND_PAUSED, reason=REASON)
    early = _t(2, K.TRANSITION_KIND_CANDIDATE_PROPOSED, candidate="7", reason="cycle 1")
    records = [
        record("transition:000000000003", late, 0),
        record("state", late.state, 1),
        record("transition:000000000002", early, 2),
    ]
    assert [t.seq for t in read_transitions(records)] == [2, 3]


def test_the_next_version_is_above_every_version_on_disk(tmp_path: Path) -> None:
    artifacts, repository = tmp_path / "a", tmp_path / "m"
    assert next_version(str(artifacts), str(repository)) == 1
    (artifacts / MODEL_NAME / "0").mkdir(parents=True)
    assert next_version(str(artifacts), "") == 1  # Triton's versions start at 1
    (repository / MODEL_NAME / "4").mkdir(parents=True)
    (artifacts / MODEL_NAME / "2").mkdir(parents=True)
    assert next_version(str(artifacts), str(repository)) == 5


def test_bootstrap_without_a_broker_setting_is_bad_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PODIUM_BUS", raising=False)
    parser = argparse.ArgumentParser()
    rollout_cmd.add_arguments(parser)
    args = parser.parse_args(["bootstrap", "--address", "127.0.0.1:9"])
    assert rollout_cmd.run(args) == rollout_cmd.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("podium rollout bootstrap: BootstrapSettings: PODIUM_BUS is required")


async def test_an_unreachable_broker_is_retried_until_the_deadline() -> None:
    """A Job starts beside a Kafka cluster still coming up: it waits for it (a connection
    refused is retriable), then fails naming the broker."""
    from podium.bus import KafkaBus, KafkaConfig
    from podium.errors import PodiumError
    from podium_app.bootstrap import start_bus

    said: list[str] = []
    with pytest.raises(PodiumError, match=r"127\.0\.0\.1:9"):
        await start_bus(KafkaBus(KafkaConfig.from_url("kafka://127.0.0.1:9")), 1.5, said.append)
    assert said and all("broker not reachable yet" in line for line in said)
