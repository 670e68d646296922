"""deploy/kuberay/: the RayJob of a sweep and its MLflow server, checked without a Kubernetes cluster.

- every core Kubernetes object (Secret, ConfigMap, PVC, Deployment, Service), and every pod template inside
  the RayJob (head, worker groups, submitter) as a Pod, against Kubernetes' own OpenAPI schemas
  (kubernetes-validate, strict: an unknown field fails);
- the RayJob against the fields KubeRay documents for ray.io/v1 (its CRD schema is not vendored here);
- the RayJob's entry point is the image's own command (docker/Dockerfile's CMD) and its overrides compose
  into a valid sweeper config, cluster.address=auto and the MLflow Service's address among them.
"""

import shlex
from pathlib import Path

import pytest
import yaml

from sweeper import config
from tests.harness import compose_cfg

REPO = Path(__file__).resolve().parents[2]
KUBERAY = REPO / "deploy" / "kuberay"
# The Kubernetes version whose schemas the core objects are checked against (kubernetes-validate ships them).
KUBERNETES = "1.33.0"

# ray.io/v1 RayJob and RayCluster fields as KubeRay's API reference names them: a misspelt key (which the
# API server would drop without a word, CRDs prune unknown fields) fails here.
RAYJOB_SPEC = {"entrypoint", "runtimeEnvYAML", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished",
               "activeDeadlineSeconds", "backoffLimit", "submitterPodTemplate", "rayClusterSpec", "submissionMode",
               "entrypointNumCpus", "entrypointNumGpus", "entrypointResources", "jobId", "metadata",
               "clusterSelector", "suspend", "submitterConfig", "managedBy", "deletionPolicy"}
RAYCLUSTER_SPEC = {"rayVersion", "headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling",
                   "autoscalerOptions", "headServiceAnnotations", "suspend", "managedBy", "gcsFaultToleranceOptions"}
HEAD_GROUP = {"rayStartParams", "template", "serviceType", "headService", "enableIngress"}
WORKER_GROUP = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template",
                "scaleStrategy", "idleTimeoutSeconds", "suspend", "numOfHosts"}


def _documents() -> list:
    docs = []
    for path in sorted(KUBERAY.glob("*.yaml")):
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _of_kind(kind: str) -> list:
    return [d for _, d in _documents() if d["kind"] == kind]


def _rayjob() -> dict:
    (job,) = _of_kind("RayJob")
    return job


def _validate(document: dict) -> list:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(document, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'/'.join(map(str, exc.path))}: {exc.message}"]
    return []


def _pods() -> dict:
    """The RayJob's pod templates, each as the Pod it becomes."""
    spec = _rayjob()["spec"]
    templates = {"head": spec["rayClusterSpec"]["headGroupSpec"]["template"], "submitter": spec["submitterPodTemplate"]}
    templates.update({g["groupName"]: g["template"] for g in spec["rayClusterSpec"]["workerGroupSpecs"]})
    return {name: {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **t.get("metadata", {})},
                   "spec": t["spec"]} for name, t in templates.items()}


def test_every_core_object_is_valid_against_the_kubernetes_schema():
    core = [(name, d) for name, d in _documents() if d["kind"] != "RayJob"]
    assert {d["kind"] for _, d in core} == {"Secret", "ConfigMap", "PersistentVolumeClaim", "Deployment", "Service"}
    for name, document in core:
        assert _validate(document) == [], f"{name}: {document['kind']} {document['metadata']['name']}"


@pytest.mark.parametrize("pod", ["head", "cpu", "gpu", "submitter"])
def test_every_pod_of_the_rayjob_is_a_valid_pod(pod):
    assert _validate(_pods()[pod]) == []


def test_the_schema_check_can_fail():
    pod = _pods()["gpu"]
    pod["spec"]["containers"][0]["resource"] = pod["spec"]["containers"][0].pop("resources")  # a typo'd key
    assert any("resource" in e for e in _validate(pod)), _validate(pod)
    (service,) = _of_kind("Service")
    service["spec"]["ports"][0]["port"] = "5000"  # a string where the schema wants an integer
    assert _validate(service) != []


def test_the_rayjob_has_the_fields_kuberay_documents():
    job = _rayjob()
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert set(spec) <= RAYJOB_SPEC, set(spec) - RAYJOB_SPEC
    assert spec["shutdownAfterJobFinishes"] is True
    assert isinstance(spec["activeDeadlineSeconds"], int) and spec["activeDeadlineSeconds"] > 0
    assert spec["backoffLimit"] == 0  # a retry would be another sweep
    # `ray job stop` and a deleted RayJob give the driver time to end the sweep KILLED (Ray's default is 3 s).
    assert int(yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"]) >= 30
    cluster = spec["rayClusterSpec"]
    assert set(cluster) <= RAYCLUSTER_SPEC, set(cluster) - RAYCLUSTER_SPEC
    assert set(cluster["headGroupSpec"]) <= HEAD_GROUP
    # KubeRay passes rayStartParams to `ray start` as --key=value: strings only.
    groups = cluster["workerGroupSpecs"]
    for params in [cluster["headGroupSpec"]["rayStartParams"], *[g["rayStartParams"] for g in groups]]:
        assert all(isinstance(v, str) for v in params.values()), params
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # trials land on the workers
    for group in groups:
        assert set(group) <= WORKER_GROUP, set(group) - WORKER_GROUP
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    gpus = {g["groupName"]: g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
            for g in groups}
    assert gpus == {"cpu": None, "gpu": "1"}


def test_every_pod_runs_the_image_with_the_clusters_token_and_one_shared_work_folder():
    images = {c["image"] for pod in _pods().values()
              for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]}
    assert len(images) == 1 and images.pop().endswith("/sweeper:0.1.0")  # one Ray and Python everywhere
    (secret,) = _of_kind("Secret")
    claims = {c["metadata"]["name"]: c for c in _of_kind("PersistentVolumeClaim")}
    for name, pod in _pods().items():
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token", name
        ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"], name
        if name != "submitter":
            mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
            volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mounts["/work"])
            claim = claims[volume["persistentVolumeClaim"]["claimName"]]
            assert claim["spec"]["accessModes"] == ["ReadWriteMany"], name  # every node, one folder
            assert pod["spec"]["securityContext"]["fsGroup"] == 10001  # the image's user writes it
    head = {e["name"]: e for e in _pods()["head"]["spec"]["containers"][0]["env"]}
    for variable in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):  # the driver's login
        assert head[variable]["valueFrom"]["secretKeyRef"]["key"] in secret["stringData"]
    assert all(v == "CHANGE-ME" or k == "MLFLOW_TRACKING_USERNAME" for k, v in secret["stringData"].items())


def _dockerfile_cmd() -> list:
    import json

    lines = (REPO / "docker" / "Dockerfile").read_text().splitlines()
    (cmd,) = [line for line in lines if line.startswith("CMD ")]
    return json.loads(cmd[len("CMD "):])


def test_the_entrypoint_is_the_images_command_with_overrides_sweeper_accepts():
    words = shlex.split(_rayjob()["spec"]["entrypoint"])
    # `exec`: the driver replaces Ray's `sh -c`, so `ray job stop` waits for the sweep itself (docs/cluster.md)
    assert words.pop(0) == "exec"
    command = _dockerfile_cmd()
    assert words[: len(command)] == command == ["python", "-m", "sweeper"]
    overrides = words[len(command):]
    cfg = config.load(compose_cfg(*overrides))  # raises ConfigError naming a bad key or value
    assert cfg.cluster.address == "auto" and cfg.cluster.ray_dir.startswith("/work/")
    # The tracking server is the MLflow Service, at its port.
    (service,) = _of_kind("Service")
    assert cfg.tracking.uri == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    (deployment,) = _of_kind("Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--serve-artifacts" in container["command"][-1]  # the driver reaches artifacts through the server
    assert {p["containerPort"] for p in container["ports"]} == {5000}


def test_the_secret_placeholder_is_refused_where_it_would_be_used():
    import subprocess

    (deployment,) = _of_kind("Deployment")
    guards = [deployment["spec"]["template"]["spec"]["containers"][0]["command"][-1].split(" exec ")[0],
              _pods()["head"]["spec"]["initContainers"][0]["command"][-1]]
    for guard in guards:
        for value, refused in (("CHANGE-ME", True), ("3f9a0c", False)):
            run = subprocess.run(["sh", "-c", guard], env={"PATH": "/usr/bin:/bin", "SECRET": value},
                                 capture_output=True, text=True)
            assert (run.returncode != 0) == refused and ("CHANGE-ME placeholder" in run.stderr) == refused, guard
