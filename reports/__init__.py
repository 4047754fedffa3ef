"""What it means: Pareto fronts, tables, plots, coupling analysis and fitted laws, read from a
study's storage. Never imports torch."""

from __future__ import annotations

from ._analysis import (
    Coupling,
    LawFit,
    NoiseFloor,
    coupling_analysis,
    fit_power_law,
    front_probability,
    hypervolume,
    hypervolume_history,
    noise_floor,
    pareto_mask,
    reference_point,
)
from ._report import REFERENCE_RULE, analyse, data_mismatch, decision_looks, write_comparison, write_study_report
from ._tables import converged, pareto_frame, trials_frame, usable

__all__ = [
    "Coupling",
    "LawFit",
    "NoiseFloor",
    "REFERENCE_RULE",
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
