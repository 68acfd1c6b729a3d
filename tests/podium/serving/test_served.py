"""Against a real KServe-V2 server (MLServer + the onnxruntime adapter on CPU), with tritonclient.

Each test exports into the server's model repository under a model name of its own, loads it
through the repository API (``RepositoryModelLoad``), and calls it over gRPC on loopback.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from serving_helpers import SIGNATURE, make_policy

from podium.errors import ArtifactError, ProcessingError
from podium.serving.backends import LocalPolicy, ServedPolicy, ServingConfig, make_policy_backend
from podium.serving.contract import PolicyInputs, random_inputs, stack_padded, unstack_padded
from podium.serving.export import export_policy
from podium.v1.reward_pb2 import PolicyUpdated

pytestmark = pytest.mark.serving


def _served(v2_grpc: str, model_name: str) -> ServedPolicy:
    return ServedPolicy(v2_grpc, model_name, SIGNATURE, timeout_s=10.0)


@pytest.mark.parametrize(("n_subtasks", "n_agents"), [(1, 9), (7, 4), (30, 9), (100, 13)])
def test_served_logits_equal_local_torch(
    v2_grpc: str, v2_repository: Path, model_name: str, n_subtasks: int, n_agents: int
) -> None:
    """One export serves any task size on any pool size (4 and 13 agents: not the 9 of the
    training pool) with the logits local torch computes."""
    net = make_policy(seed=n_subtasks)
    export_policy(net, SIGNATURE, v2_repository, model_name, 1)
    served = _served(v2_grpc, model_name)
    try:
        assert served.load(version=1) == "1"
        assert served.model_ready()
        local = LocalPolicy(net, SIGNATURE)
        rng = np.random.default_rng(100 + n_subtasks)
        for batch in (1, 8):
            obs = random_inputs(SIGNATURE, batch, n_subtasks, rng, n_agents=n_agents)
            got, want = served.decide(obs), local.decide(obs)
            assert got.version == "1"
            assert got.logits.shape == (batch, SIGNATURE.n_actions(n_subtasks, n_agents))
            assert got.value.shape == (batch,)
            np.testing.assert_allclose(got.logits, want.logits, atol=1e-4, rtol=0)
            np.testing.assert_allclose(got.value, want.value, atol=1e-4, rtol=0)
            # Masked actions stay masked, valid ones keep ordinary magnitudes.
            assert (got.logits[~obs.action_mask] < -1e8).all()
            assert np.array_equal(got.logits.argmax(axis=1), want.logits.argmax(axis=1)), (
                "served and local policies pick different greedy actions"
            )
    finally:
        served.close()


def test_new_version_hot_swaps_under_load_without_failures(
    v2_grpc: str, v2_repository: Path, model_name: str
) -> None:
    """Clients decide continuously while PolicyUpdated makes version 2 go live."""
    v1, v2 = make_policy(seed=11), make_policy(seed=12)
    export_policy(v1, SIGNATURE, v2_repository, model_name, 1)
    control = _served(v2_grpc, model_name)
    assert control.load(version=1) == "1"
    obs = random_inputs(SIGNATURE, 2, 9, np.random.default_rng(5))
    expected = {
        "1": LocalPolicy(v1, SIGNATURE).decide(obs).logits,
        "2": LocalPolicy(v2, SIGNATURE).decide(obs).logits,
    }
    assert np.abs(expected["1"] - expected["2"]).max() > 1e-3  # the swap is observable

    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[list[str]] = [[] for _ in range(3)]

    # Threads 0 and 1 share one client (one gRPC channel, as the orchestrator's sessions do);
    # thread 2 has its own.
    shared = _served(v2_grpc, model_name)

    def client_loop(i: int) -> None:
        served = shared if i < 2 else _served(v2_grpc, model_name)
        try:
            while not stop.is_set():
                out = served.decide(obs)
                # Every answer is exactly one version's answer, never a mix or garbage.
                np.testing.assert_allclose(out.logits, expected[out.version], atol=1e-4, rtol=0)
                seen[i].append(out.version)
        except BaseException as exc:
            errors.append(exc)
        finally:
            if served is not shared:
                served.close()

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        export_policy(v2, SIGNATURE, v2_repository, model_name, 2)
        event = PolicyUpdated(model_name=model_name, version=2, uri="", sha256="")
        assert control.on_policy_updated(event) == "2"
        assert control.on_policy_updated(PolicyUpdated(model_name="other", version=9)) == ""
        swapped_at = [len(s) for s in seen]
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    control.close()
    shared.close()
    assert not errors, f"{len(errors)} request(s) failed during the swap: {errors[0]!r}"
    for i, versions in enumerate(seen):
        assert versions[0] == "1" and versions[-1] == "2", f"client {i}: {versions[:3]}..."
        # Once a client has seen version 2 it never goes back to version 1.
        first_v2 = versions.index("2")
        assert set(versions[first_v2:]) == {"2"}, f"client {i} saw version 1 after version 2"
        assert first_v2 <= swapped_at[i] + 1, "version 2 was not live when load() returned"
        assert len(versions) - first_v2 >= 5, "too few requests after the swap to show anything"


@pytest.mark.parametrize("damage", ["garbage", "truncated_with_stale_hash"])
def test_corrupt_version_is_refused_and_previous_keeps_serving(
    v2_grpc: str, v2_repository: Path, model_name: str, damage: str
) -> None:
    net = make_policy(seed=21)
    good = export_policy(net, SIGNATURE, v2_repository, model_name, 1)
    served = _served(v2_grpc, model_name)
    try:
        served.load(version=1)
        obs = random_inputs(SIGNATURE, 1, 5, np.random.default_rng(3))
        before = served.decide(obs)
        bad_dir = v2_repository / model_name / "2"
        bad_dir.mkdir()
        bad = bad_dir / "model.onnx"
        if damage == "garbage":
            bad.write_bytes(b"this is not an onnx protobuf \x00\x01\x02" * 100)
            pattern = "onnxruntime cannot load it"
        else:
            data = good.path.read_bytes()
            bad.write_bytes(data[: len(data) // 2])
            (bad_dir / "model.onnx.sha256").write_text(f"{good.sha256}  model.onnx\n")
            pattern = "sha256 mismatch"
        with pytest.raises(ArtifactError, match=pattern) as info:
            served.load(version=2)
        assert str(bad) in str(info.value), "the error must name the broken file"
        assert "version 2" in str(info.value)
        after = served.decide(obs)
        assert after.version == "1"
        np.testing.assert_array_equal(after.logits, before.logits)
        assert served.served_versions() == ["1"]
    finally:
        served.close()


def test_unload_then_reload_and_health(v2_grpc: str, v2_repository: Path, model_name: str) -> None:
    export_policy(make_policy(seed=31), SIGNATURE, v2_repository, model_name, 1)
    served = _served(v2_grpc, model_name)
    try:
        assert served.server_ready()
        assert not served.model_ready()  # explicit model control: nothing loaded yet
        obs = random_inputs(SIGNATURE, 1, 3, np.random.default_rng(0))
        with pytest.raises(ProcessingError, match=f"inference on {model_name} failed"):
            served.decide(obs)
        served.load()
        assert served.model_ready()
        served.unload()
        assert not served.model_ready()
        with pytest.raises(ProcessingError):
            served.decide(obs)
        assert served.load() == "1"
        assert served.decide(obs).version == "1"
    finally:
        served.close()


def test_loading_a_model_that_is_not_in_the_repository(v2_grpc: str, model_name: str) -> None:
    served = _served(v2_grpc, model_name)
    try:
        with pytest.raises(ArtifactError, match=f"{model_name}.*not found"):
            served.load()
    finally:
        served.close()


def test_server_reports_bad_tensors_with_the_file_name(
    v2_grpc: str, v2_repository: Path, model_name: str
) -> None:
    exported = export_policy(make_policy(seed=41), SIGNATURE, v2_repository, model_name, 1)
    served = ServedPolicy(v2_grpc, model_name, SIGNATURE, validate=False)
    try:
        served.load()
        good = random_inputs(SIGNATURE, 1, 4, np.random.default_rng(0))
        wrong = PolicyInputs(
            good.subtask_features[:, :, :5].copy(),  # 5 features instead of F
            good.subtask_mask,
            good.global_features,
            good.pair_features,
            good.action_mask,
        )
        with pytest.raises(ProcessingError, match="inference failed") as info:
            served.decide(wrong)
        assert str(exported.path) in str(info.value)
    finally:
        served.close()


def test_factory_selects_the_served_backend_and_tritonclient_sees_the_repository(
    v2_grpc: str, v2_repository: Path, model_name: str
) -> None:
    net = make_policy(seed=51)
    export_policy(net, SIGNATURE, v2_repository, model_name, 3)
    config = ServingConfig(policy_backend=f"v2://{v2_grpc}", model_name=model_name)
    backend = make_policy_backend(config, SIGNATURE)
    try:
        assert isinstance(backend, ServedPolicy)
        obs = random_inputs(SIGNATURE, 2, 6, np.random.default_rng(9))
        out = backend.decide(obs)
        assert out.version == "3"
        np.testing.assert_allclose(
            out.logits, LocalPolicy(net, SIGNATURE).decide(obs).logits, atol=1e-4, rtol=0
        )
    finally:
        backend.close()
    # The plain tritonclient view of the same server: the repository index lists the model.
    client = grpcclient.InferenceServerClient(v2_grpc)
    try:
        index = {m.name for m in client.get_model_repository_index().models}
        assert model_name in index
        assert client.is_server_live() and client.is_server_ready()
    finally:
        client.close()


def test_one_served_call_decides_for_sessions_of_different_sizes(
    v2_grpc: str, v2_repository: Path, model_name: str
) -> None:
    """Sessions of different task sizes on pools of different sizes, padded into one call."""
    net = make_policy(seed=61)
    export_policy(net, SIGNATURE, v2_repository, model_name, 1)
    served = _served(v2_grpc, model_name)
    try:
        served.load(version=1)
        rng = np.random.default_rng(8)
        sessions = [
            random_inputs(SIGNATURE, 1, s, rng, n_agents=a)
            for s, a in ((4, 9), (25, 4), (11, 2), (60, 9))
        ]
        joint = unstack_padded(
            served.decide(stack_padded(sessions, SIGNATURE)), sessions, SIGNATURE
        )
        local = LocalPolicy(net, SIGNATURE)
        for obs, out in zip(sessions, joint, strict=True):
            np.testing.assert_allclose(out.logits, local.decide(obs).logits, atol=1e-4, rtol=0)
    finally:
        served.close()
