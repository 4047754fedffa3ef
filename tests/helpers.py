"""Helpers shared by tests (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations

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
