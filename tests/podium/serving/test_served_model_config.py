"""The real KServe-V2 server reads config.pbtxt as Triton's ModelConfig: a misspelled field is
refused at load with the file and the field named, as Triton refuses it; the committed
repository's config serves."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from serving_helpers import SIGNATURE, make_policy
from tritonclient.utils import InferenceServerException

from podium.serving.export import export_policy

pytestmark = pytest.mark.serving

ROOT = Path(__file__).resolve().parents[3]


def test_a_misspelled_field_is_refused_naming_file_and_field(
    v2_grpc: str, v2_repository: Path, model_name: str
) -> None:
    export_policy(make_policy(seed=7), SIGNATURE, v2_repository, model_name, 1)
    config = v2_repository / model_name / "config.pbtxt"
    # Triton's field is max_batch_size; a hand edit that drops "_size" must not load silently.
    config.write_text(config.read_text().replace("max_batch_size:", "max_batch:"))
    client = grpcclient.InferenceServerClient(v2_grpc)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.load_model(model_name)
        message = info.value.message() or str(info.value)
        assert str(config) in message and "unknown field 'max_batch'" in message
        assert "inference.ModelConfig" in message
    finally:
        client.close()


def test_the_committed_config_serves_unchanged(
    v2_grpc: str, v2_repository: Path, model_name: str
) -> None:
    """triton_models/swarm_policy/config.pbtxt (the GPU production file, TensorRT settings and
    all) under another name: the V2 server reads every field of it and serves the model."""
    export_policy(make_policy(seed=8), SIGNATURE, v2_repository, model_name, 1)
    committed = (ROOT / "triton_models" / "swarm_policy" / "config.pbtxt").read_text()
    (v2_repository / model_name / "config.pbtxt").write_text(
        committed.replace('name: "swarm_policy"', f'name: "{model_name}"')
    )
    client = grpcclient.InferenceServerClient(v2_grpc)
    try:
        client.load_model(model_name)
        assert client.is_model_ready(model_name)
        metadata = client.get_model_metadata(model_name)
        assert [t.name for t in metadata.inputs] == [
            "subtask_features",
            "subtask_mask",
            "global_features",
            "pair_features",
            "action_mask",
        ]
    finally:
        client.close()
