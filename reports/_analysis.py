"""Compute first, draw second: Pareto front, hypervolume, coupling strengths, fitted laws.

Everything here works on plain records (pandas frames of trials), never on torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

OBJECTIVES = ("val_loss", "peak_mem_mb")
FOLK_ALPHAS = (-0.5, 0.5)


@dataclass(frozen=True)
class Objectives:
    """A study's objectives and their directions (Optuna's metric names and directions):
    val_loss and peak_mem_mb, and fidelity (maximized) when the study was run with it."""

    names: tuple[str, ...] = OBJECTIVES
    directions: tuple[str, ...] = ("minimize", "minimize")

    @classmethod
    def of(cls, study: Any) -> Objectives:
        dirs = tuple(d.name.lower() for d in study.directions)
        names = tuple(study.metric_names or OBJECTIVES[: len(dirs)])
        return cls(names, dirs)

    def minimized(self, frame: pd.DataFrame) -> np.ndarray:
        """The objective columns of `frame` as points of a minimisation problem (the maximized
        ones negated), for the Pareto set and the hypervolume."""
        pts = frame[list(self.names)].to_numpy(dtype=float).reshape(len(frame), len(self.names))
        return pts * self.signs

    @property
    def signs(self) -> np.ndarray:
        return np.array([-1.0 if d == "maximize" else 1.0 for d in self.directions])

    def words(self) -> str:
        """'minimize val_loss, minimize peak_mem_mb, maximize fidelity'"""
        return ", ".join(f"{d} {n}" for n, d in zip(self.names, self.directions))


# --- Pareto front and hypervolume --------------------------------------------------------
# Optuna has no public routine for the Pareto set of plain points nor for a hypervolume: its
# private ones are used under an upper bound on Optuna's version (pyproject), and
# tests/reports/test_optuna_private_api.py fails loudly when they move.
def pareto_mask(points: np.ndarray) -> np.ndarray:
    """Non-dominated rows of a (n, k) minimisation problem, by Optuna's own routine."""
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


def hypervolume_history(trials: pd.DataFrame, ok: pd.DataFrame, ref: Sequence[float],
                        objectives: Objectives = Objectives()) -> pd.DataFrame:
    """Hypervolume of the front of the usable trials `ok` after each trial number of `trials`
    (`ref` in the minimised space of `objectives.minimized`)."""
    ok = ok.sort_values("trial")
    rows = []
    for n in sorted(trials["trial"]):
        pts = objectives.minimized(ok[ok["trial"] <= n])
        rows.append({"trial": int(n), "hypervolume": hypervolume(pts, ref) if len(pts) else 0.0})
    return pd.DataFrame(rows, columns=["trial", "hypervolume"])


# --- seed noise --------------------------------------------------------------------------
@dataclass(frozen=True)
class NoiseFloor:
    """Pooled within-config std of a score (val_loss, fidelity), from the trials' seed
    replicates."""

    std: float | None  # None: not measured (every trial has one seed)
    n_configs: int  # configs with two or more seeds
    dof: int  # degrees of freedom of the pooled estimate
    metric: str = "val_loss"

    def sentence(self, spread: float | None = None) -> str:
        if self.std is None:
            return (f"Seed noise of {self.metric}: not measured (every trial ran one seed); run with --seeds 2 "
                    "or more, or `csweep rerun-front` to re-train the front with fresh seeds.")
        m = self.metric
        out = (f"Seed noise floor: {m} std {self.std:.3g} within a config (pooled over {self.n_configs} "
               f"configs, {self.dof} degrees of freedom).")
        if spread is not None and self.std > 0:
            out += (f" The configs' {m} spreads {spread:.3g} (std across trials), "
                    f"{spread / self.std:.1f}x the seed noise.")
            if spread < self.std:
                more = " or more sample images per trial (--samples N)" if m == "fidelity" else ""
                out += (f" Its differences between configs are within seed noise: do not rank configs by "
                        f"{m} alone; more seeds per config (--seeds K){more} narrow it.")
        return out


def noise_floor(ok: pd.DataFrame, metric: str = "val_loss") -> NoiseFloor:
    std_col = f"{metric}_std"
    if "n_seeds" not in ok.columns or std_col not in ok.columns:
        return NoiseFloor(None, 0, 0, metric)
    n = ok["n_seeds"].fillna(1).astype(int).to_numpy()
    s = ok[std_col].astype(float).to_numpy()
    use = (n >= 2) & np.isfinite(s)
    if not use.any():
        return NoiseFloor(None, 0, 0, metric)
    dof = int((n[use] - 1).sum())
    return NoiseFloor(float(math.sqrt(((n[use] - 1) * s[use] ** 2).sum() / dof)), int(use.sum()), dof, metric)


def trial_sems(ok: pd.DataFrame, floor: NoiseFloor | None = None, metric: str = "val_loss") -> np.ndarray:
    """Standard error of each trial's score (val_loss, fidelity): its own replicates' where it
    has them, else the noise floor over sqrt(its seeds), else 0 (not measured)."""
    floor = floor or noise_floor(ok, metric)
    n = ok["n_seeds"].fillna(1).astype(float).to_numpy() if "n_seeds" in ok.columns else np.ones(len(ok))
    sem_col = f"{metric}_sem"
    own = ok[sem_col].astype(float).to_numpy() if sem_col in ok.columns else np.full(len(ok), np.nan)
    fallback = (floor.std or 0.0) / np.sqrt(np.maximum(n, 1))
    return np.where(np.isfinite(own), own, fallback)


def front_probability(ok: pd.DataFrame, trials: Sequence[int], *, objectives: Objectives = Objectives(),
                      floors: Mapping[str, NoiseFloor] | None = None, draws: int = 1000,
                      seed: int = 0) -> list[float]:
    """Per trial in `trials`, the probability that it is non-dominated among the usable trials
    `ok` when each trial's val_loss (and fidelity, when it is an objective) is drawn from
    N(its mean, its sem^2) (Monte Carlo); peak memory is measured, not noisy. `floors`: the
    noise floor per score for trials without replicates of their own [pooled over `ok`]."""
    if not len(trials):
        return []
    pts = objectives.minimized(ok)
    sems = {j: trial_sems(ok, (floors or {}).get(name), metric=name)
            for j, name in enumerate(objectives.names) if name != "peak_mem_mb"}
    index = {int(t): i for i, t in enumerate(ok["trial"])}
    rows = [index[int(t)] for t in trials]
    if not any((s > 0).any() for s in sems.values()):
        return [float(pareto_mask(pts)[r]) for r in rows]
    rng = np.random.default_rng(seed)
    hits = np.zeros(len(rows))
    for _ in range(draws):
        drawn = pts.copy()
        for j, s in sems.items():
            drawn[:, j] += rng.normal(0.0, 1.0, len(pts)) * s
        hits += pareto_mask(drawn)[rows]
    return [float(h / draws) for h in hits]


# --- the surrogate: a GP over numeric and categorical params --------------------------------
def _design(ok: pd.DataFrame, params: Mapping[str, Mapping[str, Any]],
            categorical: Mapping[str, Sequence[Any]]) -> tuple[np.ndarray, dict[str, list[int]]]:
    """Numeric params scaled to [0, 1] (log-scaled where the distribution is log), categorical
    ones one-hot; returns the design and each param's columns."""
    cols, groups = [], {}
    for name, dist in params.items():
        v = ok[name].astype(float).to_numpy()
        lo, hi = float(dist["low"]), float(dist["high"])
        if dist.get("log"):
            v, lo, hi = np.log(v), math.log(lo), math.log(hi)
        groups[name] = [len(cols)]
        cols.append((v - lo) / (hi - lo) if hi > lo else np.zeros_like(v))
    for name, choices in categorical.items():
        groups[name] = []
        values = ok[name].astype(str).to_numpy()
        for c in choices:
            groups[name].append(len(cols))
            cols.append((values == str(c)).astype(float))
    return np.stack(cols, axis=1), groups


def _surrogate(x: np.ndarray, y: np.ndarray, seed: int, *, sem: np.ndarray | None = None,
               kernel: Any = None) -> Any:
    """Matérn 5/2 GP with a noise term. Where the seed noise is measured it enters per trial
    (sem^2 on the diagonal); the white-noise term takes the rest. With `kernel` given (fitted
    before), its hyperparameters are kept (bootstrap refits)."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    scale = float(np.std(y)) or 1.0
    alpha = 1e-10 if sem is None else np.maximum((np.asarray(sem) / scale) ** 2, 1e-10)
    if kernel is None:
        kernel = ConstantKernel(1.0, (1e-3, 1e3)) * Matern(
            length_scale=np.full(x.shape[1], 0.5), length_scale_bounds=(0.05, 20.0), nu=2.5
        ) + WhiteKernel(1e-2, (1e-6, 1.0))
        gp = GaussianProcessRegressor(kernel=kernel, alpha=alpha, normalize_y=True, random_state=seed,
                                      n_restarts_optimizer=1)
    else:
        gp = GaussianProcessRegressor(kernel=kernel, alpha=alpha, normalize_y=True, optimizer=None)
    return gp.fit(x, y)


def _pd_grid(model: Any, ref: np.ndarray, settings: np.ndarray, cols: list[int]) -> np.ndarray:
    """Partial dependence: for each row of `settings` (values of columns `cols`), the model's
    mean over the reference points with those columns set."""
    m = len(ref)
    grid = np.repeat(ref[None, :, :], len(settings), axis=0)
    grid[:, :, cols] = settings[:, None, :]
    return model.predict(grid.reshape(len(settings) * m, -1)).reshape(len(settings), m).mean(axis=1)


# --- coupling: interaction share of val_loss variance on a surrogate ---------------------
@dataclass(frozen=True)
class Coupling:
    param_a: str
    param_b: str
    strength: float
    ci_low: float
    ci_high: float
    n_trials: int
    kind: str = "numeric x numeric"
    # categorical x numeric: per level of the categorical knob, the numeric knob's best value
    # (lowest partial dependence) with a 95% bootstrap interval: {level: (best, low, high)}
    best_by_level: tuple[tuple[str, float, float, float], ...] = ()

    def verdict(self) -> str:
        if self.ci_low > COUPLED_ABOVE:
            return "coupled: tune them together"
        if self.ci_high < COUPLED_ABOVE:
            return "no sign of coupling: they can be tuned one at a time"
        return "inconclusive at this number of trials"

    def sentence(self) -> str:
        pct = f"{100 * self.strength:.1f}%"
        ci = f"95% CI {100 * self.ci_low:.1f}–{100 * self.ci_high:.1f}%"
        out = (f"{self.param_a} × {self.param_b}: {pct} of the val_loss variance is their interaction "
               f"({ci}, {self.n_trials} trials) — {self.verdict()}.")
        if self.best_by_level:
            cat, num = (self.param_a, self.param_b) if self.kind.startswith("categorical x numeric") else (
                self.param_b, self.param_a)
            per = "; ".join(f"{lvl}: {best:.3g} [{lo:.3g}, {hi:.3g}]" for lvl, best, lo, hi in self.best_by_level)
            out += f" Best {num} per {cat} (95% CI): {per}."
        return out


COUPLED_ABOVE = 0.05  # a pair is called coupled when its interval starts above this share


def _unscale(v: np.ndarray, dist: Mapping[str, Any]) -> np.ndarray:
    lo, hi = float(dist["low"]), float(dist["high"])
    if dist.get("log"):
        return np.exp(math.log(lo) + v * (math.log(hi) - math.log(lo)))
    return lo + v * (hi - lo)


def _pair_effects(model: Any, ref: np.ndarray, groups: dict[str, list[int]], names: list[str],
                  pairs: list[tuple[int, int]], n_levels: dict[str, int], grid: np.ndarray) -> tuple[
                      dict[tuple[int, int], float], dict[tuple[int, int], list[float]]]:
    """Share of Var f(X) carried by each pair's pure interaction PD_ab - PD_a - PD_b (centred
    partial dependences at the reference points; Friedman & Popescu's construction, normalised
    by the total variance as a second-order functional ANOVA term), and for categorical x
    numeric pairs the numeric value (on `grid`, scaled) that minimises PD_ab per level."""
    total = float(np.var(model.predict(ref)))

    def pd_at(params: tuple[str, ...]) -> np.ndarray:
        cols = [c for p in params for c in groups[p]]
        out = _pd_grid(model, ref, ref[:, cols], cols)
        return out - out.mean()

    used = {names[f] for p in pairs for f in p}
    single = {p: pd_at((p,)) for p in used}
    shares, best = {}, {}
    for a, b in pairs:
        pa, pb = names[a], names[b]
        joint = pd_at((pa, pb))
        shares[(a, b)] = float(np.mean((joint - single[pa] - single[pb]) ** 2) / total) if total > 0 else 0.0
        if (pa in n_levels) != (pb in n_levels):
            cat, num = (pa, pb) if pa in n_levels else (pb, pa)
            cols = groups[cat] + groups[num]
            rows = []
            for level in range(n_levels[cat]):
                onehot = np.zeros((len(grid), len(groups[cat])))
                onehot[:, level] = 1.0
                rows.append(float(grid[np.argmin(_pd_grid(model, ref, np.column_stack([onehot, grid]), cols))]))
            best[(a, b)] = rows
    return shares, best


def coupling_analysis(
    ok: pd.DataFrame,
    params: Mapping[str, Mapping[str, Any]],
    *,
    categorical: Mapping[str, Sequence[Any]] | None = None,
    n_boot: int = 20,
    max_points: int = 60,
    seed: int = 0,
) -> list[Coupling]:
    """For every pair of sampled params (numeric and categorical), the interaction share of
    val_loss variance on a GP surrogate fitted to the usable trials `ok`, with a 95% bootstrap
    interval (the surrogate refitted to resampled trials); strongest first."""
    categorical = {k: list(v) for k, v in (categorical or {}).items() if len(v) >= 2}
    ok = ok.dropna(subset=["val_loss", *params, *categorical])
    names = list(params) + list(categorical)
    if len(names) < 2 or len(ok) < max(8, len(names) + 3):
        return []
    x, groups = _design(ok, params, categorical)
    y = ok["val_loss"].astype(float).to_numpy()
    sem = trial_sems(ok)
    sem = sem if (sem > 0).any() else None
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a in range(len(names)) for b in range(a + 1, len(names))]
    ref = x if len(x) <= max_points else x[rng.choice(len(x), max_points, replace=False)]
    n_levels = {k: len(v) for k, v in categorical.items()}
    grid = np.linspace(0.0, 1.0, 21)
    import warnings

    boots: dict[tuple[int, int], list[float]] = {p: [] for p in pairs}
    best_boots: dict[tuple[int, int], list[list[float]]] = {}
    from threadpoolctl import threadpool_limits

    # small matrices: BLAS threads only contend (7x slower on a loaded 2-core machine)
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")  # GP fits on few trials warn about length-scale bounds
        fitted = _surrogate(x, y, seed, sem=sem)
        point, best = _pair_effects(fitted, ref, groups, names, pairs, n_levels, grid)
        for b in range(n_boot):
            # trials resampled, the surrogate refitted with the fitted kernel's hyperparameters,
            # and the points the partial dependences average over drawn from the resample
            idx = rng.integers(0, len(x), len(x))
            model = _surrogate(x[idx], y[idx], seed, sem=None if sem is None else sem[idx], kernel=fitted.kernel_)
            bref = x[idx] if len(idx) <= max_points else x[rng.choice(idx, max_points, replace=False)]
            shares, bests = _pair_effects(model, bref, groups, names, pairs, n_levels, grid)
            for p in pairs:
                boots[p].append(shares[p])
            for p, v in bests.items():
                best_boots.setdefault(p, []).append(v)
    out = []
    for a, b in pairs:
        kinds = ["categorical" if names[i] in categorical else "numeric" for i in (a, b)]
        by_level: tuple[tuple[str, float, float, float], ...] = ()
        if (a, b) in best:
            cat, num = (names[a], names[b]) if kinds[0] == "categorical" else (names[b], names[a])
            draws = np.array(best_boots.get((a, b), [best[(a, b)]]))
            by_level = tuple(
                (str(level), float(_unscale(np.array(best[(a, b)][i]), params[num])),
                 float(_unscale(np.percentile(draws[:, i], 2.5), params[num])),
                 float(_unscale(np.percentile(draws[:, i], 97.5), params[num])))
                for i, level in enumerate(categorical[cat]))
        kind = " x ".join(kinds)
        a_name, b_name = names[a], names[b]
        if kinds == ["numeric", "categorical"]:  # the categorical knob first
            a_name, b_name, kind = b_name, a_name, "categorical x numeric"
        out.append(Coupling(a_name, b_name, point[(a, b)], float(np.percentile(boots[(a, b)], 2.5)),
                            float(np.percentile(boots[(a, b)], 97.5)), len(ok), kind, by_level))
    return sorted(out, key=lambda c: -c.strength)


def coupling_frame(couplings: list[Coupling]) -> pd.DataFrame:
    cols = ["param_a", "param_b", "strength", "ci_low", "ci_high", "n_trials", "kind", "verdict", "best_by_level"]
    rows = [{**{k: getattr(c, k) for k in cols[:7]}, "verdict": c.verdict().split(":")[0],
             "best_by_level": "; ".join(f"{lvl}={best:.4g} [{lo:.4g}, {hi:.4g}]"
                                        for lvl, best, lo, hi in c.best_by_level)} for c in couplings]
    return pd.DataFrame(rows, columns=cols)


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
    n_trials: int = 0
    note: str = ""  # why there is no fit

    def excludes(self, alpha: float) -> bool:
        return not (self.alpha_ci_low <= alpha <= self.alpha_ci_high)

    def sentence(self) -> str:
        if not math.isfinite(self.alpha):
            return f"{self.y}*({self.x}) = c·{self.x}^alpha: no fit — {self.note or 'not enough usable trials'}."
        verdicts = []
        for a in FOLK_ALPHAS:
            verdicts.append(f"alpha = {a:+.1f} is {'excluded' if self.excludes(a) else 'not excluded'}")
        return (f"{self.y}*({self.x}) = {self.c:.3g}·{self.x}^{self.alpha:.2f} "
                f"(alpha 95% CI {self.alpha_ci_low:.2f} to {self.alpha_ci_high:.2f}, r² = {self.r2:.2f}, "
                f"from {self.n_trials} trials): {'; '.join(verdicts)} by the interval.")


LAW_MIN_TRIALS = 10


def _law_points(model: Any, ref: np.ndarray, ix: int, iy: int, gx: np.ndarray, gy: np.ndarray) -> np.ndarray:
    """y*(x) on the surrogate: for each x in gx (scaled), the y in gy minimising the partial
    dependence of val_loss on (x, y), refined by a parabola through the grid minimum; NaN where
    the minimum lies on the edge of the range."""
    settings = np.array([(a, b) for a in gx for b in gy])
    pd_ = _pd_grid(model, ref, settings, [ix, iy]).reshape(len(gx), len(gy))
    out = np.full(len(gx), np.nan)
    step = gy[1] - gy[0]
    for i, row in enumerate(pd_):
        j = int(np.argmin(row))
        if 0 < j < len(gy) - 1:
            l, m, r = row[j - 1], row[j], row[j + 1]
            denom = l - 2 * m + r
            out[i] = gy[j] + (0.5 * step * (l - r) / denom if denom > 0 else 0.0)
    return out


def fit_power_law(ok: pd.DataFrame, x: str, y: str, *, params: Mapping[str, Mapping[str, Any]] | None = None,
                  categorical: Mapping[str, Sequence[Any]] | None = None, n_boot: int = 30,
                  max_points: int = 30, seed: int = 0) -> LawFit:
    """y* = c · x^alpha, where y*(x) is the y that minimises val_loss at x: read off a GP
    surrogate of all usable trials (the partial dependence of val_loss on x and y, the other
    params averaged out) on a grid of x, then least squares in log-log. The 95% interval of
    alpha comes from a bootstrap of the whole fit: trials resampled, surrogate refitted (its
    kernel's hyperparameters kept), y*(x) read off again, regression redone."""
    ok = ok.dropna(subset=["val_loss", x, y])
    ok = ok[(ok[x].astype(float) > 0) & (ok[y].astype(float) > 0)]
    nan = LawFit(x, y, "power", math.nan, math.nan, math.nan, math.nan, math.nan, 0, n_trials=len(ok),
                 note=f"{len(ok)} usable trials, {LAW_MIN_TRIALS} needed")
    if len(ok) < LAW_MIN_TRIALS:
        return nan
    params = dict(params or {})
    for name in (x, y):
        if name not in params:
            v = ok[name].astype(float)
            params[name] = {"low": float(v.min()), "high": float(v.max()), "log": True}
    params = {k: v for k, v in params.items() if k in ok.columns}
    cats = {k: list(v) for k, v in (categorical or {}).items() if k in ok.columns and len(v) >= 2}
    ok = ok.dropna(subset=[*params, *cats])
    design, groups = _design(ok, params, cats)
    ix, iy = groups[x][0], groups[y][0]
    vals = ok["val_loss"].astype(float).to_numpy()
    sem = trial_sems(ok)
    sem = sem if (sem > 0).any() else None
    rng = np.random.default_rng(seed)
    ref = design if len(design) <= max_points else design[rng.choice(len(design), max_points, replace=False)]
    gx = np.linspace(design[:, ix].min(), design[:, ix].max(), 10)
    gy = np.linspace(0.0, 1.0, 33)

    def to_log(v: np.ndarray, name: str) -> np.ndarray:
        d = params[name]
        if d.get("log"):
            return math.log(float(d["low"])) + v * (math.log(float(d["high"])) - math.log(float(d["low"])))
        return np.log(_unscale(v, d))

    lgx = to_log(gx, x)

    def regress(ystar: np.ndarray) -> tuple[float, float, float] | None:
        keep = np.isfinite(ystar)
        if keep.sum() < 3:
            return None
        ly = to_log(ystar[keep], y)
        slope, icpt = np.polyfit(lgx[keep], ly, 1)
        resid = ly - (slope * lgx[keep] + icpt)
        ss = float(np.sum((ly - ly.mean()) ** 2))
        return float(slope), float(icpt), (1 - float(np.sum(resid**2)) / ss) if ss > 0 else 1.0

    import warnings

    from threadpoolctl import threadpool_limits

    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")
        model = _surrogate(design, vals, seed, sem=sem)
        ystar = _law_points(model, ref, ix, iy, gx, gy)
        fit = regress(ystar)
        if fit is None:
            return replace(nan, note=f"the best {y} lies on the edge of its range at most values of {x} "
                                     f"({len(ok)} usable trials): widen the range of {y}")
        alphas = []
        for b in range(n_boot):
            idx = rng.integers(0, len(design), len(design))
            boot = _surrogate(design[idx], vals[idx], seed, sem=None if sem is None else sem[idx],
                              kernel=model.kernel_)
            # the other params' values averaged over are data too: drawn from the resample
            bref = design[idx] if len(idx) <= max_points else design[rng.choice(idx, max_points, replace=False)]
            got = regress(_law_points(boot, bref, ix, iy, gx, gy))
            if got is not None:
                alphas.append(got[0])
    slope, icpt, r2 = fit
    lo, hi = -math.inf, math.inf
    if len(alphas) >= 5:
        # the wider of the percentile interval and the normal one (point ± 1.96 bootstrap sd): the
        # refits keep the kernel's hyperparameters, whose own uncertainty is not resampled
        sd = float(np.std(alphas, ddof=1))
        lo = min(float(np.percentile(alphas, 2.5)), slope - 1.96 * sd)
        hi = max(float(np.percentile(alphas, 97.5)), slope + 1.96 * sd)
    keep = np.isfinite(ystar)
    pts = tuple((float(math.exp(a)), float(math.exp(b))) for a, b in zip(lgx[keep], to_log(ystar[keep], y)))
    return LawFit(x, y, "power", slope, min(lo, slope), max(hi, slope), float(math.exp(icpt)), r2, len(pts),
                  pts, len(ok))


def scaling_frame(fits: list[LawFit]) -> pd.DataFrame:
    cols = ["x", "y", "law", "alpha", "alpha_ci_low", "alpha_ci_high", "c", "r2", "n_points", "n_trials"]
    return pd.DataFrame([{k: getattr(f, k) for k in cols} for f in fits], columns=cols)
