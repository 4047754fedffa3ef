"""Every built-in search space runs 2 trials end to end (few steps) through `csweep run`."""

from __future__ import annotations

import optuna
import pandas as pd
import pytest

from search_spaces import builtin_space_names, load_space
from sweeps import main

pytestmark = pytest.mark.slow  # starts Ray and runs real sweeps


@pytest.fixture(scope="module", autouse=True)
def one_ray_for_all():
    yield
    import ray

    ray.shutdown()


@pytest.mark.parametrize("name", builtin_space_names())
def test_builtin_space_runs_two_trials(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = main(["run", name, "--trials", "2", "--workers", "2", "--set", "steps=3", "--no-progress",
               "--seed", "0"])
    assert rc == 0
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'csweep_runs/optuna.db'}")
    states = [t.state.name for t in study.trials]
    # a trial may be stopped by the health checks (PRUNED, with its reason); none may fail
    assert len(states) == 2 and set(states) <= {"COMPLETE", "PRUNED"}, [
        t.user_attrs.get("fail_reason") for t in study.trials]
    assert "COMPLETE" in states
    trials = pd.read_csv(tmp_path / f"csweep_runs/reports/{name}/trials.csv")
    assert set(p.name for p in load_space(name).params) <= set(trials.columns)
    assert trials["val_loss"].notna().all() and (trials["peak_mem_mb"] > 0).all()
