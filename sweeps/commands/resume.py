"""`csweep resume STUDY` and `csweep rerun-front STUDY`: a stored study run again, from its
stored settings."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from ._options import (
    UsageError,
    add_pool_options,
    add_store_options,
    finish,
    open_existing,
    positive_int,
    stored_config,
)


def add_parsers(sub: Any) -> None:
    res = sub.add_parser("resume", help="continue an interrupted study (same spec, same MLflow parent)")
    res.add_argument("study")
    add_store_options(res)
    add_pool_options(res)
    res.set_defaults(handler=cmd_resume)

    rf = sub.add_parser("rerun-front", help="re-train the current Pareto front's configs with K fresh seeds")
    rf.add_argument("study")
    add_store_options(rf)
    rf.add_argument("--seeds", type=positive_int("--seeds"), default=3, help="fresh seeds per config [3]")
    add_pool_options(rf)
    rf.set_defaults(handler=cmd_rerun_front)


def cmd_resume(a: argparse.Namespace) -> int:
    from common import attrs as A
    from .._resume import fresh_seed_offset, prepare_resume, unfinished_reruns
    from .._runner import run_sweep, write_study_reports
    from .._tracking import SafeTracker

    workdir, storage, study = open_existing(a)
    cfg = stored_config(a, study, workdir, storage, trials=0)
    mlflow = None
    if study.user_attrs.get(A.PARENT_RUN):
        mlflow = SafeTracker(cfg.tracking_uri, a.study, artifact_root=cfg.artifact_root)
    redo, remaining, attrs = prepare_resume(study, mlflow)
    if remaining == 0:
        out = write_study_reports(study, workdir, mlflow, study.user_attrs.get(A.PARENT_RUN))
        print(f"study {a.study}: nothing left to run ({len(study.trials)} trials); reports: {out}")
        return 0
    # an interrupted rerun-front goes on with seeds none of the study's trials used
    offset = fresh_seed_offset(study) if unfinished_reruns(study, attrs) else 0
    cfg = dataclasses.replace(cfg, trials=remaining, enqueue=redo, enqueue_attrs=attrs, seed_offset=offset)
    print(f"study {a.study}: resuming {remaining} trial(s), {len(redo)} of them re-runs of unfinished ones",
          file=sys.stderr)
    return finish(run_sweep(cfg), workdir, a.tracking_uri, cfg.tracking_uri)


def cmd_rerun_front(a: argparse.Namespace) -> int:
    """The current front's configs again, each with K seeds none of its trials used."""
    workdir, storage, study = open_existing(a)
    from reports import trials_frame, pareto_frame

    from common import attrs as A
    from .._resume import fresh_seed_offset
    from .._runner import run_sweep

    front = pareto_frame(study, trials_frame(study))
    if front.empty:
        raise UsageError(f"study {a.study!r}: its Pareto front is empty (no usable COMPLETE trial to re-train)")
    by_number = {t.number: t for t in study.trials}
    configs = [dict(by_number[int(n)].params) for n in front["trial"]]
    cfg = stored_config(a, study, workdir, storage, trials=len(configs), enqueue=configs,
                         enqueue_attrs=[{A.RERUN_OF: int(n)} for n in front["trial"]],
                         seed_offset=fresh_seed_offset(study))
    cfg = dataclasses.replace(cfg, seeds=a.seeds, seed_plan="every")  # every front config gets its K seeds
    print(f"study {a.study}: re-training {len(configs)} front config(s) (trials "
          f"{', '.join(str(int(n)) for n in front['trial'])}) with {a.seeds} fresh seed(s) each", file=sys.stderr)
    study.set_user_attr(A.TARGET_TRIALS, int(study.user_attrs.get(A.TARGET_TRIALS, 0)) + len(configs))
    code = finish(run_sweep(cfg), workdir, a.tracking_uri, cfg.tracking_uri)
    print(front_held(study))
    return code


def front_held(study: Any) -> str:
    """Per re-trained config: held or not under its fresh seeds, and the trials the front now rests on."""
    from reports import trials_frame
    from reports import Objectives
    from reports._tables import rerun_outcomes, rerun_sentence

    rows, rests_on = rerun_outcomes(trials_frame(study), Objectives.of(study))
    lines = [f"  trial {r['trial']} ({r['val_loss']:.4g}) -> trial {r['rerun']} ({r['rerun_val_loss']:.4g} over "
             f"{r['rerun_seeds']} fresh seeds): {'held' if r['held'] else 'did not hold'}" for r in rows]
    return "\n".join([rerun_sentence(rows, rests_on), *lines])
