"""PolicyHolder: hot swap under concurrent decisions, and a bad version never replaces a good one."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from podium.errors import ArtifactError, ProcessingError
from podium.policy.artifacts import (
    WEIGHTS_FILE,
    ArtifactRef,
    policy_updated_event,
    publish_weights,
    sha256_file,
)
from podium.policy.holder import PolicyHolder, build_actor_critic
from podium.policy.signing import RefusedAnnouncement, SigningKey, TrustedKeys, key_id
from podium.rl.networks import ActorCritic
from podium.v1.reward_pb2 import PolicyUpdated

OBS = torch.linspace(-1.0, 1.0, 4 * 8).reshape(8, 4)
_KEY = Ed25519PrivateKey.generate()
SIGNER = SigningKey(key_id(_KEY.public_key()), _KEY)
"""The learner's key in these tests."""
TRUSTED = TrustedKeys.of(_KEY.public_key())


def _publish(root: Path, version: int) -> tuple[ArtifactRef, torch.Tensor]:
    """Version ``version`` with its own weights; returns the ref and its expected logits on OBS."""
    torch.manual_seed(version)
    model = ActorCritic(4, 3, (16, 16))
    ref = publish_weights(model.state_dict(), root, "orch", version, metadata=model.architecture())
    with torch.no_grad():
        return ref, model.logits(OBS)


def _decide(model: ActorCritic) -> torch.Tensor:
    with torch.no_grad():
        return model.logits(OBS)


def _holder() -> PolicyHolder[ActorCritic]:
    return PolicyHolder(build_actor_critic, TRUSTED)


def _event(ref: ArtifactRef, **changes: object) -> PolicyUpdated:
    """The learner's signed announcement of ``ref`` (``changes`` applied before signing)."""
    event = policy_updated_event(ref)
    for name, value in changes.items():
        setattr(event, name, value)
    return SIGNER.sign(event)


def test_no_version_yet_is_a_clear_error() -> None:
    with pytest.raises(ProcessingError, match="no policy version loaded"):
        _holder().current()


def test_tampered_version_rejected_previous_keeps_serving(tmp_path: Path) -> None:
    holder = _holder()
    v1, logits1 = _publish(tmp_path, 1)
    holder.load(v1.uri, 1, v1.sha256)
    v2, _ = _publish(tmp_path, 2)
    data = bytearray(v2.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    v2.path.write_bytes(bytes(data))

    with pytest.raises(ArtifactError, match=f"expected {v2.sha256}"):
        holder.load(v2.uri, 2, v2.sha256)
    version, logits = holder.decide(_decide)
    assert version == 1 and torch.equal(logits, logits1)
    assert holder.last_error is not None and str(v2.path) in str(holder.last_error)

    # The event path reports the rejection instead of raising, and still serves v1.
    assert asyncio.run(holder.on_policy_updated(_event(v2))) is False
    assert holder.version == 1
    # A good v3 afterwards is picked up.
    v3, logits3 = _publish(tmp_path, 3)
    assert asyncio.run(holder.on_policy_updated(_event(v3))) is True
    version, logits = holder.decide(_decide)
    assert version == 3 and torch.equal(logits, logits3)


def test_older_or_duplicate_versions_never_roll_back(tmp_path: Path) -> None:
    holder = _holder()
    v1, _ = _publish(tmp_path, 1)
    v2, _ = _publish(tmp_path, 2)
    holder.load(v2.uri, 2, v2.sha256)
    assert holder.load(v1.uri, 1, v1.sha256).version == 2
    assert holder.load(v2.uri, 2, v2.sha256).version == 2


def test_decision_in_flight_finishes_on_its_version(tmp_path: Path) -> None:
    holder = _holder()
    v1, logits1 = _publish(tmp_path, 1)
    v2, logits2 = _publish(tmp_path, 2)
    holder.load(v1.uri, 1, v1.sha256)
    started, release = threading.Event(), threading.Event()
    result: list[tuple[int, torch.Tensor]] = []

    def slow_decision(model: ActorCritic) -> torch.Tensor:
        started.set()
        assert release.wait(5.0)
        return _decide(model)

    worker = threading.Thread(target=lambda: result.append(holder.decide(slow_decision)))
    worker.start()
    assert started.wait(5.0)
    holder.load(v2.uri, 2, v2.sha256)  # swap while the decision is mid-way
    assert holder.version == 2
    release.set()
    worker.join(5.0)
    assert result[0][0] == 1 and torch.equal(result[0][1], logits1)
    version, logits = holder.decide(_decide)
    assert version == 2 and torch.equal(logits, logits2)


def test_hot_swap_under_concurrent_thread_decisions(tmp_path: Path) -> None:
    refs = {v: _publish(tmp_path, v) for v in range(1, 11)}
    holder = _holder()
    holder.load(refs[1][0].uri, 1, refs[1][0].sha256)
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[list[int]] = [[] for _ in range(4)]

    def decide_forever(k: int) -> None:
        try:
            while not stop.is_set():
                version, logits = holder.decide(_decide)
                # Every answer is exactly the answer of the version that produced it.
                assert torch.equal(logits, refs[version][1]), f"v{version} gave foreign logits"
                seen[k].append(version)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=decide_forever, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()

    def wait_until_all_decided_on(version: int) -> None:
        deadline = time.monotonic() + 10.0
        while not all(s and s[-1] == version for s in seen) and not errors:
            assert time.monotonic() < deadline, f"threads did not reach v{version}"
            time.sleep(0.001)

    wait_until_all_decided_on(1)
    for v in range(2, 11):
        # A corrupt announcement between good ones must not disturb anything.
        with pytest.raises(ArtifactError):
            holder.load(refs[v][0].uri, v, "0" * 64)
        holder.load(refs[v][0].uri, v, refs[v][0].sha256)
        wait_until_all_decided_on(v)
    stop.set()
    for t in threads:
        t.join(10.0)
    assert not errors, errors
    assert holder.version == 10
    for versions in seen:
        assert versions, "a decision thread made no decision"
        assert versions == sorted(versions)  # never served an older version after a newer one
        assert set(versions) == set(range(1, 11))  # every thread decided on every version


async def test_hot_swap_under_concurrent_async_decisions(tmp_path: Path) -> None:
    refs = {v: _publish(tmp_path, v) for v in range(1, 6)}
    holder = _holder()
    holder.load(refs[1][0].uri, 1, refs[1][0].sha256)
    done = asyncio.Event()
    counts: list[int] = [0] * 8

    async def decider(k: int) -> list[int]:
        versions = []
        while not done.is_set():
            version, logits = holder.decide(_decide)
            assert torch.equal(logits, refs[version][1])
            versions.append(version)
            counts[k] += 1
            await asyncio.sleep(0)
        return versions

    tasks = [asyncio.create_task(decider(k)) for k in range(8)]
    for v in range(2, 6):
        before = sum(counts)
        assert await holder.on_policy_updated(_event(refs[v][0]))
        assert sum(counts) > before or v == 2  # decisions kept flowing while it loaded
    done.set()
    results = await asyncio.gather(*tasks)  # any failed decision re-raises here
    assert holder.version == 5
    assert all(r == sorted(r) and r for r in results)
    assert (tmp_path / "orch" / "5" / WEIGHTS_FILE).exists()


async def test_the_announced_version_serves_no_decision_before_its_loader_resumes(
    tmp_path: Path,
) -> None:
    """The swap happens on the event loop, as the awaited load returns: whatever its caller does
    next (the orchestrator logs the version loaded, and ``podium bench pipeline`` times sessions
    from that line) comes before any decision on the new version. Swapped in the worker thread,
    the deciders below would see version 2 while the loader still waits to be resumed."""
    refs = {v: _publish(tmp_path, v) for v in (1, 2)}
    holder = _holder()
    holder.load(refs[1][0].uri, 1, refs[1][0].sha256)
    resumed = False
    early: list[int] = []
    done = asyncio.Event()

    async def decider() -> None:
        while not done.is_set():
            version, _ = holder.decide(_decide)
            if version == 2 and not resumed:
                early.append(version)
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(decider()) for _ in range(4)]
    assert await holder.on_policy_updated(_event(refs[2][0]))
    resumed = True
    await asyncio.sleep(0.01)
    done.set()
    await asyncio.gather(*tasks)
    assert holder.version == 2 and early == []


def test_build_verifies_without_serving(tmp_path: Path) -> None:
    ref, _ = _publish(tmp_path, 1)
    holder = _holder()
    built = holder.build(ref.uri, 1, ref.sha256)
    assert built is not None and built.version == 1 and holder.version is None
    holder.publish(built)
    assert holder.version == 1 and holder.build(ref.uri, 1, ref.sha256) is None


# -- the trust chain (issue 12): only signed, hashed, newer announcements are served ------------


def _refused(holder: PolicyHolder[ActorCritic], event: PolicyUpdated) -> str:
    """Apply ``event``; assert it was refused; the reason word (or the error's text)."""
    assert asyncio.run(holder.on_policy_updated(event)) is False
    err = holder.last_error
    assert err is not None
    return err.reason if isinstance(err, RefusedAnnouncement) else str(err)


def test_flipped_byte_with_rewritten_sidecar_is_refused(tmp_path: Path) -> None:
    holder = _holder()
    v1, logits1 = _publish(tmp_path, 1)
    assert asyncio.run(holder.on_policy_updated(_event(v1)))
    v2, _ = _publish(tmp_path, 2)
    genuine = _event(v2)
    data = bytearray(v2.path.read_bytes())
    data[len(data) // 2] ^= 0x01
    v2.path.write_bytes(bytes(data))
    digest = sha256_file(v2.path)
    v2.path.with_name(WEIGHTS_FILE + ".sha256").write_text(f"{digest}  {WEIGHTS_FILE}\n")

    unsigned = policy_updated_event(v2)
    unsigned.sha256 = digest  # agrees with the rewritten sidecar
    assert _refused(holder, unsigned) == "unsigned"
    assert "sha256 mismatch" in _refused(holder, genuine)
    version, logits = holder.decide(_decide)
    assert version == 1 and torch.equal(logits, logits1)


def test_empty_hash_is_refused_never_the_sidecar(tmp_path: Path) -> None:
    holder = _holder()
    v1, _ = _publish(tmp_path, 1)
    assert _refused(holder, _event(v1, sha256="")) == "hashless"
    with pytest.raises(ArtifactError, match="refusing to trust its sidecar"):
        holder.load(v1.uri, 1, "")
    assert holder.version is None


def test_forged_huge_version_is_refused_and_the_next_real_version_loads(tmp_path: Path) -> None:
    holder = _holder()
    v1, _ = _publish(tmp_path, 1)
    assert asyncio.run(holder.on_policy_updated(_event(v1)))
    forged = policy_updated_event(v1)
    forged.version = 2**62
    assert _refused(holder, forged) == "unsigned"
    moved = _event(v1)
    moved.version = 2**62
    assert _refused(holder, moved) == "bad-signature"
    other = Ed25519PrivateKey.generate()
    assert (
        _refused(holder, SigningKey(key_id(other.public_key()), other).sign(forged))
        == "untrusted-key"
    )
    v2, logits2 = _publish(tmp_path, 2)
    assert asyncio.run(holder.on_policy_updated(_event(v2)))
    version, logits = holder.decide(_decide)
    assert version == 2 and torch.equal(logits, logits2)


def test_old_or_duplicate_announcements_are_refused_out_of_sequence(tmp_path: Path) -> None:
    holder = _holder()
    v1, _ = _publish(tmp_path, 1)
    v2, _ = _publish(tmp_path, 2)
    assert asyncio.run(holder.on_policy_updated(_event(v2)))
    assert _refused(holder, _event(v1)) == "out-of-sequence"
    assert _refused(holder, _event(v2)) == "out-of-sequence"
    assert holder.version == 2


def test_a_holder_without_trusted_keys_serves_no_announcement(tmp_path: Path) -> None:
    v1, _ = _publish(tmp_path, 1)
    holder: PolicyHolder[ActorCritic] = PolicyHolder(build_actor_critic)
    assert _refused(holder, _event(v1)) == "no-trusted-keys"
    assert "podium keys generate" in str(holder.last_error)
