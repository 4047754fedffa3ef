"""The MLflow logging process (sweeps._lane): a process that runs several sweeps hands a finished
run's logging process to its next run, which logs where *it* says, from where *it* runs."""

from __future__ import annotations

import os
from pathlib import Path

from mlflow.tracking import MlflowClient

from sweeps._lane import MlflowLane


def _log_one_trial(study: str, value: float) -> tuple[int, str, str]:
    """One run's lane: a trial started and finished in `study`'s experiment of mlflow.db in this
    process's working directory (as csweep's default store, an absolute path); the logging
    process's pid, working directory, and what it reads for CSWEEP_LANE_PROBE in its environment."""
    uri = f"sqlite:///{Path('mlflow.db').resolve()}"
    lane = MlflowLane().open(uri, study, artifact_root=None, pending=Path("pending"), parent="")
    run_id = MlflowLane.run_id(lane.start_trial(0, {"x": value}))
    assert run_id, lane.error
    lane.finish_trial(0, run_id, "FINISHED", metrics={"val_loss": value})
    pid = lane._pool.submit(os.getpid).result(timeout=60)
    probe = lane._pool.submit(os.getenv, "CSWEEP_LANE_PROBE").result(timeout=60)
    cwd = lane._pool.submit(os.getcwd).result(timeout=60)
    assert lane.close() == ""
    return pid, cwd, probe


def test_the_next_run_takes_the_idle_logging_process_and_logs_where_it_runs(tmp_path, monkeypatch):
    seen = []
    for name, value in (("first", 0.5), ("second", 0.25)):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        monkeypatch.setenv("CSWEEP_LANE_PROBE", name)
        seen.append(_log_one_trial(name, value))
    (pid, *_), (again, *_) = seen
    assert pid == again and pid != os.getpid()  # one logging process for both runs
    # each run's working directory and environment, as they were when the run opened
    assert [(Path(cwd), probe) for _, cwd, probe in seen] == [(tmp_path / "first", "first"),
                                                              (tmp_path / "second", "second")]
    for name, value in (("first", 0.5), ("second", 0.25)):  # each run's store, in its own folder
        client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / name / 'mlflow.db'}")
        exp = client.get_experiment_by_name(name)
        runs = client.search_runs([exp.experiment_id])
        assert [(r.info.status, r.data.metrics["val_loss"]) for r in runs] == [("FINISHED", value)]
        other = "second" if name == "first" else "first"
        assert client.get_experiment_by_name(other) is None


def test_a_logging_process_that_died_idle_is_replaced(tmp_path, monkeypatch):
    import signal

    monkeypatch.chdir(tmp_path)
    pid, _, _ = _log_one_trial("one", 1.0)
    os.kill(pid, signal.SIGKILL)
    again, _, _ = _log_one_trial("two", 2.0)
    assert again != pid
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("two")
    assert [r.data.metrics["val_loss"] for r in client.search_runs([exp.experiment_id])] == [2.0]


def test_a_forked_child_does_not_take_its_parents_logging_process(monkeypatch):
    """After os.fork the child holds its parent's idle list but not the threads that drive those
    processes: a submit there would wait out the ready timeout. It starts its own instead."""
    from sweeps import _lane

    class ParentsProcess:
        def submit(self, *args):
            raise AssertionError("the forked child used its parent's logging process")

    monkeypatch.setattr(_lane, "_idle", [(os.getpid() + 1, ParentsProcess())])
    assert _lane._take_idle() is None and _lane._idle == []
