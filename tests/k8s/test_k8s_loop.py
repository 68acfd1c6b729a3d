"""The learning loop as the manifests wire it: the learner (one pod, its own volume) trains in
swarm mode and exports every version into the model repository the V2 server reads; the
orchestrators decide with the learned policy through that server (cpls until the rollout
names a learned version) and can read every file an announcement points to; the rollout
controller can read the weights of its candidates. Dev is CPU-only with ReadWriteOnce volumes;
prod puts Triton and the learner on GPUs."""

from __future__ import annotations

from typing import Any

import pytest
from test_kustomize import (
    OVERLAYS,
    _by_name,
    _claim,
    _container,
    _env,
    _mounts,
    _pod,
    _render,
    _workloads,
)

from learner_svc.rollout.config import ControllerSettings
from podium.serving.endpoint import parse_backend


def _flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return value


def _mounted_claim(workload: dict[str, Any], path: str) -> tuple[str, bool]:
    """(claim, read-only) of the PersistentVolumeClaim mounted at ``path`` or a parent of it."""
    mounts = _mounts(workload, _container(workload))
    (mount,) = [m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")]
    volume = mounts[mount]
    claim = _claim(volume) or volume["claimTemplate"]["metadata"]["name"]
    return claim, bool(volume["readOnly"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_learner_is_one_pod_training_in_swarm_mode_on_its_own_volume(overlay: str) -> None:
    docs = _render(overlay)
    (learner,) = _by_name(docs, "StatefulSet").values()
    assert learner["metadata"]["name"] == "learner"
    assert "learner" not in _by_name(docs, "Deployment")
    assert learner["spec"]["replicas"] == 1
    assert learner["spec"]["serviceName"] in _by_name(docs, "Service")
    env = _env(_container(learner))
    assert _container(learner)["command"] == ["python", "-m", "learner_svc"]
    assert env["PODIUM_LEARNER_MODE"] == "swarm"
    # The checkpoint lives on the claim template: the pod's own volume, kept across restarts.
    claim, read_only = _mounted_claim(learner, env["PODIUM_LEARNER_CHECKPOINT_DIR"])
    (template,) = learner["spec"]["volumeClaimTemplates"]
    assert claim == template["metadata"]["name"] and not read_only
    assert template["spec"]["accessModes"] == ["ReadWriteOnce"]
    # Artifacts and exports go to shared claims, written by the learner alone.
    for var in ("PODIUM_LEARNER_ARTIFACTS", "PODIUM_MODEL_REPOSITORY"):
        claim, read_only = _mounted_claim(learner, env[var])
        assert claim in _by_name(docs, "PersistentVolumeClaim") and not read_only, var


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_learner_exports_into_the_repository_the_v2_server_serves(overlay: str) -> None:
    docs = _render(overlay)
    workloads = _workloads(docs)
    learner, triton = workloads["learner"], workloads["triton"]
    repository = _env(_container(learner))["PODIUM_MODEL_REPOSITORY"]
    exported_to, _ = _mounted_claim(learner, repository)
    server = _container(triton)
    served_from = _flag(server["args"], "model-repository")
    claim, read_only = _mounted_claim(triton, served_from)
    assert claim == exported_to and read_only
    # ...which Triton loads on command (repository API), and reports ready while the
    # repository has no version yet, so the orchestrators can start and produce the first.
    assert _flag(server["args"], "model-control-mode") == "explicit"
    assert _flag(server["args"], "strict-readiness") == "false"
    # The init container writes config.pbtxt into that same claim.
    (init,) = _pod(triton)["initContainers"]
    path = init["command"][init["command"].index("--repository") + 1]
    mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod(triton)["volumes"]}
    assert _claim(volumes[mounts[path]]) == exported_to


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_orchestrator_decides_through_the_v2_server_with_cpls_as_cold_start(overlay: str) -> None:
    docs = _render(overlay)
    workloads = _workloads(docs)
    orchestrator = workloads["orchestrator"]
    env = _env(_container(orchestrator))
    assert env["PODIUM_POLICY"] == "learned"
    address = parse_backend(env["PODIUM_POLICY_BACKEND"])
    assert address is not None, "not a v2:// backend"
    host, port = address.rsplit(":", 1)
    service = _by_name(docs, "Service")[host]
    (grpc,) = [p for p in service["spec"]["ports"] if p["port"] == int(port)]
    triton_ports = {p["name"]: p["containerPort"] for p in _container(workloads["triton"])["ports"]}
    assert service["spec"]["selector"] == workloads["triton"]["spec"]["selector"]["matchLabels"]
    assert triton_ports[grpc["targetPort"]] == int(
        _flag(_container(workloads["triton"])["args"], "grpc-port")
    )
    # Cold start: the rollout decides, and before any rollout the live version is cpls.
    assert env["PODIUM_ROLLOUT"] == "controlled"
    rollout_env = _env(_container(workloads["rollout"]))
    cold = rollout_env.get("PODIUM_ROLLOUT_COLD_START", ControllerSettings().cold_start)
    assert cold == "rules:cpls"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_readers_mount_what_announcements_point_to_at_the_learners_paths(overlay: str) -> None:
    """An announcement carries the learner's paths (weights ``uri``, ONNX ``onnx_uri``); the
    orchestrator hashes both before loading, the rollout controller loads candidates'
    weights: they must see the same claims at the same paths, read-only."""
    workloads = _workloads(_render(overlay))
    learner_env = _env(_container(workloads["learner"]))
    readers = {
        "orchestrator": ("PODIUM_LEARNER_ARTIFACTS", "PODIUM_MODEL_REPOSITORY"),
        "rollout": ("PODIUM_LEARNER_ARTIFACTS",),
    }
    for reader, variables in readers.items():
        for var in variables:
            path = learner_env[var] + "/swarm_policy/1/file"
            written, _ = _mounted_claim(workloads["learner"], path)
            claim, read_only = _mounted_claim(workloads[reader], path)
            assert (claim, read_only) == (written, True), (reader, var)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_cold_start_job_publishes_as_the_learner_and_acts_as_an_operator(overlay: str) -> None:
    """The bootstrap Job writes the initial version where the learner writes its versions (the
    same claims at the same paths, writable), signs with the learner's key, logs in to Kafka as
    the learner's user, and calls RolloutService with an operator token over TLS; a setting
    the Job names is a setting the learner has (its paths are the learner's); and the
    orchestrators explore, so the loop goes on without a trainer client."""
    docs = _render(overlay)
    workloads = _workloads(docs)
    (job,) = [d for d in docs if d["kind"] == "Job"]
    container = _container(job)
    assert container["command"] == ["podium", "rollout", "bootstrap"]
    env, learner_env = _env(container), _env(_container(workloads["learner"]))
    for var in ("PODIUM_LEARNER_ARTIFACTS", "PODIUM_MODEL_REPOSITORY", "PODIUM_POLICY_SIGNING_KEY"):
        assert env[var] == learner_env[var], var
    for var in ("PODIUM_LEARNER_ARTIFACTS", "PODIUM_MODEL_REPOSITORY"):
        path = learner_env[var] + "/swarm_policy/1/file"
        assert _mounted_claim(job, path) == (_mounted_claim(workloads["learner"], path)[0], False)
    volumes = {v["name"]: v for v in _pod(job)["volumes"]}
    mounts = _mounts(job, container)
    key_dir = env["PODIUM_POLICY_SIGNING_KEY"].rsplit("/", 1)[0]
    assert mounts[key_dir]["secret"]["secretName"] == "podium-policy-signing-key"
    secrets = {v["name"]: v.get("secret", {}).get("secretName") for v in volumes.values()}
    token_dir = env["PODIUM_TOKEN_FILE"].rsplit("/", 1)[0]
    assert mounts[token_dir]["secret"]["secretName"] == "podium-bootstrap"
    assert env["PODIUM_GRPC_CA"].startswith(token_dir + "/")
    assert "podium-bootstrap" in secrets.values()
    bus = next(e for e in container["env"] if e["name"] == "PODIUM_BUS")["value"]
    assert "sasl_username=learner&" in bus
    rollout = _by_name(docs, "Service")["rollout"]["spec"]["ports"]
    assert env["PODIUM_ROLLOUT_ADDRESS"] in {f"rollout:{p['port']}" for p in rollout}
    # From then on the loop needs no trainer client: the orchestrators sample a share of live
    # sessions (the learner trains only on sampled ones).
    share = float(_env(_container(workloads["orchestrator"]))["PODIUM_EXPLORE_SHARE"])
    assert 0 < share <= (0.5 if overlay == "dev" else 0.1), share


def _gpu_requests(docs: list[dict[str, Any]]) -> dict[str, str]:
    out = {}
    for name, workload in _workloads(docs).items():
        pod = _pod(workload)
        for c in pod["containers"] + pod.get("initContainers", []):
            for part in ("requests", "limits"):
                if "nvidia.com/gpu" in c["resources"].get(part, {}):
                    out[f"{name}/{c['name']}"] = c["resources"][part]["nvidia.com/gpu"]
    return out


def test_dev_runs_on_one_node_without_a_gpu() -> None:
    docs = _render("dev")
    assert _gpu_requests(docs) == {}
    for name, workload in _workloads(docs).items():
        assert "tolerations" not in _pod(workload), name
    claims = list(_by_name(docs, "PersistentVolumeClaim").values())
    claims += [
        t for s in _by_name(docs, "StatefulSet").values() for t in s["spec"]["volumeClaimTemplates"]
    ]
    for claim in claims:
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"], claim["metadata"]["name"]
    # Triton's config declares CPU instances (no TensorRT on a GPU that is not there).
    (init,) = _pod(_workloads(docs)["triton"])["initContainers"]
    assert "--cpu" in init["command"]
    assert (
        _env(_container(_workloads(docs)["learner"])).get("PODIUM_LEARNER_DEVICE", "cpu") == "cpu"
    )


def test_prod_serves_and_trains_on_gpus_with_shared_volumes() -> None:
    docs = _render("prod")
    assert _gpu_requests(docs) == {"triton/triton": "1", "learner/learner": "1"}
    workloads = _workloads(docs)
    (init,) = _pod(workloads["triton"])["initContainers"]
    assert "--cpu" not in init["command"]  # GPU instances with the TensorRT accelerator
    mounts = {m["mountPath"] for m in _container(workloads["triton"])["volumeMounts"]}
    assert "/cache/tensorrt" in mounts  # trt_engine_cache_path of the GPU config.pbtxt
    assert _env(_container(workloads["learner"]))["PODIUM_LEARNER_DEVICE"] == "cuda"
    for claim in _by_name(docs, "PersistentVolumeClaim").values():
        # Pods on several nodes read them.
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"], claim["metadata"]["name"]
    # One Triton: every orchestrator loads each version through the one Service.
    assert workloads["triton"]["spec"]["replicas"] == 1
