"""Policy signing keys in k8s/base: the learner gets the private key, orchestrators the trusted
public keys, each from its own Secret (placeholders until an operator puts real keys in), and
the settings point into the mounts."""

from __future__ import annotations

from typing import Any

import pytest
from test_kustomize import _render, _secrets, _workloads

SIGNING_SECRET = "podium-policy-signing-key"
TRUSTED_SECRET = "podium-policy-trusted-keys"


def _by_name(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _mounts(dep: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(env name -> value, mount path -> volume, volume -> secret) over a pod's containers."""
    pod = dep["spec"]["template"]["spec"]
    containers = pod["containers"]
    env = {e["name"]: e.get("value", "") for c in containers for e in c.get("env", [])}
    mounts = {m["mountPath"]: m["name"] for c in containers for m in c.get("volumeMounts", [])}
    secrets = {
        v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v
    }
    return env, mounts, secrets


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_learner_signs_orchestrator_verifies_with_separate_secrets(overlay: str) -> None:
    docs = _render(overlay)
    secrets = _secrets(docs)
    assert {SIGNING_SECRET, TRUSTED_SECRET} <= set(secrets)
    for name in (SIGNING_SECRET, TRUSTED_SECRET):
        assert all("REPLACE-ME" in v for v in secrets[name]["stringData"].values()), name
    deployments = _workloads(docs)  # the learner is a StatefulSet

    env, mounts, volumes = _mounts(deployments["learner"])
    key = env["PODIUM_POLICY_SIGNING_KEY"]
    (mount,) = [m for m in mounts if key.startswith(m + "/")]
    assert volumes[mounts[mount]] == SIGNING_SECRET
    assert key.rsplit("/", 1)[1] in secrets[SIGNING_SECRET]["stringData"]
    assert TRUSTED_SECRET not in volumes.values()

    env, mounts, volumes = _mounts(deployments["orchestrator"])
    assert volumes[mounts[env["PODIUM_POLICY_TRUSTED_KEYS"]]] == TRUSTED_SECRET
    # The private key goes to the learner alone.
    for name, dep in deployments.items():
        if name != "learner":
            assert SIGNING_SECRET not in _mounts(dep)[2].values(), name
