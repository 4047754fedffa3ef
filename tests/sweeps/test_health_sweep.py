"""Divergence-aware early stopping in a two-objective sweep: PRUNED with the reason, everywhere."""

from __future__ import annotations

import json

import optuna
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from sweeps import main

pytestmark = pytest.mark.slow  # runs real sweeps on the Ray of this test process (helpers.in_process)

SPACE = """
name: blowup
params:
  lr: {type: float, low: 50.0, high: 100.0, log: true}
fixed:
  steps: 60
"""


@pytest.mark.parametrize("early_stop", [True, False])
def test_diverging_trials_are_pruned_with_reason(tmp_path, monkeypatch, capsys, early_stop):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "blowup.yaml").write_text(SPACE)
    extra = [] if early_stop else ["--no-early-stop", "--set", "steps=6"]
    assert main(["run", "blowup.yaml", "--trials", "2", "--workers", "2", "--no-progress", *extra]) == 0
    study = optuna.load_study(study_name="blowup", storage=f"sqlite:///{tmp_path / 'csweep_runs/optuna.db'}")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'csweep_runs/mlflow.db'}")
    for t in study.trials:
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert t.user_attrs["health"] == "diverged" and run.data.tags["health"] == "diverged"
        if early_stop:
            assert t.state == optuna.trial.TrialState.PRUNED
            assert t.user_attrs["prune_reason"].startswith("diverged:")
            assert run.info.status == "KILLED" and run.data.tags["optuna.state"] == "PRUNED"
            steps = client.get_metric_history(run.info.run_id, "train_loss")
            assert 1 <= len(steps) <= 5  # stopped at once, not after the 60 steps
        else:
            assert t.state == optuna.trial.TrialState.COMPLETE and run.info.status == "FINISHED"
        assert "health.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
    report = tmp_path / "csweep_runs/reports/blowup"
    trials = pd.read_csv(report / "trials.csv")
    assert list(trials["health"]) == ["diverged", "diverged"]
    summary = json.loads((report / "summary.json").read_text())
    assert summary["counts_by_health"] == {"diverged": 2}
    assert ("2 pruned" if early_stop else "0 pruned") in capsys.readouterr().out
