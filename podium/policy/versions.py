"""Policy version strings, parsed strictly: the one place a ``policy_version`` becomes a number.

A trajectory names the policy that acted in ``Trajectory.policy_version`` (and each decision
in ``Decision.policy_version``): a learned version is a bare decimal (``"12"``), other
policies are labels that may end in a number (``"orchestrator:12"``, ``"example:0"``) or not
(``"rules:cpls"``). These strings arrive from the bus, so they are untrusted: the parser is
*total* (every string gives a number or a :class:`~podium.errors.DecodeError` naming the
problem, never another exception) and *strict* (ASCII digits only). Python's own
``str.isdigit`` / ``int`` / ``re`` ``\\d`` accept Unicode digits (``"²".isdigit()`` is True and
``int("²")`` raises, ``int("٣")`` is 3) and ``int`` refuses more than 4300 digits, which once
let one record crash-loop the learner.
"""

from __future__ import annotations

import re

from podium.errors import DecodeError

MAX_VERSION_CHARS = 256
"""Longest accepted policy version string (a label, not a document)."""
MAX_VERSION_DIGITS = 18
"""Most digits in a version number: every such number fits a signed 64-bit integer."""

_LAST_NUMBER = re.compile(r"([0-9]+)(?!.*[0-9])", re.ASCII | re.DOTALL)


def _checked(policy_version: str) -> str:
    """``policy_version`` if it is short printable ASCII, else a DecodeError naming why."""
    if len(policy_version) > MAX_VERSION_CHARS:
        raise DecodeError(
            f"policy_version of {len(policy_version)} characters (at most {MAX_VERSION_CHARS})"
        )
    if not (policy_version.isascii() and policy_version.isprintable()):
        raise DecodeError(
            f"policy_version {policy_version!r} is not printable ASCII (digits must be 0-9)"
        )
    return policy_version


def policy_version_number(policy_version: str) -> int:
    """The last integer in a policy version (``"orchestrator:12"`` -> 12, ``"7"`` -> 7); 0 when
    it has none (``""``, ``"rules:cpls"``).

    Raises :class:`DecodeError` when the string is not printable ASCII, is longer than
    :data:`MAX_VERSION_CHARS` or its number has more than :data:`MAX_VERSION_DIGITS` digits.
    """
    m = _LAST_NUMBER.search(_checked(policy_version))
    if m is None:
        return 0
    digits = m.group(1)
    if len(digits) > MAX_VERSION_DIGITS:
        raise DecodeError(
            f"policy_version {policy_version[:40]!r}...: a number of {len(digits)} digits "
            f"(at most {MAX_VERSION_DIGITS})"
        )
    return int(digits)


def is_version_number(policy_version: str) -> bool:
    """Whether ``policy_version`` is a learned version: a bare ASCII decimal of at most
    :data:`MAX_VERSION_DIGITS` digits (``"12"``; not ``"²"``, ``"+1"``, ``" 1"`` or ``""``)."""
    return (
        0 < len(policy_version) <= MAX_VERSION_DIGITS
        and policy_version.isascii()
        and policy_version.isdigit()
    )


__all__ = [
    "MAX_VERSION_CHARS",
    "MAX_VERSION_DIGITS",
    "is_version_number",
    "policy_version_number",
]
