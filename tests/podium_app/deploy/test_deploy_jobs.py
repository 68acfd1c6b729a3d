"""Jobs in the local deployment (podium_app.deploy): a Job is one pod run to completion, its
containers planned apart from the long-running ones; a Job that fails fails the deployment
with its output; a container that runs the ``podium`` CLI is checked against the CLI's
settings too (and only it). No broker: processes of this interpreter."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from podium.errors import ConfigError
from podium_app.deploy.checks import read_variables, runs_cli, unread_variables
from podium_app.deploy.local import DeploymentError, LocalDeployment
from podium_app.deploy.manifest import Container, Objects, pods
from podium_app.deploy.plan import LocalContainer, Plan
from podium_app.deploy.standins import OperatorFiles


def _job(parallelism: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "bootstrap", "namespace": "podium"},
        "spec": {
            "parallelism": parallelism,
            "template": {
                "metadata": {"labels": {"app": "bootstrap"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "bootstrap", "image": "podium", "command": ["podium", "x"]}
                    ],
                },
            },
        },
    }


def test_a_job_is_one_pod() -> None:
    (pod,) = pods(Objects.of([_job()]))
    assert (pod.name, pod.kind, pod.workload) == ("bootstrap-0", "Job", "bootstrap")
    assert pod.containers[0].argv == ("podium", "x")
    with pytest.raises(ConfigError, match="Job bootstrap: parallelism 2"):
        pods(Objects.of([_job(parallelism=2)]))


def _local(tmp_path: Path, name: str, code: str) -> LocalContainer:
    c = Container(
        pod=f"{name}-0",
        workload=name,
        name=name,
        image="podium",
        argv=(sys.executable, "-c", code),
        env=(),
        env_names=(),
        ports={},
        probes=(),
        mounts=(),
    )
    return LocalContainer(c, c.argv, {"PATH": "/usr/bin:/bin"}, (), tmp_path)


def _plan(tmp_path: Path, jobs: tuple[LocalContainer, ...]) -> Plan:
    return Plan(Objects.of([]), (), (), (), {}, (), OperatorFiles(), tmp_path, jobs)


async def test_jobs_run_to_completion_and_a_failed_one_fails_with_its_output(
    tmp_path: Path,
) -> None:
    ok = _local(tmp_path, "good", "print('done')")
    bad = _local(
        tmp_path, "bad", "import sys; print('no controller at rollout:50061'); sys.exit(3)"
    )
    deployment = LocalDeployment(_plan(tmp_path, (ok,)))
    await deployment.start()
    assert set(await deployment.wait_jobs(30.0)) == {"good-0/good"}
    assert deployment.exited() == {}  # a Job that ended is no service that died
    await deployment.stop()

    deployment = LocalDeployment(_plan(tmp_path, (ok, bad)))
    await deployment.start()
    with pytest.raises(DeploymentError) as caught:
        await deployment.wait_jobs(30.0)
    await deployment.stop()
    assert caught.value.stage == "jobs"
    (problem,) = caught.value.problems
    assert problem.startswith("job bad-0/bad exited 3: ")
    assert "no controller at rollout:50061" in problem


async def test_a_job_that_does_not_finish_is_killed_and_named(tmp_path: Path) -> None:
    slow = _local(tmp_path, "slow", "import time; time.sleep(60)")
    deployment = LocalDeployment(_plan(tmp_path, (slow,)))
    await deployment.start()
    with pytest.raises(DeploymentError, match="job slow-0/slow did not finish within 1s"):
        await deployment.wait_jobs(1.0)
    await deployment.stop()


def test_cli_containers_are_checked_against_the_cli_settings_too() -> None:
    assert runs_cli(("podium", "rollout", "bootstrap"))
    assert runs_cli(("/usr/local/bin/podium", "rollout"))
    assert not runs_cli(("python", "-m", "learner_svc"))
    service, cli = read_variables(), read_variables(top_floor=True)
    # The bootstrap's and the rollout client's settings: read by the CLI, not by a service.
    for name in ("PODIUM_BOOTSTRAP_INIT", "PODIUM_TOKEN_FILE", "PODIUM_ROLLOUT_ADDRESS"):
        assert name in cli and name not in service, name
    assert service <= cli
    c = Container(
        pod="bootstrap-0",
        workload="bootstrap",
        name="bootstrap",
        image="podium",
        argv=("podium", "rollout", "bootstrap"),
        env=(),
        env_names=("PODIUM_BOOTSTRAP_INIT", "PODIUM_BOOTSTRAP_INITT"),
        ports={},
        probes=(),
        mounts=(),
    )
    assert unread_variables([c], cli) == [
        "bootstrap-0/bootstrap: PODIUM_BOOTSTRAP_INITT is set but read by no config (not an "
        "env() field of podium/ or a service, nor a standard OTEL_* variable)"
    ]
