"""Draw what _analysis computed: PNG with matplotlib, interactive HTML with plotly."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ._front import Objectives
from ._laws import LawFit

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, ax: Any, path: Path, *, title: str, legend: int | None = 8, grid: str = "major") -> Path:
    """Title, grid, legend (when anything is labelled), tight layout, PNG; closes the figure."""
    plt = _plt()
    ax.set_title(title)
    if grid != "none":
        ax.grid(alpha=0.3, which=grid)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=legend)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _sem95(rows: pd.DataFrame) -> np.ndarray | None:
    """1.96 x each trial's sem of val_loss (its replicates', or the noise floor's), None if unmeasured."""
    from ._front import trial_sems

    if "val_loss_sem" not in rows.columns or not len(rows):
        return None
    sems = trial_sems(rows)
    return 1.96 * sems if (sems > 0).any() else None


def front_png(ok: pd.DataFrame, front: pd.DataFrame, path: Path, *, title: str, left_out: str = "",
              objectives: Objectives = Objectives()) -> Path:
    """The usable trials (dominated grey, the front labelled, 95% seed-noise bars where measured);
    trials without a usable result are named in the caption, never drawn. With fidelity among
    the objectives, a second panel shows val_loss against fidelity, the front's points are
    coloured by fidelity, and no staircase is drawn (a projection of a 3-objective front is not
    one)."""
    plt = _plt()
    three = "fidelity" in objectives.names
    if three:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110, gridspec_kw={"width_ratios": [3, 2]})
    else:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    dominated = ok[~ok["trial"].isin(front["trial"])]
    f = front.sort_values("peak_mem_mb")
    err = _sem95(f)
    panels = [(ax, "peak_mem_mb", "peak_mem_mb (lower is better)")]
    if three:
        panels.append((ax2, "fidelity", "fidelity (higher is better)"))
    for axis, x, xlabel in panels:
        axis.scatter(dominated[x], dominated["val_loss"], c="#b0b0b0", s=22, label=f"dominated ({len(dominated)})")
        if not three:
            axis.step(f[x], f["val_loss"], where="post", c=PALETTE[1], lw=1.2, alpha=0.7)
        if err is not None:
            axis.errorbar(f[x], f["val_loss"], yerr=err, fmt="none", ecolor=PALETTE[1], capsize=3,
                          lw=1, label="95% seed-noise interval")
        if three:
            dots = axis.scatter(f[x], f["val_loss"], c=f["fidelity"].astype(float), cmap="viridis", s=46, zorder=3,
                                edgecolors=PALETTE[1], linewidths=1.2, label=f"Pareto front ({len(f)})")
        else:
            axis.scatter(f[x], f["val_loss"], c=PALETTE[1], s=40, zorder=3, label=f"Pareto front ({len(f)})")
        for _, row in f.iterrows():
            axis.annotate(f"#{int(row['trial'])}", (row[x], row["val_loss"]),
                          textcoords="offset points", xytext=(4, 4), fontsize=8, color=PALETTE[1])
        axis.set_xlabel(xlabel)
        axis.set_ylabel("val_loss (lower is better)")
    if three:
        fig.colorbar(dots, ax=ax2, label="fidelity of the front's trials")
        ax2.grid(alpha=0.3)
        ax2.set_title("validation loss vs concept fidelity")
    scale = loss_scale(ok)
    if scale is not None:
        lo, hi, off = scale
        for axis, x, _ in panels:
            axis.set_ylim(lo, hi)
            axis.scatter(off[x], np.full(len(off), hi), marker="^", c="#d62728", s=40, clip_on=False, zorder=4,
                         label=f"did not converge ({len(off)}): val_loss above the scale")
    if left_out:
        fig.text(0.01, 0.01, left_out, fontsize=7, color="#666666")
    return _save(fig, ax, path, title=title)


def loss_scale(ok: pd.DataFrame) -> tuple[float, float, pd.DataFrame] | None:
    """The val_loss axis of the runs that converged (their range and a margin) and the runs
    beyond it that did not converge (diverged, degrading, at the edge), to be marked at its top:
    one diverged run's loss, 10x the rest, would flatten every other point onto the bottom.
    None when every run converged or the others fit the range anyway."""
    from common.runs import UNSETTLED

    if "health" not in ok.columns or not len(ok):
        return None
    broke = ok["health"].astype(str).isin(UNSETTLED)
    settled = ok.loc[~broke, "val_loss"].astype(float)
    if len(settled) < 2 or not broke.any():
        return None
    lo, hi = float(settled.min()), float(settled.max())
    pad = 0.08 * (hi - lo) if hi > lo else 0.05 * abs(hi) or 0.05
    top = hi + pad
    off = ok[broke & (ok["val_loss"].astype(float) > top)]
    if off.empty:
        return None
    return lo - pad, top, off


def fronts_overlay_png(fronts: Mapping[str, pd.DataFrame], path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for i, (name, f) in enumerate(fronts.items()):
        f = f.sort_values("peak_mem_mb")
        color = PALETTE[i % len(PALETTE)]
        ax.step(f["peak_mem_mb"], f["val_loss"], where="post", c=color, lw=1.2)
        ax.scatter(f["peak_mem_mb"], f["val_loss"], c=color, s=30, label=f"{name} ({len(f)})")
    ax.set_xlabel("peak_mem_mb")
    ax.set_ylabel("val_loss")
    return _save(fig, ax, path, title="Pareto fronts")


def _hover(row: pd.Series, params: list[str]) -> str:
    parts = [f"trial {int(row['trial'])}", f"val_loss={row['val_loss']:.5g}", f"peak_mem_mb={row['peak_mem_mb']:.5g}"]
    if "fidelity" in row and pd.notna(row["fidelity"]):
        parts.append(f"fidelity={row['fidelity']:.4g}")
    parts += [f"{p}={row[p]}" for p in params if p in row]
    return "<br>".join(parts)


def front_figure(fronts: Mapping[str, tuple[pd.DataFrame, pd.DataFrame]], params: list[str],
                 objectives: Objectives = Objectives()) -> Any:
    """Interactive plotly figure: per study its dominated trials (grey) and its front. With
    fidelity among the objectives, the front's markers are coloured by fidelity (no staircase:
    the front is over three objectives)."""
    import plotly.graph_objects as go

    three = "fidelity" in objectives.names
    fig = go.Figure()
    for i, (name, (ok, front)) in enumerate(fronts.items()):
        dominated = ok[~ok["trial"].isin(front["trial"])]
        color = PALETTE[(i + 1) % len(PALETTE)] if len(fronts) > 1 else PALETTE[1]
        suffix = f" ({name})" if len(fronts) > 1 else ""
        fig.add_trace(go.Scatter(
            x=dominated["peak_mem_mb"], y=dominated["val_loss"], mode="markers",
            marker={"color": "#b0b0b0", "size": 7}, name=f"dominated{suffix}",
            text=[_hover(r, params) for _, r in dominated.iterrows()], hoverinfo="text",
        ))
        f = front.sort_values("peak_mem_mb")
        err = _sem95(f)
        marker: dict[str, Any] = {"color": color, "size": 10}
        if three:
            marker = {"color": list(f["fidelity"].astype(float)), "colorscale": "Viridis", "size": 12,
                      "line": {"color": color, "width": 2}, "colorbar": {"title": {"text": "fidelity"}}}
        fig.add_trace(go.Scatter(
            x=f["peak_mem_mb"], y=f["val_loss"], mode="markers+text" if three else "lines+markers+text",
            line={"shape": "hv", "color": color},
            error_y=None if err is None else {"type": "data", "array": list(err), "visible": True},
            marker=marker, name=f"Pareto front{suffix}",
            text=[f"#{int(t)}" for t in f["trial"]], textposition="top right",
            hovertext=[_hover(r, params) for _, r in f.iterrows()], hoverinfo="text",
        ))
    scales = [loss_scale(ok) for ok, _ in fronts.values()]
    if scales and all(sc is not None for sc in scales):
        lo, hi = min(sc[0] for sc in scales), max(sc[1] for sc in scales)
        off = pd.concat([sc[2] for sc in scales])
        fig.add_trace(go.Scatter(
            x=off["peak_mem_mb"], y=[hi] * len(off), mode="markers", cliponaxis=False,
            marker={"color": "#d62728", "size": 10, "symbol": "triangle-up"},
            name=f"did not converge ({len(off)}): val_loss above the scale",
            text=[_hover(r, params) for _, r in off.iterrows()], hoverinfo="text"))
        fig.update_yaxes(range=[lo, hi])
    fig.update_layout(xaxis_title="peak_mem_mb", yaxis_title="val_loss", template="plotly_white",
                      height=460, margin={"l": 60, "r": 20, "t": 30, "b": 50})
    return fig


def hv_history_png(history: pd.DataFrame, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=110)
    ax.plot(history["trial"], history["hypervolume"], c=PALETTE[0], marker=".")
    ax.set_xlabel("trial number")
    ax.set_ylabel("hypervolume")
    return _save(fig, ax, path, title="Hypervolume of the feasible front", legend=None)


def curves_png(curves: Mapping[str, Sequence[tuple[int, float]]], path: Path, *, score: str = "final") -> Path:
    """val_loss against step, one line per trial, its best step marked."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for i, (label, curve) in enumerate(curves.items()):
        steps, values = zip(*curve)
        colour = PALETTE[i % len(PALETTE)] if "worst" not in label else "#7f7f7f"
        ax.plot(steps, values, c=colour, marker=".", lw=1.2, label=label)
        k = int(np.argmin(values))
        ax.scatter([steps[k]], [values[k]], marker="*", s=110, c=colour, edgecolors="black", zorder=4)
    ax.set_xlabel("step")
    ax.set_ylabel("val_loss")
    return _save(fig, ax, path, title=f"Validation during training (★ best step; score: {score})")


def pair_png(trials: pd.DataFrame, x: str, y: str, logs: Mapping[str, bool], path: Path,
             fit: LawFit | None = None, *, categorical: Mapping[str, Sequence[Any]] | None = None,
             best_by_level: Sequence[tuple[str, float, float, float]] = ()) -> Path:
    """val_loss over a pair of params, for every kind of pair: numeric x numeric, a filled contour
    of the usable trials (triangulated) under them; categorical x numeric, one curve per level
    over the numeric knob (its best value per level marked, when the coupling analysis found
    one); categorical x categorical, a heatmap of the cells' mean val_loss."""
    categorical = categorical or {}
    ok = trials.dropna(subset=["val_loss", x, y])
    if x in categorical and y in categorical:
        return _pair_cells_png(ok, x, y, path, categorical)
    if x in categorical or y in categorical:
        cat, num = (x, y) if x in categorical else (y, x)
        return _pair_levels_png(ok, cat, num, logs, path, categorical[cat], best_by_level)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 4.4), dpi=110)
    xs, ys, zs = (ok[c].astype(float).to_numpy() for c in (x, y, "val_loss"))
    tx = np.log10(xs) if logs.get(x) and (xs > 0).all() else xs
    ty = np.log10(ys) if logs.get(y) and (ys > 0).all() else ys
    drawn = None
    if len(ok) >= 6 and len(set(tx)) > 2 and len(set(ty)) > 2:
        try:
            drawn = ax.tricontourf(tx, ty, zs, levels=12, cmap="viridis_r", alpha=0.85)
        except (ValueError, RuntimeError):
            drawn = None
    pts = ax.scatter(tx, ty, c=zs, cmap="viridis_r", edgecolors="white", s=28, zorder=3)
    fig.colorbar(drawn if drawn is not None else pts, ax=ax, label="val_loss")
    if fit is not None and math.isfinite(fit.alpha):
        grid = np.linspace(np.log10(xs[xs > 0].min()), np.log10(xs.max()), 50) if (xs > 0).any() else None
        if grid is not None:
            curve = fit.c * (10**grid) ** fit.alpha
            gx = grid if logs.get(x) else 10**grid
            gy = np.log10(curve) if logs.get(y) else curve
            ax.plot(gx, gy, c="#d62728", lw=1.5, label=f"fit: {y}* ∝ {x}^{fit.alpha:.2f}")
            ax.legend(fontsize=8)
    ax.set_xlabel(f"log10 {x}" if logs.get(x) else x)
    ax.set_ylabel(f"log10 {y}" if logs.get(y) else y)
    ax.set_title(f"val_loss over {x} × {y}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _pair_levels_png(ok: pd.DataFrame, cat: str, num: str, logs: Mapping[str, bool], path: Path,
                     levels: Sequence[Any], best_by_level: Sequence[tuple[str, float, float, float]]) -> Path:
    """Categorical x numeric: per level its trials and a curve through the medians of up to five
    quantile bins of the numeric knob; a dashed line at the level's best value (with its 95%
    interval shaded) where the coupling analysis gives one."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.8, 4.4), dpi=110)
    best = {str(lvl): (b, lo, hi) for lvl, b, lo, hi in best_by_level}
    for i, level in enumerate(levels):
        rows = ok[ok[cat].astype(str) == str(level)]
        color = PALETTE[i % len(PALETTE)]
        xs, zs = rows[num].astype(float).to_numpy(), rows["val_loss"].astype(float).to_numpy()
        ax.scatter(xs, zs, c=color, s=24, edgecolors="white", label=f"{cat}={level} ({len(rows)})")
        if len(rows) >= 3:
            order = np.argsort(xs)
            bins = np.array_split(order, min(5, max(2, len(rows) // 3)))
            ax.plot([np.median(xs[b]) for b in bins], [np.median(zs[b]) for b in bins], c=color, lw=1.4)
        if str(level) in best:
            b, lo, hi = best[str(level)]
            ax.axvline(b, c=color, ls="--", lw=1)
            ax.axvspan(lo, hi, color=color, alpha=0.08)
    if logs.get(num) and (ok[num].astype(float) > 0).all():
        ax.set_xscale("log")
    ax.set_xlabel(num)
    ax.set_ylabel("val_loss (lower is better)")
    return _save(fig, ax, path, title=f"val_loss over {num} per {cat}", legend=7)


def _pair_cells_png(ok: pd.DataFrame, x: str, y: str, path: Path, categorical: Mapping[str, Sequence[Any]]) -> Path:
    """Categorical x categorical: the mean val_loss of each cell, its trial count written in it."""
    plt = _plt()
    xl, yl = [str(v) for v in categorical[x]], [str(v) for v in categorical[y]]
    cells = ok.assign(_x=ok[x].astype(str), _y=ok[y].astype(str)).groupby(["_y", "_x"])["val_loss"]
    mean, count = cells.mean(), cells.size()
    grid = np.full((len(yl), len(xl)), np.nan)
    for (vy, vx), m in mean.items():
        if vy in yl and vx in xl:
            grid[yl.index(vy), xl.index(vx)] = m
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(xl), 1.4 + 0.8 * len(yl)), dpi=110)
    im = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis_r", aspect="auto")
    fig.colorbar(im, ax=ax, label="mean val_loss")
    for (vy, vx), n in count.items():
        if vy in yl and vx in xl:
            ax.text(xl.index(vx), yl.index(vy), f"{mean[(vy, vx)]:.3g}\n({n})", ha="center", va="center",
                    fontsize=8, color="white")
    ax.set_xticks(range(len(xl)), xl)
    ax.set_yticks(range(len(yl)), yl)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    return _save(fig, ax, path, title=f"mean val_loss per {x} × {y}", legend=None, grid="none")


def law_png(fit: LawFit, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.8), dpi=110)
    px = np.array([p[0] for p in fit.points])
    py = np.array([p[1] for p in fit.points])
    if len(px):
        ax.scatter(px, py, c=PALETTE[0], label=f"{fit.y}* read off the surrogate")
    if math.isfinite(fit.alpha) and len(px):
        grid = np.geomspace(px.min(), px.max(), 50)
        ax.plot(grid, fit.c * grid**fit.alpha, c=PALETTE[1],
                label=f"{fit.c:.3g}·x^{fit.alpha:.2f} [{fit.alpha_ci_low:.2f}, {fit.alpha_ci_high:.2f}]")
        for a, style in ((-0.5, ":"), (0.5, "--")):
            ref = fit.c * grid**a * (np.exp(np.mean(np.log(py))) / np.exp(np.mean(np.log(fit.c * px**a))))
            ax.plot(grid, ref, c="#888888", ls=style, lw=1, label=f"folk alpha = {a:+.1f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    # within a decade matplotlib labels every minor tick, and the labels run into each other
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=8))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelrotation=30)
    ax.set_xlabel(fit.x)
    ax.set_ylabel(f"{fit.y}*")
    return _save(fig, ax, path, title=f"{fit.y}*({fit.x}), power law", legend=7, grid="both")


HEALTH_STYLE = {
    "ok": ("#2ca02c", "o"), "diverged": ("#d62728", "X"), "collapsed": ("#9467bd", "D"),
    "dead_adapter": ("#8c564b", "s"), "oscillating": ("#ff7f0e", "^"), "degrading": ("#e377c2", "v"),
    "at_edge": ("#bcbd22", "P"),  # its seeds disagree: one trained, another broke
}


def health_png(trials: pd.DataFrame, x: str, y: str, logs: Mapping[str, bool], path: Path, *,
               categorical: Mapping[str, Sequence[Any]] | None = None,
               boundary: Mapping[str, np.ndarray] | None = None) -> Path:
    """Where in a parameter pair the trials diverged, collapsed or stayed healthy (pruned trials
    included, at the parameters they were stopped with), with the stability analysis's fitted
    boundary (the other knobs at the middle of their ranges) and its 95% band when given
    (reports._stability.StabilityResult.grid)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 4.4), dpi=110)
    if boundary is not None:
        share = boundary["share"]
        if share.min() < 0.5 < share.max():
            ax.contour(boundary["x"], boundary["y"], share, levels=[0.5], colors="#444", linewidths=1.4)
            ax.plot([], [], c="#444", lw=1.4, label="fitted boundary")
        if share.min() < 0.975 and share.max() > 0.025:
            ax.contourf(boundary["x"], boundary["y"], share, levels=[0.025, 0.975], colors=["#999"], alpha=0.18)
            ax.fill_between([], [], color="#999", alpha=0.18, label="its 95% band")
    shown = trials.dropna(subset=[x, y])
    shown = shown[shown["health"].astype(str) != ""]
    for state, group in shown.groupby("health"):
        color, marker = HEALTH_STYLE.get(str(state), ("#7f7f7f", "o"))
        gx, gy = (group[c].astype(str if c in (categorical or {}) else float) for c in (x, y))
        ax.scatter(gx, gy, c=color, marker=marker, s=36, label=f"{state} ({len(group)})", edgecolors="white")
    if logs.get(x):
        ax.set_xscale("log")
    if logs.get(y):
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    return _save(fig, ax, path, title=f"Training health over {x} × {y}")
