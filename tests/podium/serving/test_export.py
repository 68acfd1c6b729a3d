"""ONNX export, the Triton config and the local backend (no server needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from serving_helpers import SIGNATURE, make_policy

from podium.errors import ArtifactError, ConfigError
from podium.serving.backends import LocalPolicy, ServingConfig, make_policy_backend, parse_backend
from podium.serving.contract import (
    INPUT_NAMES,
    ObservationError,
    PolicyInputs,
    PolicySignature,
    random_inputs,
    render_policy_config,
    stack_padded,
    unstack_padded,
)
from podium.serving.export import (
    ensure_model_config,
    export_policy,
    onnx_session,
    torch_forward,
)
from podium.serving.pbtxt import read_model_config

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    repo = tmp_path_factory.mktemp("repo")
    net = make_policy(seed=1)
    result = export_policy(net, SIGNATURE, repo, "swarm_policy", 1)
    return result.path, net


def test_export_writes_triton_layout_with_dynamic_axes(exported: tuple[Path, object]) -> None:
    path, _ = exported
    assert path.name == "model.onnx" and path.parent.name == "1"
    assert (path.parent.parent / "config.pbtxt").is_file()
    # Readable by a server running as another user (Triton's uid differs from the learner's).
    assert path.stat().st_mode & 0o777 == 0o644
    assert (path.parent.parent / "config.pbtxt").stat().st_mode & 0o777 == 0o644
    sidecar = path.with_name("model.onnx.sha256").read_text().split()[0]
    import hashlib

    assert sidecar == hashlib.sha256(path.read_bytes()).hexdigest()
    graph = onnx.load(str(path)).graph
    dims = {
        i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in graph.input
    }
    assert dims["subtask_features"] == ["batch", "n_subtasks", SIGNATURE.subtask_features]
    assert dims["subtask_mask"] == ["batch", "n_subtasks"]
    assert dims["global_features"] == ["batch", SIGNATURE.global_features]
    assert dims["pair_features"] == ["batch", "n_subtasks", "n_agents", SIGNATURE.pair_features]
    assert dims["action_mask"][0] == "batch" and isinstance(dims["action_mask"][1], str)
    assert [i.name for i in graph.input] == list(INPUT_NAMES)


@pytest.mark.parametrize(
    ("batch", "n_subtasks", "n_agents"),
    [(1, 1, 9), (3, 8, 9), (2, 30, 4), (1, 100, 1), (4, 6, 17)],
)
def test_onnxruntime_matches_torch_on_task_and_pool_sizes(
    exported: tuple[Path, object], batch: int, n_subtasks: int, n_agents: int
) -> None:
    """Parity on task sizes and on pool sizes other than the training pool's 9 agents (the
    export traced 2 agents): the agent axis is as dynamic as the subtask axis."""
    path, net = exported
    rng = np.random.default_rng(n_subtasks)
    inputs = random_inputs(SIGNATURE, batch, n_subtasks, rng, n_agents=n_agents)
    got = onnx_session(path).run(["logits", "value"], inputs.arrays())
    want = torch_forward(net, inputs)  # type: ignore[arg-type]
    assert got[0].shape == (batch, SIGNATURE.n_actions(n_subtasks, n_agents))
    assert got[1].shape == (batch,)
    np.testing.assert_allclose(got[0], want[0], atol=1e-4, rtol=0)
    np.testing.assert_allclose(got[1], want[1], atol=1e-4, rtol=0)
    # Masked actions stay masked in the exported graph.
    assert (got[0][~inputs.action_mask] < -1e8).all()
    assert (got[0][inputs.action_mask] > -1e3).all()


def test_versions_are_immutable(exported: tuple[Path, object]) -> None:
    path, net = exported
    before = path.read_bytes()
    with pytest.raises(ArtifactError, match=r"1/model\.onnx already exists"):
        export_policy(net, SIGNATURE, path.parents[2], "swarm_policy", 1)  # type: ignore[arg-type]
    assert path.read_bytes() == before
    with pytest.raises(ArtifactError, match="must be >= 1"):
        export_policy(net, SIGNATURE, path.parents[2], "swarm_policy", 0)  # type: ignore[arg-type]


def test_existing_config_for_another_signature_is_refused(tmp_path: Path) -> None:
    other = PolicySignature(
        SIGNATURE.subtask_features + 1, SIGNATURE.global_features, SIGNATURE.pair_features
    )
    ensure_model_config(tmp_path, "swarm_policy", other)
    with pytest.raises(ArtifactError, match=r"config\.pbtxt: input declarations do not match"):
        export_policy(make_policy(seed=2), SIGNATURE, tmp_path, "swarm_policy", 1)
    assert not (tmp_path / "swarm_policy" / "1" / "model.onnx").exists()


def test_committed_config_matches_the_default_network() -> None:
    """triton_models/swarm_policy/config.pbtxt is what the exporter would write for today's
    environment: a changed observation layout must update the committed file too."""
    repo = ROOT / "triton_models"
    ensure_model_config(repo, "swarm_policy", SIGNATURE)  # raises on a mismatch
    config = read_model_config(repo / "swarm_policy")
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size >= 64
    message = config.message
    assert message.HasField("dynamic_batching")
    assert message.instance_group[0].kind == message.instance_group[0].KIND_GPU
    (accel,) = message.optimization.execution_accelerators.gpu_execution_accelerator
    assert accel.name == "tensorrt"
    assert accel.parameters["precision_mode"] == "FP16"
    # Byte for byte what the renderer writes: the committed file is generated, never hand-edited.
    rendered = render_policy_config("swarm_policy", SIGNATURE)
    assert (repo / "swarm_policy" / "config.pbtxt").read_text() == rendered


def test_local_policy_runs_the_module_and_validates(exported: tuple[Path, object]) -> None:
    _, net = exported
    local = LocalPolicy(net, SIGNATURE)  # type: ignore[arg-type]
    inputs = random_inputs(SIGNATURE, 4, 12, np.random.default_rng(0), n_agents=9)
    out = local.decide(inputs)
    want = torch_forward(net, inputs)  # type: ignore[arg-type]
    np.testing.assert_array_equal(out.logits, want[0])
    assert out.value.shape == (4,) and out.version == "local"
    bad = PolicyInputs(
        inputs.subtask_features[:, :, :-1].copy(),
        inputs.subtask_mask,
        inputs.global_features,
        inputs.pair_features,
        inputs.action_mask,
    )
    with pytest.raises(ObservationError, match="subtask_features has shape") as info:
        local.decide(bad)
    assert info.value.field == "subtask_features"
    wrong_mask = PolicyInputs(
        inputs.subtask_features,
        inputs.subtask_mask,
        inputs.global_features,
        inputs.pair_features,
        inputs.action_mask[:, :-1].copy(),
    )
    with pytest.raises(ObservationError, match=r"action_mask has shape \(4, 325\)") as info:
        local.decide(wrong_mask)
    assert "12 subtasks and 9 agents" in str(info.value)
    # A mask of another pool's size than the pair rows say.
    other_pool = PolicyInputs(
        inputs.subtask_features,
        inputs.subtask_mask,
        inputs.global_features,
        inputs.pair_features[:, :, :4].copy(),
        inputs.action_mask,
    )
    with pytest.raises(ObservationError, match=r"action_mask has shape .* and 4 agents"):
        local.decide(other_pool)
    bad_pairs = PolicyInputs(
        inputs.subtask_features,
        inputs.subtask_mask,
        inputs.global_features,
        inputs.pair_features[:, :, :, :-1].copy(),
        inputs.action_mask,
    )
    with pytest.raises(ObservationError, match="pair_features has shape") as info:
        local.decide(bad_pairs)
    assert info.value.field == "pair_features"
    as_float = PolicyInputs(
        inputs.subtask_features,
        inputs.subtask_mask.astype(np.float32),  # type: ignore[arg-type]
        inputs.global_features,
        inputs.pair_features,
        inputs.action_mask,
    )
    with pytest.raises(ObservationError, match="subtask_mask has dtype float32"):
        local.decide(as_float)


def test_backend_spec_parsing() -> None:
    assert parse_backend("local") is None
    assert parse_backend("v2://127.0.0.1:8001") == "127.0.0.1:8001"
    assert parse_backend("v2://triton.podium.svc:8001/") == "triton.podium.svc:8001"
    for bad in ("", "triton:8001", "v2://host", "v2://host:notaport", "grpc://h:1", "v2://:80"):
        with pytest.raises(ConfigError, match="PODIUM_POLICY_BACKEND"):
            parse_backend(bad)
    with pytest.raises(ConfigError, match="PODIUM_POLICY_BACKEND"):
        ServingConfig(policy_backend="v2:/oops")
    with pytest.raises(ConfigError, match="needs a policy module"):
        make_policy_backend(ServingConfig(), SIGNATURE)
    backend = make_policy_backend(ServingConfig(), SIGNATURE, make_policy(seed=3))
    assert isinstance(backend, LocalPolicy)


def test_padded_batch_of_mixed_task_sizes_decides_like_separate_calls(
    exported: tuple[Path, object],
) -> None:
    """Many sessions, one call: padding smaller tasks and smaller pools must not change any
    decision."""
    _, net = exported
    local = LocalPolicy(net, SIGNATURE)  # type: ignore[arg-type]
    rng = np.random.default_rng(4)
    parts = [
        random_inputs(SIGNATURE, b, s, rng, n_agents=a)
        for b, s, a in ((2, 3, 9), (1, 17, 4), (3, 9, 11))
    ]
    stacked = stack_padded(parts, SIGNATURE)
    assert stacked.batch == 6 and stacked.n_subtasks == 17 and stacked.n_agents == 11
    together = unstack_padded(local.decide(stacked), parts, SIGNATURE)
    for part, joint in zip(parts, together, strict=True):
        alone = local.decide(part)
        assert joint.logits.shape == alone.logits.shape
        np.testing.assert_allclose(joint.logits, alone.logits, atol=1e-5, rtol=0)
        np.testing.assert_allclose(joint.value, alone.value, atol=1e-5, rtol=0)
    with pytest.raises(ObservationError, match="at least one batch"):
        stack_padded([], SIGNATURE)
