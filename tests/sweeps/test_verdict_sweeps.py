"""The verdict machinery through `csweep run` itself (sweeps.main in this process, on Ray): the
qmc and coupling samplers, and --until-decisive stopping a strongly coupled study early."""

from __future__ import annotations

import pandas as pd
import pytest

from helpers import in_process

pytestmark = pytest.mark.slow

OBJECTIVE = '''
import hashlib


def objective(params):
    x, y, z = params["x"], params["y"], params["z"]
    h = hashlib.sha1(repr((x, y, z, params.get("seed", 0))).encode()).digest()
    noise = 0.02 * (int.from_bytes(h[:4], "big") / 2**32 - 0.5)
    return {"val_loss": 3 * (x - 0.5) * (y - 0.5) + (z - 0.5) ** 2 + noise, "peak_mem_mb": 10 + z}
'''

SPACE = """
name: strong
objective: verdictobj:objective
params:
  x: {type: float, low: 0.0, high: 1.0}
  y: {type: float, low: 0.0, high: 1.0}
  z: {type: float, low: 0.0, high: 1.0}
"""


@pytest.fixture
def project(tmp_path, monkeypatch, capsys):
    (tmp_path / "verdictobj.py").write_text(OBJECTIVE)
    (tmp_path / "strong.yaml").write_text(SPACE)
    monkeypatch.delitem(__import__("sys").modules, "verdictobj", raising=False)
    return tmp_path, in_process(tmp_path, monkeypatch, capsys)


def test_until_decisive_stops_a_strongly_coupled_study_well_before_its_budget(project):
    path, csweep = project
    res = csweep("run", "strong.yaml", "--trials", "60", "--workers", "2", "--sampler", "coupling", "--seed", "1",
                 "--until-decisive", "--no-progress")
    assert res.returncode == 0, res.stderr
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("decided after")]
    assert len(line) == 1, res.stdout
    coupling = pd.read_csv(path / "csweep_runs/reports/strong/coupling.csv")
    n = int(coupling["n_trials"].iloc[0])
    assert n < 30, line  # well under half the budget
    # the decision the stop was taken on: every pair decided, and rightly
    assert "x x y coupled" in line[0], line
    assert "x x z no sign of coupling" in line[0] and "y x z no sign of coupling" in line[0], line
    # the report also counts the trials that were in flight at the stop (2 workers): the planted
    # pair stays coupled and no other pair is called coupled (one near the line may read
    # inconclusive there)
    verdicts = {frozenset((r.param_a, r.param_b)): r.verdict for r in coupling.itertuples()}
    assert verdicts[frozenset(("x", "y"))] == "coupled"
    assert verdicts[frozenset(("x", "z"))] != "coupled" and verdicts[frozenset(("y", "z"))] != "coupled", verdicts
    page = (path / "csweep_runs/reports/strong/index.html").read_text()
    assert "Tune x and y together" in page and page.index("Conclusions") < page.index("Seed noise")


def test_qmc_spreads_the_trials_and_a_rerun_continues_the_sequence(project):
    path, csweep = project
    res = csweep("run", "strong.yaml", "--trials", "8", "--workers", "1", "--sampler", "qmc", "--seed", "2",
                 "--no-progress")
    assert res.returncode == 0, res.stderr
    trials = pd.read_csv(path / "csweep_runs/reports/strong/trials.csv")
    # scrambled Sobol (its first point drawn at random, as Optuna's QMCSampler does): every axis
    # covered on both sides
    for k in "xyz":
        assert 3 <= (trials[k] < 0.5).sum() <= 5, trials[k].tolist()
    res = csweep("run", "strong.yaml", "--trials", "8", "--workers", "1", "--sampler", "qmc", "--seed", "2",
                 "--no-progress")
    assert res.returncode == 0, res.stderr
    trials = pd.read_csv(path / "csweep_runs/reports/strong/trials.csv")
    assert len(trials) == 16 and len(trials[["x", "y", "z"]].drop_duplicates()) == 16
    # one sequence: the two runs of 8 drew the configs that one run of 16 draws (the rerun once
    # restarted a differently scrambled sequence)
    res = csweep("run", "strong.yaml", "--study", "whole", "--trials", "16", "--workers", "1", "--sampler", "qmc",
                 "--seed", "2", "--no-progress")
    assert res.returncode == 0, res.stderr
    whole = pd.read_csv(path / "csweep_runs/reports/whole/trials.csv")
    assert _configs(trials) == _configs(whole)


def _configs(trials: pd.DataFrame) -> list[tuple[float, ...]]:
    return sorted(tuple(round(float(v), 9) for v in row) for row in trials[["x", "y", "z"]].to_numpy())


@pytest.mark.parametrize("sampler", ["qmc", "coupling"])
def test_an_unseeded_study_keeps_one_sobol_sequence_across_reruns(project, sampler):
    """Without --seed the study draws its Sobol scramble seed once and stores it (the study's
    `qmc_seed`): a rerun continues that sequence, as a seeded study does, so that the design's
    start stays space-filling across runs (coupling's start: 2 x 3 params + 2 = 8 trials)."""
    import optuna

    path, csweep = project
    for _ in range(2):
        res = csweep("run", "strong.yaml", "--trials", "4", "--workers", "1", "--sampler", sampler, "--no-progress")
        assert res.returncode == 0, res.stderr
    storage = f"sqlite:///{path / 'csweep_runs' / 'optuna.db'}"
    seed = optuna.load_study(study_name="strong", storage=storage).user_attrs["qmc_seed"]
    res = csweep("run", "strong.yaml", "--study", "whole", "--trials", "8", "--workers", "1", "--sampler", sampler,
                 "--seed", str(seed), "--no-progress")
    assert res.returncode == 0, res.stderr
    assert _configs(pd.read_csv(path / "csweep_runs/reports/strong/trials.csv")) == _configs(
        pd.read_csv(path / "csweep_runs/reports/whole/trials.csv"))


def test_seed_plan_design_spends_the_runs_on_configs_after_the_noise_floor(project):
    """--seed-plan design: --trials 10 --seeds 2 is 20 training runs; the design's start (2 x 3
    params + 2 = 8 trials) trains 2 seeds each, every later config one, so 12 configs in all,
    and the report's noise floor comes from the start's replicates."""
    path, csweep = project
    res = csweep("run", "strong.yaml", "--trials", "10", "--seeds", "2", "--workers", "2", "--sampler", "coupling",
                 "--seed-plan", "design", "--seed", "3", "--no-progress")
    assert res.returncode == 0, res.stderr
    trials = pd.read_csv(path / "csweep_runs/reports/strong/trials.csv").sort_values("trial")
    assert trials["n_seeds"].tolist() == [2] * 8 + [1] * 4, trials[["trial", "n_seeds"]]
    assert trials["n_seeds"].sum() == 20
    assert trials["val_loss_sem"].iloc[:8].notna().all() and trials["val_loss_sem"].iloc[8:].isna().all()
    summary = __import__("json").loads((path / "csweep_runs/reports/strong/summary.json").read_text())
    noise = {k: v for k, v in summary.items() if "noise" in k}
    assert noise and any(v for v in noise.values()), summary
    # the same command again adds 10 x 2 runs of single-seed configs: the start is behind it
    res = csweep("run", "strong.yaml", "--trials", "10", "--seeds", "2", "--workers", "1", "--sampler", "coupling",
                 "--seed-plan", "design", "--seed", "3", "--no-progress")
    assert res.returncode == 0, res.stderr
    trials = pd.read_csv(path / "csweep_runs/reports/strong/trials.csv").sort_values("trial")
    assert len(trials) == 32 and trials["n_seeds"].iloc[12:].eq(1).all()
