"""Compute first, draw second: Pareto front, hypervolume, coupling strengths, fitted laws.

Everything here works on plain records (pandas frames of trials), never on torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

OBJECTIVES = ("val_loss", "peak_mem_mb")
FOLK_ALPHAS = (-0.5, 0.5)


# --- Pareto front and hypervolume --------------------------------------------------------
def feasible_complete(trials: pd.DataFrame) -> pd.DataFrame:
    done = trials[trials["state"] == "COMPLETE"]
    if "feasible" in done.columns:
        done = done[done["feasible"].astype(bool)]
    return done.dropna(subset=list(OBJECTIVES))


def pareto_mask(points: np.ndarray) -> np.ndarray:
    """Non-dominated rows of a (n, 2) minimisation problem, by Optuna's own routine."""
    from optuna.study._multi_objective import _is_pareto_front

    if len(points) == 0:
        return np.zeros(0, dtype=bool)
    return _is_pareto_front(np.asarray(points, dtype=float), assume_unique_lexsorted=False)


def reference_point(points: np.ndarray) -> list[float]:
    """The documented reference: per objective, the worst feasible value plus 10% of the
    observed range (or 10% of |worst| when all values are equal, or 1e-9 when that is 0)."""
    worst, best = points.max(axis=0), points.min(axis=0)
    spread = np.where(worst - best > 0, worst - best, np.maximum(np.abs(worst), 1e-8))
    return [float(v) for v in worst + 0.1 * spread]


def hypervolume(points: np.ndarray, ref: Sequence[float]) -> float:
    from optuna._hypervolume import compute_hypervolume

    pts = np.asarray(points, dtype=float)
    pts = pts[(pts < np.asarray(ref)).all(axis=1)]
    if len(pts) == 0:
        return 0.0
    return float(compute_hypervolume(pts[pareto_mask(pts)], np.asarray(ref, dtype=float)))


def hypervolume_history(trials: pd.DataFrame, ref: Sequence[float]) -> pd.DataFrame:
    """Hypervolume of the feasible front after each trial number."""
    ok = feasible_complete(trials).sort_values("trial")
    rows = []
    for n in sorted(trials["trial"]):
        pts = ok[ok["trial"] <= n][list(OBJECTIVES)].to_numpy()
        rows.append({"trial": int(n), "hypervolume": hypervolume(pts, ref) if len(pts) else 0.0})
    return pd.DataFrame(rows, columns=["trial", "hypervolume"])


# --- coupling: interaction share of val_loss variance on a surrogate ---------------------
@dataclass(frozen=True)
class Coupling:
    param_a: str
    param_b: str
    strength: float
    ci_low: float
    ci_high: float
    n_trials: int

    def sentence(self) -> str:
        pct = f"{100 * self.strength:.1f}%"
        ci = f"95% CI {100 * self.ci_low:.1f}–{100 * self.ci_high:.1f}%"
        if self.ci_low > 0.05:
            verdict = "coupled: tune them together"
        elif self.ci_high < 0.05:
            verdict = "no sign of coupling: they can be tuned one at a time"
        else:
            verdict = "inconclusive at this number of trials"
        return (f"{self.param_a} × {self.param_b}: {pct} of the val_loss variance is their interaction "
                f"({ci}, {self.n_trials} trials) — {verdict}.")


def _design(trials: pd.DataFrame, params: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
    """Numeric params scaled to [0, 1] (log-scaled where the distribution is log)."""
    cols = []
    for name, dist in params.items():
        v = trials[name].astype(float).to_numpy()
        lo, hi = float(dist["low"]), float(dist["high"])
        if dist.get("log"):
            v, lo, hi = np.log(v), math.log(lo), math.log(hi)
        cols.append((v - lo) / (hi - lo) if hi > lo else np.zeros_like(v))
    return np.stack(cols, axis=1)


def _surrogate(x: np.ndarray, y: np.ndarray, seed: int) -> Any:
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    kernel = ConstantKernel(1.0, (1e-3, 1e3)) * Matern(
        length_scale=np.full(x.shape[1], 0.5), length_scale_bounds=(0.05, 20.0), nu=2.5
    ) + WhiteKernel(1e-2, (1e-6, 1.0))
    gp = GaussianProcessRegressor(kernel=kernel, normalize_y=True, random_state=seed, n_restarts_optimizer=1)
    return gp.fit(x, y)


def _interaction_shares(model: Any, x: np.ndarray, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
    """Share of Var f(X) carried by the pure pair interaction PD_jk - PD_j - PD_k (centred
    partial dependences evaluated at the trials' own points; Friedman & Popescu's construction,
    normalised by the total variance as a second-order functional ANOVA term)."""
    n, _ = x.shape
    total = float(np.var(model.predict(x)))
    if total <= 0:
        return {p: 0.0 for p in pairs}

    def pd_at(features: tuple[int, ...]) -> np.ndarray:
        grid = np.repeat(x[None, :, :], n, axis=0)  # grid[i] = all points with features of point i
        for f in features:
            grid[:, :, f] = x[:, f][:, None]
        out = model.predict(grid.reshape(n * n, -1)).reshape(n, n).mean(axis=1)
        return out - out.mean()

    single = {f: pd_at((f,)) for f in {f for p in pairs for f in p}}
    return {
        (a, b): float(np.mean((pd_at((a, b)) - single[a] - single[b]) ** 2) / total)
        for a, b in pairs
    }


def coupling_analysis(
    trials: pd.DataFrame,
    params: Mapping[str, Mapping[str, Any]],
    *,
    n_boot: int = 20,
    max_points: int = 80,
    seed: int = 0,
) -> list[Coupling]:
    """For every pair of numeric params, the interaction share of val_loss variance on a GP
    surrogate fitted to the COMPLETE trials, with a bootstrap 95% interval; strongest first."""
    ok = trials[trials["state"] == "COMPLETE"].dropna(subset=["val_loss", *params])
    names = list(params)
    if len(names) < 2 or len(ok) < max(8, len(names) + 3):
        return []
    x, y = _design(ok, params), ok["val_loss"].astype(float).to_numpy()
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a in range(len(names)) for b in range(a + 1, len(names))]
    eval_x = x if len(x) <= max_points else x[rng.choice(len(x), max_points, replace=False)]
    import warnings

    boots: dict[tuple[int, int], list[float]] = {p: [] for p in pairs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GP fits on few trials warn about length-scale bounds
        point = _interaction_shares(_surrogate(x, y, seed), eval_x, pairs)
        for b in range(n_boot):
            idx = rng.integers(0, len(x), len(x))
            shares = _interaction_shares(_surrogate(x[idx], y[idx], seed + b + 1), eval_x, pairs)
            for p in pairs:
                boots[p].append(shares[p])
    out = [
        Coupling(names[a], names[b], point[(a, b)], float(np.percentile(boots[(a, b)], 2.5)),
                 float(np.percentile(boots[(a, b)], 97.5)), len(ok))
        for a, b in pairs
    ]
    return sorted(out, key=lambda c: -c.strength)


def coupling_frame(couplings: list[Coupling]) -> pd.DataFrame:
    cols = ["param_a", "param_b", "strength", "ci_low", "ci_high", "n_trials"]
    return pd.DataFrame([asdict(c) for c in couplings], columns=cols)


# --- fitted laws ------------------------------------------------------------------------
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

    def excludes(self, alpha: float) -> bool:
        return not (self.alpha_ci_low <= alpha <= self.alpha_ci_high)

    def sentence(self) -> str:
        if not math.isfinite(self.alpha):
            return (f"{self.y}*({self.x}) = c·{self.x}^alpha: not enough trials to fit "
                    f"({self.n_points} usable bins, 3 needed).")
        verdicts = []
        for a in FOLK_ALPHAS:
            verdicts.append(f"alpha = {a:+.1f} is {'excluded' if self.excludes(a) else 'not excluded'}")
        return (f"{self.y}*({self.x}) = {self.c:.3g}·{self.x}^{self.alpha:.2f} "
                f"(alpha 95% CI {self.alpha_ci_low:.2f} to {self.alpha_ci_high:.2f}, r² = {self.r2:.2f}, "
                f"{self.n_points} bins): {'; '.join(verdicts)} by the interval.")


def fit_power_law(trials: pd.DataFrame, x: str, y: str, *, bins: int | None = None) -> LawFit:
    """y* = c · x^alpha: in each log-x bin take y of the trial with the lowest val_loss, then
    ordinary least squares in log-log with a t-interval for alpha."""
    from scipy import stats

    ok = feasible_complete(trials)
    ok = ok[(ok[x].astype(float) > 0) & (ok[y].astype(float) > 0)]
    nan = LawFit(x, y, "power", math.nan, math.nan, math.nan, math.nan, math.nan, 0)
    if len(ok) < 3:
        return nan
    lx = np.log(ok[x].astype(float).to_numpy())
    k = bins or int(min(8, max(3, len(ok) // 5)))
    edges = np.linspace(lx.min(), lx.max(), k + 1)
    which = np.clip(np.digitize(lx, edges[1:-1]), 0, k - 1)
    best = []
    for b in range(k):
        members = ok[which == b]
        if len(members):
            row = members.loc[members["val_loss"].astype(float).idxmin()]
            best.append((float(row[x]), float(row[y])))
    if len({p[0] for p in best}) < 3:
        return LawFit(x, y, "power", math.nan, math.nan, math.nan, math.nan, math.nan, len(best))
    bx, by = np.log([p[0] for p in best]), np.log([p[1] for p in best])
    fit = stats.linregress(bx, by)
    dof = len(best) - 2
    half = float(stats.t.ppf(0.975, dof) * fit.stderr) if dof > 0 else math.inf
    return LawFit(
        x, y, "power", float(fit.slope), float(fit.slope - half), float(fit.slope + half),
        float(math.exp(fit.intercept)), float(fit.rvalue**2), len(best), tuple(best),
    )


def scaling_frame(fits: list[LawFit]) -> pd.DataFrame:
    cols = ["x", "y", "law", "alpha", "alpha_ci_low", "alpha_ci_high", "c", "r2", "n_points"]
    return pd.DataFrame([{k: getattr(f, k) for k in cols} for f in fits], columns=cols)
