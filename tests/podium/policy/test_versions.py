"""Policy version strings and observation tensors off the bus: parsed strictly and totally.

Every string gives a number or a DecodeError naming the problem — never ValueError (``int("²")``
raises although ``"²".isdigit()`` is True; ``int`` refuses more than 4300 digits) and never a
silent non-ASCII reading (``int("٣")`` is 3).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from podium.config import ServiceConfig, from_env, is_port
from podium.errors import ConfigError, DecodeError
from podium.policy.decisions import decode_observation, encode_observation
from podium.policy.versions import (
    MAX_VERSION_CHARS,
    MAX_VERSION_DIGITS,
    is_version_number,
    policy_version_number,
)
from podium.rewards.score import progress_from_policy_version
from podium.serving.endpoint import parse_backend
from podium.serving.pbtxt import version_dirs


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("", 0),
        ("0", 0),
        ("12", 12),
        ("orchestrator:12", 12),
        ("v3", 3),
        ("rules:cpls", 0),
        ("example:0", 0),
        ("a1b22", 22),
        ("9" * MAX_VERSION_DIGITS, int("9" * MAX_VERSION_DIGITS)),
    ],
)
def test_version_numbers(text: str, number: int) -> None:
    assert policy_version_number(text) == number


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("²", "not printable ASCII"),
        ("٣", "not printable ASCII"),
        ("v١٢", "not printable ASCII"),
        ("1\n", "not printable ASCII"),
        ("0\x00", "not printable ASCII"),
        ("1" * 5000, "5000 characters"),
        ("x" * (MAX_VERSION_CHARS + 1), f"at most {MAX_VERSION_CHARS}"),
        ("1" * (MAX_VERSION_DIGITS + 1), f"{MAX_VERSION_DIGITS + 1} digits"),
    ],
)
def test_malformed_versions_raise_decode_error_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(DecodeError, match=problem):
        policy_version_number(text)
    with pytest.raises(DecodeError):
        progress_from_policy_version(text, 1.0)  # the reward's reading is the same parser


def test_is_version_number_is_a_bare_ascii_decimal() -> None:
    assert is_version_number("0") and is_version_number("12")
    for text in ("", "²", "٣", "+1", "-1", " 1", "1 ", "v1", "1" * (MAX_VERSION_DIGITS + 1)):
        assert not is_version_number(text), text


def test_observation_tensor_is_decoded_strictly() -> None:
    values = np.arange(6, dtype=np.float32)
    assert np.array_equal(decode_observation(encode_observation(values), 6, "t"), values)
    with pytest.raises(DecodeError, match="holds 6 floats, expected 7"):
        decode_observation(encode_observation(values), 7, "t")
    with pytest.raises(DecodeError, match="truncated"):
        decode_observation(encode_observation(values)[:-3], 6, "t")
    with pytest.raises(DecodeError, match="bytes after"):
        decode_observation(encode_observation(values) + b"junk", 6, "t")
    with pytest.raises(DecodeError, match="not zlib"):
        decode_observation(b"\xff\xfegarbage", 6, "t")
    with pytest.raises(DecodeError, match="non-finite"):
        decode_observation(encode_observation(np.array([0, np.nan], dtype=np.float32)), 2, "t")
    # A few kilobytes that would inflate to 100 MB are refused after inflating 25 bytes.
    bomb = zlib.compress(bytes(100_000_000), 9)
    assert len(bomb) < 200_000
    with pytest.raises(DecodeError, match="more than the 6 floats"):
        decode_observation(bomb, 6, "t")


def test_other_digit_readings_in_the_library_are_ascii_strict(tmp_path: Path) -> None:
    """Ports and version directories: ``"²"`` is refused as a value, never a ValueError."""
    assert is_port("8001") and not is_port("²") and not is_port("0") and not is_port("1" * 5000)
    with pytest.raises(ConfigError, match="PODIUM_POLICY_BACKEND"):
        parse_backend("v2://127.0.0.1:²")
    with pytest.raises(ConfigError, match="not HOST:PORT"):
        from_env(ServiceConfig, {"PODIUM_BUS": "kafka://127.0.0.1:²"})
    model = tmp_path / "swarm_policy"
    for name in ("2", "10", "²", "٣"):
        (model / name).mkdir(parents=True)
    assert version_dirs(model) == [2, 10]
