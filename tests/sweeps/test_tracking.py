"""MLflow's store for a first sweep in a folder: a copy of an empty one this MLflow made before
on the machine, the same as the store MLflow makes itself."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

from sweeps._study import tune_sqlite
from sweeps._tracking import Tracker, empty_store, seed_store


def _schema(db: Path) -> tuple[list, dict]:
    """The store's last migration, and each table's columns (name, type, not null, key). Not the
    tables' SQL: two stores MLflow makes itself can order a table's constraints differently."""
    with sqlite3.connect(db) as con:
        tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return (con.execute("SELECT version_num FROM alembic_version").fetchall(),
                {t: sorted((c[1], c[2], c[3], c[5]) for c in con.execute(f"PRAGMA table_info('{t}')")) for t in tables})


def test_a_new_folders_store_is_the_one_mlflow_makes_and_an_existing_one_is_left_alone(tmp_path, monkeypatch):
    """With every SQLite connection in WAL mode (as in a sweep's driver, whose store once lost the
    migrations its log still held), the empty store in the cache and a folder's store copied from
    it have the schema MLflow gives a store it makes itself: every table, at its last migration.
    Opened in a new process, the copy holds MLflow's Default experiment and takes a study's
    experiment and runs. A store that exists is never replaced, and no folder is made for one."""
    monkeypatch.setenv("CSWEEP_CACHE", str(tmp_path / "cache"))
    tune_sqlite()
    own = tmp_path / "own" / "mlflow.db"
    own.parent.mkdir()
    MlflowClient(tracking_uri=f"sqlite:///{own}").search_experiments()

    empty = empty_store()
    assert empty is not None and empty.parent.parent == tmp_path / "cache"
    assert _schema(empty) == _schema(own)
    with sqlite3.connect(empty) as con:
        assert con.execute("SELECT COUNT(*) FROM experiments").fetchone() == (0,)

    store = tmp_path / "sweep" / "csweep_runs" / "mlflow.db"
    seed_store(f"sqlite:///{store}")  # no folder: none made, MLflow says so as it would
    assert not store.parent.exists()
    store.parent.mkdir(parents=True)
    tracker = Tracker(f"sqlite:///{store}", "study")
    run = tracker.client.create_run(tracker.experiment_id).info.run_id
    tracker.client.log_metric(run, "val_loss", 0.5)
    assert _schema(store) == _schema(own)
    check = ("import sys; from mlflow.tracking import MlflowClient; c = MlflowClient(tracking_uri=sys.argv[1]); "
             "print(sorted(e.name for e in c.search_experiments()), "
             "[r.data.metrics for r in c.search_runs([c.get_experiment_by_name('study').experiment_id])])")
    out = subprocess.run([sys.executable, "-c", check, f"sqlite:///{store}"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['Default', 'study'] [{'val_loss': 0.5}]"

    before = store.read_bytes()
    seed_store(f"sqlite:///{store}")
    assert store.read_bytes() == before
