"""One definition of the trials an analysis may use: a study with out-of-memory, over-budget,
pruned and failed trials is analysed exactly as its usable trials alone."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pandas as pd
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from reports import analyse, trials_frame, usable, write_study_report
from common import attrs as A

DISTS = {"a": FloatDistribution(0.0, 1.0), "b": FloatDistribution(0.0, 1.0), "c": FloatDistribution(0.0, 1.0),
         "mode": CategoricalDistribution(["x", "y"])}
BUDGET = 140.0


def _loss(p):
    return 4 * (p["a"] - 0.5) * (p["b"] - 0.5) + p["c"] + 0.2 * (p["mode"] == "y")


def _mem(p):
    return 100 + 40 * p["c"] + 10 * p["a"]


def build(with_bad: bool) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["minimize", "minimize"])
    study.set_user_attr(A.MAX_MEM, BUDGET)
    study.set_user_attr(A.SPACE, {"hypotheses": [{"x": "a", "y": "b", "law": "power"}]})
    rng = np.random.default_rng(0)
    for i in range(70):
        p = {"a": float(rng.uniform(0.05, 1)), "b": float(rng.uniform(0.05, 1)), "c": float(rng.uniform(0, 1)),
             "mode": ["x", "y"][i % 2]}
        kind = ("oom" if p["a"] > 0.8 and p["b"] > 0.6 else "fail" if i % 11 == 3 else
                "pruned" if i % 13 == 5 else "ok")
        if kind == "ok":
            mem = _mem(p)
            trial = create_trial(values=[_loss(p), mem], params=p, distributions=DISTS,
                                 user_attrs={A.OUTCOME: "ok"}, constraints={"peak_mem_mb": mem - BUDGET})
            if mem > BUDGET and not with_bad:
                continue
            study.add_trial(trial)
        elif with_bad:
            attrs = {A.OUTCOME: {"oom": "out_of_memory", "fail": "failed", "pruned": "pruned"}[kind]}
            if kind == "oom":
                attrs |= {A.OUT_OF_MEMORY: True, A.FAIL_REASON: "out of memory: planted"}
            state = TrialState.PRUNED if kind == "pruned" else TrialState.FAIL
            study.add_trial(create_trial(state=state, params=p, distributions=DISTS, user_attrs=attrs))
    return study


def test_the_analysis_equals_the_analysis_of_the_usable_trials_alone():
    messy, clean = build(True), build(False)
    rm, rc = analyse(messy, n_boot=4), analyse(clean, n_boot=4)
    counts = rm.summary["counts_by_outcome"]
    assert counts["out_of_memory"] > 0 and counts["failed"] > 0 and counts["pruned"] > 0
    assert (~rm.trials["feasible"] & (rm.trials["outcome"] == "ok")).any()  # over budget, too
    assert len(rm.usable) == len(rc.usable) == len(rc.trials)
    assert list(rm.front["trial"].map(lambda n: messy.trials[n].params["a"])) == \
        list(rc.front["trial"].map(lambda n: clean.trials[n].params["a"]))
    assert rm.summary["hypervolume"] == pytest.approx(rc.summary["hypervolume"])
    assert rm.summary["reference_point"] == pytest.approx(rc.summary["reference_point"])
    key = [(c.param_a, c.param_b, round(c.strength, 9), round(c.ci_low, 9)) for c in rm.couplings]
    assert key == [(c.param_a, c.param_b, round(c.strength, 9), round(c.ci_low, 9)) for c in rc.couplings]
    assert [(f.alpha, f.alpha_ci_low, f.alpha_ci_high) for f in rm.laws] == \
        [(f.alpha, f.alpha_ci_low, f.alpha_ci_high) for f in rc.laws]


def test_unusable_trials_are_in_the_tables_with_their_reason_never_as_numbers(tmp_path):
    messy = build(True)
    files = write_study_report(messy, tmp_path / "out", n_boot=3)
    trials = pd.read_csv(files["trials.csv"])
    oom = trials[trials["outcome"] == "out_of_memory"]
    assert len(oom) and oom["val_loss"].isna().all() and oom["peak_mem_mb"].isna().all()
    assert oom["reason"].str.startswith("out of memory").all() and not oom["feasible"].any()
    front = pd.read_csv(files["pareto.csv"])
    assert front["feasible"].all() and (front["outcome"] == "ok").all() and (front["peak_mem_mb"] <= BUDGET).all()
    assert "p_front" in front.columns and "val_loss_sem" in front.columns


def test_an_older_study_with_placeholder_oom_values_is_read_right():
    """csweep before this round told out-of-memory trials COMPLETE with 1e6 and marked `oom`."""
    study = build(False)
    p = {"a": 0.9, "b": 0.9, "c": 0.1, "mode": "x"}
    study.add_trial(create_trial(values=[1e6, 2 * BUDGET], params=p, distributions=DISTS,
                                 user_attrs={A.OUT_OF_MEMORY: True, A.FAIL_REASON: "out of memory: old"},
                                 constraints={"peak_mem_mb": 1e6}))
    frame = trials_frame(study)
    row = frame.iloc[-1]
    assert row["outcome"] == "out_of_memory" and math.isnan(row["val_loss"])
    assert study.trials[-1].number not in set(usable(frame)["trial"])


def test_runs_that_never_settled_stay_on_the_front_but_out_of_the_fits(tmp_path):
    """Two COMPLETE trials the health monitor labelled `degrading` and `diverged` (val_loss far
    above the rest, two wild seeds each; one at the lowest memory, so on the front): coupling,
    laws and noise equal those of the study without them; the page and summary.json say which
    were left out."""
    clean, study = build(False), build(False)
    low = min(_mem(t.params) for t in clean.trials)
    for health, loss, mem in (("degrading", 40.0, low - 5), ("diverged", 55.0, low + 20)):
        p = {"a": 0.3, "b": 0.7, "c": 0.5, "mode": "x"}
        study.add_trial(create_trial(values=[loss, mem], params=p, distributions=DISTS,
                                     user_attrs={A.OUTCOME: "ok", A.HEALTH: health, A.N_SEEDS: 2,
                                                 A.VAL_LOSS_STD: 3.0, A.VAL_LOSS_SEM: 2.12},
                                     constraints={"peak_mem_mb": mem - BUDGET}))
    rep, ref = analyse(study, n_boot=4), analyse(clean, n_boot=4)
    unsettled = [len(clean.trials), len(clean.trials) + 1]
    assert len(rep.usable) == len(ref.usable) + 2 and unsettled[0] in set(rep.front["trial"])
    assert [(c.param_a, c.param_b, c.strength, c.ci_low) for c in rep.couplings] == \
        [(c.param_a, c.param_b, c.strength, c.ci_low) for c in ref.couplings]
    assert [(f.alpha, f.alpha_ci_low) for f in rep.laws] == [(f.alpha, f.alpha_ci_low) for f in ref.laws]
    assert rep.summary["val_loss_spread_std"] == pytest.approx(ref.summary["val_loss_spread_std"])
    # their replicates' wild spread is not the study's seed noise: none is measured among the rest,
    # so the other front trials stay certain
    assert rep.summary["noise_floor_std"] is None
    assert (rep.front.loc[~rep.front["trial"].isin(unsettled), "p_front"] == 1.0).all()
    assert rep.summary["n_fitted"] == rep.summary["n_usable"] - 2
    assert [(d["trial"], d["health"]) for d in rep.summary["left_out_of_fits"]] == \
        list(zip(unsettled, ["degrading", "diverged"]))
    files = write_study_report(study, tmp_path / "out", n_boot=2)
    page = files["index.html"].read_text()
    assert f"left out 2 whose training did not settle: trials {unsettled[0]} (degrading, val_loss 40)" in page
    assert ref.fit_note == "" and ref.summary["left_out_of_fits"] == []


def test_a_plug_in_marks_a_run_that_did_not_settle_through_its_tags():
    """What a plug-in returns -> the trial in storage -> the fits: `tags: {health: ...}` is the
    way in, and only `diverged` / `degrading` keep a trial out."""
    from reports import converged
    from sweeps._result import Kind, TrialResult, normalize, tell

    study = optuna.create_study(directions=["minimize", "minimize"])
    for health in ("degrading", "oscillating", None):
        raw = {"val_loss": 1.0, "peak_mem_mb": 2.0, "history": {"train_loss": [3, 2]}}
        if health:
            raw["tags"] = {"health": health}
        trial = study.ask({"a": DISTS["a"]})
        tell(study, trial, TrialResult(Kind.OK, **normalize(raw)), max_mem_mb=None)
    frame = trials_frame(study)
    assert list(frame["health"]) == ["degrading", "oscillating", ""]
    assert list(converged(usable(frame))["trial"]) == [1, 2]
