"""Fixtures of the fault suite: a broker of the test's own behind a cuttable TCP proxy, the
services as processes, and the table of scenarios x counts.

Every test gets a fresh broker (a few seconds to start; it is killed, paused and restarted
freely and never shared), so "read every topic back" is exactly this scenario's log. Every
process a test starts is killed in the fixture's ``finally``, failed test or not.

The suite needs what the Kafka tests need (java and the cached broker jars, which CI has): it
runs where ``$PODIUM_KAFKA_BOOTSTRAP`` is set, is skipped by hand without it, and fails under
``CI=true`` without it (the ``kafka_bootstrap`` fixture).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from harness import Cluster, render_table, running_cluster

ROWS: list[dict[str, object]] = []
"""One row per scenario run in this session (recorded through :func:`fault_table`)."""

COLUMNS = (
    ("scenario", "scenario"),
    ("result", "result"),
    ("submitted", "sessions"),
    ("trajectories", "trajs"),
    ("lost", "lost"),
    ("run_twice", "run 2x"),
    ("unscored", "unscored"),
    ("scored_twice", "scored 2x"),
    ("trace_split", "trace split"),
    ("poison", "poison"),
    ("dead_letters", "DLQ'd"),
    ("in_flight", "in flight at fault"),
    ("p50", "recovery p50 s"),
    ("p99", "recovery p99 s"),
    ("wall", "wall s"),
    ("restarts", "exited, restarted"),
    ("proxied", "proxy conns"),
)


@pytest.fixture(scope="session")
def fault_table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., None]]:
    """``fault_table(**row)`` records a scenario's row; the table is written to
    ``<pytest tmp>/faults-table.md`` at the end of the session (and printed in the summary)."""

    def record(**row: object) -> None:
        ROWS.append(row)

    yield record
    if ROWS:
        path = tmp_path_factory.getbasetemp() / "faults-table.md"
        path.write_text(render_table(ROWS, COLUMNS) + "\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the scenarios x counts table after the run."""
    if ROWS:
        terminalreporter.section("fault suite: scenarios x counts")
        terminalreporter.write_line(render_table(ROWS, COLUMNS))


@pytest.fixture
async def cluster(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    """A fresh secured broker (SASL_SSL, ACLs) behind a fresh proxy, and an empty set of
    service processes (:func:`harness.running_cluster`)."""
    del kafka_bootstrap  # only the gate: a machine that runs the Kafka tests runs these
    async with running_cluster(tmp_path) as cluster:
        yield cluster
