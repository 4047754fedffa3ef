"""Faults on real Ray workers and real processes, as smoke tests: nothing lost, every finished
trial is in storage and MLflow, counts are exact. The driver that is killed or interrupted is a
`csweep` process of its own; the other sweeps run `sweeps.main` in the test process (the
`csweep` fixture) on real Ray workers. The scheduling cases (a worker dying with a trial queued
behind it, retries exhausted, Ctrl-C between ask and tell, the last trials not queued) run in
milliseconds against a fake pool in test_driver.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pandas as pd
import psutil
import pytest

from helpers import child_runs, load

from common import attrs as A

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _popen(project: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sweeps", *args], cwd=project, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.5)


def _states(project: Path) -> dict[str, int]:
    db = project / "csweep_runs/optuna.db"
    if not db.exists():
        return {}
    try:
        study = optuna.load_study(study_name="analytic", storage=f"sqlite:///{db}")
    except Exception:  # noqa: BLE001 - not created yet
        return {}
    return pd.Series([t.state.name for t in study.trials]).value_counts().to_dict()


def _kill_driver(proc: subprocess.Popen) -> None:
    """SIGKILL the driver and every process it started (its local Ray's daemons and workers,
    the MLflow logging process), each by its own process id."""
    try:
        family = [proc.pid] + [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = [proc.pid]
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def _run_killing_one_worker(project: Path, csweep, *extra: str):
    """Run 4 slow trials on 2 workers; SIGKILL the first worker process that starts a trial."""
    pids = project / "pids"
    pids.mkdir()
    killed: list[int] = []

    def killer() -> None:
        deadline = time.time() + 120
        while not killed and time.time() < deadline:
            for f in sorted(pids.iterdir()):
                os.kill(int(f.name), signal.SIGKILL)
                killed.append(int(f.name))
                return
            time.sleep(0.2)

    thread = threading.Thread(target=killer)
    thread.start()
    res = csweep("run", "analytic.yaml", "--trials", "4", "--workers", "2", "--set", f"pid_dir={pids}",
                 "--set", "sleep=2", "--no-progress", *extra)
    thread.join()
    assert killed, "no worker was killed"
    return res


def test_worker_killed_mid_trial_is_retried(analytic_project, csweep):
    res = _run_killing_one_worker(analytic_project, csweep)
    assert res.returncode == 0, res.stderr
    study, client = load(analytic_project)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    retried = [t for t in study.trials if t.user_attrs.get("attempts") == 2]
    assert len(retried) == 1
    children, parents = child_runs(client)
    assert len(children) == 4 and len(parents) == 1
    assert {r.info.status for r in children} == {"FINISHED"}


def test_driver_killed_then_resume_finishes_exactly(analytic_project, csweep):
    proc = _popen(analytic_project, "run", "analytic.yaml", "--trials", "6", "--workers", "2",
                  "--set", "sleep=1.5", "--no-progress")
    _wait_for(lambda: _states(analytic_project).get("COMPLETE", 0) >= 2
              and _states(analytic_project).get("RUNNING", 0) >= 1)
    _kill_driver(proc)
    before = _states(analytic_project)
    assert before.get("RUNNING", 0) >= 1
    res = csweep("resume", "analytic", "--workers", "2", "--no-progress")
    assert res.returncode == 0, res.stderr
    study, client = load(analytic_project)
    states = pd.Series([t.state.name for t in study.trials]).value_counts().to_dict()
    stale = [t for t in study.trials if str(t.number) in study.user_attrs.get(A.STALE, {})]
    assert states["COMPLETE"] == 6 and "RUNNING" not in states
    assert len(stale) == before["RUNNING"] and all(t.state.name == "FAIL" for t in stale)
    # the stale trials' parameters were run again
    done_params = [t.params for t in study.trials if t.state.name == "COMPLETE"]
    assert all(t.params in done_params for t in stale)
    children, parents = child_runs(client)
    assert len(parents) == 1 and parents[0].info.run_id == study.user_attrs["mlflow_parent_run_id"]
    numbers = [r.data.tags["optuna.trial_number"] for r in children]
    assert len(numbers) == len(set(numbers))  # one run per trial, no duplicates
    assert "RUNNING" not in {r.info.status for r in children}
    for t in study.trials:
        if t.state.name == "COMPLETE":
            assert client.get_run(t.user_attrs["mlflow_run_id"]).info.status == "FINISHED"


def test_ctrl_c_stops_cleanly_and_resume_continues(analytic_project, csweep):
    proc = _popen(analytic_project, "run", "analytic.yaml", "--trials", "6", "--workers", "2",
                  "--set", "sleep=2", "--no-progress")
    _wait_for(lambda: _states(analytic_project).get("COMPLETE", 0) >= 1)
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert time.time() - sent < 90  # a generous bound: it stops, it does not hang
    assert proc.returncode == 130, err
    assert "csweep resume analytic" in out
    assert "RUNNING" not in _states(analytic_project)
    assert (analytic_project / "csweep_runs/reports/analytic/pareto.csv").is_file()
    res = csweep("resume", "analytic", "--workers", "2", "--no-progress")
    assert res.returncode == 0, res.stderr
    assert _states(analytic_project).get("COMPLETE") == 6


def test_out_of_memory_and_over_budget_trials_are_kept_out_of_the_analysis(analytic_project, csweep):
    res = csweep("run", "analytic.yaml", "--trials", "8", "--workers", "2", "--set", "oom_above=0.7",
                 "--max-mem-mb", "60", "--sampler", "random", "--seed", "4", "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "out of memory" in res.stdout  # the end-of-run line counts them
    study, client = load(analytic_project)
    trials = pd.read_csv(analytic_project / "csweep_runs/reports/analytic/trials.csv")
    oom = trials[trials["x"] > 0.7]
    over = trials[(trials["x"] <= 0.7) & (trials["peak_mem_mb"] > 60)]
    assert len(oom) and (oom["state"] == "FAIL").all() and (oom["outcome"] == "out_of_memory").all()
    assert oom["val_loss"].isna().all() and not oom["feasible"].any()
    assert oom["reason"].str.startswith("out of memory").all()
    assert not over["feasible"].any()
    for t in study.trials:
        if t.number in set(oom["trial"]):
            assert t.values is None and t.user_attrs[A.OUT_OF_MEMORY]
            assert client.get_run(t.user_attrs[A.MLFLOW_RUN_ID]).data.tags["infeasible"] == "out of memory"
        else:  # the budget through Optuna's constraints, which the samplers read
            assert (max(t.constraints.values()) > 0) == (t.values[1] > 60)
    front = pd.read_csv(analytic_project / "csweep_runs/reports/analytic/pareto.csv")
    assert front["feasible"].all() and (front["peak_mem_mb"] <= 60).all()


def test_a_sweep_whose_trials_keep_failing_stops_with_a_message(analytic_project, csweep):
    res = csweep("run", "analytic.yaml", "--trials", "20", "--workers", "2", "--set", "fail_above=-1",
                 "--no-progress")
    assert res.returncode == 1
    assert "more than 50%" in res.stderr and "--max-fail-share" in res.stderr
    study, _ = load(analytic_project)
    # stopped after 4 finished, with what was in flight (short trials: up to 2 per worker)
    assert 4 <= len(study.trials) <= 8


def test_sigterm_stops_as_ctrl_c_does_with_reports_and_exit_143(analytic_project, csweep):
    """SIGTERM is what Slurm's scancel, Kubernetes and `timeout` send: the trials in flight end FAIL
    'interrupted', the reports are written, one line says so, exit 143, and a resume finishes."""
    proc = _popen(analytic_project, "run", "analytic.yaml", "--trials", "6", "--workers", "2",
                  "--set", "sleep=2", "--no-progress")
    _wait_for(lambda: _states(analytic_project).get("COMPLETE", 0) >= 1
              and _states(analytic_project).get("RUNNING", 0) >= 1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 143, err
    assert "SIGTERM received" not in err and "PC: @" not in err  # no C-level stack
    assert [line for line in err.splitlines() if line.strip()] == [
        line for line in err.splitlines() if line.startswith("csweep: terminated (SIGTERM)")]
    assert "csweep resume analytic" in err
    states = _states(analytic_project)
    assert "RUNNING" not in states and states.get("FAIL", 0) >= 1
    study, client = load(analytic_project)
    failed = [t for t in study.trials if t.state.name == "FAIL"]
    assert all(t.user_attrs[A.FAIL_REASON] == "interrupted (SIGTERM on the driver)" for t in failed)
    assert (analytic_project / "csweep_runs/reports/analytic/index.html").is_file()
    assert "RUNNING" not in {r.info.status for r in child_runs(client)[0]}
    res = csweep("resume", "analytic", "--workers", "2", "--no-progress")
    assert res.returncode == 0, res.stderr
    assert _states(analytic_project).get("COMPLETE") == 6


def test_an_interrupted_rerun_front_resumes_with_fresh_seeds(analytic_project, csweep):
    res = csweep("run", "analytic.yaml", "--trials", "8", "--workers", "2", "--seeds", "2", "--sampler", "random",
                 "--seed", "1", "--set", "sleep=0.7", "--no-progress")
    assert res.returncode == 0, res.stderr
    study, _ = load(analytic_project)
    front = [t.number for t in study.best_trials]
    assert len(front) >= 2  # enough configs that an interruption lands between them
    proc = _popen(analytic_project, "rerun-front", "analytic", "--seeds", "2", "--workers", "1", "--no-progress")
    _wait_for(lambda: _states(analytic_project).get("COMPLETE", 0) >= 9)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=90)
    assert proc.returncode == 130
    res = csweep("resume", "analytic", "--workers", "2", "--no-progress")
    assert res.returncode == 0, res.stderr
    study, _ = load(analytic_project)
    reruns = [t for t in study.trials if t.state.name == "COMPLETE" and A.RERUN_OF in t.user_attrs]
    assert sorted(t.user_attrs[A.RERUN_OF] for t in reruns) == sorted(front)  # each front config once
    original = {s for t in study.trials[:8] for s in t.user_attrs.get(A.SEEDS, [])}
    assert original == {0, 1}
    for t in reruns:  # fresh seeds, also for those the resume ran
        assert not set(t.user_attrs[A.SEEDS]) & original, (t.number, t.user_attrs[A.SEEDS])
    assert _states(analytic_project).get("RUNNING", 0) == 0 and "WAITING" not in _states(analytic_project)


def test_sigterm_on_csweep_ui_takes_its_server_down(analytic_project, csweep):
    import socket

    res = csweep("run", "analytic.yaml", "--trials", "2", "--no-progress")
    assert res.returncode == 0, res.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _popen(analytic_project, "ui", "--port", str(port))
    for line in proc.stdout:  # MLflow prints lines of its own first
        if line.startswith("MLflow UI:"):
            break
    else:
        raise AssertionError(f"the UI never said where it is: exit {proc.wait()}")
    family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    assert family
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 143
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in family if psutil.pid_exists(p)], timeout=30)
    assert not alive, alive
    with socket.socket() as s:  # the port is free again
        s.bind(("127.0.0.1", port))
