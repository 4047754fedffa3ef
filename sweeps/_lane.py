"""Per-trial MLflow logging in a child process, in order, off the driver's critical path.

A trial's MLflow work (create the nested run, log its params; later its metrics, history, tags,
artifacts, end it) costs tens of milliseconds of CPU, mostly SQLAlchemy. On a thread of the
driver it competes with Optuna's ask and tell for the GIL; in its own process it runs beside
them. One process, one queue: calls run in the order they were made. When MLflow cannot be
reached, the trial's record goes to WORKDIR/pending_mlflow/ for `csweep sync`, as before.

The process outlives its run: a process that runs several sweeps (a notebook, a script's loop,
the test suite) hands a finished run's logging process to the next run, which points it at its
own store, working directory and environment, instead of starting another and importing MLflow
again (about 2-3 s of CPU a run on two cores).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

PENDING_DIR = "pending_mlflow"

# the child's state: its tracker (a SafeTracker) and where pending records go
_state: dict[str, Any] = {}
# in the driver: a finished run's logging process, alive and idle, for the next run to take, with
# the pid of the process that made it (a forked child has its parent's list, not its threads)
_idle: list[tuple[int, ProcessPoolExecutor]] = []
_idle_lock = threading.Lock()
READY_TIMEOUT = 10.0  # seconds an idle logging process has to answer before a new one is started


def done_future(value: Any) -> Future:
    """A future that already holds its value."""
    fut: Future = Future()
    fut.set_result(value)
    return fut


def write_pending(pending: Path, number: int, status: str, run_id: str, record: Mapping[str, Any]) -> None:
    """A trial's MLflow record on disk, for `csweep sync` to back-fill."""
    pending.mkdir(parents=True, exist_ok=True)
    blob = {"number": number, "status": status, "run_id": run_id,
            **{k: v for k, v in record.items() if k != "artifacts"}}
    (pending / f"trial-{number}.json").write_text(json.dumps(blob, default=str))
    for name, data in record.get("artifacts", {}).items():
        path = pending / f"trial-{number}" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _warm() -> None:
    """The child's start: the imports its first call needs (MLflow's, SQLAlchemy's), while the
    driver still opens the study and starts Ray. Ctrl-C reaches the whole process group: the
    driver handles it and still needs this process to end the interrupted trials' runs."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import mlflow  # noqa: F401
    from mlflow.tracking import MlflowClient  # noqa: F401

    from . import _study, _tracking  # noqa: F401
    try:
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - the local stores' backend
    except Exception:  # noqa: BLE001 - an MLflow without it: the first call imports what it needs
        pass


def _init(uri: str, experiment: str, artifact_root: str | None, pending: str, cwd: str,
          env: Mapping[str, str]) -> None:
    """Point the child at a run: its store, and the driver's working directory and environment
    as they are now (MLflow reads its MLFLOW_* settings from the environment; a relative path is
    the driver's), whatever run it served before."""
    from ._study import tune_sqlite
    from ._tracking import SafeTracker

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tune_sqlite()
    _state["pending"] = Path(pending)
    _state["safe"] = SafeTracker(uri, experiment, artifact_root=Path(artifact_root) if artifact_root else None)


def _start(parent: str, study: str, number: int, params: Mapping[str, Any]) -> str:
    return _state["safe"].start_trial(parent, study, number, params)


def _finish(number: int, run_id: str, status: str, record: Mapping[str, Any]) -> None:
    if not _state["safe"].finish_trial(run_id, status=status, **record):
        write_pending(_state["pending"], number, status, run_id, record)


def _error() -> str:
    return _state["safe"].error


def _ready() -> bool:
    return True


class PendingLog:
    """The trial log when MLflow cannot be reached at the start: every record goes to
    WORKDIR/pending_mlflow/ for `csweep sync`."""

    def __init__(self, pending: Path) -> None:
        self.pending = pending

    def start_trial(self, number: int, params: Mapping[str, Any]) -> Future:
        return done_future("")

    def finish_trial(self, number: int, run_id: str, status: str, **record: Any) -> None:
        write_pending(self.pending, number, status, run_id, record)

    def close(self) -> str:
        return ""


class MlflowLane:
    """The driver's handle on the child. Every method returns at once; `start_trial` gives a
    future of the run id ("" when MLflow is unreachable). The child starts (and imports MLflow)
    when the lane is made, before the run knows its parent run, unless an earlier run of this
    process left one idle (`close`); `open` then points it at the store, as its first call."""

    def __init__(self) -> None:
        self.parent = ""
        self.study_name = ""
        self.pending = Path(PENDING_DIR)
        self.error = ""
        self._pool: ProcessPoolExecutor | None = _take_idle() or _new_process()

    def open(self, uri: str, study_name: str, *, artifact_root: Path | None, pending: Path,
             parent: str) -> MlflowLane:
        self.parent, self.study_name, self.pending = parent, study_name, pending
        self._submit(_init, uri, study_name, str(artifact_root) if artifact_root else None, str(pending),
                     os.getcwd(), dict(os.environ))
        return self

    def discard(self) -> None:
        """Not needed after all (MLflow unreachable, or the run stopped before its first trial)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _submit(self, fn: Any, *args: Any) -> Future | None:
        try:
            if self._pool is None:
                raise RuntimeError("the lane is closed")
            return self._pool.submit(fn, *args)
        except Exception as exc:  # noqa: BLE001 - a dead child: MLflow is unreachable from here on
            self.error = self.error or f"the MLflow logging process stopped: {exc.__class__.__name__}: {exc}"
            return None

    def start_trial(self, number: int, params: Mapping[str, Any]) -> Future:
        fut = self._submit(_start, self.parent, self.study_name, number, dict(params))
        return done_future("") if fut is None else fut

    def finish_trial(self, number: int, run_id: str, status: str, **record: Any) -> None:
        if self._submit(_finish, number, run_id, status, record) is None:
            write_pending(self.pending, number, status, run_id, record)

    @staticmethod
    def run_id(fut: Future) -> str:
        try:
            return fut.result()
        except Exception:  # noqa: BLE001 - the child died before it answered
            return ""

    def close(self) -> str:
        """Wait for the queue to drain; returns the last MLflow error, "" when none."""
        fut = self._submit(_error)
        alive = fut is not None
        try:
            err = fut.result() if fut is not None else ""
        except Exception as exc:  # noqa: BLE001
            err = f"the MLflow logging process stopped: {exc.__class__.__name__}"
            alive = False
        pool, self._pool = self._pool, None
        if pool is not None:
            if alive:  # the queue is drained: the process waits, idle, for this process's next run
                with _idle_lock:
                    _idle.append((os.getpid(), pool))
            else:
                pool.shutdown(wait=False)
        return self.error or err


def _new_process() -> ProcessPoolExecutor:
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_warm)
    pool.submit(_ready)  # start the process now, while the study opens and Ray starts
    return pool


def _take_idle() -> ProcessPoolExecutor | None:
    """An earlier run's logging process that still answers, or None (it ends with this process:
    concurrent.futures stops an idle one at exit)."""
    while True:
        with _idle_lock:
            while _idle and _idle[-1][0] != os.getpid():  # made before a fork: not this process's
                _idle.pop()
            if not _idle:
                return None
            pool = _idle.pop()[1]
        try:
            pool.submit(_ready).result(timeout=READY_TIMEOUT)
            return pool
        except Exception:  # noqa: BLE001 - it died or hangs: start another
            pool.shutdown(wait=False, cancel_futures=True)
