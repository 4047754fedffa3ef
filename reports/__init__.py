"""What it means: Pareto fronts, tables, plots, coupling analysis and fitted laws, read from a
study's storage. Never imports torch."""

from __future__ import annotations

from ._analysis import Coupling, coupling_analysis
from ._front import (
    NoiseFloor,
    Objectives,
    front_probability,
    hypervolume,
    hypervolume_history,
    noise_floor,
    pareto_mask,
    reference_point,
)
from ._laws import LawFit, fit_power_law
from ._report import data_mismatch, write_comparison, write_study_report
from ._stability import StabilityResult, stability_analysis, stability_runs
from ._summary import REFERENCE_RULE, StudyReport, analyse, decision_looks
from ._tables import categorical_params, converged, numeric_params, pareto_frame, stability_runs_of, trials_frame, usable

write_report = write_study_report  # every report file of one study into a folder

__all__ = [
    "Coupling",
    "LawFit",
    "NoiseFloor",
    "Objectives",
    "REFERENCE_RULE",
    "StabilityResult",
    "StudyReport",
    "categorical_params",
    "numeric_params",
    "stability_analysis",
    "stability_runs",
    "stability_runs_of",
    "write_report",
    "analyse",
    "converged",
    "coupling_analysis",
    "data_mismatch",
    "decision_looks",
    "fit_power_law",
    "front_probability",
    "hypervolume",
    "hypervolume_history",
    "noise_floor",
    "pareto_frame",
    "pareto_mask",
    "reference_point",
    "trials_frame",
    "usable",
    "write_comparison",
    "write_study_report",
]
