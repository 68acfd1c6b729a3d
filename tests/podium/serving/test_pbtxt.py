"""config.pbtxt as Triton's own ModelConfig message: strict parsing (unknown fields are errors
naming the file and the field), round trips, and the repository's committed configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from serving_helpers import SIGNATURE
from tritonclient.grpc import model_config_pb2

from podium.errors import ConfigError
from podium.serving.contract import render_policy_config
from podium.serving.pbtxt import (
    model_config_from_text,
    parse_model_config,
    read_model_config,
    render_model_config,
    version_dirs,
)

ROOT = Path(__file__).resolve().parents[3]

TRITON_DOC_EXAMPLE = """
# from Triton's model configuration guide, reformatted
name: "mymodel"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { specific: { versions: [1, 3] } }
input [
  {
    name: "input0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  },
  {
    name: "input1"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
output [
  {
    name: "output0"
    data_type: TYPE_FP32
    dims: [ 1 ]
    reshape: { shape: [ ] }
  }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "execution_mode" value: { string_value: "0" } }
"""


def test_parses_triton_documentation_example() -> None:
    config = model_config_from_text(TRITON_DOC_EXAMPLE, "example.pbtxt")
    assert config.name == "mymodel" and config.max_batch_size == 8
    assert [t.name for t in config.inputs] == ["input0", "input1"]
    assert config.inputs[0].data_type == "FP32" and config.inputs[0].dims == (16,)
    assert config.outputs[0].dims == (1,) and config.outputs[0].reshape == ()
    assert config.specific_versions == (1, 3)
    assert config.versions_to_serve([1, 2, 3, 4]) == [3, 1]
    # The full message is Triton's own: map fields, enums, nested messages.
    message = config.message
    assert isinstance(message, model_config_pb2.ModelConfig)
    assert message.parameters["intra_op_thread_count"].string_value == "1"
    assert message.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert message.instance_group[0].count == 2


def test_version_policies() -> None:
    base = 'name: "m" platform: "onnxruntime_onnx" '
    assert model_config_from_text(base).versions_to_serve([1, 5, 3]) == [5]
    latest2 = model_config_from_text(base + "version_policy: { latest { num_versions: 2 } }")
    assert latest2.versions_to_serve([1, 5, 3]) == [5, 3]
    every = model_config_from_text(base + "version_policy: { all { } }")
    assert every.versions_to_serve([1, 5, 3]) == [5, 3, 1]
    assert model_config_from_text(base).versions_to_serve([]) == []
    backend = model_config_from_text('name: "m" backend: "onnxruntime"')
    assert backend.platform == "onnxruntime"


@pytest.mark.parametrize("gpu", [True, False])
def test_rendered_policy_config_round_trips(gpu: bool) -> None:
    text = render_policy_config("swarm_policy", SIGNATURE, max_batch_size=64, gpu=gpu)
    config = model_config_from_text(text)
    assert config.name == "swarm_policy" and config.max_batch_size == 64
    shapes = {t.name: (t.data_type, t.dims) for t in config.inputs}
    assert shapes == {
        "subtask_features": ("FP32", (-1, SIGNATURE.subtask_features)),
        "subtask_mask": ("BOOL", (-1,)),
        "global_features": ("FP32", (SIGNATURE.global_features,)),
        "pair_features": ("FP32", (-1, -1, SIGNATURE.pair_features)),
        "action_mask": ("BOOL", (-1,)),
    }
    value = {t.name: t for t in config.outputs}["value"]
    assert value.dims == (1,) and value.reshape == ()
    kind = config.message.instance_group[0].kind
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(kind) == (
        "KIND_GPU" if gpu else "KIND_CPU"
    )
    assert config.message.HasField("optimization") is gpu
    # parse(render(m)) == m, and render(parse(text)) == text: nothing lost either way.
    assert render_model_config(config.message) == text_format.MessageToString(config.message)
    assert parse_model_config(render_model_config(config.message)) == config.message
    assert text.endswith(render_model_config(config.message))


def test_hand_written_syntax_parses_to_the_same_message() -> None:
    """Triton's compact list syntax and the renderer's one-field-per-line form are one message."""
    compact = parse_model_config(TRITON_DOC_EXAMPLE)
    rendered = render_model_config(compact, ["a comment"])
    assert rendered.startswith("# a comment\n")
    assert parse_model_config(rendered) == compact


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # Misspelled or invented fields: Triton would refuse them, so do we, naming the field.
        (
            'name: "m"\nmax_batch: 8',
            r"m\.pbtxt:2:1: unknown field 'max_batch' in inference\.ModelConfig",
        ),
        (
            'name: "m"\ninput [ { name: "x" data_type: TYPE_FP32 dim: [ 1 ] } ]',
            r"m\.pbtxt:2:.*unknown field 'dim' in inference\.ModelInput",
        ),
        (
            'name: "m" dynamic_batching { max_queue_delay_us: 5 }',
            r"unknown field 'max_queue_delay_us' in inference\.ModelDynamicBatching",
        ),
        ('name: "m" input [ { name: "x" data_type: TYPE_FOO } ]', "has no value named TYPE_FOO"),
        ('name: "m"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] }', r"m\.pbtxt:2:"),
        ('name: "m"\nplatform: "onnxruntime_onnx" @', r"m\.pbtxt:2:"),
        ('name: "m" name: "n"', 'should not have multiple "name" fields'),
        ('platform: "onnxruntime_onnx"', "'name' is required"),
        (
            'name: "m" input [ { name: "x" data_type: TYPE_UINT64 } ]',
            "unsupported data_type TYPE_UINT64",
        ),
        ('name: "m" input { data_type: TYPE_FP32 }', "needs a name"),
    ],
)
def test_bad_configs_name_the_file_and_problem(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        model_config_from_text(text, "/repo/m.pbtxt")
    assert str(info.value).startswith("/repo/m.pbtxt")


def test_render_refuses_anything_but_triton_model_config() -> None:
    with pytest.raises(TypeError, match=r"expected inference\.ModelConfig"):
        render_model_config(model_config_pb2.ModelInput(name="x"))


def test_directory_name_must_match(tmp_path: Path) -> None:
    model_dir = tmp_path / "policy_a"
    model_dir.mkdir()
    (model_dir / "config.pbtxt").write_text('name: "policy_b" platform: "onnxruntime_onnx"')
    with pytest.raises(ConfigError, match="differs from its directory 'policy_a'"):
        read_model_config(model_dir)
    with pytest.raises(ConfigError, match="cannot read"):
        read_model_config(tmp_path / "missing")
    for name in ("1", "10", "2", "tmp", ".3.tmp"):
        (model_dir / name).mkdir()
    assert version_dirs(model_dir) == [1, 2, 10]


def test_unknown_field_in_a_repository_file_names_the_path(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.pbtxt").write_text('name: "m"\nplatform: "onnxruntime_onnx"\nbatch: 4\n')
    with pytest.raises(ConfigError) as info:
        read_model_config(model_dir)
    assert f"{model_dir / 'config.pbtxt'}:3:1: unknown field 'batch'" in str(info.value)


COMMITTED = sorted((ROOT / "triton_models").glob("**/config.pbtxt"))


def test_the_repository_has_committed_configs() -> None:
    assert COMMITTED, "triton_models/ should hold at least one config.pbtxt"


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_configs_use_triton_field_names(path: Path) -> None:
    """Every committed config is a valid ModelConfig (Triton's field names only) and survives
    a round trip through the text format unchanged."""
    config = read_model_config(path.parent)
    message = config.message
    assert parse_model_config(render_model_config(message), str(path)) == message
    # Spot-check fields by Triton's own names, through the message's descriptor.
    names = {f.name for f, _ in message.ListFields()}
    assert {"name", "platform", "max_batch_size", "input", "output"} <= names
    for tensor in (*message.input, *message.output):
        assert {f.name for f, _ in tensor.ListFields()} <= {
            "name",
            "data_type",
            "dims",
            "reshape",
            "format",
            "is_shape_tensor",
            "optional",
            "allow_ragged_batch",
            "label_filename",
        }
