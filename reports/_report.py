"""One study (or a comparison of several) -> WORKDIR/reports/...: tables, plots, analyses, page."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ._analysis import (
    OBJECTIVES,
    coupling_analysis,
    coupling_frame,
    feasible_complete,
    fit_power_law,
    hypervolume,
    hypervolume_history,
    reference_point,
    scaling_frame,
)
from ._page import render_page
from ._plots import (
    front_figure,
    front_png,
    fronts_overlay_png,
    health_png,
    hv_history_png,
    law_png,
    pair_png,
)
from ._tables import MAX_MEM_ATTR, numeric_params, pareto_frame, trials_frame, write_table

REFERENCE_RULE = (
    "per objective: the worst feasible COMPLETE value plus 10% of the observed range "
    "(10% of |worst| when all values are equal)"
)


@dataclass
class StudyReport:
    name: str
    trials: pd.DataFrame
    front: pd.DataFrame
    summary: dict[str, Any]
    couplings: list[Any] = field(default_factory=list)
    laws: list[Any] = field(default_factory=list)
    hv_history: pd.DataFrame | None = None
    params: list[str] = field(default_factory=list)


def analyse(study: Any, *, n_boot: int = 20) -> StudyReport:
    """All the numbers of a report, as records (nothing drawn or written)."""
    trials = trials_frame(study)
    front = pareto_frame(study, trials)
    ok = feasible_complete(trials)
    pts = ok[list(OBJECTIVES)].to_numpy()
    ref = reference_point(pts) if len(pts) else None
    hv = hypervolume(pts, ref) if ref else 0.0
    numeric = numeric_params(study)
    space = study.user_attrs.get("space") or {}
    couplings = coupling_analysis(trials, numeric, n_boot=n_boot)
    laws = []
    for h in space.get("hypotheses", []):
        if h.get("law") == "power" and h["x"] in trials.columns and h["y"] in trials.columns:
            laws.append(fit_power_law(trials, h["x"], h["y"]))
    counts = {k: int(v) for k, v in trials["state"].value_counts().items()}
    summary = {
        "study": study.study_name,
        "directions": {"val_loss": "minimize", "peak_mem_mb": "minimize"},
        "n_trials": len(trials),
        "counts_by_state": counts,
        "counts_by_health": {k: int(v) for k, v in trials["health"].replace("", "unknown").value_counts().items()},
        "n_feasible_complete": len(ok),
        "max_mem_mb": study.user_attrs.get(MAX_MEM_ATTR),
        "pareto_size": len(front),
        "pareto_trials": [int(t) for t in front["trial"]],
        "hypervolume": hv,
        "reference_point": ref,
        "reference_point_rule": REFERENCE_RULE,
        "objective": study.user_attrs.get("objective"),
        "strongest_coupling": (
            {"param_a": couplings[0].param_a, "param_b": couplings[0].param_b, "strength": couplings[0].strength}
            if couplings else None
        ),
    }
    return StudyReport(
        study.study_name, trials, front, summary, couplings, laws,
        hypervolume_history(trials, ref) if ref else None,
        [c for c in trials.columns[5:] if c not in ("feasible", "health", "node_id", "reason")],
    )


def _declared_pairs(study: Any, numeric: dict[str, Any], couplings: list[Any]) -> list[tuple[str, str]]:
    space = study.user_attrs.get("space") or {}
    pairs = [(h["x"], h["y"]) for h in space.get("hypotheses", []) if h["x"] in numeric and h["y"] in numeric]
    if not pairs:
        pairs = [(c.param_a, c.param_b) for c in couplings[:2]]
    if not pairs and len(numeric) >= 2:
        names = list(numeric)
        pairs = [(names[0], names[1])]
    return pairs


def write_study_report(study: Any, out_dir: Path, *, tracking_uri: str | None = None,
                       n_boot: int = 20) -> dict[str, Path]:
    """Every report file of one study into out_dir; returns them by file name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rep = analyse(study, n_boot=n_boot)
    exp_id = study.user_attrs.get("mlflow_experiment_id")
    files: dict[str, Path] = {}
    counts = ", ".join(f"{k}: {v}" for k, v in sorted(rep.summary["counts_by_state"].items()))
    lead = (f"{len(rep.front)} non-dominated of {len(rep.trials)} trials ({counts}); "
            "objectives: minimize val_loss, minimize peak_mem_mb.")
    files |= write_table(rep.front, out_dir / "pareto", title=f"Pareto front of {rep.name}", lead=lead,
                         tracking_uri=tracking_uri, experiment_id=exp_id)
    files |= write_table(rep.trials, out_dir / "trials", title=f"Trials of {rep.name}", lead=lead,
                         tracking_uri=tracking_uri, experiment_id=exp_id)
    coupling_frame(rep.couplings).to_csv(out_dir / "coupling.csv", index=False)
    scaling_frame(rep.laws).to_csv(out_dir / "scaling.csv", index=False)
    files["coupling.csv"], files["scaling.csv"] = out_dir / "coupling.csv", out_dir / "scaling.csv"
    (out_dir / "summary.json").write_text(json.dumps(_jsonable(rep.summary), indent=2) + "\n")
    files["summary.json"] = out_dir / "summary.json"
    files["pareto.png"] = front_png(rep.trials, rep.front, out_dir / "pareto.png",
                                    title=f"{rep.name}: memory vs validation loss")
    fig = front_figure({rep.name: (rep.trials, rep.front)}, rep.params)
    fig.write_html(out_dir / "pareto_front.html", include_plotlyjs=True, full_html=True)
    files["pareto_front.html"] = out_dir / "pareto_front.html"
    images: dict[str, Path] = {"Pareto front": files["pareto.png"]}
    if rep.hv_history is not None:
        rep.hv_history.to_csv(out_dir / "hypervolume.csv", index=False)
        files["hypervolume.csv"] = out_dir / "hypervolume.csv"
        files["hypervolume.png"] = images["Hypervolume history"] = hv_history_png(
            rep.hv_history, out_dir / "hypervolume.png")
    numeric = numeric_params(study)
    logs = {k: bool(v["log"]) for k, v in numeric.items()}
    fits = {(f.x, f.y): f for f in rep.laws}
    for x, y in _declared_pairs(study, numeric, rep.couplings):
        name = f"pair_{x}__{y}.png"
        files[name] = images[f"val_loss over {x} × {y}"] = pair_png(
            rep.trials, x, y, logs, out_dir / name, fits.get((x, y)))
        if rep.trials["health"].astype(bool).any():
            name = f"health_{x}__{y}.png"
            files[name] = images[f"Training health over {x} × {y}"] = health_png(
                rep.trials, x, y, logs, out_dir / name)
    for f in rep.laws:
        name = f"law_{f.x}__{f.y}.png"
        files[name] = images[f"Fitted law {f.y}*({f.x})"] = law_png(f, out_dir / name)
    page = render_page(rep, images=images, figure=fig, tracking_uri=tracking_uri, experiment_id=exp_id)
    (out_dir / "index.html").write_text(page)
    files["index.html"] = out_dir / "index.html"
    return files


def write_comparison(studies: Sequence[Any], out_dir: Path) -> dict[str, Path]:
    """Overlaid fronts of several studies (csweep report A B)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    reps = {s.study_name: (trials_frame(s), None) for s in studies}
    fronts = {name: pareto_frame(s, reps[name][0]) for name, s in zip(reps, studies)}
    rows = [f.assign(study=name) for name, f in fronts.items()]
    table = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    files = write_table(table, out_dir / "pareto", title="Pareto fronts: " + " vs ".join(fronts))
    files["pareto.png"] = fronts_overlay_png(fronts, out_dir / "pareto.png")
    fig = front_figure({n: (reps[n][0], fronts[n]) for n in fronts}, [])
    fig.write_html(out_dir / "pareto_front.html", include_plotlyjs=True, full_html=True)
    files["pareto_front.html"] = out_dir / "pareto_front.html"
    return files


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v
