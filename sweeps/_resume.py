"""A stored study run again: the trials a driver that died left RUNNING failed (and their MLflow
runs ended), what to run again, how many trials remain, and rerun-front's fresh seeds."""

from __future__ import annotations

import json
from typing import Any

from common import attrs as A
from common.attrs import is_replaced

from ._tracking import SafeTracker


def counted_trials(study: Any) -> int:
    """Trials that count toward the requested total: all but those replaced by a re-run and those
    enqueued and never started (WAITING: the next asks pop them)."""
    from optuna.trial import TrialState

    return sum(1 for t in study.trials if not is_replaced(study, t) and t.state != TrialState.WAITING)


def stale_trials(study: Any) -> list[Any]:
    from optuna.trial import TrialState

    return [t for t in study.trials if t.state == TrialState.RUNNING]


def prepare_resume(study: Any, mlflow: SafeTracker | None) -> tuple[list[dict[str, Any]], int]:
    """Fail the stale RUNNING trials of a driver that died (their MLflow runs too) and return the
    parameters to run again (theirs and those of interrupted trials) and how many trials remain."""
    from optuna.trial import TrialState

    reason = "stale: its driver stopped"
    stale = dict(study.user_attrs.get(A.STALE, {}))
    parent = study.user_attrs.get(A.PARENT_RUN, "")
    for t in stale_trials(study):
        stale[str(t.number)] = reason
        study.set_user_attr(A.STALE, stale)  # before the tell: a crash in between loses nothing
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        if mlflow is None:
            continue
        run_id = t.user_attrs.get(A.MLFLOW_RUN_ID) or ""
        if not run_id:
            # the driver died before it recorded the run's id on the trial: found by its tags,
            # recorded for `csweep sync`, so that the trial keeps exactly one run
            run_id = mlflow.find_trial_run(parent, t.number)
            if run_id:
                study.set_user_attr(A.SYNCED_RUNS, {**study.user_attrs.get(A.SYNCED_RUNS, {}), str(t.number): run_id})
        mlflow.end_stale(run_id, reason)
    redo, attrs, seen = [], [], set()
    requeued = set(study.user_attrs.get(A.REQUEUED, []))
    sampled = set((study.user_attrs.get(A.SPACE) or {}).get("params", {}))
    for t in study.trials:
        if is_replaced(study, t) and t.number not in requeued:
            requeued.add(t.number)
            if not sampled <= set(t.params):
                # the driver died while `ask` was writing this trial's parameters: a partial set
                # is no config of the study; its slot is sampled afresh (it counts as replaced)
                continue
            key = json.dumps(t.params, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                redo.append(dict(t.params))
                # a re-run of `csweep rerun-front` stays one: it names the trial it re-trains
                attrs.append({A.RERUN_OF: t.user_attrs[A.RERUN_OF]} if A.RERUN_OF in t.user_attrs else {})
    study.set_user_attr(A.REQUEUED, sorted(requeued))
    target = int(study.user_attrs.get(A.TARGET_TRIALS, counted_trials(study)))
    remaining = max(0, target - counted_trials(study))
    return redo, remaining, attrs


def fresh_seed_offset(study: Any) -> int:
    """The replicate-seed offset past every seed the study's trials used (rerun-front's fresh seeds)."""
    used = [s for t in study.trials for s in t.user_attrs.get(A.SEEDS, [])]
    base = int(study.user_attrs.get(A.SETTINGS, {}).get("fixed", {}).get("seed", 0) or 0)
    return max(1, (max(used) - base + 1) if used else 1)


def unfinished_reruns(study: Any, attrs: list[dict[str, Any]]) -> bool:
    """Whether a resume completes an interrupted `csweep rerun-front`: re-runs re-queued, or
    enqueued and never started."""
    from optuna.trial import TrialState

    return any(A.RERUN_OF in a for a in attrs) or any(
        t.state == TrialState.WAITING and A.RERUN_OF in t.user_attrs for t in study.trials)
