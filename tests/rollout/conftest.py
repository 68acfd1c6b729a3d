"""Fixtures of the rollout suite: the fault suite's cluster (a secured broker of the test's
own, services as processes; tests/faults/harness.py, imported from there, not copied), the
candidate policies (built once per session), and the table of scenarios x figures.

Like the fault suite it runs where ``$PODIUM_KAFKA_BOOTSTRAP`` is set, is skipped by hand
without it, and fails under ``CI=true`` without it (the ``kafka_bootstrap`` fixture).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

# The fault suite's harness and auditor are this suite's too (one copy): tests/faults is a
# directory of modules, not a package, so it goes on the path as pytest puts a test's own.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))

from candidates import Candidate, build_candidates
from harness import Cluster, render_table, running_cluster
from rig import Rig, RolloutLoad, make_auth

from podium.policy.signing import KeyPair

ROWS: list[dict[str, object]] = []
"""One row per scenario run in this session (recorded through :func:`rollout_table`)."""

COLUMNS = (
    ("scenario", "scenario"),
    ("result", "result"),
    ("submitted", "sessions"),
    ("lost", "lost"),
    ("run_twice", "run 2x"),
    ("unscored", "unscored"),
    ("no_arm", "no arm"),
    ("walk", "transitions"),
    ("figure", "figures"),
    ("wall", "wall s"),
)


@pytest.fixture(scope="session")
def rollout_table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., None]]:
    """``rollout_table(**row)`` records a scenario's row; the table is written to
    ``<pytest tmp>/rollout-table.md`` at the end of the session (and printed in the summary)."""

    def record(**row: object) -> None:
        ROWS.append(row)

    yield record
    if ROWS:
        path = tmp_path_factory.getbasetemp() / "rollout-table.md"
        path.write_text(render_table(ROWS, COLUMNS) + "\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the scenarios x figures table after the run."""
    if ROWS:
        terminalreporter.section("rollout suite: scenarios x figures")
        terminalreporter.write_line(render_table(ROWS, COLUMNS))


@pytest.fixture(scope="session")
def candidates(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[KeyPair, dict[str, Candidate]]:
    """The signing pair and the learned candidates (good, weak, weak2, sabotaged), built once."""
    return build_candidates(tmp_path_factory.mktemp("candidates"))


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    """A fresh secured broker behind a proxy, and an empty set of service processes."""
    del kafka_bootstrap  # only the gate: a machine that runs the Kafka tests runs these
    async with running_cluster(tmp_path) as cluster:
        yield cluster


@pytest.fixture
async def rig(
    cluster: Cluster, candidates: tuple[KeyPair, dict[str, Candidate]], tmp_path: Path
) -> AsyncIterator[Rig]:
    """A scenario's deployment, not started yet (the scenario says how); its tail and
    processes are stopped at the end whatever happened."""
    keys, made = candidates
    load = RolloutLoad(cluster.admin, "rollout")
    rig = Rig(cluster, keys, made, make_auth(tmp_path / "auth"), load)
    try:
        yield rig
    finally:
        await load.stop()
