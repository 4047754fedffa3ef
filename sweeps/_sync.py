"""`csweep sync`: back-fill MLflow from the Optuna storage (the source of truth), idempotently."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from common import attrs as A
from ._lane import PENDING_DIR
from ._study import OBJECTIVES
from ._tracking import Tracker

_STATUS = {"COMPLETE": "FINISHED", "FAIL": "FAILED", "PRUNED": "KILLED"}


def sync_study(study: Any, workdir: Path, tracking_uri: str, *, artifact_root: Path | None) -> tuple[int, int, int]:
    """Every finished trial gets exactly one MLflow run holding what the storage (and any record
    kept while MLflow was unreachable) knows. Returns (created, back-filled, already there)."""
    tracker = Tracker(tracking_uri, study.study_name, artifact_root=artifact_root)
    parent = tracker.attach_parent(study, params={"space": study.user_attrs.get(A.SPACE, {}).get("name", ""),
                                                  "objective": study.user_attrs.get(A.OBJECTIVE, "")})
    study.set_user_attr(A.EXPERIMENT_ID, tracker.experiment_id)
    pending_dir = workdir / PENDING_DIR / study.study_name
    created = filled = already = 0
    # a finished trial cannot take new user attrs: runs created here are recorded on the study
    synced: dict[str, str] = dict(study.user_attrs.get(A.SYNCED_RUNS, {}))
    names = study.metric_names or list(OBJECTIVES)
    for t in study.trials:
        if t.state.name == "RUNNING" or t.state.name == "WAITING":
            continue
        record_path = pending_dir / f"trial-{t.number}.json"
        record = json.loads(record_path.read_text()) if record_path.is_file() else None
        run_id = t.user_attrs.get(A.MLFLOW_RUN_ID) or synced.get(str(t.number))
        exists = False
        if run_id:
            try:
                exists = tracker.client.get_run(run_id).info.lifecycle_stage == "active"
            except Exception:  # noqa: BLE001 - the run id was never written to MLflow
                exists = False
        if exists and record is None:
            already += 1
            continue
        if not exists:
            fixed = study.user_attrs.get(A.SETTINGS, {}).get("fixed", {})
            params = {**fixed, **t.params}
            run_id = tracker.start_trial(parent, study.study_name, t.number, params)
            synced[str(t.number)] = run_id
            study.set_user_attr(A.SYNCED_RUNS, synced)
            created += 1
        else:
            filled += 1
        status = _STATUS.get(t.state.name, "FAILED")
        if record is not None:
            artifacts = {}
            art_dir = pending_dir / f"trial-{t.number}"
            if art_dir.is_dir():
                artifacts = {str(p.relative_to(art_dir)): p.read_bytes() for p in art_dir.rglob("*") if p.is_file()}
            tracker.finish_trial(run_id, status=record["status"], metrics=record.get("metrics", {}),
                                 history=record.get("history", {}), tags=record.get("tags", {}),
                                 artifacts=artifacts, config=record.get("config"),
                                 datasets=record.get("datasets", ()), curve=record.get("curve", {}))
            record_path.unlink()
            shutil.rmtree(art_dir, ignore_errors=True)
        else:
            metrics = {}
            if t.values is not None:
                metrics = dict(zip(names, t.values))
            reason = (t.user_attrs.get(A.FAIL_REASON) or t.user_attrs.get(A.PRUNE_REASON)
                      or study.user_attrs.get(A.STALE, {}).get(str(t.number), ""))
            tags = {A.TAG_STATE: t.state.name, **({A.FAIL_REASON: reason} if reason else {})}
            curve = {"val_loss": t.user_attrs[A.VAL_CURVE]} if t.user_attrs.get(A.VAL_CURVE) else {}
            tracker.finish_trial(run_id, status=status, metrics=metrics, tags=tags, curve=curve)
    tracker.end_parent(parent)
    return created, filled, already
