"""The pool spec says who runs each agent (``runner:``): simulated by default, a plug-in by
entry-point name with its options, or an external worker; every mistake names the agent and
the field."""

from __future__ import annotations

from typing import Any

import pytest

from podium.envs.swarm.spec import (
    RUNNER_EXTERNAL,
    RUNNER_PLUGIN,
    RUNNER_SIMULATED,
    AgentRunner,
    default_pool,
    parse_pool,
)
from podium.errors import SpecError

PROFILE = {"speed": 1.0, "success": 0.9, "noise": 0.1}


def pool_with(**agent: Any) -> dict[str, Any]:
    return {"agents": [{"name": "a", "kinds": {"search": PROFILE}, **agent}]}


def test_runners_are_parsed_with_their_plugin_and_options() -> None:
    pool = parse_pool(
        {
            "agents": [
                {"name": "sim", "kinds": {"search": PROFILE}},
                {
                    "name": "bm25",
                    "kinds": {"search": PROFILE},
                    "runner": "plugin",
                    "plugin": "bm25-search",
                    "options": {"index": "/srv/index", "k": 10},
                },
                {"name": "go", "kinds": {"search": PROFILE}, "runner": "external"},
            ]
        }
    )
    sim, bm25, go = pool.agents
    assert sim.runner == AgentRunner(kind=RUNNER_SIMULATED)
    assert bm25.runner == AgentRunner(
        kind=RUNNER_PLUGIN, plugin="bm25-search", options={"index": "/srv/index", "k": "10"}
    )
    assert go.runner == AgentRunner(kind=RUNNER_EXTERNAL)
    # Planners read the advertisement whatever runs the work: the runner goes along.
    assert pool.advertised().agents[1].runner.plugin == "bm25-search"


def test_the_shipped_pools_stay_simulated() -> None:
    assert {a.runner.kind for a in default_pool().agents} == {RUNNER_SIMULATED}


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ({"runner": "docker"}, "agent 'a'.runner must be one of simulated, plugin, external"),
        ({"runner": "plugin"}, "agent 'a'.plugin must be a non-empty string"),
        ({"runner": "plugin", "plugin": ""}, "agent 'a'.plugin must be a non-empty string"),
        ({"plugin": "bm25-search"}, r"agent 'a'.plugin is only for runner: plugin"),
        ({"runner": "external", "options": {}}, "agent 'a'.options is only for runner: plugin"),
        (
            {"runner": "plugin", "plugin": "p", "options": ["index"]},
            "agent 'a'.options must be a mapping",
        ),
        (
            {"runner": "plugin", "plugin": "p", "options": {"index": {"path": "x"}}},
            "agent 'a'.options.index must be a string or a number",
        ),
        (
            {"runner": "plugin", "plugin": "p", "options": {"cache": True}},
            "agent 'a'.options.cache must be a string or a number",
        ),
        (
            {"runner": "external", "true": {"search": {"speed": 2.0}}},
            "agent 'a'.true is only for simulated agents",
        ),
    ],
)
def test_mistakes_name_the_agent_and_the_field(agent: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        parse_pool(pool_with(**agent), source="pool.yaml")
    assert str(info.value).startswith("pool.yaml: ")
