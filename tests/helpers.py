"""Helpers shared by tests (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

def load(project: Path, name: str = "analytic"):
    """The study and an MLflow client of a default workdir in `project`."""
    import optuna
    from mlflow.tracking import MlflowClient

    study = optuna.load_study(study_name=name, storage=f"sqlite:///{project / 'csweep_runs/optuna.db'}")
    return study, MlflowClient(tracking_uri=f"sqlite:///{project / 'csweep_runs/mlflow.db'}")


def child_runs(client, name: str = "analytic"):
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id], max_results=500)
    return [r for r in runs if "mlflow.parentRunId" in r.data.tags], [
        r for r in runs if "mlflow.parentRunId" not in r.data.tags]


def in_process(cwd: Path, monkeypatch, capsys):
    """`csweep ARGS` run by `sweeps.main` in this test process, from `cwd` as the user's working
    directory (a plug-in module there importable, as `python -m` makes it for the command): the
    Ray it starts stays up for the next such run in this process, one start per test process
    instead of one per command. Returns what `cli` does: returncode, stdout, stderr."""
    from sweeps import main

    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))
    monkeypatch.delitem(sys.modules, "userobj", raising=False)

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        rc = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["csweep", *args], rc, out.out, out.err)

    return run
