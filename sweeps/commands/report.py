"""`csweep report STUDY [STUDY...]` and `csweep sync STUDY`: the reports and MLflow, from the
study's storage."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._options import (
    UsageError,
    add_store_options,
    artifact_root_for,
    open_existing,
    redacted,
    tracking_of,
)


def add_parsers(sub: Any) -> None:
    syn = sub.add_parser("sync", help="back-fill MLflow from the study's storage, idempotently")
    syn.add_argument("study")
    add_store_options(syn)
    syn.set_defaults(handler=cmd_sync)

    rep = sub.add_parser("report", help="(re)write the reports of a study from its storage")
    rep.add_argument("study")
    rep.add_argument("others", nargs="*", metavar="STUDY",
                     help="more studies: their fronts are overlaid in reports/compare-A-vs-B/")
    add_store_options(rep)
    rep.set_defaults(handler=cmd_report)


def cmd_sync(a: argparse.Namespace) -> int:
    from .._sync import sync_study

    workdir, _, study = open_existing(a)
    tracking = tracking_of(a, study, workdir)
    artifact_root = artifact_root_for(tracking, workdir)
    try:
        created, filled, already = sync_study(study, workdir, tracking, artifact_root=artifact_root)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. still unreachable: say so; what was synced stays synced
        print(f"csweep: sync to {redacted(tracking)} stopped ({exc.__class__.__name__}: {str(exc)[:200]}); "
              "run it again once MLflow is reachable", file=sys.stderr)
        return 1
    print(f"study {a.study}: {created} runs created, {filled} back-filled, {already} already in MLflow")
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    workdir, storage, study = open_existing(a)
    studies = [study] + [open_existing(a, name)[2] for name in a.others]
    from common import attrs as A
    from .._runner import write_study_reports
    from .._tracking import SafeTracker

    for s in studies:
        parent = s.user_attrs.get(A.PARENT_RUN)
        tracking = tracking_of(a, s, workdir)
        mlflow = SafeTracker(tracking, s.study_name, artifact_root=artifact_root_for(tracking, workdir)) if parent else None
        out = write_study_reports(s, workdir, mlflow, parent)
        print(f"reports: {out}")
        line = mlflow.unreachable_line(s.study_name, written="the local reports are written") if mlflow else ""
        if line:
            print(line, file=sys.stderr)
    if len(studies) > 1:
        from reports import data_mismatch, write_comparison

        out = workdir / "reports" / ("compare-" + "-vs-".join(s.study_name for s in studies))
        write_comparison(studies, out)
        print(f"comparison: {out}")
        mismatch = data_mismatch(studies)
        if mismatch:
            print(f"csweep: note: {mismatch}", file=sys.stderr)
    return 0
