"""Trial and Pareto tables from a study's storage (no torch here)."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import pandas as pd

OBJECTIVES = ("val_loss", "peak_mem_mb")
MAX_MEM_ATTR = "max_mem_mb"
FIXED_COLUMNS = ("trial", "state", "val_loss", "peak_mem_mb", "mlflow_run_id")


def param_names(study: Any) -> list[str]:
    names: list[str] = []
    for t in study.trials:
        names += [p for p in t.distributions if p not in names]
    return names


def numeric_params(study: Any) -> dict[str, dict[str, Any]]:
    """Numeric sampled params -> {low, high, log}, from the trials' own distributions."""
    from optuna.distributions import FloatDistribution, IntDistribution

    out: dict[str, dict[str, Any]] = {}
    for t in study.trials:
        for name, d in t.distributions.items():
            if isinstance(d, (FloatDistribution, IntDistribution)) and name not in out:
                out[name] = {"low": d.low, "high": d.high, "log": d.log}
    return out


def _constraint_values(trial: Any) -> list[float]:
    c = trial.constraints or []
    return list(c.values()) if isinstance(c, dict) else list(c)


def trials_frame(study: Any) -> pd.DataFrame:
    """One row per trial: contract columns, one column per sampled parameter, then extras."""
    max_mem = study.user_attrs.get(MAX_MEM_ATTR)
    constrained = max_mem is not None or any(t.constraints for t in study.trials)
    names = param_names(study)
    synced = study.user_attrs.get("mlflow_run_ids_synced", {})  # runs created by `csweep sync`
    rows = []
    for t in study.trials:
        values = t.values if t.values is not None else [math.nan, math.nan]
        row: dict[str, Any] = {
            "trial": t.number,
            "state": t.state.name,
            "val_loss": values[0],
            "peak_mem_mb": values[1],
            "mlflow_run_id": t.user_attrs.get("mlflow_run_id") or synced.get(str(t.number), ""),
        }
        for p in names:
            row[p] = t.params.get(p)
        if constrained:
            # Optuna's constraints (set for a memory budget and for out-of-memory trials)
            within = values[1] <= max_mem if max_mem is not None else True
            row["feasible"] = bool(t.state.name == "COMPLETE" and within
                                   and all(c <= 0 for c in _constraint_values(t)))
        row["health"] = t.user_attrs.get("health", "")
        row["node_id"] = t.user_attrs.get("node_id", "")
        row["reason"] = t.user_attrs.get("fail_reason") or t.user_attrs.get("prune_reason") or ""
        rows.append(row)
    columns = list(FIXED_COLUMNS) + names + (["feasible"] if constrained else [])
    columns += ["health", "node_id", "reason"]
    return pd.DataFrame(rows, columns=columns)


def pareto_frame(study: Any, trials: pd.DataFrame) -> pd.DataFrame:
    """The non-dominated COMPLETE feasible trials (Optuna's own Pareto machinery)."""
    from optuna.study._multi_objective import _get_pareto_front_trials

    if "feasible" in trials.columns:
        # feasibility by the budget and the constraints, for trials told before a budget was set too
        ok = trials[(trials["state"] == "COMPLETE") & trials["feasible"].astype(bool)]
        from ._analysis import pareto_mask

        mask = pareto_mask(ok[list(OBJECTIVES)].to_numpy())
        front = set(ok[mask]["trial"])
    else:
        front = {t.number for t in _get_pareto_front_trials(study, consider_constraint=False)}
    out = trials[trials["trial"].isin(front)]
    return out.sort_values(["peak_mem_mb", "val_loss", "trial"]).reset_index(drop=True)


def run_link(run_id: str, tracking_uri: str | None, experiment_id: str | None) -> str:
    if run_id and tracking_uri and tracking_uri.startswith(("http://", "https://")) and experiment_id:
        url = f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
        return f'<a href="{html.escape(url)}">{html.escape(run_id)}</a>'
    return html.escape(run_id or "")


def html_table(df: pd.DataFrame, *, tracking_uri: str | None = None, experiment_id: str | None = None) -> str:
    shown = df.copy()
    if "mlflow_run_id" in shown.columns:
        shown["mlflow_run_id"] = [run_link(r, tracking_uri, experiment_id) for r in shown["mlflow_run_id"]]
    return shown.to_html(index=False, escape=False, na_rep="", float_format=lambda v: f"{v:.6g}",
                         classes="csweep-table", border=0)


def write_table(df: pd.DataFrame, stem: Path, *, title: str, lead: str = "",
                tracking_uri: str | None = None, experiment_id: str | None = None) -> dict[str, Path]:
    """stem.csv, stem.md, stem.html and stem.tex."""
    paths = {ext: stem.with_suffix(f".{ext}") for ext in ("csv", "md", "html", "tex")}
    df.to_csv(paths["csv"], index=False)
    body = df.to_markdown(index=False) if len(df) else "_no trials_"
    paths["md"].write_text(f"# {title}\n\n{lead}\n\n{body}\n")
    paths["html"].write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
        f"<body><h1>{html.escape(title)}</h1><p>{html.escape(lead)}</p>"
        f"{html_table(df, tracking_uri=tracking_uri, experiment_id=experiment_id)}</body></html>\n"
    )
    latex = df.drop(columns=[c for c in ("node_id", "reason") if c in df.columns])
    paths["tex"].write_text(latex.to_latex(index=False, float_format="%.5g", na_rep="", escape=True))
    return {p.name: p for p in paths.values()}
