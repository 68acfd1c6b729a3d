"""The kustomize base and overlays render, and every workload follows the operating rules:
resource requests and limits, health probes, non-root, no privilege escalation."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("PODIUM_CACHE", Path.home() / ".cache" / "podium"))


def _kustomize() -> str:
    found = shutil.which("kustomize") or str(CACHE / "go-bin" / "kustomize")
    if not Path(found).exists():
        if os.environ.get("CI") == "true":
            pytest.fail(
                "kustomize is missing: scripts/test.sh installs it under ~/.cache/podium/go-bin"
            )
        pytest.skip("kustomize not installed (scripts/test.sh installs it)")
    return found


def _render(overlay: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [_kustomize(), "build", str(ROOT / "k8s" / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_workloads_follow_operating_rules(overlay: str) -> None:
    docs = _render(overlay)
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    names = {d["metadata"]["name"] for d in deployments}
    assert {"orchestrator", "subagent", "reward", "learner"} <= names
    for dep in deployments:
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, dep["metadata"]["name"]
        for c in pod["containers"]:
            where = f"{dep['metadata']['name']}/{c['name']}"
            assert c["resources"]["limits"]["memory"], where
            assert c["resources"]["requests"]["cpu"], where
            assert "readinessProbe" in c and "livenessProbe" in c, where
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, where
    assert all(d["metadata"].get("namespace") == "podium" for d in docs if d["kind"] != "Namespace")


def test_overlays_differ_where_they_should() -> None:
    dev = {(d["kind"], d["metadata"]["name"]): d for d in _render("dev")}
    prod = {(d["kind"], d["metadata"]["name"]): d for d in _render("prod")}
    assert dev[("KafkaNodePool", "dual-role")]["spec"]["replicas"] == 1
    assert prod[("KafkaNodePool", "dual-role")]["spec"]["replicas"] == 3
    assert (
        prod[("Deployment", "subagent")]["spec"]["replicas"]
        > dev[("Deployment", "subagent")]["spec"]["replicas"]
    )
    orch = prod[("Service", "orchestrator")]
    assert orch["spec"]["ports"][0]["port"] == 50051
