"""Trial and Pareto tables from a study's storage (no torch here)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

OBJECTIVES = ("val_loss", "peak_mem_mb")
MAX_MEM_ATTR = "max_mem_mb"
FIXED_COLUMNS = ("trial", "state", "val_loss", "peak_mem_mb", "mlflow_run_id")


def trials_frame(study: Any) -> pd.DataFrame:
    """One row per trial: contract columns, one column per sampled parameter, then extras."""
    max_mem = study.user_attrs.get(MAX_MEM_ATTR)
    param_names: list[str] = []
    for t in study.trials:
        param_names += [p for p in t.distributions if p not in param_names]
    rows = []
    for t in study.trials:
        values = t.values if t.values is not None else [math.nan, math.nan]
        row: dict[str, Any] = {
            "trial": t.number,
            "state": t.state.name,
            "val_loss": values[0],
            "peak_mem_mb": values[1],
            "mlflow_run_id": t.user_attrs.get("mlflow_run_id", ""),
        }
        for p in param_names:
            row[p] = t.params.get(p)
        if max_mem is not None:
            row["feasible"] = bool(t.state.name == "COMPLETE" and values[1] <= max_mem)
        row["node_id"] = t.user_attrs.get("node_id", "")
        row["fail_reason"] = t.user_attrs.get("fail_reason", "")
        rows.append(row)
    columns = list(FIXED_COLUMNS) + param_names + (["feasible"] if max_mem is not None else [])
    columns += ["node_id", "fail_reason"]
    return pd.DataFrame(rows, columns=columns)


def pareto_frame(study: Any, trials: pd.DataFrame) -> pd.DataFrame:
    """The non-dominated COMPLETE feasible trials (Optuna's own Pareto machinery)."""
    from optuna.study._multi_objective import _get_pareto_front_trials

    max_mem = study.user_attrs.get(MAX_MEM_ATTR)
    front = {t.number for t in _get_pareto_front_trials(study, consider_constraint=max_mem is not None)}
    out = trials[trials["trial"].isin(front)]
    return out.sort_values(["peak_mem_mb", "val_loss", "trial"]).reset_index(drop=True)


def write_tables(study: Any, out_dir: Path) -> dict[str, Path]:
    """trials.csv, pareto.csv and pareto.md in out_dir; returns the paths by name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    trials = trials_frame(study)
    front = pareto_frame(study, trials)
    paths = {
        "trials.csv": out_dir / "trials.csv",
        "pareto.csv": out_dir / "pareto.csv",
        "pareto.md": out_dir / "pareto.md",
    }
    trials.to_csv(paths["trials.csv"], index=False)
    front.to_csv(paths["pareto.csv"], index=False)
    title = f"# Pareto front of {study.study_name}\n\n"
    counts = trials["state"].value_counts().to_dict()
    lead = (
        f"{len(front)} non-dominated of {len(trials)} trials "
        f"({', '.join(f'{k}: {v}' for k, v in sorted(counts.items()))}); "
        "objectives: minimize val_loss, minimize peak_mem_mb.\n\n"
    )
    body = front.to_markdown(index=False) if len(front) else "_no completed trial yet_"
    paths["pareto.md"].write_text(title + lead + body + "\n")
    return paths
