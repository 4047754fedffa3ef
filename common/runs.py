"""What a trial's runs say of where training breaks, read one way by the report's analysis and
by the coupling design: each run converged (0) or did not (1), or says nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import attrs as A

NOT_CONVERGED = ("diverged", "degrading")  # health labels of a run whose loss never settled
SILENT = ("failed", "beaten")  # replicate labels that say nothing of where training breaks
AT_EDGE = "at_edge"  # a config whose seeds disagree about converging
UNSETTLED = (*NOT_CONVERGED, AT_EDGE)  # a trial's health when its val_loss is no usable loss


def run_labels(state: str, health: str, *, outcome: str = "ok", at_rung: bool = False,
               replicates: Sequence[str] = ()) -> list[int]:
    """What a trial's runs say of where training breaks: one label per run, 1 for a run that did
    not converge (health diverged or degrading, or stopped by its objective as diverging: PRUNED
    without a rung), 0 for one that converged; none for a trial that failed, ran out of memory,
    is still running or was beaten at a rung by --early-stop dominated. With --seeds K each
    replicate is a run (`replicates`: their labels, "pruned" for a stopped one). The report's
    analysis and the coupling design's boundary read trials through this one function."""
    if replicates:
        return [int(h in NOT_CONVERGED or h == "pruned") for h in replicates if h not in SILENT]
    if state == "COMPLETE" and outcome == "ok":
        return [int(health in NOT_CONVERGED)]
    if state == "PRUNED" and not at_rung and health != "ok":
        return [1]
    return []


def health_of(t: Any) -> str:
    """A trial's health label; "at_edge" when its seed replicates (--seeds K) disagree about
    converging: one trains, another diverges or degrades."""
    if len(set(run_labels("", "", replicates=t.user_attrs.get(A.REPLICATE_HEALTH) or ()))) > 1:
        return AT_EDGE
    return t.user_attrs.get(A.HEALTH, "")
