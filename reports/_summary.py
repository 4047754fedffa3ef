"""All the numbers of one study's report, as records, nothing drawn or written: `analyse(study)`
-> StudyReport (the trials, the front, the couplings, the laws, where training breaks, the seed
noise and the summary.json dict), and `decision_looks` for --until-decisive."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from common import attrs as A
from common.runs import AT_EDGE, NOT_CONVERGED

from ._analysis import coupling_analysis, coupling_min_trials, fit_surrogate
from ._front import Objectives, hypervolume, hypervolume_history, noise_floor, reference_point
from ._laws import fit_power_law
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
    numeric, categorical = numeric_params(study), categorical_params(study)
    fit = converged(ok)  # the response-surface analyses leave out the runs that never settled
    left_out = ok[~ok["trial"].isin(fit["trial"])]
    score = (study.user_attrs.get(A.SETTINGS) or {}).get("score", "final")
    couplings, laws = _surface(study, trials, fit, numeric, categorical, n_boot=n_boot, score=score)
    # where training breaks: every run that ran, converged or not (one row per seed replicate)
    stability = stability_analysis(stability_runs_of(study, trials), numeric, categorical=categorical)
    pairs = pair_conclusions(couplings, stability)
    seeds = _seed_noise(trials, ok, fit, front, objectives)
    summary = {
        **_counts_and_front(study, trials, ok, fit, left_out, front, objectives, ref, hv),
        **seeds.summary,
        "stability": stability_frame(stability).drop(columns=["advice"]).to_dict("records"),
        "stability_runs": stability.n_runs,
        "stability_runs_not_converged": stability.n_unstable,
        "pairs": pairs,
        "reruns": seeds.reruns,
        "front_under_fresh_seeds": seeds.rests_on,
        "strongest_coupling": (
            {"param_a": couplings[0].param_a, "param_b": couplings[0].param_b, "strength": couplings[0].strength,
             "verdict": couplings[0].verdict()}
            if couplings else None
        ),
        **_compute_notes(study, trials, numeric, score),
    }
    if stability.reason:
        summary["stability_reason"] = stability.reason
    if not couplings:
        summary["no_verdict_reason"] = _no_verdict_reason(
            len(fit), len(numeric) + sum(len(v) >= 2 for v in categorical.values()),
            early_stops=summary.get("early_stop_note") is not None)
    extras = {"feasible", "fidelity", "outcome", *NOISE_COLUMNS, *FIDELITY_NOISE_COLUMNS, *CURVE_COLUMNS,
              "health", "node_id", "rerun_of", "reason", "concepts_shown", "concepts_not_shown"}
    return StudyReport(
        study.study_name, trials, front, summary, couplings, laws,
        hypervolume_history(trials, ok, ref, objectives) if ref else None,
        [c for c in trials.columns[5:] if c not in extras], ok, seeds.noise, seeds.sentences, objectives,
        _left_out_sentence(left_out, len(fit)) if len(left_out) else "", stability=stability, pairs=pairs,
    )


def _surface(study: Any, trials: pd.DataFrame, fit: pd.DataFrame, numeric: dict[str, Any],
             categorical: dict[str, Any], *, n_boot: int, score: str) -> tuple[list[Any], list[Any]]:
    """The couplings and the declared laws, from one surrogate (they read the same trials); with
    `steps` sampled, every validated step of every trial's curve is an observation (curve_rows)."""
    rows = curve_rows(fit, curves_of(study), numeric["steps"], score=score) if "steps" in numeric else None
    gp = shared_surrogate(fit, numeric, categorical, n_boot=n_boot, rows=rows)
    couplings = coupling_analysis(fit, numeric, categorical=categorical, n_boot=n_boot, gp=gp)
    laws = []
    for h in (study.user_attrs.get(A.SPACE) or {}).get("hypotheses", []):
        if h.get("law") == "power" and h["x"] in trials.columns and h["y"] in trials.columns:
            laws.append(fit_power_law(fit, h["x"], h["y"], params=numeric, categorical=categorical,
                                      n_boot=max(n_boot, 10), gp=gp))
    return couplings, laws


def _counts_and_front(study: Any, trials: pd.DataFrame, ok: pd.DataFrame, fit: pd.DataFrame,
                      left_out: pd.DataFrame, front: pd.DataFrame, objectives: Objectives,
                      ref: list[float] | None, hv: float) -> dict[str, Any]:
    """The summary's head: what the study holds, which trials the fits read, and its front."""
    return {
        "study": study.study_name,
        "objectives": list(objectives.names),
        "directions": dict(zip(objectives.names, objectives.directions)),
        "n_trials": len(trials),
        "counts_by_state": {k: int(v) for k, v in trials["state"].value_counts().items()},
        "counts_by_outcome": {k: int(v) for k, v in trials["outcome"].value_counts().items()},
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
    }


@dataclass
class _SeedNoise:
    """What the seed replicates say: the noise floor, its sentences, its part of the summary, and
    the front's reruns under fresh seeds."""
    noise: Any
    sentences: list[str]
    summary: dict[str, Any]
    reruns: Any
    rests_on: Any


def _seed_noise(trials: pd.DataFrame, ok: pd.DataFrame, fit: pd.DataFrame, front: pd.DataFrame,
                objectives: Objectives) -> _SeedNoise:
    """The seed-noise floor of val_loss (and of fidelity where it was measured) against the
    configs' spread, the replicated configs it leaves out, the front's reruns, and whether the
    front stands under seed noise."""
    noise, spread = _noise_and_spread(fit, "val_loss")
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
        "noise_floor_std": noise.std,
        "noise_floor_configs": noise.n_configs,
        "noise_floor_dof": noise.dof,
        "val_loss_spread_std": spread,
        "signal_to_noise": (spread / noise.std) if spread is not None and noise.std else None,
        **fidelity,
        "noise_floor_left_out_at_edge": [int(t) for t in at_edge["trial"]],
        "noise_floor_left_out_not_converged": int(len(broke)),
    }
    return _SeedNoise(noise, sentences, summary, reruns, rests_on)


def _compute_notes(study: Any, trials: pd.DataFrame, numeric: dict[str, Any], score: str) -> dict[str, Any]:
    """The compute the study spent and what early stops saved, the score, and the note on the
    trials early stops kept out of the fits."""
    out: dict[str, Any] = {}
    compute = compute_spent(study, trials)
    if compute is not None:
        out["compute"] = compute
        if compute["stopped_at_a_rung"]:
            out["compute_line"] = (
                f"Early stops (--early-stop dominated): {compute['stopped_at_a_rung']} trials stopped at a rung, "
                f"{compute['steps_saved_by_early_stop']} of {compute['steps_planned']} planned optimizer steps "
                f"({compute['steps_saved_by_early_stop'] / max(1, compute['steps_planned']):.0%}) and about "
                f"{compute['trial_seconds_saved_by_early_stop_est']:.0f} trial-seconds saved; "
                f"{compute['steps_trained']} steps trained.")
    out["score"] = score
    stopped = compute["stopped_at_a_rung"] if compute else 0
    if stopped and "steps" not in numeric:  # a stopped trial's curve is data only with steps sampled
        out["early_stop_note"] = (
            f"The {stopped} trials that --early-stop dominated stopped at a rung are not in the coupling and law fits "
            "(a stopped trial's curve counts as observations only where `steps` is a sampled knob), and more trials "
            "under early stops add few: to read couplings, run trials to their end (without --early-stop dominated), "
            "or sample `steps`.")
    return out


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
    calls = "; ".join(f"{c.param_a} x {c.param_b} {c.verdict_key}" for c in out)
    return (f"decided after {len(fit)} usable trials ({len(study.trials)} in the study): {calls} "
            f"(--until-decisive: every {'hypothesis' if pairs else 'pair'} decided at the 99% level; stopped asking)")


def _left_out_sentence(left_out: pd.DataFrame, n_fitted: int) -> str:
    """Which usable trials the coupling, law and noise analyses left out, and why."""
    which = ", ".join(f"{int(r.trial)} ({r.health}, val_loss {r.val_loss:.4g})" for r in left_out.itertuples())
    return (f"Coupling, laws and the noise floor against the spread fit the {n_fitted} usable trials that converged; left out "
            f"{len(left_out)} whose training did not settle: trial{'s' if len(left_out) > 1 else ''} {which}. "
            "Their loss says where training breaks (see the health plots), not how the knobs trade off; "
            "they stay in the front and the tables.")
