"""What it means: Pareto fronts, tables, plots, coupling analysis and fitted laws, read from a
study's storage. Never imports torch."""

from __future__ import annotations

from ._analysis import (
    Coupling,
    LawFit,
    coupling_analysis,
    fit_power_law,
    hypervolume,
    hypervolume_history,
    pareto_mask,
    reference_point,
)
from ._report import REFERENCE_RULE, analyse, write_comparison, write_study_report
from ._tables import MAX_MEM_ATTR, pareto_frame, trials_frame

__all__ = [
    "Coupling",
    "LawFit",
    "MAX_MEM_ATTR",
    "REFERENCE_RULE",
    "analyse",
    "coupling_analysis",
    "fit_power_law",
    "hypervolume",
    "hypervolume_history",
    "pareto_frame",
    "pareto_mask",
    "reference_point",
    "trials_frame",
    "write_comparison",
    "write_study_report",
]
