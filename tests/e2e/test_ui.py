"""What users meet: a real `mlflow server` holding a sweep (REST and the web UI in headless Chromium),
the Ray dashboard answering, with token auth, while that sweep runs on the Ray it started itself, and
what Ray Tune wrote for it. One sweep, which every test here reads (the module fixture `served`)."""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from types import SimpleNamespace

import pytest

from tests.harness import free_port

pytestmark = pytest.mark.e2e

# Four epochs: the sweep still runs while the test asks its dashboard.
TINY = ["model=mlp", "model.depth=2", "model.width=32", "model.input_shape=[1,8,8]", "train.epochs=4",
        "sweep.micro_batch_sizes=[16,32]", "sweep.accumulation_steps=[1]", "sweep.num_workers=[1]",
        "measure.windows=3", "tracking.experiment_name=ui"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# .ci/run sets it: there, a missing Chromium is a failure, not a skip that hides the UI going untested.
UI_REQUIRED = os.environ.get("SWEEPER_REQUIRE_UI") == "1"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# The [+] in a parent run's name cell that unfolds its nested runs (MLflow 3's RunNameCellRenderer).
EXPANDER = 'button[data-component-id*="runnamecellrenderer"]'


def _get(url: str, headers=None, data=None, timeout=10):
    request = urllib.request.Request(url, data=data, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return reply.status, reply.read()


# MLflow 3's server also starts a job runner (six huey consumers, ~1 GB) for GenAI jobs a sweep never
# submits: off, as in tests/e2e/test_faults.py.
SERVER_ENV = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`mlflow server` on loopback with a sweep recorded through it by the CLI, on a Ray the sweep starts
    itself; while the sweep runs, its Ray dashboard is asked for Ray's version with and without the
    token (what it answered: `dashboard`). The sweep's home is a folder of its own (`home`), which Ray
    must leave alone."""
    folder = tmp_path_factory.mktemp("server")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder / 'store.db'}",
         "--host", "127.0.0.1", "--port", str(port)],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=SERVER_ENV,
    )
    try:
        deadline = time.time() + 120
        while True:
            try:
                if _get(f"{url}/health")[0] == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            assert time.time() < deadline, "mlflow server did not answer /health within 120 s"
            time.sleep(1)
        home = folder / "home"
        home.mkdir()
        overrides = [*TINY, f"cluster.dashboard_port={free_port()}", f"tracking.uri={url}"]
        dashboard = _ask_the_dashboard_while_it_runs(folder, overrides, home)
        yield SimpleNamespace(url=url, folder=folder, home=home, overrides=overrides, dashboard=dashboard)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _ask_the_dashboard_while_it_runs(folder, overrides, home) -> SimpleNamespace:
    """Run the sweep; once it prints its dashboard's address, ask the dashboard for Ray's version with
    the token in .sweeper/ray and without; what it answered, and whether the sweep still ran then."""
    # A Ray of its own: a driver that joined a cluster names MLflow's system metrics by its host
    # (system/<host>/...), and these tests read the local names. A system-metrics sample every 2 s
    # (MLflow's own override of the monitor's 10 s): the UI draws a chart of a metric from two samples.
    sweep = subprocess.Popen(
        [sys.executable, "-m", "sweeper", *overrides], cwd=folder, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        # the dashboard line must arrive while it runs; Ray must leave the user's home alone
        env={**os.environ, "PYTHONUNBUFFERED": "1", "HOME": str(home), "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "2"},
    )
    answers = SimpleNamespace(url=None, with_token=None, without_token=None, running=None)
    try:
        for line in sweep.stdout:
            if "Ray dashboard:" in line:
                answers.url = line.split("Ray dashboard:", 1)[1].strip()
                break
        if answers.url is not None:
            token = (folder / ".sweeper" / "ray" / "auth_token").read_text().strip()
            status, raw = _get(f"{answers.url}/api/version", {"Authorization": f"Bearer {token}"})
            answers.with_token = (status, json.loads(raw))
            try:
                answers.without_token = _get(f"{answers.url}/api/version")[0]
            except urllib.error.HTTPError as refused:
                answers.without_token = refused.code
            answers.running = sweep.poll() is None
        rest = sweep.stdout.read()
        assert sweep.wait(timeout=600) == 0, rest[-3000:]
    finally:
        if sweep.poll() is None:
            sweep.kill()
    return answers


@pytest.fixture(scope="module")
def server(served) -> str:
    """The MLflow server's URL."""
    return served.url


def _search(url: str, experiment_id: str, filter_string: str):
    body = json.dumps({"experiment_ids": [experiment_id], "filter": filter_string, "max_results": 100}).encode()
    _, raw = _get(f"{url}/api/2.0/mlflow/runs/search", {"Content-Type": "application/json"}, body)
    return json.loads(raw).get("runs", [])


def _experiment_id(url: str) -> str:
    _, raw = _get(f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=ui")
    return json.loads(raw)["experiment"]["experiment_id"]


def test_the_server_holds_one_parent_with_nested_trials_and_named_metrics(server):
    experiment = _experiment_id(server)
    (parent,) = _search(server, experiment, "tags.`sweeper.role` = 'sweep'")
    children = _search(server, experiment, f"tags.mlflow.parentRunId = '{parent['info']['run_id']}'")
    assert sorted(c["info"]["run_name"] for c in children) == ["mb16-acc1-w1", "mb32-acc1-w1"]
    for child in children:
        metrics = {m["key"] for m in child["data"]["metrics"]}
        params = {p["key"] for p in child["data"]["params"]}
        assert {"samples_per_second", "peak_memory_bytes", "val_accuracy", "mfu"} <= metrics
        assert {"micro_batch_size", "accumulation_steps", "num_workers", "global_batch_size"} <= params
    _, raw = _get(f"{server}/api/2.0/mlflow/artifacts/list?run_id={parent['info']['run_id']}&path=report")
    assert "report/report.html" in {f["path"] for f in json.loads(raw)["files"]}


def test_the_sweep_fills_mlflows_own_views_kind_source_command_and_system_metrics(served, server):
    experiment = _experiment_id(server)
    _, raw = _get(f"{server}/api/2.0/mlflow/experiments/get?experiment_id={experiment}")
    kinds = {t["key"]: t["value"] for t in json.loads(raw)["experiment"].get("tags", [])}
    assert kinds.get("mlflow.experimentKind") == "custom_model_development"
    (parent,) = _search(server, experiment, "tags.`sweeper.role` = 'sweep'")
    run_id = parent["info"]["run_id"]
    children = _search(server, experiment, f"tags.mlflow.parentRunId = '{run_id}'")
    for run in [parent, *children]:
        tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
        assert tags["mlflow.source.name"].endswith(os.path.join("sweeper", "__main__.py"))
        assert tags["mlflow.user"] not in ("", "unknown") and tags["mlflow.source.type"] == "LOCAL"
    _, raw = _get(f"{server}/api/2.0/mlflow/artifacts/list?run_id={run_id}")
    assert {"config.yaml", "overrides.yaml", "command.txt"} <= {f["path"] for f in json.loads(raw)["files"]}
    _, raw = _get(f"{server}/get-artifact?path=overrides.yaml&run_uuid={run_id}")
    assert raw.decode().splitlines() == [f"- {o}" for o in served.overrides]
    # MLflow's monitor sampled the driver's machine while the sweep ran: the System metrics tab.
    metrics = {m["key"] for m in parent["data"]["metrics"]}
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= metrics, metrics


def chromium_env(profile) -> dict:
    """Chromium keeps its certificate store in $HOME/.pki whatever --user-data-dir says: the profile's
    folder is its home, so the suite writes nothing to the user's."""
    return {**os.environ, "HOME": str(profile)}


def _render(url: str, profile) -> str:
    """The page's DOM after its scripts ran, from headless Chromium. Flags from this machine's
    notes: without the background-networking ones Chromium keeps trying the closed network."""
    dom = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=20000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120, env=chromium_env(profile),
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom.stdout


# A chart renders in seconds on a quiet machine; under `-n 2` the other worker's sweep shares the cores
# (one wait took over 120 s there).
def _click_through(url: str, profile, shown: str, click, then: list, timeout: float = 300.0) -> str:
    """What a user sees: open `url` in headless Chromium, wait for text `shown`, click every element
    matching the CSS selector `click` (None: nothing), wait until every text in `then` is on the page; the page's
    text. Driven over the DevTools protocol (aiohttp's websocket client: Ray's dashboard needs it)."""
    port = free_port()
    proc = subprocess.Popen(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
         "--window-size=1400,900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=chromium_env(profile),
    )
    try:
        return asyncio.run(_drive(port, url, shown, click, then, time.monotonic() + timeout))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _drive(port: int, url: str, shown: str, click, then: list, deadline: float) -> str:
    import aiohttp

    while True:
        try:
            pages = [t for t in json.loads(_get(f"http://127.0.0.1:{port}/json/list")[1]) if t["type"] == "page"]
            if pages:
                break
        except (urllib.error.URLError, OSError):
            pass
        assert time.monotonic() < deadline, "Chromium's DevTools endpoint did not answer"
        await asyncio.sleep(0.5)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            calls = iter(range(1, 1_000_000))

            async def call(method: str, **params):
                n = next(calls)
                await ws.send_json({"id": n, "method": method, "params": params})
                while (reply := await ws.receive_json()).get("id") != n:
                    pass  # events
                return reply.get("result", {})

            async def js(expression: str):
                out = await call("Runtime.evaluate", expression=expression, returnByValue=True)
                return out.get("result", {}).get("value")

            async def wait_for(texts: list):
                test = " && ".join(f"document.body.innerText.includes({json.dumps(t)})" for t in texts)
                while not await js(test):
                    assert time.monotonic() < deadline, f"the page never showed {texts}"
                    await asyncio.sleep(0.5)

            await call("Page.navigate", url=url)
            await wait_for([shown])
            if click is not None:
                clicked = await js(f"[...document.querySelectorAll({json.dumps(click)})].map(e => e.click()).length")
                assert clicked, f"nothing on the page matches {click}"
            await wait_for(then)
            return await js("document.body.innerText")


@pytest.mark.ui
@pytest.mark.skipif(CHROMIUM is None and not UI_REQUIRED, reason="needs Debian's chromium (.ci/run installs it)")
def test_the_mlflow_ui_lists_the_sweep_and_compares_its_trials_in_headless_chromium(server, tmp_path):
    assert CHROMIUM, "SWEEPER_REQUIRE_UI=1 but there is no chromium: .ci/run's apt-get install failed"
    experiment = _experiment_id(server)
    (parent,) = _search(server, experiment, "tags.`sweeper.role` = 'sweep'")
    # The runs page lists the sweep; its trials are nested under it, shown by its [+] as a user would.
    name = parent["info"]["run_name"]
    trials = ["mb16-acc1-w1", "mb32-acc1-w1"]
    runs_page = _click_through(f"{server}/#/experiments/{experiment}/runs", tmp_path / "p1", name, EXPANDER, trials)
    assert runs_page.index(name) < min(runs_page.index(t) for t in trials), runs_page[:3000]
    children = _search(server, experiment, f"tags.mlflow.parentRunId = '{parent['info']['run_id']}'")
    ids = urllib.parse.quote(json.dumps([c["info"]["run_id"] for c in children]))
    # What "Compare" on the selected child runs opens: the trials side by side, with the
    # parallel-coordinates view of params against metrics.
    compare = _render(f"{server}/#/compare-runs?runs={ids}&experiments=%5B%22{experiment}%22%5D", tmp_path / "p2")
    assert "mb16-acc1-w1" in compare and "mb32-acc1-w1" in compare
    assert "micro_batch_size" in compare and "Parallel" in compare


@pytest.mark.own_ray  # the dashboard and token of the Ray the sweep starts itself
def test_the_ray_dashboard_answers_with_the_token_while_a_sweep_runs(served):
    dashboard = served.dashboard
    port = next(o for o in served.overrides if o.startswith("cluster.dashboard_port=")).split("=")[1]
    assert dashboard.url == f"http://127.0.0.1:{port}"
    status, version = dashboard.with_token
    assert status == 200 and "ray_version" in version
    assert dashboard.without_token == 401
    assert dashboard.running  # the sweep was still running when the dashboard answered
    # Ray's files stay in the configured directory, not in the user's home.
    assert (served.folder / ".sweeper" / "ray" / "results").is_dir()
    assert not (served.home / ".ray").exists() and not (served.home / "ray_results").exists()


@pytest.mark.own_ray  # connect() sets Tune's environment before Ray starts
def test_ray_tune_writes_its_experiment_state_and_no_automatic_logger_files(served):
    """What Ray Tune wrote for the sweep: its experiment state (what sweep.resume restores), not its
    automatic CSV / JSON / TensorBoard loggers, whose per-trial curves would join a worker group's
    unrelated points."""
    results = served.folder / ".sweeper" / "ray" / "results"
    written = [os.path.join(folder, name) for folder, _, names in os.walk(results) for name in names]
    assert any("experiment_state" in path for path in written), written
    logged = [path for path in written if os.path.basename(path).startswith(("progress.csv", "result.json",
                                                                           "events.out.tfevents"))]
    assert logged == [], logged


@pytest.mark.ui
@pytest.mark.skipif(CHROMIUM is None and not UI_REQUIRED, reason="needs Debian's chromium (.ci/run installs it)")
def test_the_mlflow_ui_shows_system_metrics_and_the_source_in_headless_chromium(server, tmp_path):
    assert CHROMIUM, "SWEEPER_REQUIRE_UI=1 but there is no chromium: .ci/run's apt-get install failed"
    experiment = _experiment_id(server)
    (parent,) = _search(server, experiment, "tags.`sweeper.role` = 'sweep'")
    run_id = parent["info"]["run_id"]
    # The run page's System metrics tab: MLflow's charts of what its monitor sampled (the charts
    # render lazily, so wait for them as a user would).
    name = parent["info"]["run_name"]
    system = _click_through(f"{server}/#/experiments/{experiment}/runs/{run_id}/system-metrics", tmp_path / "p3",
                            "System metrics", None, [f"{name} (system/cpu_utilization_percentage)"])
    assert "cpu_utilization_percentage" in system and "disk_usage_megabytes" in system
    # The runs table's Source column: the entry point MLflow resolved (it was empty). MLflow 3.17's
    # UI picks GenAI or model-training by a per-browser toggle (default GenAI) or this URL parameter.
    runs = _click_through(f"{server}/#/experiments/{experiment}?workflowType=machine_learning", tmp_path / "p4",
                          name, None, ["Source", "Model registry"])
    assert "__main__.py" in runs.split("Source", 1)[1], runs[:3000]
