"""Scale out on real components started on loopback: PostgreSQL storage with two concurrent
drivers, an `mlflow server` (and its outage), a two-node Ray cluster."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import optuna
import psutil
import psycopg
import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow  # starts Ray and runs real sweeps

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
PG = "postgresql://postgres:s3cret-pw@127.0.0.1:5432"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def databases():
    """Two fresh PostgreSQL databases (Optuna, MLflow) on the machine's server; dropped after."""
    names = [f"csweep_{kind}_{uuid.uuid4().hex[:8]}" for kind in ("optuna", "mlflow")]
    conn = psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True)
    with conn.cursor() as cur:
        for n in names:
            cur.execute(f"CREATE DATABASE {n}")
    yield [f"{PG}/{n}" for n in names]
    with conn.cursor() as cur:
        for n in names:
            cur.execute(f"DROP DATABASE IF EXISTS {n} WITH (FORCE)")
    conn.close()


def test_two_drivers_on_postgres_share_one_study(analytic_project, databases):
    storage, tracking = databases
    cmd = [sys.executable, "-m", "sweeps", "run", "analytic.yaml", "--storage", storage, "--tracking-uri",
           tracking, "--set", "sleep=0.5", "--no-progress"]
    procs = [subprocess.Popen(cmd + ["--trials", str(n)], cwd=analytic_project, env=ENV, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for n in (3, 4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    study = optuna.load_study(study_name="analytic", storage=storage)
    numbers = [t.number for t in study.trials]
    assert sorted(numbers) == list(range(7)) and len(set(numbers)) == 7
    assert all(t.state.name == "COMPLETE" for t in study.trials)
    client = MlflowClient(tracking_uri=tracking)
    exp = client.get_experiment_by_name("analytic")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 7
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    # no credential from the storage URL is stored or printed
    assert all("s3cret" not in str(v) for v in parents[0].data.params.values())
    assert "s3cret" not in "".join(o + e for o, e in outs)
    assert parents[0].data.params["storage"].startswith("postgresql://postgres:***@")


@pytest.fixture
def mlflow_server(tmp_path):
    """`mlflow server` with a SQLite database backend on 127.0.0.1, stopped by its process id."""
    port = _free_port()
    backend = f"sqlite:///{tmp_path / 'server.db'}"
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", backend, "--artifacts-destination", str(tmp_path / "server-artifacts"),
           "--workers", "1"]

    def start() -> subprocess.Popen:
        # the GenAI job runners (a job process and a pool of consumers) are not what this serves
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                return proc
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "mlflow server did not start"
                time.sleep(1)

    procs: list[subprocess.Popen] = []
    yield f"http://127.0.0.1:{port}", lambda: procs.append(start()) or procs[-1]
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=30)


def test_mlflow_outage_then_sync_backfills_idempotently(analytic_project, mlflow_server, cli, csweep, monkeypatch):
    url, start = mlflow_server
    down = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "3"}
    res = cli("run", "analytic.yaml", "--trials", "4", "--workers", "2", "--tracking-uri", url,
              "--no-progress", cwd=analytic_project, env=down)  # the server is down for the whole sweep
    assert res.returncode == 0, res.stderr
    assert "was not updated" in res.stderr and "csweep sync analytic" in res.stderr
    study = optuna.load_study(study_name="analytic",
                              storage=f"sqlite:///{analytic_project / 'csweep_runs/optuna.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4  # storage is the source of truth
    start()
    # once it is up, a loaded machine can take seconds to answer its first requests: no 3 s limit;
    # the commands from here on run in this process (the csweep fixture)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
    first = csweep("sync", "analytic", "--tracking-uri", url)
    assert first.returncode == 0, first.stderr
    assert "4 runs created" in first.stdout
    again = csweep("sync", "analytic", "--tracking-uri", url)
    assert "0 runs created, 0 back-filled, 4 already in MLflow" in again.stdout
    client = MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name("analytic")
    children = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 4 and {r.info.status for r in children} == {"FINISHED"}
    study = optuna.load_study(study_name="analytic",
                              storage=f"sqlite:///{analytic_project / 'csweep_runs/optuna.db'}")
    synced = study.user_attrs["mlflow_run_ids_synced"]
    for t in study.trials:
        run = client.get_run(synced[str(t.number)])
        assert run.data.metrics["val_loss"] == pytest.approx(t.values[0])
        assert len(client.get_metric_history(run.info.run_id, "val_loss")) == 1
    # and with the server up, a sweep logs to it over HTTP directly
    res = csweep("run", "analytic.yaml", "--trials", "2", "--tracking-uri", url, "--no-progress")
    assert res.returncode == 0 and "unreachable" not in res.stderr
    children = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 6


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def ray_cluster(tmp_path):
    """A two-node Ray cluster on this host (a head and a second node), one CPU each. Each node is
    a `ray start --block` child of this test, so its daemons are that child's descendants and are
    stopped by their own process ids."""
    # `ray start` turns token auth on: every node and client of this cluster presents the token
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}
    base = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats", "--block"]
    nodes: list[subprocess.Popen] = []
    try:
        port = _start_head(nodes, env, lambda p: [
            "--include-dashboard", "false", *base, "--min-worker-port", "21000", "--max-worker-port", "21200"])["port"]
        second = [sys.executable, "-m", "ray.scripts.scripts", "start", "--address", f"127.0.0.1:{port}", *base,
                  "--min-worker-port", "21201", "--max-worker-port", "21400"]
        nodes.append(subprocess.Popen(second, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_nodes(f"127.0.0.1:{port}", 2, env)
        yield f"127.0.0.1:{port}"
    finally:
        _stop(nodes)


def _start_head(nodes: list[subprocess.Popen], env: dict, args: Any, *, wait_for: str = "port") -> dict[str, int]:
    """`ray start --head ... --block` as a child of this test (appended to `nodes`), on fresh
    ports; returns them once the `wait_for` port answers. A free port can be taken again before
    Ray binds it (or be one Ray uses for itself, such as its agent's 52365): then start again on
    others, three tries in all."""
    for attempt in range(3):
        ports = {"port": _free_port(), "dash": _free_port(), "agent": _free_port()}
        temp = Path("/tmp") / f"csweep-ray-{uuid.uuid4().hex[:6]}"  # short: Ray's socket paths are limited
        head = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--port", str(ports["port"]),
                "--temp-dir", str(temp), *args(ports)]
        proc = subprocess.Popen(head, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        nodes.append(proc)
        deadline = time.time() + 180
        while proc.poll() is None and not _port_open(ports[wait_for]) and time.time() < deadline:
            time.sleep(0.5)
        if proc.poll() is None and _port_open(ports[wait_for]):
            return ports
        _stop(nodes)
        assert attempt < 2, f"ray start --head failed: {(proc.stdout.read() if proc.stdout else '')[-2000:]}"
    raise AssertionError("unreachable")


def _wait_nodes(address: str, count: int, env: dict) -> None:
    code = ("import ray, time, sys; ray.init(address=sys.argv[1], logging_level='error'); d = time.time() + 120\n"
            "while len([n for n in ray.nodes() if n['Alive']]) < int(sys.argv[2]) and time.time() < d: time.sleep(1)\n"
            "sys.exit(0 if len([n for n in ray.nodes() if n['Alive']]) >= int(sys.argv[2]) else 1)")
    subprocess.run([sys.executable, "-c", code, address, str(count)], env=env, check=True, timeout=240,
                   capture_output=True)


def _stop(nodes: list[subprocess.Popen]) -> None:
    """Stop the cluster's processes: each node's `ray start --block` and its descendants, by pid."""
    procs = []
    for node in nodes:
        try:
            parent = psutil.Process(node.pid)
            procs += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=30)
    nodes.clear()


def test_trials_run_on_both_nodes_of_a_cluster(analytic_project, ray_cluster, cli):
    res = cli("run", "analytic.yaml", "--trials", "6", "--workers", "2", "--ray-address", ray_cluster,
              "--set", "sleep=1", "--no-progress", cwd=analytic_project, env={"RAY_AUTH_MODE": "token"})
    assert res.returncode == 0, res.stderr[-3000:]
    study = optuna.load_study(study_name="analytic",
                              storage=f"sqlite:///{analytic_project / 'csweep_runs/optuna.db'}")
    nodes = {t.user_attrs["node_id"] for t in study.trials}
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 6
    assert len(nodes) == 2, nodes


def test_unreachable_ray_address_fails_fast(analytic_project, cli):
    port = _free_port()
    started = time.time()
    res = cli("run", "analytic.yaml", "--ray-address", f"127.0.0.1:{port}", cwd=analytic_project)
    assert res.returncode == 2 and time.time() - started < 60  # a generous bound: no hang
    assert res.stderr.strip().splitlines()[-1].startswith("csweep: error: --ray-address")
    assert not (analytic_project / "csweep_runs").exists()


def test_ray_job_submit_runs_the_sweep_inside_the_jobs_cluster(analytic_project, tmp_path):
    """As Ray users launch work: a head with its dashboard on loopback, then `ray job submit
    --working-dir . -- csweep run ...`; csweep joins the job's cluster and reuses its runtime env
    (no --ray-address, no second working_dir), the job ends SUCCEEDED, its trials are in the study."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    nodes: list[subprocess.Popen] = []
    try:
        # the job agent on a port of its own: its default (52365) may still be held by a cluster
        # another test just stopped
        dash = _start_head(nodes, env, lambda p: [
            "--node-ip-address", "127.0.0.1", "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(p["dash"]), "--dashboard-agent-listen-port", str(p["agent"]), "--num-cpus", "2",
            "--disable-usage-stats", "--block"], wait_for="dash")["dash"]
        workdir = tmp_path / "runs"
        deadline = time.time() + 240
        while True:
            job = subprocess.run(
                [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", "--address",
                 f"http://127.0.0.1:{dash}", "--working-dir", str(analytic_project), "--", "python", "-m", "sweeps",
                 "run", "analytic.yaml", "--trials", "3", "--workers", "2", "--no-progress", "--workdir", str(workdir)],
                env=env, capture_output=True, text=True, timeout=600)
            out = job.stdout + job.stderr
            # the dashboard answers before its job agent is up; Ray's own message says to try again
            if "No available agent to submit job" not in out or time.time() > deadline:
                break
            time.sleep(2)
        assert job.returncode == 0, out[-4000:]
        assert "succeeded" in out.lower(), out[-2000:]
        study = optuna.load_study(study_name="analytic", storage=f"sqlite:///{workdir / 'optuna.db'}")
        assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
        assert "3 completed" in out
    finally:
        _stop(nodes)
