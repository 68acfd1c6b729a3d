"""The config.pbtxt reader: the text format Triton documents, and errors that name the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from serving_helpers import SIGNATURE

from podium.errors import ConfigError
from podium.serving.contract import render_policy_config
from podium.serving.pbtxt import model_config_from_text, parse_text, read_model_config, version_dirs

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
    # Repeated message fields collect into a list.
    params = config.raw["parameters"]
    assert [p["key"] for p in params] == ["intra_op_thread_count", "execution_mode"]
    assert config.raw["instance_group"][0] == {"count": 2, "kind": "KIND_CPU"}


def test_version_policies() -> None:
    base = 'name: "m" platform: "onnxruntime_onnx" '
    assert model_config_from_text(base).versions_to_serve([1, 5, 3]) == [5]
    latest2 = model_config_from_text(base + "version_policy: { latest { num_versions: 2 } }")
    assert latest2.versions_to_serve([1, 5, 3]) == [5, 3]
    every = model_config_from_text(base + "version_policy: { all { } }")
    assert every.versions_to_serve([1, 5, 3]) == [5, 3, 1]
    assert model_config_from_text(base).versions_to_serve([]) == []


def test_rendered_policy_config_round_trips() -> None:
    text = render_policy_config("swarm_policy", SIGNATURE, max_batch_size=64, gpu=False)
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
    assert config.raw["instance_group"][0]["kind"] == "KIND_CPU"
    assert "optimization" not in config.raw


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name: "m"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] }', "missing ']'"),
        ('name: "m"\nplatform: "onnxruntime_onnx" @', r"m\.pbtxt:2: unexpected character '@'"),
        ('platform: "onnxruntime_onnx"', "'name' is required"),
        (
            'name: "m" input [ { name: "x" data_type: TYPE_FOO } ]',
            "unsupported data_type 'TYPE_FOO'",
        ),
        ('name: "m" input { data_type: TYPE_FP32 }', "needs a name"),
    ],
)
def test_bad_configs_name_the_file_and_problem(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        model_config_from_text(text, "/repo/m.pbtxt")
    assert "/repo/m.pbtxt" in str(info.value)


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


def test_parse_text_scalars() -> None:
    raw = parse_text('a: 1 b: -2.5 c: true d: "x\\"y" e: KIND_GPU f: [ ] g < h: 1 >')
    assert raw == {
        "a": 1,
        "b": -2.5,
        "c": True,
        "d": 'x"y',
        "e": "KIND_GPU",
        "f": [],
        "g": {"h": 1},
    }
