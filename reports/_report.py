"""One study (or a comparison of several) -> WORKDIR/reports/...: tables, plots, analyses, page."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ._analysis import COUPLED_ABOVE, coupling_analysis, coupling_frame, coupling_min_trials, fit_surrogate
from ._front import Objectives, hypervolume, hypervolume_history, noise_floor, reference_point
from ._gallery import gallery_html, hover_script
from ._laws import fit_power_law, scaling_frame
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

from common.runs import AT_EDGE, NOT_CONVERGED
from ._stability import StabilityResult, pair_conclusions, stability_analysis, stability_frame
from ._tables import (
    CURVE_COLUMNS,
    FIDELITY_NOISE_COLUMNS,
    NOISE_COLUMNS,
    categorical_params,
    compute_spent,
    converged,
    curve_rows,
    curves_of,
    numeric_params,
    pareto_frame,
    rerun_outcomes,
    rerun_sentence,
    stability_runs_of,
    trials_frame,
    usable,
    write_table,
)

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
    usable: pd.DataFrame | None = None  # the trials of the front and the plots (reports.usable)
    noise: Any = None
    sentences: list[str] = field(default_factory=list)  # what the numbers say, for the page
    objectives: Objectives = field(default_factory=Objectives)
    fit_note: str = ""  # which usable trials the coupling, law and noise analyses left out, and why
    figure_notes: list[str] = field(default_factory=list)  # figures that could not be drawn, and why
    stability: StabilityResult = field(default_factory=StabilityResult)  # where training breaks
    pairs: list[dict[str, Any]] = field(default_factory=list)  # per pair: together because of loss, boundary, neither


def _noise_and_spread(ok: pd.DataFrame, metric: str) -> tuple[Any, float | None]:
    """A score's seed-noise floor and its spread across the usable trials (std; None below two)."""
    values = ok[metric].astype(float).dropna()
    return noise_floor(ok, metric), float(values.std()) if len(values) >= 2 else None


def analyse(study: Any, *, n_boot: int = 48) -> StudyReport:
    """All the numbers of a report, as records (nothing drawn or written). Every analysis takes
    the usable trials from one place (`usable`)."""
    objectives = Objectives.of(study)
    trials = trials_frame(study)
    ok = usable(trials)
    front = pareto_frame(study, trials)
    pts = objectives.minimized(ok)  # maximized objectives negated
    ref = reference_point(pts) if len(pts) else None
    hv = hypervolume(pts, ref) if ref else 0.0
    numeric = numeric_params(study)
    categorical = categorical_params(study)
    space = study.user_attrs.get(A.SPACE) or {}
    fit = converged(ok)  # the response-surface analyses leave out the runs that never settled
    left_out = ok[~ok["trial"].isin(fit["trial"])]
    # one surrogate for the couplings and the laws (they read the same trials); with `steps`
    # sampled, every validated step of every trial's curve is an observation (curve_rows)
    score = (study.user_attrs.get(A.SETTINGS) or {}).get("score", "final")
    rows = curve_rows(fit, curves_of(study), numeric["steps"], score=score) if "steps" in numeric else None
    gp = shared_surrogate(fit, numeric, categorical, n_boot=n_boot, rows=rows)
    couplings = coupling_analysis(fit, numeric, categorical=categorical, n_boot=n_boot, gp=gp)
    laws = []
    for h in space.get("hypotheses", []):
        if h.get("law") == "power" and h["x"] in trials.columns and h["y"] in trials.columns:
            laws.append(fit_power_law(fit, h["x"], h["y"], params=numeric, categorical=categorical,
                                      n_boot=max(n_boot, 10), gp=gp))
    # where training breaks: every run that ran, converged or not (one row per seed replicate)
    stability = stability_analysis(stability_runs_of(study, trials), numeric, categorical=categorical)
    pairs = pair_conclusions(couplings, stability)
    noise, spread = _noise_and_spread(fit, "val_loss")
    counts = {k: int(v) for k, v in trials["state"].value_counts().items()}
    outcomes = {k: int(v) for k, v in trials["outcome"].value_counts().items()}
    replicated = ok[ok["n_seeds"].fillna(1).astype(int) >= 2] if "n_seeds" in ok.columns else ok.iloc[:0]
    at_edge = replicated[replicated["health"].astype(str) == AT_EDGE]
    broke = replicated[replicated["health"].astype(str).isin(NOT_CONVERGED)]
    sentences = [noise.sentence(spread)]
    if len(at_edge) or len(broke):
        sentences.append(_edge_sentence(at_edge, len(broke)))
    fidelity: dict[str, Any] = {}
    if "fidelity" in fit.columns and fit["fidelity"].notna().any():
        f_noise, f_spread = _noise_and_spread(fit, "fidelity")
        sentences.append(f_noise.sentence(f_spread))
        fidelity = {
            "fidelity_noise_floor_std": f_noise.std, "fidelity_noise_floor_configs": f_noise.n_configs,
            "fidelity_spread_std": f_spread,
            "fidelity_signal_to_noise": (f_spread / f_noise.std) if f_spread is not None and f_noise.std else None,
            "best_fidelity": float(ok["fidelity"].max()),
        }
    reruns, rests_on = rerun_outcomes(trials, objectives)
    if reruns:
        sentences.append(rerun_sentence(reruns, rests_on))
    if noise.std is not None and len(front) >= 2:
        unsure = front[front["p_front"] < 0.95]
        if len(unsure):
            sentences.append(
                f"{len(unsure)} of the {len(front)} front trials cannot be told apart from a dominated "
                f"trial within seed noise (p_front < 0.95: trials {', '.join(str(int(t)) for t in unsure['trial'])}).")
        else:
            sentences.append(f"All {len(front)} front trials stay non-dominated under seed noise (p_front >= 0.95).")
    summary = {
        "study": study.study_name,
        "objectives": list(objectives.names),
        "directions": dict(zip(objectives.names, objectives.directions)),
        "n_trials": len(trials),
        "counts_by_state": counts,
        "counts_by_outcome": outcomes,
        "counts_by_health": {k: int(v) for k, v in trials["health"].replace("", "unknown").value_counts().items()},
        "n_usable": len(ok),
        # coupling, laws and the noise floor against the spread fit these usable trials
        "n_fitted": len(fit),
        "left_out_of_fits": [{"trial": int(r.trial), "health": str(r.health), "val_loss": float(r.val_loss)}
                             for r in left_out.itertuples()],
        "n_feasible_complete": len(ok),
        "max_mem_mb": study.user_attrs.get(A.MAX_MEM),
        "pareto_size": len(front),
        "pareto_trials": [int(t) for t in front["trial"]],
        "best_val_loss": float(ok["val_loss"].min()) if len(ok) else None,
        "hypervolume": hv,
        # in the objectives' own units (a maximized one's reference lies below its worst value)
        "reference_point": [float(v) for v in np.asarray(ref) * objectives.signs] if ref else None,
        "reference_point_rule": REFERENCE_RULE,
        "objective": study.user_attrs.get(A.OBJECTIVE),
        "data_digest": study.user_attrs.get(A.DATA_DIGEST),
        "noise_floor_std": noise.std,
        "noise_floor_configs": noise.n_configs,
        "noise_floor_dof": noise.dof,
        "val_loss_spread_std": spread,
        "signal_to_noise": (spread / noise.std) if spread is not None and noise.std else None,
        **fidelity,
        "noise_floor_left_out_at_edge": [int(t) for t in at_edge["trial"]],
        "noise_floor_left_out_not_converged": int(len(broke)),
        "stability": stability_frame(stability).drop(columns=["advice"]).to_dict("records"),
        "stability_runs": stability.n_runs,
        "stability_runs_not_converged": stability.n_unstable,
        "pairs": pairs,
        "reruns": reruns,
        "front_under_fresh_seeds": rests_on,
        "strongest_coupling": (
            {"param_a": couplings[0].param_a, "param_b": couplings[0].param_b, "strength": couplings[0].strength,
             "verdict": couplings[0].verdict()}
            if couplings else None
        ),
    }
    compute = compute_spent(study, trials)
    if compute is not None:
        summary["compute"] = compute
        if compute["stopped_at_a_rung"]:
            summary["compute_line"] = (
                f"Early stops (--early-stop dominated): {compute['stopped_at_a_rung']} trials stopped at a rung, "
                f"{compute['steps_saved_by_early_stop']} of {compute['steps_planned']} planned optimizer steps "
                f"({compute['steps_saved_by_early_stop'] / max(1, compute['steps_planned']):.0%}) and about "
                f"{compute['trial_seconds_saved_by_early_stop_est']:.0f} trial-seconds saved; "
                f"{compute['steps_trained']} steps trained.")
    summary["score"] = score
    stopped = compute["stopped_at_a_rung"] if compute else 0
    out_of_fits = bool(stopped) and "steps" not in numeric  # a stopped trial's curve is data only with steps sampled
    if out_of_fits:
        summary["early_stop_note"] = (
            f"The {stopped} trials that --early-stop dominated stopped at a rung are not in the coupling and law fits "
            "(a stopped trial's curve counts as observations only where `steps` is a sampled knob), and more trials "
            "under early stops add few: to read couplings, run trials to their end (without --early-stop dominated), "
            "or sample `steps`.")
    if stability.reason:
        summary["stability_reason"] = stability.reason
    if not couplings:
        summary["no_verdict_reason"] = _no_verdict_reason(
            len(fit), len(numeric) + sum(len(v) >= 2 for v in categorical.values()), early_stops=out_of_fits)
    extras = {"feasible", "fidelity", "outcome", *NOISE_COLUMNS, *FIDELITY_NOISE_COLUMNS, *CURVE_COLUMNS,
              "health", "node_id", "rerun_of", "reason", "concepts_shown", "concepts_not_shown"}
    return StudyReport(
        study.study_name, trials, front, summary, couplings, laws,
        hypervolume_history(trials, ok, ref, objectives) if ref else None,
        [c for c in trials.columns[5:] if c not in extras], ok, noise, sentences, objectives,
        _left_out_sentence(left_out, len(fit)) if len(left_out) else "", stability=stability, pairs=pairs,
    )


def _edge_sentence(at_edge: pd.DataFrame, broke: int) -> str:
    """Which replicated configs the noise floor leaves out: those whose seeds disagree about
    converging (at the edge of the stable region, their spread is not seed noise) and those
    whose seeds all broke."""
    parts = []
    if len(at_edge):
        which = ", ".join(str(int(t)) for t in at_edge["trial"])
        parts.append(f"{len(at_edge)} config{'s' if len(at_edge) > 1 else ''} at the edge of the stable region "
                     f"(one seed trained, another did not: trial{'s' if len(at_edge) > 1 else ''} {which})")
    if broke:
        parts.append(f"{broke} whose seeds did not converge")
    return ("The noise floor is pooled over configs whose seeds all converged; left out: " + " and ".join(parts)
            + ". A config at the edge is not noise: the stability analysis reads each of its seeds as a run.")


def _no_verdict_reason(fitted: int, knobs: int, *, early_stops: bool) -> str:
    """Why the page has no coupling verdict, and what to do about it (the early stops' own note
    follows it where they kept trials out of the fits)."""
    if knobs < 2:
        return "No coupling verdict: the study samples fewer than two knobs, so there is no pair to read."
    need = coupling_min_trials(knobs)
    if fitted >= need:
        return f"No coupling verdict could be read from the {fitted} fitted trials."
    text = f"Not enough usable trials for a coupling verdict yet: {fitted} fitted, {need} needed"
    return text + ("." if early_stops else f": about {need - fitted} more trials.")


def shared_surrogate(fit: pd.DataFrame, numeric: dict[str, Any], categorical: dict[str, Any], *,
                     n_boot: int, rows: pd.DataFrame | None = None) -> Any:
    """The surrogate both the coupling and the law analyses draw from, when there are enough
    complete rows for either (else None: each says why it has no answer). `rows`: the trials'
    curves as observations (curve_rows), fitted instead of one row per trial."""
    cats = {k: list(v) for k, v in categorical.items() if len(v) >= 2}
    complete = fit.dropna(subset=["val_loss", *numeric, *cats])
    if len(complete) != len(fit) or len(numeric) + len(cats) < 2 or len(complete) < max(8, len(numeric) + len(cats) + 3):
        return None
    rows = complete if rows is None else rows.dropna(subset=["val_loss", *numeric, *cats])
    import warnings

    from threadpoolctl import threadpool_limits

    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")
        return fit_surrogate(rows, numeric, cats, n_hyper=max(4, n_boot))


LOOK_LEVEL = 0.99  # --until-decisive's looks: stricter than the report's 95%, for the repeated looks


def decision_looks(study: Any, pairs: Sequence[tuple[str, str]] = ()) -> str:
    """--until-decisive, after a trial: one line once every pair in `pairs` (with none, every pair
    of sampled params) has a decided verdict at the 99% level, else "". The first look waits for
    2 x params + 2 usable trials (at least 10)."""
    numeric, categorical = numeric_params(study), categorical_params(study)
    fit = converged(usable(trials_frame(study)))
    if len(fit) < max(10, 2 * (len(numeric) + len(categorical)) + 2):
        return ""
    out = coupling_analysis(fit, numeric, categorical=categorical, pairs=list(pairs) or None, level=LOOK_LEVEL,
                            n_boot=16)
    if not out or not all(c.decided for c in out):
        return ""
    calls = "; ".join(f"{c.param_a} x {c.param_b} {c.verdict().split(':')[0]}" for c in out)
    return (f"decided after {len(fit)} usable trials ({len(study.trials)} in the study): {calls} "
            f"(--until-decisive: every {'hypothesis' if pairs else 'pair'} decided at the 99% level; stopped asking)")


def _left_out_sentence(left_out: pd.DataFrame, n_fitted: int) -> str:
    """Which usable trials the coupling, law and noise analyses left out, and why."""
    which = ", ".join(f"{int(r.trial)} ({r.health}, val_loss {r.val_loss:.4g})" for r in left_out.itertuples())
    return (f"Coupling, laws and the noise floor against the spread fit the {n_fitted} usable trials that converged; left out "
            f"{len(left_out)} whose training did not settle: trial{'s' if len(left_out) > 1 else ''} {which}. "
            "Their loss says where training breaks (see the health plots), not how the knobs trade off; "
            "they stay in the front and the tables.")


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
