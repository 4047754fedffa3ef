"""One study (or a comparison of several) -> WORKDIR/reports/...: tables, plots, analyses, page."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ._analysis import COUPLED_ABOVE, coupling_frame
from ._gallery import gallery_html, hover_script
from ._laws import scaling_frame
from ._page import render_page
from ._plots import (
    front_figure,
    front_png,
    fronts_overlay_png,
    health_png,
    curves_png,
    hv_history_png,
    law_png,
    pair_png,
)
from common import attrs as A

from ._stability import StabilityResult, stability_frame
from ._summary import StudyReport, analyse
from ._tables import (
    categorical_params,
    converged,
    curves_of,
    numeric_params,
    pareto_frame,
    trials_frame,
    usable,
    write_table,
)

OPEN_DRAWN = 2  # the strongest undecided pairs drawn beside the decided ones


def _declared_pairs(study: Any, sampled: Sequence[str], couplings: list[Any],
                    stability: StabilityResult | None = None) -> list[tuple[str, str]]:
    """The pairs drawn: those the Conclusions talk about (the pairs the loss or the boundary calls
    coupled, and the OPEN_DRAWN strongest the trials cannot decide yet) and the space's
    hypotheses; else the first two sampled params; of every kind (numeric, categorical)."""
    space = study.user_attrs.get(A.SPACE) or {}
    pairs = [(h["x"], h["y"]) for h in space.get("hypotheses", []) if h["x"] in sampled and h["y"] in sampled]
    seen = {frozenset(p) for p in pairs}
    decided = [(c.param_a, c.param_b) for c in couplings if c.ci_low > COUPLED_ABOVE]
    decided += [(b.by, b.param) for b in (stability.boundaries if stability else []) if b.verdict_key == "coupled"]
    decided += [(c.param_a, c.param_b) for c in couplings if not c.decided][:OPEN_DRAWN]  # strongest first
    for p in decided:
        if frozenset(p) not in seen:
            pairs.append(p)
            seen.add(frozenset(p))
    if not pairs:
        pairs = [(c.param_a, c.param_b) for c in couplings[:2]]
    if not pairs and len(sampled) >= 2:
        pairs = [(sampled[0], sampled[1])]
    return list(dict.fromkeys(pairs))


class _Figures:
    """Draws the report's figures one by one: a figure that cannot be drawn is left out with one
    line saying why (`notes`), and the rest of the report is written."""

    def __init__(self, files: dict[str, Path], images: dict[str, Path]) -> None:
        self.files, self.images, self.notes = files, images, []

    def draw(self, name: str, caption: str | None, draw: Any, *args: Any, **kwargs: Any) -> Path | None:
        try:
            path = draw(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - one figure never costs the report
            first = (str(exc).strip().splitlines() or [""])[0]
            self.notes.append(f"{name} left out: {type(exc).__name__}: {first[:200]}")
            return None
        self.files[name] = path
        if caption:
            self.images[caption] = path
        return path


def write_study_report(study: Any, out_dir: Path, *, tracking_uri: str | None = None,
                       n_boot: int = 48, samples: Path | None = None) -> dict[str, Path]:
    """Every report file of one study into out_dir; returns them by file name. `samples`: the
    folder of the trials' sample grids (one subfolder per trial number), when they drew any."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rep = analyse(study, n_boot=n_boot)
    exp_id = study.user_attrs.get(A.EXPERIMENT_ID)
    files: dict[str, Path] = {}
    counts = ", ".join(f"{k}: {v}" for k, v in sorted(rep.summary["counts_by_state"].items()))
    lead = f"{len(rep.front)} non-dominated of {len(rep.trials)} trials ({counts}); objectives: {rep.objectives.words()}."
    files |= write_table(rep.front, out_dir / "pareto", title=f"Pareto front of {rep.name}", lead=lead,
                         tracking_uri=tracking_uri, experiment_id=exp_id)
    files |= write_table(rep.trials, out_dir / "trials", title=f"Trials of {rep.name}", lead=lead,
                         tracking_uri=tracking_uri, experiment_id=exp_id)
    coupling_frame(rep.couplings).to_csv(out_dir / "coupling.csv", index=False)
    stability_frame(rep.stability).to_csv(out_dir / "stability.csv", index=False)
    files["stability.csv"] = out_dir / "stability.csv"
    scaling_frame(rep.laws).to_csv(out_dir / "scaling.csv", index=False)
    files["coupling.csv"], files["scaling.csv"] = out_dir / "coupling.csv", out_dir / "scaling.csv"
    (out_dir / "summary.json").write_text(json.dumps(_jsonable(rep.summary), indent=2) + "\n")
    files["summary.json"] = out_dir / "summary.json"
    left_out = _left_out(rep)
    images: dict[str, Path] = {}
    figs = _Figures(files, images)
    figs.draw("pareto.png", "Pareto front", front_png, rep.usable, rep.front, out_dir / "pareto.png",
              title=f"{rep.name}: memory vs validation loss", left_out=left_out, objectives=rep.objectives)
    fig = front_figure({rep.name: (rep.usable, rep.front)}, rep.params, rep.objectives)
    fig.write_html(out_dir / "pareto_front.html", include_plotlyjs=True, full_html=True,
                   post_script=hover_script(rep, samples) or None)
    files["pareto_front.html"] = out_dir / "pareto_front.html"
    if rep.hv_history is not None:
        rep.hv_history.to_csv(out_dir / "hypervolume.csv", index=False)
        files["hypervolume.csv"] = out_dir / "hypervolume.csv"
        figs.draw("hypervolume.png", "Hypervolume history", hv_history_png, rep.hv_history,
                  out_dir / "hypervolume.png")
    curves = curves_of(study)
    if curves and len(rep.usable):
        shown = _curves_shown(rep, curves)
        figs.draw("curves.png", "Validation curves: the front and the worst trial", curves_png, shown,
                  out_dir / "curves.png", score=rep.summary["score"])
    numeric = numeric_params(study)
    categorical = categorical_params(study)
    logs = {k: bool(v["log"]) for k, v in numeric.items()}
    fits = {(f.x, f.y): f for f in rep.laws}
    by_pair = {(c.param_a, c.param_b): c for c in rep.couplings}
    by_pair |= {(c.param_b, c.param_a): c for c in rep.couplings}
    for x, y in _declared_pairs(study, [*numeric, *categorical], rep.couplings, rep.stability):
        name = f"pair_{x}__{y}.png"
        c = by_pair.get((x, y))
        figs.draw(name, f"val_loss over {x} × {y}", pair_png,  # the surface the law was read off
                  converged(rep.usable), x, y, logs, out_dir / name, fits.get((x, y)), categorical=categorical,
                  best_by_level=c.best_by_level if c is not None else ())
        if rep.trials["health"].astype(bool).any():
            name = f"health_{x}__{y}.png"
            figs.draw(name, f"Training health over {x} × {y}", health_png, rep.trials, x, y, logs, out_dir / name,
                      categorical=categorical, boundary=rep.stability.grid(x, y, numeric))
    for f in rep.laws:
        name = f"law_{f.x}__{f.y}.png"
        if not f.points:  # nothing to draw: the law's sentence says why
            figs.notes.append(f"{name} left out: no {f.y}*({f.x}) was read ({f.note or 'not enough usable trials'})")
            continue
        figs.draw(name, f"Fitted law {f.y}*({f.x})", law_png, f, out_dir / name)
    rep.figure_notes = figs.notes
    page = render_page(rep, images=images, figure=fig, tracking_uri=tracking_uri, experiment_id=exp_id,
                       gallery=gallery_html(rep, samples))
    (out_dir / "index.html").write_text(page)
    files["index.html"] = out_dir / "index.html"
    for note in figs.notes:
        print(f"csweep: report {rep.name}: {note}", file=sys.stderr)
    return files


def _curves_shown(rep: StudyReport, curves: dict[int, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    """The front trials' curves and the worst converged trial's, labelled."""
    out = {f"trial {int(t)} (front)": curves[int(t)] for t in rep.front["trial"] if int(t) in curves}
    # the worst run that converged: a diverged one's curve, 10x the rest, flattens every other line
    settled = converged(rep.usable)
    worst = (settled if len(settled) else rep.usable).sort_values("val_loss").iloc[-1]
    if int(worst.trial) in curves and int(worst.trial) not in set(rep.front["trial"].astype(int)):
        out[f"trial {int(worst.trial)} (worst)"] = curves[int(worst.trial)]
    return out


def _left_out(rep: StudyReport) -> str:
    """The trials not drawn (no usable result), counted by why."""
    rest = rep.trials[~rep.trials["trial"].isin(rep.usable["trial"])]
    if rest.empty:
        return ""
    why = rest["outcome"].astype(str)
    if "feasible" in rest.columns:
        why = why.where(~((rest["outcome"] == "ok") & ~rest["feasible"].astype(bool)), "over memory budget")
    counts = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in sorted(why.value_counts().items()))
    return f"not drawn (no usable result): {counts}"


def data_mismatch(studies: Sequence[Any]) -> str:
    """A line when the studies' trials saw different data (content digests differ), else ""."""
    digests = {s.study_name: s.user_attrs.get(A.DATA_DIGEST) for s in studies}
    known = {d for d in digests.values() if d}
    if len(known) <= 1:
        return ""
    listed = ", ".join(f"{name}: {d or 'unknown'}" for name, d in digests.items())
    return f"these studies were trained on different data (digests {listed}): their fronts do not compare like for like"


def write_comparison(studies: Sequence[Any], out_dir: Path) -> dict[str, Path]:
    """Overlaid fronts of several studies (csweep report A B)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    reps = {s.study_name: (usable(trials_frame(s)), None) for s in studies}
    fronts = {name: pareto_frame(s, trials_frame(s)) for name, s in zip(reps, studies)}
    rows = [f.assign(study=name) for name, f in fronts.items()]
    table = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    files = write_table(table, out_dir / "pareto", title="Pareto fronts: " + " vs ".join(fronts),
                        lead=data_mismatch(studies))
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
