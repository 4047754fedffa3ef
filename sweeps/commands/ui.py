"""`csweep ui`: the MLflow UI for a workdir on 127.0.0.1, supervised: its process group goes
down with this command however it ends."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ._options import DEFAULT_WORKDIR, UsageError, default_tracking, positive_int


def add_parser(sub: Any) -> None:
    ui = sub.add_parser("ui", help="start the MLflow UI for a workdir on 127.0.0.1")
    ui.add_argument("--workdir", default=DEFAULT_WORKDIR)
    ui.add_argument("--tracking-uri")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--workers", type=positive_int("--workers"), default=1,
                    help="MLflow server processes [1: one person browsing]")
    ui.set_defaults(handler=cmd_ui)


def cmd_ui(a: argparse.Namespace) -> int:
    workdir = Path(a.workdir).expanduser()
    tracking = a.tracking_uri or default_tracking(workdir)
    if a.tracking_uri is None and not (workdir / "mlflow.db").is_file():
        raise UsageError(f"--workdir {str(workdir)!r}: no mlflow.db there (run a sweep first)")
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking,
           "--host", a.host, "--port", str(a.port), "--workers", str(a.workers)]
    if a.tracking_uri is None:
        cmd += ["--default-artifact-root", (workdir / "mlartifacts").resolve().as_uri()]
    import signal
    import subprocess

    # browsing training runs needs none of MLflow 3's GenAI job runners (a job process and a
    # pool of consumers, each importing MLflow: most of the UI's start-up); a user's own setting wins
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    # the server and its worker processes in a process group of their own, which goes down with
    # this command however it ends (Ctrl-C, SIGTERM, the server's own exit): none is left on the port
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    terminated = []

    def on_sigterm(*_: Any) -> None:
        # the server's group is stopped and its wait returns: no exception is raised into whatever
        # runs when the signal lands (an import of MLflow's client once let it escape: exit -2)
        terminated.append(True)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        code = _serve(proc, a, tracking)
        return 143 if terminated else code
    except KeyboardInterrupt:
        return 143 if terminated else 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop_group(proc)


def _stop_group(proc: Any) -> None:
    """SIGTERM to the server's own process group (by its id), SIGKILL after 30 s."""
    import signal
    import subprocess

    if proc.poll() is not None and not _group_alive(proc.pid):
        return
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if not _group_alive(proc.pid):
            return


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _serve(proc: Any, a: argparse.Namespace, tracking: str) -> int:
    """Wait for the UI's server to listen, print where it is, then wait for it to end."""
    import socket
    import time

    # say where it is once it accepts connections (seconds: MLflow imports itself first)
    while proc.poll() is None:
        try:
            with socket.create_connection((a.host, a.port), timeout=1):
                break
        except OSError:
            time.sleep(0.5)
    if proc.poll() is None:
        url = f"http://{a.host}:{a.port}"
        print(f"MLflow UI: {url}  (Ctrl-C to stop)", flush=True)
        # MLflow 3's UI opens experiments in its GenAI view unless told the workflow: link each
        # study's page of training runs
        try:
            from mlflow.tracking import MlflowClient

            for exp in MlflowClient(tracking_uri=tracking).search_experiments():
                if exp.name != "Default":
                    print(f"  {exp.name}: {url}/#/experiments/{exp.experiment_id}?workflowType=machine_learning",
                          flush=True)
        except Exception:  # noqa: BLE001 - the links are a convenience; the UI is up
            pass
    return proc.wait()

