"""Fitted laws: the best y as a power of x (y* = c x^alpha), read on the surrogate's draws, with
alpha's interval against the folk rules. Plain records, never torch."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from ._analysis import _refined_argmin, _unscale, fit_surrogate

FOLK_ALPHAS = (-0.5, 0.5)


@dataclass(frozen=True)
class LawFit:
    x: str
    y: str
    law: str
    alpha: float
    alpha_ci_low: float
    alpha_ci_high: float
    c: float
    r2: float
    n_points: int
    points: tuple[tuple[float, float], ...] = ()
    n_trials: int = 0
    note: str = ""  # why there is no fit

    def excludes(self, alpha: float) -> bool:
        return not (self.alpha_ci_low <= alpha <= self.alpha_ci_high)

    @property
    def stated(self) -> bool:
        """A law is stated when its interval excludes 0: the best y moves with x."""
        return math.isfinite(self.alpha) and self.excludes(0.0)

    def sentence(self) -> str:
        if not math.isfinite(self.alpha):
            return f"{self.y}*({self.x}) = c·{self.x}^alpha: no fit — {self.note or 'not enough usable trials'}."
        verdicts = []
        for a in FOLK_ALPHAS:
            verdicts.append(f"alpha = {a:+.1f} is {'excluded' if self.excludes(a) else 'not excluded'}")
        if not self.excludes(0.0):
            return (f"{self.y}*({self.x}): no law stated — alpha's 95% interval ({self.alpha_ci_low:.2f} to "
                    f"{self.alpha_ci_high:.2f}, from {self.n_trials} trials) includes 0, so the best {self.y} is not "
                    f"shown to move with {self.x}; {'; '.join(verdicts)} by the interval.")
        return (f"{self.y}*({self.x}) = {self.c:.3g}·{self.x}^{self.alpha:.2f} "
                f"(alpha 95% CI {self.alpha_ci_low:.2f} to {self.alpha_ci_high:.2f}, r² = {self.r2:.2f}, "
                f"from {self.n_trials} trials): {'; '.join(verdicts)} by the interval.")


LAW_MIN_TRIALS = 12  # below this a law is not fitted at all
LAW_MIN_POINTS = 6  # of the grid of x values, at least this many must have their best y inside its range


def fit_power_law(ok: pd.DataFrame, x: str, y: str, *, params: Mapping[str, Mapping[str, Any]] | None = None,
                  categorical: Mapping[str, Sequence[Any]] | None = None, n_boot: int = 24, seed: int = 0,
                  gp: Any = None) -> LawFit:
    """y* = c · x^alpha, where y*(x) is the y that minimises val_loss at x (the partial dependence
    on x and y: their main effects and interaction, the other knobs averaged out), read off
    each posterior draw of the fully Bayesian ANOVA GP (common.gp) on the grid of x, and a
    least-squares line in log-log per draw: alpha's point is the median over draws, its 95%
    interval their 2.5-97.5 percentiles, so it carries the surrogate's own uncertainty. No law is
    stated from fewer than LAW_MIN_POINTS points of x whose best y lies inside y's range."""
    from common.gp import QUAD

    ok = ok.dropna(subset=["val_loss", x, y])
    ok = ok[(ok[x].astype(float) > 0) & (ok[y].astype(float) > 0)]
    nan = LawFit(x, y, "power", math.nan, math.nan, math.nan, math.nan, math.nan, 0, n_trials=len(ok),
                 note=f"{len(ok)} usable trials, {LAW_MIN_TRIALS} needed")
    if len(ok) < LAW_MIN_TRIALS:
        return nan
    ok, params, cats = _law_space(ok, x, y, params, categorical)
    names = list(params) + list(cats)
    ix, iy = names.index(x), names.index(y)
    import warnings

    from threadpoolctl import threadpool_limits

    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")
        if gp is None or len(gp.groups) != len(names) or getattr(gp, "n_trials", -1) != len(ok):
            gp = fit_surrogate(ok, params, cats, seed=seed, n_hyper=max(4, n_boot))
        draws, mean = gp.draws(), gp.mean()
    # the x grid of the surrogate (its quadrature nodes and their weights), inside the range its
    # rows covered (a curve's points included)
    gx, wx, gy = gp.grid[ix][:, 0], gp.weights[ix], gp.grid[iy][:, 0]
    scaled_x = gp.x[:, gp.groups[ix][0]]
    lo_x, hi_x = float(scaled_x.min()), float(scaled_x.max())
    cover = (gx >= lo_x - 0.5 / QUAD) & (gx <= hi_x + 0.5 / QUAD)
    lgx = _to_log(gx, params[x])
    central = _best_y({c: v[None, :] for c, v in mean.items()}, ix, iy, gy, cover)[0]
    fit = _regress(central, lgx, wx, params[y])
    per_draw = [_regress(row, lgx, wx, params[y]) for row in _best_y(draws, ix, iy, gy, cover)]
    alphas = np.array([f[0] for f in per_draw if f is not None])
    if fit is None or len(alphas) < 0.6 * len(per_draw):
        inside = int(np.isfinite(central).sum())
        share = len(alphas) / max(len(per_draw), 1)
        return replace(nan, note=f"the best {y} lies inside its range at {inside} of {int(cover.sum())} values of {x}, "
                                 f"and at {LAW_MIN_POINTS} or more in {share:.0%} of the surrogate's draws ({len(ok)} "
                                 f"usable trials; a law needs {LAW_MIN_POINTS} values on the posterior mean and in 60% "
                                 f"of the draws): widen the range of {y}, or run more trials")
    slope = float(np.median(alphas))
    lo, hi = (float(v) for v in np.percentile(alphas, [2.5, 97.5]))
    keep = np.isfinite(central)
    log_y = _to_log(central[keep], params[y])
    icpt = float(np.average(log_y - slope * lgx[keep], weights=wx[keep]))
    pts = tuple((float(math.exp(a)), float(math.exp(b))) for a, b in zip(lgx[keep], log_y))
    return LawFit(x, y, "power", slope, min(lo, slope), max(hi, slope), float(math.exp(icpt)), fit[2], len(pts),
                  pts, len(ok))


def _law_space(ok: pd.DataFrame, x: str, y: str, params: Mapping[str, Mapping[str, Any]] | None,
               categorical: Mapping[str, Sequence[Any]] | None) -> tuple[pd.DataFrame, dict[str, Any], dict[str, list]]:
    """The trials and the knobs the law's surrogate reads: x and y (log-scaled over their trials'
    range where the space does not say), the other numeric knobs, the categorical ones of two or
    more levels."""
    params = dict(params or {})
    for name in (x, y):
        if name not in params:
            v = ok[name].astype(float)
            params[name] = {"low": float(v.min()), "high": float(v.max()), "log": True}
    params = {k: v for k, v in params.items() if k in ok.columns}
    cats = {k: list(v) for k, v in (categorical or {}).items() if k in ok.columns and len(v) >= 2}
    return ok.dropna(subset=[*params, *cats]), params, cats


def _to_log(v: np.ndarray, d: Mapping[str, Any]) -> np.ndarray:
    """Scaled values of a knob (distribution `d`) as the log of the knob's own values."""
    if d.get("log"):
        return math.log(float(d["low"])) + v * (math.log(float(d["high"])) - math.log(float(d["low"])))
    return np.log(np.maximum(_unscale(v, d), 1e-300))


def _best_y(comp: Mapping[tuple[int, ...], np.ndarray], ix: int, iy: int, gy: np.ndarray,
            cover: np.ndarray) -> np.ndarray:
    """(draws, x grid) the best y (scaled), NaN on the edge of y's range or outside the trials' x."""
    from common.gp import QUAD

    key = (min(ix, iy), max(ix, iy))
    inter = comp[key].reshape(-1, QUAD, QUAD)
    if ix > iy:
        inter = inter.transpose(0, 2, 1)
    surf = inter + comp[(iy,)].reshape(-1, 1, QUAD)  # x's own main effect moves no minimum
    pos, inner = _refined_argmin(surf, gy)
    return np.where(inner & cover[None, :], pos, np.nan)


def _regress(ys: np.ndarray, lgx: np.ndarray, wx: np.ndarray, dist_y: Mapping[str, Any]) -> tuple[float, float, float] | None:
    """The least-squares line of log y* on log x over x's range (each point weighted by its node's
    quadrature weight): (slope, intercept, r2); None below LAW_MIN_POINTS points."""
    keep = np.isfinite(ys)
    if keep.sum() < LAW_MIN_POINTS:
        return None
    ly, w = _to_log(ys[keep], dist_y), wx[keep] / wx[keep].sum()
    slope, icpt = np.polyfit(lgx[keep], ly, 1, w=np.sqrt(w))
    resid = ly - (slope * lgx[keep] + icpt)
    ss = float(w @ (ly - w @ ly) ** 2)
    return float(slope), float(icpt), (1 - float(w @ resid**2) / ss) if ss > 0 else 1.0


def scaling_frame(fits: list[LawFit]) -> pd.DataFrame:
    cols = ["x", "y", "law", "alpha", "alpha_ci_low", "alpha_ci_high", "c", "r2", "n_points", "n_trials"]
    return pd.DataFrame([{k: getattr(f, k) for k in cols} for f in fits], columns=cols)
