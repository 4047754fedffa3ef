"""The curve of every trial: validation during training, the best step, `--score best`, and
`--early-stop dominated` (rungs judged on the curves of the trials that reached them)."""

from __future__ import annotations

import json
import math
import types

import pandas as pd
import pytest

from synthetic import CURVE_PLUGIN, CURVE_SPACE
from sweeps._rungs import RungBoard, rung_steps
from sweeps._workers import drive_curve, run_trial


def curves_module() -> types.ModuleType:
    m = types.ModuleType("curves")
    exec(CURVE_PLUGIN, m.__dict__)
    return m


# --- the board's rule ------------------------------------------------------------------------
def _feed(board: RungBoard, trial: int, mem: float, curve: dict[int, float], *, steps: int = 90, seed: int = 0):
    answer = ("", 0)
    for step, value in sorted(curve.items()):
        answer = board.report(trial, seed, steps, step, {"val_loss": value, "peak_mem_mb": mem})
        if answer[0]:
            return answer
    return answer


def test_a_trial_beaten_at_a_rung_by_trials_of_no_more_memory_is_stopped_there():
    board = RungBoard(fractions=(1 / 9, 1 / 3), min_reached=2, extrapolate=False)
    assert rung_steps(board.fractions, 90) == [10, 30]
    for trial in range(2):  # two good trials reach both rungs
        assert _feed(board, trial, 100.0, {0: 1.0, 10: 0.5, 20: 0.4, 30: 0.3, 90: 0.2}) == ("", 0)
    reason, rung = _feed(board, 2, 100.0, {0: 1.0, 10: 0.8, 20: 0.7})
    assert rung == 1 and "dominated at rung 1 (step 10)" in reason and "trial 0's 0.5" in reason
    # once stopped, every further report of that trial (another seed replicate) says so
    assert board.report(2, 1, 90, 10, {"val_loss": 0.1, "peak_mem_mb": 100.0})[1] == 1


def test_less_memory_or_a_loss_within_the_margin_keeps_a_trial_going():
    board = RungBoard(fractions=(1 / 9,), min_reached=2, extrapolate=False)
    for trial in range(2):
        _feed(board, trial, 100.0, {0: 1.0, 10: 0.5, 90: 0.2})
    # worse loss at less memory: a front member of its own memory, not dominated
    assert _feed(board, 2, 50.0, {0: 1.0, 10: 0.9, 20: 0.8}) == ("", 0)
    # same memory, loss within the 1% margin of the best: not clearly worse
    assert _feed(board, 3, 100.0, {0: 1.0, 10: 0.504, 20: 0.45}) == ("", 0)


def test_a_rung_stops_nothing_until_enough_trials_reached_it():
    board = RungBoard(fractions=(1 / 9,), min_reached=3, extrapolate=False)
    _feed(board, 0, 100.0, {0: 1.0, 10: 0.2, 90: 0.1})
    _feed(board, 1, 100.0, {0: 1.0, 10: 0.2, 90: 0.1})
    assert _feed(board, 2, 100.0, {0: 1.0, 10: 0.9, 20: 0.9}) == ("", 0)  # two reached it: grace
    assert _feed(board, 3, 100.0, {0: 1.0, 10: 0.9, 20: 0.9})[1] == 1  # three did


def test_other_trials_are_read_off_their_curves_between_validations_and_replicates_are_averaged():
    board = RungBoard(fractions=(1 / 3,), min_reached=1, extrapolate=False)
    _feed(board, 0, 100.0, {0: 1.0, 20: 0.6, 40: 0.2, 90: 0.1})  # at step 30: 0.4 interpolated
    assert board.value(0, 30) == pytest.approx(0.4)
    # trial 1's replicates: 0.3 and 0.6 at step 30, mean 0.45 > 0.4 -> stopped by the second
    assert _feed(board, 1, 100.0, {0: 1.0, 30: 0.3, 60: 0.2}, seed=0) == ("", 0)
    reason, rung = _feed(board, 1, 100.0, {0: 1.0, 30: 0.6}, seed=1)
    assert rung == 1 and "val_loss 0.45" in reason


def test_a_trial_that_cannot_reach_what_a_finished_trial_ended_at_is_stopped():
    """Level with the others at the rung, but a trial of no more memory that ran to its end
    finished below where this one would end at best: the front has already beaten it."""
    board = RungBoard(fractions=(1 / 3,), min_reached=1)
    _feed(board, 0, 100.0, {0: 1.0, 10: 0.6, 20: 0.55, 30: 0.52, 90: 0.2})
    # 0.52 at step 30 like trial 0 there, its gains 0.05 then 0.03: it would end near 0.48
    reason, rung = _feed(board, 1, 100.0, {0: 1.0, 10: 0.6, 20: 0.55, 30: 0.52, 40: 0.51})
    assert rung == 1 and "trial 0's final 0.2" in reason, reason
    # gains that grow (0.2, then 0.25): its extrapolation goes below 0.2, so it is kept
    assert _feed(board, 2, 100.0, {0: 1.0, 10: 0.9, 20: 0.7, 30: 0.45, 40: 0.3}) == ("", 0)
    # less memory than the finished trial: nothing finished dominates it
    assert _feed(board, 3, 50.0, {0: 1.0, 10: 0.6, 20: 0.55, 30: 0.52, 40: 0.51}) == ("", 0)


def test_a_slow_starter_that_may_still_catch_up_is_kept_a_flat_one_is_stopped():
    """Dominated now is not enough: the trial is stopped only if even its curve's geometric
    extrapolation (its gains shrinking as they last did) ends above the dominating value."""
    board = RungBoard(fractions=(1 / 3,), min_reached=1)
    _feed(board, 0, 100.0, {0: 1.0, 10: 0.4, 20: 0.3, 30: 0.28, 90: 0.25})
    # 0.5 at step 30, its gains 0.2 then 0.15 (ratio 0.75): it would end well below 0.28
    assert _feed(board, 1, 100.0, {0: 1.0, 10: 0.85, 20: 0.65, 30: 0.5, 40: 0.4}) == ("", 0)
    # 0.8 at step 30 and hardly moving (gains 0.02, 0.01): it cannot get below 0.28
    reason, rung = _feed(board, 2, 100.0, {0: 1.0, 10: 0.83, 20: 0.81, 30: 0.8, 40: 0.8})
    assert rung == 1 and "step 30" in reason
    assert board.optimistic(2, 30, 90) == pytest.approx(0.8 - 0.01 * 0.5 * (1 - 0.5 ** 6) / 0.5)


def test_replicates_that_validate_at_their_own_pace_are_each_extrapolated_from_their_own_curve():
    """--seeds 2: seed 1 has reported step 4 only (it runs lower), seed 0 steps 4 and 7. Seed 0
    is still improving (0.0926 -> 0.0900) and would end near 0.0815, below the 0.085 a finished
    trial of the same memory reached: it goes on. A gain read from the replicates' mean at step 4
    and seed 0 alone at step 7 was negative, so the trial was read as flat and stopped (the
    README demo's space with --seeds 2 lost front trials to it)."""
    board = RungBoard(fractions=(4 / 30, 7 / 30), min_reached=1)
    _feed(board, 0, 21.4, {4: 0.09, 7: 0.088, 30: 0.085}, steps=30)
    assert _feed(board, 1, 21.4, {4: 0.080}, steps=30, seed=1) == ("", 0)
    assert _feed(board, 1, 21.4, {4: 0.0926, 7: 0.0900}, steps=30, seed=0) == ("", 0)
    assert board.optimistic(1, 7, 30) == pytest.approx(0.09 - 0.0026 * 0.8 * (1 - 0.8 ** (23 / 3)) / 0.2)
    # once both have two points, the trial's end is the mean of the two extrapolations
    _feed(board, 1, 21.4, {4: 0.080, 7: 0.079}, steps=30, seed=1)
    assert board.optimistic(1, 7, 30) == pytest.approx(
        (0.09 - 0.0026 * 4 * (1 - 0.8 ** (23 / 3)) + 0.079 - 0.001 * 4 * (1 - 0.8 ** (23 / 3))) / 2)


# --- a plug-in that reports its curve ------------------------------------------------------------
def test_a_generator_plug_in_reports_each_point_and_is_closed_when_stopped():
    closed = []

    def objective(params):
        try:
            for step in (0, 10, 20, 30):
                yield {"step": step, "val_loss": 1.0 - step / 100, "peak_mem_mb": 5.0}
            return {"val_loss": 0.7, "peak_mem_mb": 5.0}
        finally:
            closed.append(True)

    seen = []
    out = drive_curve(objective({}), score="best", report=lambda s, v: seen.append(s) or "")
    assert seen == [0, 10, 20, 30] and out["val_loss"] == pytest.approx(0.7)
    assert [p["step"] for p in out["curve"]] == [0, 10, 20, 30]

    from objectives import TrialStopped

    with pytest.raises(TrialStopped) as stop:
        drive_curve(objective({}), score="final", report=lambda s, v: "dominated" if s == 10 else "")
    assert closed == [True, True]  # the stopped generator's finally ran
    assert [p["step"] for p in stop.value.partial["curve"]] == [0, 10]


def test_score_best_takes_the_lowest_point_and_keeps_the_final_one():
    m = curves_module()
    params = {"lr": 0.1, "rank": 4, "steps": 90, "val_every": 10, "noise": 0.0}
    best = drive_curve(m.objective(params), score="best", report=None)
    final = drive_curve(m.objective(params), score="final", report=None)
    values = {p["step"]: p["val_loss"] for p in final["curve"]}
    assert final["val_loss"] == pytest.approx(values[90])
    assert best["val_loss"] == pytest.approx(min(values.values()))
    assert best["val_loss"] < best["val_loss_final"]


@pytest.mark.parametrize("bad,words", [
    ([{"step": 0, "val_loss": 1.0}, {"step": 0, "val_loss": 0.9}], "steps must increase"),
    ([{"step": -1, "val_loss": 1.0}], "int >= 0"),
    ([{"step": 1, "val_loss": float("nan")}], "must be finite"),
    ([{"val_loss": 1.0}], "step and val_loss"),
])
def test_a_bad_curve_fails_the_trial_with_the_reason(bad, words, monkeypatch):
    def objective(params):
        yield from bad
        return {"val_loss": 1.0, "peak_mem_mb": 1.0}

    module = types.ModuleType("badcurve")
    module.objective = objective
    monkeypatch.setitem(__import__("sys").modules, "badcurve", module)
    out = run_trial("badcurve:objective", False, {}, model="tiny", data=None)
    assert out.kind.value == "failed" and words in out.reason


# --- the built-in objective ------------------------------------------------------------------
@pytest.mark.slow
def test_the_builtin_validates_during_training_and_score_best_is_the_best_steps_model():
    """val_every gives the curve; with score=best, val_loss, the exports and the learned rows are
    the best step's: the same as a run trained for exactly that many steps (the LR schedule is
    constant after warmup, so a run's first s steps are a run of s steps)."""
    import torch
    from safetensors.torch import load

    from objectives import train

    torch.set_num_threads(1)
    params = {"lr": 5e-3, "seed": 1, "steps": 80}
    best = train({**params, "val_every": 10}, score="best").result
    steps = [p["step"] for p in best["curve"]]
    assert steps == [0, 10, 20, 30, 40, 50, 60, 70, 80]
    assert all(f"val_loss/t{t}" in best["curve"][1] for t in (100, 300, 500, 700, 900))
    values = {p["step"]: p["val_loss"] for p in best["curve"]}
    b = int(best["best_step"])
    assert values[b] == min(values.values()) and best["val_loss_at_best"] == pytest.approx(values[b])
    assert 0 < b < 80, "this config peaks before its last step (pick another if the tiny model changes)"
    assert best["val_loss"] == pytest.approx(values[b], rel=1e-6)
    assert best["val_loss_final"] == pytest.approx(values[80], rel=1e-6) and best["val_loss_final"] > best["val_loss"]
    short = train({**params, "steps": b, "val_every": b}).result
    assert short["val_loss"] == pytest.approx(best["val_loss"], rel=1e-5)
    key = "concepts/red-circle/learned_embeds.safetensors"
    a, c = load(best["artifacts"][key]), load(short["artifacts"][key])
    assert all(torch.allclose(a[k], c[k], atol=1e-6) for k in a)
    # the default: about 8 validations a trial, but no more often than every 8 x held-out / batch
    # steps: the tiny model's 9 held-out images at batch 4, so every 18th
    default = train({"lr": 5e-3, "seed": 1, "steps": 40}).result
    assert [p["step"] for p in default["curve"]] == [0, 18, 36, 40] and default["val_every"] == 18
    from objectives import default_val_every

    assert default_val_every(1000, 9, 4) == 125 and default_val_every(80, 0, 4) == 10
    # under --early-stop dominated the default also validates at each rung's step (1/9, 2/9, ...,
    # 2/3 of 20 steps: 3, 5, 7, 9, 12, 14), so a rung judges the trial where it is placed; a
    # val_every the user gave is kept as it is
    from sweeps._rungs import BoardReporter

    board = RungBoard()
    ruled = train({"lr": 5e-3, "seed": 1, "steps": 20}, report=BoardReporter(board, 0, 0, 20)).result
    assert [p["step"] for p in ruled["curve"]] == [0, 3, 5, 7, 9, 12, 14, 18, 20]
    # the board sees every point of the curve, step 0 included (as a plug-in yields it), so a
    # trial is judged at its first rung with two points
    assert sorted(board.curves[0][0]) == [0, 3, 5, 7, 9, 12, 14, 18, 20]
    given = train({"lr": 5e-3, "seed": 1, "steps": 20, "val_every": 10},
                  report=BoardReporter(RungBoard(), 0, 0, 20)).result
    assert [p["step"] for p in given["curve"]] == [0, 10, 20]


# --- through csweep run ------------------------------------------------------------------------
@pytest.fixture
def curve_project(tmp_path):
    (tmp_path / "curves.py").write_text(CURVE_PLUGIN)
    (tmp_path / "curves.yaml").write_text(CURVE_SPACE)
    return tmp_path


@pytest.mark.slow
def test_early_stop_dominated_and_score_best_through_csweep_run(curve_project, monkeypatch, capsys):
    from helpers import child_runs, in_process, load

    csweep = in_process(curve_project, monkeypatch, capsys)
    res = csweep("run", "curves.yaml", "--trials", "24", "--workers", "2", "--sampler", "random", "--seed", "3",
                 "--early-stop", "dominated", "--score", "best", "--no-progress")
    assert res.returncode == 0, res.stderr
    study, client = load(curve_project, "curves")
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert pruned and done, [t.state.name for t in study.trials]
    for t in pruned:  # stopped at a rung, with the reason, its curve kept up to there
        assert t.user_attrs["rung"] in range(1, 7) and "dominated at rung" in t.user_attrs["prune_reason"]
        assert t.user_attrs["steps_run"] == t.user_attrs["val_curve"][-1][0] in (10, 20, 30, 40, 50, 60)
    m = curves_module()
    for t in done:  # the study's val_loss is the best step's
        curve = t.user_attrs["val_curve"]
        assert [s for s, _ in curve] == list(range(0, 91, 10))
        step, value = min(curve, key=lambda p: (p[1], p[0]))
        assert t.user_attrs["best_step"] == step and t.values[0] == pytest.approx(value)
        assert t.user_attrs["val_loss_at_best"] == pytest.approx(value)
        assert abs(value - m.truth(t.params["lr"], t.params["rank"], step)) < 0.06
    out = curve_project / "csweep_runs" / "reports" / "curves"
    trials = pd.read_csv(out / "trials.csv")
    assert {"best_step", "val_loss_at_best", "steps_run", "rung"} <= set(trials.columns)
    front = pd.read_csv(out / "pareto.csv")
    assert set(front["trial"]) <= {t.number for t in done}
    summary = json.loads((out / "summary.json").read_text())
    c = summary["compute"]
    assert summary["score"] == "best" and c["stopped_at_a_rung"] == len(pruned)
    assert c["steps_saved_by_early_stop"] == sum(90 - t.user_attrs["steps_run"] for t in pruned)
    assert c["steps_trained"] + c["steps_saved_by_early_stop"] == c["steps_planned"] == 90 * len(study.trials)
    page = (out / "index.html").read_text()
    assert (out / "curves.png").is_file() and "Validation curves" in page and "steps saved by early stops" in page
    # MLflow: val_loss with its step on every trial's run
    runs, _ = child_runs(client, "curves")
    by_number = {int(r.data.tags["optuna.trial_number"]): r for r in runs}
    t = done[0]
    history = client.get_metric_history(by_number[t.number].info.run_id, "val_loss")
    assert sorted(h.step for h in history) == list(range(0, 91, 10))
    assert by_number[t.number].data.metrics["val_loss_at_best"] == pytest.approx(t.values[0])
    stopped = client.get_metric_history(by_number[pruned[0].number].info.run_id, "val_loss")
    assert max(h.step for h in stopped) == pruned[0].user_attrs["steps_run"]
    assert math.isfinite(summary["hypervolume"])
