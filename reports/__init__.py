"""What it means: tables and Pareto fronts read from a study's storage."""

from __future__ import annotations

from ._tables import MAX_MEM_ATTR, pareto_frame, trials_frame, write_tables

__all__ = ["MAX_MEM_ATTR", "pareto_frame", "trials_frame", "write_tables"]
