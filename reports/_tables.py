"""Trial and Pareto tables from a study's storage (no torch here)."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from common import attrs as A
from common.runs import UNSETTLED, health_of

from ._front import OBJECTIVES, Objectives

FIXED_COLUMNS = ("trial", "state", "val_loss", "peak_mem_mb", "mlflow_run_id")
NOISE_COLUMNS = ("n_seeds", "val_loss_std", "val_loss_sem")
FIDELITY_NOISE_COLUMNS = ("fidelity_std", "fidelity_sem")
CURVE_COLUMNS = (A.BEST_STEP, A.VAL_LOSS_AT_BEST, A.STEPS_RUN, A.RUNG)  # trials that validated during training


def param_names(study: Any) -> list[str]:
    names: list[str] = []
    for t in study.trials:
        names += [p for p in t.distributions if p not in names]
    return names


def categorical_params(study: Any) -> dict[str, list[Any]]:
    """Categorical sampled params -> their choices, from the trials' own distributions."""
    from optuna.distributions import CategoricalDistribution

    out: dict[str, list[Any]] = {}
    for t in study.trials:
        for name, d in t.distributions.items():
            if isinstance(d, CategoricalDistribution) and name not in out:
                out[name] = list(d.choices)
    return out


def numeric_params(study: Any) -> dict[str, dict[str, Any]]:
    """Numeric sampled params -> {low, high, log, step}, from the trials' own distributions
    (`step`: the grid the knob's values lie on, 1 for an int knob; None for a continuous one)."""
    from optuna.distributions import FloatDistribution, IntDistribution

    out: dict[str, dict[str, Any]] = {}
    for t in study.trials:
        for name, d in t.distributions.items():
            if isinstance(d, (FloatDistribution, IntDistribution)) and name not in out:
                out[name] = {"low": d.low, "high": d.high, "log": d.log, "step": d.step}
    return out


def _constraint_values(trial: Any) -> list[float]:
    c = trial.constraints or []
    return list(c.values()) if isinstance(c, dict) else list(c)


def _outcome(t: Any) -> str:
    """ok | pruned | out_of_memory | failed | running (studies of older csweep versions told
    out-of-memory trials COMPLETE with placeholder values and marked them `oom`)."""
    if t.user_attrs.get(A.OUT_OF_MEMORY):
        return "out_of_memory"
    return t.user_attrs.get(A.OUTCOME) or {"COMPLETE": "ok", "PRUNED": "pruned", "FAIL": "failed"}.get(
        t.state.name, t.state.name.lower())


def stability_runs_of(study: Any, trials: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every training run of the study that says whether its config trains stably (one row per
    replicate with --seeds K): reports._stability.stability_runs over the trials frame."""
    from ._stability import stability_runs

    trials = trials_frame(study) if trials is None else trials
    replicates = {t.number: list(t.user_attrs[A.REPLICATE_HEALTH]) for t in study.trials
                  if t.user_attrs.get(A.REPLICATE_HEALTH)}
    return stability_runs(trials, replicates)


def trials_frame(study: Any) -> pd.DataFrame:
    """One row per trial: contract columns, one column per sampled parameter, then extras.
    Only a trial with a usable result shows objective values (never placeholder numbers)."""
    max_mem = study.user_attrs.get(A.MAX_MEM)
    constrained = max_mem is not None or any(t.constraints for t in study.trials)
    names = param_names(study)
    synced = study.user_attrs.get(A.SYNCED_RUNS, {})  # runs created by `csweep sync`
    stale = study.user_attrs.get(A.STALE, {})
    rows = []
    objectives = Objectives.of(study)
    fidelity = "fidelity" in objectives.names or any(A.FIDELITY in t.user_attrs for t in study.trials)
    reruns = any(A.RERUN_OF in t.user_attrs for t in study.trials)  # csweep rerun-front
    curves = any(A.VAL_CURVE in t.user_attrs for t in study.trials)  # validated during training
    for t in study.trials:
        outcome = _outcome(t)
        ok = t.values is not None and outcome == "ok"
        values = dict(zip(objectives.names, t.values)) if ok else {}
        row: dict[str, Any] = {
            "trial": t.number,
            "state": t.state.name,
            "val_loss": values.get("val_loss", math.nan),
            "peak_mem_mb": values.get("peak_mem_mb", math.nan),
            "mlflow_run_id": t.user_attrs.get(A.MLFLOW_RUN_ID) or synced.get(str(t.number), ""),
        }
        for p in names:
            row[p] = t.params.get(p)
        if constrained:
            within = row["peak_mem_mb"] <= max_mem if max_mem is not None else True
            row["feasible"] = bool(t.state.name == "COMPLETE" and outcome == "ok" and within
                                   and all(c <= 0 for c in _constraint_values(t)))
        if fidelity:
            row["fidelity"] = values.get(A.FIDELITY, t.user_attrs.get(A.FIDELITY, math.nan)) if ok else math.nan
            shown = t.user_attrs.get(A.CONCEPTS_SHOWN) or {}
            row["concepts_shown"] = ", ".join(n for n, v in sorted(shown.items()) if v >= 0.5) if shown else ""
            row["concepts_not_shown"] = ", ".join(n for n, v in sorted(shown.items()) if v < 0.5) if shown else ""
        row["outcome"] = outcome
        row["n_seeds"] = int(t.user_attrs.get(A.N_SEEDS, 1))
        row["val_loss_std"] = t.user_attrs.get(A.VAL_LOSS_STD, math.nan)
        row["val_loss_sem"] = t.user_attrs.get(A.VAL_LOSS_SEM, math.nan)
        if fidelity:
            row["fidelity_std"] = t.user_attrs.get(A.FIDELITY_STD, math.nan)
            row["fidelity_sem"] = t.user_attrs.get(A.FIDELITY_SEM, math.nan)
        if curves:
            row[A.BEST_STEP] = t.user_attrs.get(A.BEST_STEP)
            row[A.VAL_LOSS_AT_BEST] = t.user_attrs.get(A.VAL_LOSS_AT_BEST, math.nan)
            row[A.STEPS_RUN] = t.user_attrs.get(A.STEPS_RUN)
            row[A.RUNG] = t.user_attrs.get(A.RUNG)
        row["health"] = health_of(t)
        row["node_id"] = t.user_attrs.get(A.NODE_ID, "")
        if reruns:
            row["rerun_of"] = t.user_attrs.get(A.RERUN_OF)
        row["reason"] = (t.user_attrs.get(A.FAIL_REASON) or t.user_attrs.get(A.PRUNE_REASON)
                         or stale.get(str(t.number), ""))
        rows.append(row)
    columns = list(FIXED_COLUMNS) + names + (["feasible"] if constrained else [])
    columns += (["fidelity", "concepts_shown", "concepts_not_shown"] if fidelity else []) + ["outcome", *NOISE_COLUMNS]
    columns += (list(FIDELITY_NOISE_COLUMNS) if fidelity else []) + (list(CURVE_COLUMNS) if curves else [])
    columns += ["health", "node_id"]
    columns += (["rerun_of"] if reruns else []) + ["reason"]
    out = pd.DataFrame(rows, columns=columns)
    for c in (A.BEST_STEP, A.STEPS_RUN, A.RUNG):
        if c in out.columns:
            out[c] = out[c].astype("Int64")  # steps are whole numbers; absent ones stay empty
    return out


def curves_of(study: Any) -> dict[int, list[tuple[int, float]]]:
    """trial number -> its validation curve [(step, val_loss), ...], for the trials that kept one."""
    return {t.number: [(int(s), float(v)) for s, v in t.user_attrs[A.VAL_CURVE]]
            for t in study.trials if t.user_attrs.get(A.VAL_CURVE)}


def curve_rows(fit: pd.DataFrame, curves: dict[int, list[tuple[int, float]]], steps: dict[str, Any], *,
               score: str = "final", max_rows: int = 120) -> pd.DataFrame | None:
    """Steps as data: when `steps` is a sampled param, each trial's validations at steps inside
    the space's range are observations of the objective at those steps (a trial's first s steps
    are a trial of s steps: the LR schedule is constant after warmup), one row each, the other
    params the trial's. Under `--score best` a row's value is the best of the curve up to its
    step. At most max_rows // trials points per trial (evenly spaced, its own last one always),
    so the surrogate's cost stays what it was. The rows keep the trial in CURVE_TRIAL: they share
    its seed noise, and the surrogate models that (common.gp: an offset per trial). None when
    no trial kept a curve."""
    from ._analysis import CURVE_TRIAL

    have = [int(t) for t in fit["trial"] if int(t) in curves]
    if not have or len(have) < len(fit):
        return None
    per = max(1, max_rows // len(have))
    lo, hi = float(steps["low"]), float(steps["high"])
    rows = []
    for r in fit.itertuples(index=False):
        row = r._asdict()
        points = [(s, v) for s, v in curves[int(row["trial"])] if lo <= s <= min(hi, float(row["steps"]))]
        if score == "best":
            best, kept = math.inf, []
            for s, v in points:
                best = min(best, v)
                kept.append((s, best))
            points = kept
        if not points:
            continue
        if len(points) > per:
            idx = np.unique(np.round(np.linspace(len(points) - 1, 0, per)).astype(int))
            points = [points[i] for i in idx]
        for s, v in points:
            rows.append({**row, "steps": s, "val_loss": v, CURVE_TRIAL: int(row["trial"])})
    return pd.DataFrame(rows) if rows else None


def compute_spent(study: Any, trials: pd.DataFrame) -> dict[str, Any] | None:
    """Optimizer steps and trial-seconds spent, and what the early stops saved (the steps a stopped
    trial did not train, and its seconds scaled by them); None when no trial recorded its steps."""
    if A.STEPS_RUN not in trials.columns or trials[A.STEPS_RUN].isna().all():
        return None
    planned = {t.number: t.user_attrs.get(A.STEPS_PLANNED) for t in study.trials}
    run = {t.number: t.user_attrs.get(A.STEPS_RUN) for t in study.trials}
    seconds = {t.number: (t.datetime_complete - t.datetime_start).total_seconds()
               for t in study.trials if t.datetime_complete is not None and t.datetime_start is not None}
    stopped = [t.number for t in study.trials if t.user_attrs.get(A.RUNG)]
    steps_saved = sum(planned[n] - run[n] for n in stopped if planned.get(n) and run.get(n))
    seconds_saved = sum(seconds[n] * (planned[n] / run[n] - 1) for n in stopped
                        if n in seconds and planned.get(n) and run.get(n))
    steps_trained = sum(v for v in run.values() if v)
    return {"steps_trained": int(steps_trained), "steps_planned": int(sum(v for v in planned.values() if v)),
            "steps_saved_by_early_stop": int(steps_saved), "trial_seconds": float(sum(seconds.values())),
            "trial_seconds_saved_by_early_stop_est": float(seconds_saved),
            "stopped_at_a_rung": len(stopped),
            "stopped_at_rung": {str(k): int(v) for k, v in pd.Series(
                [study.trials[n].user_attrs[A.RUNG] for n in stopped], dtype="int64").value_counts().sort_index().items()}}


def usable(trials: pd.DataFrame) -> pd.DataFrame:
    """The one definition of the trials an analysis may use: COMPLETE, a result (not out of
    memory), within the memory budget and its constraints, finite objectives. Front,
    hypervolume and the plots take it from here, coupling, laws, the pair contours
    and noise its `converged` part; the other trials appear in the tables only, with their
    state and reason."""
    ok = trials[(trials["state"] == "COMPLETE") & (trials["outcome"] == "ok")]
    if "feasible" in ok.columns:
        ok = ok[ok["feasible"].astype(bool)]
    values = ok[list(OBJECTIVES)].astype(float)  # a study's fidelity objective: COMPLETE has it
    return ok[np.isfinite(values).all(axis=1)]


# health labels of a run whose loss never settled, and of a config whose seeds disagree about it


def converged(ok: pd.DataFrame) -> pd.DataFrame:
    """The usable trials the response-surface analyses fit (coupling, laws, pair contours, noise
    floor against spread): without those whose objective labelled them `diverged` or `degrading` (the built-in
    health monitor, or a plug-in's `tags: {health: ...}`), and configs `at_edge` (their seeds disagree
    about converging: their mean loss mixes a broken run in, their spread is not seed noise). One such run's loss, far above the
    rest, carries most of the variance a surrogate explains and so decides which pair looks
    coupled; it says where training breaks (the health plots show where), not how the knobs
    trade off. They stay in the front, the tables and every plot but the pair contours."""
    if "health" not in ok.columns:
        return ok
    return ok[~ok["health"].astype(str).isin(UNSETTLED)]


def pareto_frame(study: Any, trials: pd.DataFrame) -> pd.DataFrame:
    """The non-dominated usable trials over the study's objectives (Optuna's own Pareto
    routine), with `p_front`: the probability that the trial is non-dominated under the
    measured seed noise."""
    from ._front import front_probability, noise_floor, pareto_mask

    objectives = Objectives.of(study)
    ok = usable(trials)
    mask = pareto_mask(objectives.minimized(ok))
    out = ok[mask].copy()
    # the study's noise floor, as the summary states it: pooled over the runs that converged
    floors = {name: noise_floor(converged(ok), name) for name in objectives.names if name != "peak_mem_mb"}
    out["p_front"] = front_probability(ok, out["trial"].tolist(), objectives=objectives, floors=floors)
    return out.sort_values(["peak_mem_mb", "val_loss", "trial"]).reset_index(drop=True)


def rerun_outcomes(trials: pd.DataFrame, objectives: Objectives) -> tuple[list[dict[str, Any]], list[int]]:
    """What `csweep rerun-front` found: per re-trained front config, its original trial and value,
    its re-run (fresh seeds) and value, and whether it held: whether the re-run is on the front
    under fresh seeds (the usable trials with every re-trained original replaced by its re-run, so
    that a lucky original does not dominate its own re-run). Returns (those rows, the trials the
    front under fresh seeds rests on); ([], []) when nothing was re-run."""
    from ._front import pareto_mask

    if "rerun_of" not in trials.columns or not trials["rerun_of"].notna().any():
        return [], []
    reruns = trials[trials["rerun_of"].notna()]
    originals = {int(v) for v in reruns["rerun_of"]}
    ok = usable(trials)
    fresh = ok[~ok["trial"].isin(originals)]
    on_front = set(fresh[pareto_mask(objectives.minimized(fresh))]["trial"].astype(int)) if len(fresh) else set()
    by_trial = trials.set_index("trial")
    rows = []
    for r in reruns.itertuples():
        original = int(r.rerun_of)
        before = by_trial.loc[original] if original in by_trial.index else None
        rows.append({"trial": original, "rerun": int(r.trial),
                     "val_loss": float(before["val_loss"]) if before is not None else math.nan,
                     "rerun_val_loss": float(r.val_loss), "rerun_seeds": int(r.n_seeds or 1),
                     "held": int(r.trial) in on_front})
    return rows, sorted(on_front)


def rerun_sentence(rows: list[dict[str, Any]], rests_on: list[int]) -> str:
    """'Under fresh seeds 2 of 3 front configs held: trial 6 did not (0.0846 -> 0.0878 over 3
    seeds). The front now rests on trials 27, 28, 31.'"""
    if not rows:
        return ""
    held = [r for r in rows if r["held"]]
    not_held = [f"trial {r['trial']} did not ({r['val_loss']:.4g} -> {r['rerun_val_loss']:.4g} over "
                f"{r['rerun_seeds']} seeds)" for r in rows if not r["held"]]
    head = f"Under fresh seeds (csweep rerun-front) {len(held)} of {len(rows)} front configs held"
    return (head + (": " + "; ".join(not_held) if not_held else "") + ". The front now rests on trials "
            + ", ".join(map(str, rests_on)) + ".")


def run_link(run_id: str, tracking_uri: str | None, experiment_id: str | None) -> str:
    if run_id and tracking_uri and tracking_uri.startswith(("http://", "https://")) and experiment_id:
        url = f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
        return f'<a href="{html.escape(url)}">{html.escape(run_id)}</a>'
    return html.escape(run_id or "")


# a trials table as a reader decides on it: the trial, its chance of being on the front, its
# objectives and health first, its knobs after, the ids and the reason last
LEAD_COLUMNS = ("trial", "p_front", "val_loss", "peak_mem_mb", "fidelity", "health", "outcome", "state")
LAST_COLUMNS = ("reason", "mlflow_run_id", "node_id")
REASON_SHOWN = 48  # characters of a reason shown in a row; the whole text on hover


def reader_order(columns: list[str]) -> list[str]:
    lead = [c for c in LEAD_COLUMNS if c in columns]
    last = [c for c in LAST_COLUMNS if c in columns]
    return lead + [c for c in columns if c not in lead and c not in last] + last


def html_table(df: pd.DataFrame, *, tracking_uri: str | None = None, experiment_id: str | None = None) -> str:
    """The page's table of a frame: trials tables in reader_order (the CSV files keep the
    contract's order), a long reason cut to one line with the whole on hover, whole numbers
    shown as such (rerun_of 27, not 27.0)."""
    shown = df.copy()
    if "trial" in shown.columns:
        shown = shown[reader_order(list(shown.columns))]
    if "rerun_of" in shown.columns:
        shown["rerun_of"] = shown["rerun_of"].astype("Int64")
    if "reason" in shown.columns:
        shown["reason"] = [f'<span title="{html.escape(str(r))}">{html.escape(str(r)[:REASON_SHOWN])}…</span>'
                           if isinstance(r, str) and len(r) > REASON_SHOWN else html.escape(str(r or ""))
                           for r in shown["reason"]]
    if "node_id" in shown.columns:  # Ray's 56-character node ids: the first 8 shown, the whole on hover
        shown["node_id"] = [f'<span title="{html.escape(str(n))}">{html.escape(str(n)[:8])}</span>'
                            if isinstance(n, str) and n else "" for n in shown["node_id"]]
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
