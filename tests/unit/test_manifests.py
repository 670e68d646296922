"""deploy/kuberay/: the RayJob of a sweep and its MLflow server, checked without a Kubernetes cluster.

- every core Kubernetes object (Secret, ConfigMap, PVC, Deployment, Service), and every pod template inside
  the RayJob (head, worker groups, submitter) as a Pod, against Kubernetes' own OpenAPI schemas
  (kubernetes-validate, strict: an unknown field fails);
- every RayJob and RayCluster (and the RayJob's cluster as a RayCluster) against KubeRay's own CRD schema,
  ray.io/v1's openAPIV3Schema, read from ../shared/vendor/kuberay/ beside the clone, refusing an unknown
  field as `kubectl apply --validate=strict` does;
- GPU pods sized by GPUs per node, the head sized for the driver;
- the RayJob's entry point is the image's own command (docker/Dockerfile's CMD) and its overrides compose
  into a valid sweeper config, cluster.address=auto and the MLflow Service's address among them.
"""

import copy
import os
import re
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
# KubeRay's CRDs, unmodified, in ../shared beside the clone (never copied into it; a git worktree kept in a
# folder beside the clone finds them one level up): where they are, and where to get them.
CRDS = next((folder / "shared" / "vendor" / "kuberay" for folder in (REPO.parent, REPO.parent.parent)
             if (folder / "shared" / "vendor" / "kuberay").is_dir()), REPO.parent / "shared" / "vendor" / "kuberay")
CRD_FILES = {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
KUBERAY_COMMIT = "feeaf72facab4881ba2b179248bb67315634e229"  # the vendored copy's (its README.md)
# .ci/run sets it: there ../shared is beside the clone, and missing CRDs are a failure, not a skip.
REQUIRE_CRDS = os.environ.get("SWEEPER_REQUIRE_KUBERAY_CRDS") == "1"


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


def _kuberay_resources() -> list:
    """Every RayJob and RayCluster the project ships (deploy/, docker/), as (file, document)."""
    found = []
    for path in sorted([*(REPO / "deploy").rglob("*.y*ml"), *(REPO / "docker").rglob("*.y*ml")]):
        found += [(str(path.relative_to(REPO)), d) for d in yaml.safe_load_all(path.read_text())
                  if isinstance(d, dict) and d.get("kind") in CRD_FILES]
    return found


def _as_raycluster(job: dict) -> dict:
    """The RayJob's cluster as the RayCluster KubeRay creates from it."""
    return {"apiVersion": job["apiVersion"], "kind": "RayCluster", "metadata": {"name": job["metadata"]["name"]},
            "spec": copy.deepcopy(job["spec"]["rayClusterSpec"])}


def _strict(node: dict) -> dict:
    """A CRD's schema node with unknown fields refused, as the API server's strict field validation does.

    A CRD's structural schema names every field of an object that has `properties`; the API server refuses
    any other under strict field validation (kubectl's default, --validate=strict) and drops it otherwise.
    The schema says so with no `additionalProperties: false` that jsonschema would read: it is added here.
    Left open: an object that keeps unknown fields (x-kubernetes-preserve-unknown-fields) or embeds a whole
    resource (x-kubernetes-embedded-resource), neither of which occurs in ray.io/v1 at the vendored commit;
    a map (its `additionalProperties` given); an object without `properties` (the resource's own metadata,
    checked apart as ObjectMeta). A pod template's metadata is closed: the CRD names its five fields. An
    int-or-string is an `anyOf` of the two types, read by jsonschema as it is; OpenAPI's `nullable`
    becomes JSON Schema's null type."""
    node = dict(node)
    if "properties" in node:
        node["properties"] = {name: _strict(field) for name, field in node["properties"].items()}
        keeps_unknown = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-embedded-resource")
        if "additionalProperties" not in node and not keeps_unknown:
            node["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), dict):
            node[key] = _strict(node[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            node[key] = [_strict(option) for option in node[key]]
    if node.get("nullable"):
        node["type"] = [node["type"], "null"]
    return node


def _cel_not_evaluated(validator, rules, instance, schema):
    """A field guarded by CEL rules (x-kubernetes-validations), which the API server evaluates and jsonschema
    cannot: refused here, so that a manifest that sets one has its rules checked by hand, not passed unseen."""
    import jsonschema

    yield jsonschema.ValidationError(
        f"guarded by CEL rules this check does not evaluate: {'; '.join(r['message'] for r in rules)}")


@pytest.fixture(scope="module")
def kuberay() -> dict:
    """kind -> (apiVersion, a jsonschema validator of KubeRay's ray.io/v1 schema of that kind, made strict)."""
    import jsonschema

    missing = [name for name in CRD_FILES.values() if not (CRDS / name).is_file()]
    if missing:
        where = (f"KubeRay's CRDs {', '.join(missing)} are not in {CRDS}: copy them there from "
                 f"github.com/ray-project/kuberay, ray-operator/config/crd/bases/, at commit {KUBERAY_COMMIT}")
        if REQUIRE_CRDS:
            pytest.fail(f"SWEEPER_REQUIRE_KUBERAY_CRDS=1 (.ci/run) but {where}")
        pytest.skip(where)
    strict = jsonschema.validators.extend(jsonschema.Draft4Validator, {"x-kubernetes-validations": _cel_not_evaluated})
    # 2.3 MB of YAML: libyaml reads the RayJob CRD in 0.3 s, PyYAML's own loader in 1.7 s.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    validators = {}
    for kind, name in CRD_FILES.items():
        crd = yaml.load((CRDS / name).read_text(), Loader=loader)
        assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == kind, name
        (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        validators[kind] = (f"{crd['spec']['group']}/v1", strict(_strict(v1["schema"]["openAPIV3Schema"])))
    return validators


def _kuberay_problems(document: dict, kuberay: dict) -> list:
    """Where `document` breaks KubeRay's schema of its kind, one line each (path: message). Its own metadata,
    left open by the CRD (the API server checks it as any object's ObjectMeta), is checked as a core object's."""
    api_version, validator = kuberay[document["kind"]]
    found = [] if document["apiVersion"] == api_version else [
        f"apiVersion: {document['apiVersion']!r}, not {api_version}"]
    found += sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document))
    return found + _validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": document["metadata"]})


def test_every_rayjob_and_raycluster_passes_kuberays_own_schema(kuberay):
    shipped = _kuberay_resources()
    # What is shipped, found by kind: a RayJob or RayCluster added to deploy/ or docker/ is checked too.
    assert [(name, d["kind"]) for name, d in shipped] == [("deploy/kuberay/rayjob.yaml", "RayJob")]
    for name, document in shipped + [("the RayJob's rayClusterSpec", _as_raycluster(_rayjob()))]:
        assert _kuberay_problems(document, kuberay) == [], f"{name}: {document['kind']}"
    assert KUBERAY_COMMIT in (CRDS / "README.md").read_text()  # the commit the skip line names is the vendored one


def _misspelt_key(cluster):
    group = cluster["workerGroupSpecs"][0]
    group["replcas"] = group.pop("replicas")


def _wrong_type(cluster):
    cluster["workerGroupSpecs"][0]["replicas"] = "two"


def _number_for_ray_start(cluster):
    cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0  # KubeRay passes them to `ray start` as strings


def _misspelt_pod_field(cluster):
    container = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    container["resource"] = container.pop("resources")


def _misspelt_template_label(cluster):
    metadata = cluster["workerGroupSpecs"][1]["template"]["metadata"]
    metadata["label"] = metadata.pop("labels")


def _cel_guarded(cluster):
    cluster["managedBy"] = "ray.io/kuberay-operator"


MUTATIONS = [  # what each does to a rayClusterSpec, and the one problem the check must then name
    (_misspelt_key, "workerGroupSpecs/0: Additional properties are not allowed ('replcas' was unexpected)"),
    (_wrong_type, "workerGroupSpecs/0/replicas: 'two' is not of type 'integer'"),
    (_number_for_ray_start, "headGroupSpec/rayStartParams/num-cpus: 0 is not of type 'string'"),
    (_misspelt_pod_field, "containers/0: Additional properties are not allowed ('resource' was unexpected)"),
    (_misspelt_template_label, "template/metadata: Additional properties are not allowed ('label' was unexpected)"),
    (_cel_guarded, "managedBy: guarded by CEL rules this check does not evaluate: the managedBy field is immutable;"),
]


@pytest.mark.parametrize("kind", ["RayJob", "RayCluster"])
@pytest.mark.parametrize("mutate, expected", [pytest.param(m, e, id=m.__name__[1:]) for m, e in MUTATIONS])
def test_the_kuberay_schema_check_fails_on_a_broken_manifest(kuberay, kind, mutate, expected):
    job = copy.deepcopy(_rayjob())
    document = job if kind == "RayJob" else _as_raycluster(job)
    mutate(document["spec"]["rayClusterSpec"] if kind == "RayJob" else document["spec"])
    problems = _kuberay_problems(document, kuberay)
    assert len(problems) == 1 and expected in problems[0], problems


def test_the_kuberay_schema_check_fails_on_a_wrong_api_version_and_a_misspelt_metadata_field(kuberay):
    job = copy.deepcopy(_rayjob())
    job["apiVersion"] = "ray.io/v1alpha1"
    job["metadata"]["label"] = job["metadata"].pop("labels")
    problems = _kuberay_problems(job, kuberay)
    assert problems[0] == "apiVersion: 'ray.io/v1alpha1', not ray.io/v1" and len(problems) == 2, problems
    assert "label" in problems[1], problems


def test_the_rayjob_ends_with_its_sweep():
    spec = _rayjob()["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["activeDeadlineSeconds"] > 0
    assert spec["backoffLimit"] == 0  # a retry would be another sweep
    # `ray job stop` and a deleted RayJob give the driver time to end the sweep KILLED (Ray's default is 3 s).
    assert int(yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"]) >= 30
    for group in spec["rayClusterSpec"]["workerGroupSpecs"]:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]


def _gib(quantity: str) -> float:
    """A memory quantity in GiB (the binary suffixes these manifests use)."""
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi|Ti)", quantity).groups()
    return int(number) * {"Mi": 1 / 1024, "Gi": 1, "Ti": 1024}[unit]


def test_a_gpu_pod_holds_a_whole_nodes_gpus_sized_per_gpu():
    groups = {g["groupName"]: g for g in _rayjob()["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    assert "nvidia.com/gpu" not in groups["cpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    gpu = groups["gpu"]
    resources = gpu["template"]["spec"]["containers"][0]["resources"]
    gpus = int(resources["limits"]["nvidia.com/gpu"])
    assert gpus == 8  # a node's GPUs in one pod, not one GPU per pod
    assert gpu["rayStartParams"]["num-gpus"] == "8"  # what Ray offers is what the pod holds
    # Requests equal to limits (Guaranteed QoS): a pod whose points are timed gets its CPUs to itself.
    assert resources["requests"] == resources["limits"]
    # Per GPU: 8 CPUs, 64 GiB of memory, 16 GiB of /dev/shm (the comment above the group in rayjob.yaml).
    assert int(resources["limits"]["cpu"]) == 8 * 8
    assert _gib(resources["limits"]["memory"]) == 64 * 8
    (shm,) = [v for v in gpu["template"]["spec"]["volumes"] if v["name"] == "shm"]
    assert _gib(shm["emptyDir"]["sizeLimit"]) == 16 * 8


def test_the_head_runs_the_driver_and_no_trials():
    head = _rayjob()["spec"]["rayClusterSpec"]["headGroupSpec"]
    # No CPUs or GPUs for tasks: trials land on the workers, and sweeper's CPU share counts only theirs.
    assert head["rayStartParams"]["num-cpus"] == "0" and head["rayStartParams"]["num-gpus"] == "0"
    resources = head["template"]["spec"]["containers"][0]["resources"]
    # The driver builds models (a real one when fake tensors cannot trace it: 16 GB of fp32 weights and
    # gradients at 2B parameters) after 0.85 GiB of imports; its memory is reserved, not borrowed.
    assert _gib(resources["requests"]["memory"]) == _gib(resources["limits"]["memory"]) >= 16
    assert int(resources["requests"]["cpu"]) >= 2


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
