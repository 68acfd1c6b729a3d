"""Sub-agent plug-ins are found by entry-point name: Podium's own from its pyproject table
(Podium runs from its source tree here, not installed), a third party's from a real
``*.dist-info`` on the path, and every way of getting it wrong is a PluginError naming it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from podium.errors import PluginError
from podium.subagents import (
    ENTRY_POINT_GROUP,
    ExecutionReport,
    ExecutionRequest,
    SubAgent,
    load_subagent,
    registered,
)
from podium.subagents.plugin import entry_points_of
from podium.subagents.reference import ContextDigestAgent, context_digest
from podium.v1 import subtask_pb2, task_pb2

ROOT = Path(__file__).resolve().parents[3]

ACME = '''
import asyncio
from podium.subagents import ExecutionReport, ToolCallRecord


class Shouter:
    """Answers with the query in capitals, after a real pause."""

    def __init__(self, options):
        self.suffix = options.get("suffix", "!")
        self.closed = False

    async def execute(self, request):
        await asyncio.sleep(0.01)
        return ExecutionReport(success=True, output=request.description.upper() + self.suffix)

    async def close(self):
        self.closed = True


def make(options):
    return Shouter(options)


def refuses(options):
    raise ValueError("needs an index option")


def not_an_agent(options):
    return 42
'''


def install_dist(site: Path, name: str, module: str, source: str, entry_points: str) -> None:
    """A distribution as pip leaves it: the module and ``<name>-1.0.dist-info`` with its
    METADATA and entry_points.txt."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n" + textwrap.dedent(entry_points)
    )


@pytest.fixture
def acme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A third-party distribution ``acme-agents`` on sys.path with four entry points."""
    site = tmp_path / "site"
    site.mkdir()
    install_dist(
        site,
        "acme_agents",
        "acme_agents",
        ACME,
        """\
        shout = acme_agents:make
        shout-refuses = acme_agents:refuses
        shout-int = acme_agents:not_an_agent
        shout-missing = acme_agents_gone:make
        """,
    )
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("acme_agents", None)


def request(description: str = "where is errno") -> ExecutionRequest:
    context = subtask_pb2.ExecutionContext(
        subtask=task_pb2.SubtaskSpec(id="q", kind="search", work=1.0, description=description)
    )
    return ExecutionRequest(
        session_id="s",
        execution_id="s.0",
        subtask_id="q",
        kind="search",
        agent="shouter",
        attempt=1,
        description=description,
        dependency_outputs={},
        context=context,
    )


async def test_a_third_party_plugin_is_found_through_its_dist_info(acme: Path) -> None:
    assert registered()["shout"] == "acme_agents:make"
    agent = load_subagent("shout", {"suffix": "?"})
    assert isinstance(agent, SubAgent)
    report = await agent.execute(request("where is errno"))
    assert report == ExecutionReport(success=True, output="WHERE IS ERRNO?")
    await agent.close()


def test_podiums_own_plugins_come_from_its_pyproject_table() -> None:
    table = {ep.name: ep.value for ep in entry_points_of(ROOT / "pyproject.toml")}
    assert table["context-digest"] == "podium.subagents.reference:make"
    found = registered()
    assert all(found[name] == value for name, value in table.items())
    assert isinstance(load_subagent("context-digest", {}), ContextDigestAgent)


def test_an_unknown_name_lists_the_registered_ones(acme: Path) -> None:
    with pytest.raises(PluginError, match="unknown sub-agent plug-in 'shot'") as info:
        load_subagent("shot", {})
    assert "context-digest" in str(info.value) and "shout" in str(info.value)
    assert info.value.plugin == "shot" and not info.value.retriable


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("shout-missing", r"'shout-missing' \(acme_agents_gone:make\) does not load"),
        ("shout-refuses", "'shout-refuses' refused its options .*needs an index option"),
        ("shout-int", "'shout-int' .* returned a int, not a sub-agent"),
    ],
)
def test_a_broken_plugin_is_named(acme: Path, name: str, problem: str) -> None:
    with pytest.raises(PluginError, match=problem):
        load_subagent(name, {})


def test_one_name_with_two_targets_is_refused(acme: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-site"
    other.mkdir()
    install_dist(other, "rival", "rival_agents", ACME, "shout = rival_agents:make\n")
    sys.path.insert(0, str(other))
    try:
        with pytest.raises(PluginError, match=r"registered more than once.*rival_agents:make"):
            load_subagent("shout", {})
    finally:
        sys.path.remove(str(other))


def test_a_malformed_plugin_table_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "pyproject.toml"
    bad.write_text('[project.entry-points."podium.subagents"]\nx = 3\n')
    with pytest.raises(PluginError, match=r"pyproject\.toml.*must map names"):
        entry_points_of(bad)


async def test_the_reference_plugin_digests_exactly_its_context() -> None:
    agent = load_subagent("context-digest", {})
    req = request("q1")
    report = await agent.execute(req)
    digest = context_digest(req.context)
    assert report.success and report.output == f"search:q:{digest}"
    (call,) = report.tool_calls
    assert call.name == "context.sha256" and call.result_digest == digest
    assert 0 < call.started_at <= call.ended_at
    assert (await agent.execute(request("q2"))).output != report.output
    with pytest.raises(PluginError, match="context-digest takes no options, got k"):
        load_subagent("context-digest", {"k": "1"})
