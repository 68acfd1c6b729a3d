"""The Triton Deployment and Service in k8s/, as rendered by kustomize: CPU instances in dev,
GPU with TensorRT in prod, and the init container's command writes the config each expects."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from podium.serving.contract import render_policy_config
from podium.serving.export import default_swarm_signature
from podium.serving.pbtxt import read_model_config

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("PODIUM_CACHE", Path.home() / ".cache" / "podium"))


def _render(overlay: str) -> dict[tuple[str, str], dict[str, Any]]:
    tool = shutil.which("kustomize") or str(CACHE / "go-bin" / "kustomize")
    if not Path(tool).exists():
        if os.environ.get("CI") == "true":
            pytest.fail("kustomize is missing: scripts/test.sh installs it")
        pytest.skip("kustomize not installed (scripts/test.sh installs it)")
    out = subprocess.run(
        [tool, "build", str(ROOT / "k8s" / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_triton_deployment_serves_the_repository_over_grpc(overlay: str) -> None:
    docs = _render(overlay)
    service = docs[("Service", "triton")]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports["grpc"] == 8001 and ports["http"] == 8000
    pod = docs[("Deployment", "triton")]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (triton,) = pod["containers"]
    args = triton["args"]
    assert "--model-control-mode=explicit" in args
    assert "--model-repository=/models" in args
    assert "--grpc-port=8001" in args and "--http-port=8000" in args
    probe = triton["readinessProbe"]["httpGet"]
    container_ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
    assert probe["path"] == "/v2/health/ready" and container_ports[probe["port"]] == 8000
    gpu = overlay == "prod"
    assert triton["resources"]["limits"].get("nvidia.com/gpu") == ("1" if gpu else None)
    assert triton["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m for m in triton["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in docs
    # The init container seeds the config with the project image (renamed by kustomize).
    (init,) = pod["initContainers"]
    assert init["image"].startswith("ghcr.io/podium-rl/podium:")
    assert init["command"][:4] == ["python", "-m", "podium.serving.export", "ensure-config"]
    assert ("--cpu" in init["command"]) is not gpu


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_init_container_command_writes_a_valid_config(overlay: str, tmp_path: Path) -> None:
    """The command the init container runs, run here: prod's writes the committed (GPU)
    config, dev's the CPU one (no GPU on a laptop cluster)."""
    docs = _render(overlay)
    (init,) = docs[("Deployment", "triton")]["spec"]["template"]["spec"]["initContainers"]
    command = [sys.executable if c == "python" else c for c in init["command"]]
    command[command.index("--repository") + 1] = str(tmp_path)
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "swarm_policy" / "config.pbtxt").read_text()
    gpu = overlay == "prod"
    expected = render_policy_config("swarm_policy", default_swarm_signature(), gpu=gpu)
    assert written == expected
    if gpu:
        assert written == (ROOT / "triton_models" / "swarm_policy" / "config.pbtxt").read_text()
    assert read_model_config(tmp_path / "swarm_policy").platform == "onnxruntime_onnx"
    # A second run checks and keeps the file.
    again = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    assert again.returncode == 0 and Path(again.stdout.strip()).read_text() == written
