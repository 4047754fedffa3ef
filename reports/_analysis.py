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
    (`ref` in the minimised space of `objectives.minimized`). Incremental: a new point that the
    front dominates leaves the hypervolume as it was, so the cost grows with the trials times
    the front, not with the trials squared."""
    ok = ok.sort_values("trial")
    pts = objectives.minimized(ok)
    numbers = ok["trial"].to_numpy()
    front = np.zeros((0, pts.shape[1]))
    hv, j, rows = 0.0, 0, []
    for n in sorted(trials["trial"]):
        changed = False
        while j < len(numbers) and numbers[j] <= n:
            p = pts[j]
            j += 1
            if len(front) and ((front <= p).all(axis=1) & (front < p).any(axis=1)).any():
                continue  # dominated: the front and its hypervolume stay
            front = np.vstack([front, p])
            front = front[pareto_mask(front)]
            changed = True
        if changed:
            hv = hypervolume(front, ref)
        rows.append({"trial": int(n), "hypervolume": hv if len(front) else 0.0})
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


# --- coupling: interaction share of val_loss variance on a surrogate ---------------------
COUPLED_ABOVE = 0.05  # a pair is called coupled when its interval starts above this share
PATH_AT = (0.1, 0.9)  # where along param_a (scaled) the best param_b is read for the advice


@dataclass(frozen=True)
class Coupling:
    param_a: str
    param_b: str
    strength: float  # the posterior median of the interaction share
    ci_low: float
    ci_high: float
    n_trials: int
    kind: str = "numeric x numeric"
    # categorical x numeric: per level of the categorical knob, the numeric knob's best value
    # (lowest partial dependence) with a 95% posterior interval: {level: (best, low, high)}
    best_by_level: tuple[tuple[str, float, float, float], ...] = ()
    more_trials: int | None = None  # inconclusive: about how many more trials would likely decide it
    # numeric x numeric: how the best value of param_b moves with param_a: ((a, best b), ...)
    best_path: tuple[tuple[float, float], ...] = ()

    @property
    def decided(self) -> bool:
        return self.ci_low > COUPLED_ABOVE or self.ci_high < COUPLED_ABOVE

    def verdict(self) -> str:
        if self.ci_low > COUPLED_ABOVE:
            return "coupled: tune them together"
        if self.ci_high < COUPLED_ABOVE:
            return "no sign of coupling: they can be tuned one at a time"
        if self.more_trials is None:
            return "inconclusive: the trials cannot decide it yet"
        if self.more_trials > 3 * self.n_trials:  # the same figure as coupling.csv's more_trials
            return (f"inconclusive: its interval is wide; about {self.more_trials} more trials would "
                    "likely be needed to decide it")
        return f"inconclusive: about {self.more_trials} more trials would likely decide it"

    def advice(self) -> str:
        """What a practitioner may do, in one sentence."""
        a, b = self.param_a, self.param_b
        if self.ci_low > COUPLED_ABOVE:
            out = f"Tune {a} and {b} together"
            if self.best_by_level:
                num = b if self.kind == "categorical x numeric" else a
                per = ", ".join(f"{best:.3g} with {a}={lvl}" for lvl, best, _, _ in self.best_by_level)
                out += f": the best {num} is {per}"
            elif len(self.best_path) >= 2:
                (a0, b0), (a1, b1) = self.best_path[0], self.best_path[-1]
                out += f": the best {b} moves from {b0:.3g} at {a}={a0:.3g} to {b1:.3g} at {a}={a1:.3g}"
            return out + "."
        if self.ci_high < COUPLED_ABOVE:
            return (f"Tune {a} and {b} one at a time: their interaction carries under {COUPLED_ABOVE:.0%} of the "
                    f"val_loss variance (95% upper bound {100 * self.ci_high:.1f}%).")
        return f"{a} × {b}: {self.verdict()}."

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


def _unscale(v: np.ndarray, dist: Mapping[str, Any]) -> np.ndarray:
    lo, hi = float(dist["low"]), float(dist["high"])
    if dist.get("log"):
        return np.exp(math.log(lo) + v * (math.log(hi) - math.log(lo)))
    return lo + v * (hi - lo)


def _taken(v: float, dist: Mapping[str, Any]) -> float:
    """A value inside a knob's range as the nearest value the knob can take (its step grid: an int
    knob's whole numbers), for what the report tells a user to set."""
    step = dist.get("step")
    if not step:
        return float(v)
    lo, hi = float(dist["low"]), float(dist["high"])
    return float(min(max(lo + round((float(v) - lo) / float(step)) * float(step), lo), hi))


def more_trials_to_decide(median: float, low: float, high: float, n: int) -> int | None:
    """About how many more trials would put the 95% interval on one side of the coupled line,
    if the interval's width on the log scale (shares are skewed) shrinks as 1/sqrt(trials) around
    the present median: a rough guide, rounded up to 5."""
    floor = 1e-4
    med, lo, hi, line = (math.log(max(v, floor)) for v in (median, low, high, COUPLED_ABOVE))
    gap = abs(med - line)
    if gap <= 1e-9 or n <= 0:
        return None
    half = (med - lo) if med > line else (hi - med)
    need = n * (half / gap) ** 2
    return int(5 * math.ceil(max(need - n, 1.0) / 5))


def fit_surrogate(ok: pd.DataFrame, params: Mapping[str, Mapping[str, Any]],
                  categorical: Mapping[str, Sequence[Any]], *, seed: int = 0, n_hyper: int = 24) -> Any:
    """The fully Bayesian ANOVA GP (common.gp) on the usable trials `ok`; its knobs are
    `params` then `categorical`, in that order."""
    from common.gp import BayesGP

    x, groups = _design(ok, params, categorical)
    y = ok["val_loss"].astype(float).to_numpy()
    sem = trial_sems(ok)
    sem = sem if (sem > 0).any() else None
    names = list(params) + list(categorical)
    # rows that are points of trials' curves (reports.curve_rows) share their trial's seed noise
    cluster = ok[CURVE_TRIAL].to_numpy() if CURVE_TRIAL in ok.columns else None
    gp = BayesGP(x, y, [groups[n] for n in names], categorical=[n in categorical for n in names], sem=sem,
                 n_hyper=n_hyper, seed=seed, cluster=cluster)
    gp.n_trials = len(np.unique(cluster)) if cluster is not None else len(ok)
    return gp


CURVE_TRIAL = "curve_of_trial"  # the column of curve rows naming the trial they come from


def _max_fit() -> int:
    from common.gp import MAX_FIT

    return MAX_FIT


def _refined_argmin(rows: np.ndarray, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (values at a knob's grid `nodes`, scaled, increasing), where the minimum lies: the
    lowest node refined by the vertex of the parabola through it and its two neighbours, and
    whether it lies inside the grid (not on its edge)."""
    j = np.argmin(rows, axis=-1)
    inner = (j > 0) & (j < rows.shape[-1] - 1)
    jj = np.clip(j, 1, rows.shape[-1] - 2)
    take = lambda k: np.take_along_axis(rows, k[..., None], axis=-1)[..., 0]  # noqa: E731
    l, m, r = take(jj - 1), take(jj), take(jj + 1)
    x0, x1, x2 = nodes[jj - 1], nodes[jj], nodes[jj + 1]
    # the vertex of the parabola through (x0, l), (x1, m), (x2, r): x1 - num / (2 den)
    num = (x1 - x0) ** 2 * (m - r) - (x1 - x2) ** 2 * (m - l)
    den = (x1 - x0) * (m - r) - (x1 - x2) * (m - l)
    ok = inner & (den < 0)  # opens upwards (m below both neighbours)
    shift = np.where(ok, -0.5 * num / np.where(ok, den, 1.0), 0.0)
    return nodes[j] + shift, inner


def coupling_min_trials(knobs: int) -> int:
    """Usable trials the coupling analysis needs before it reads anything: 8, or knobs + 3."""
    return max(8, knobs + 3)


def coupling_analysis(
    ok: pd.DataFrame,
    params: Mapping[str, Mapping[str, Any]],
    *,
    categorical: Mapping[str, Sequence[Any]] | None = None,
    n_boot: int = 48,
    seed: int = 0,
    pairs: Sequence[tuple[str, str]] | None = None,
    gp: Any = None,
    level: float = 0.95,
) -> list[Coupling]:
    """For every pair of sampled params (numeric and categorical; or only `pairs`), the share of
    val_loss variance over the search space carried by the pair's pure interaction (its
    second-order functional ANOVA term), on posterior draws of a fully Bayesian orthogonal
    ANOVA GP (common.gp): the median over draws and a 95% posterior interval that carries the
    surrogate's own uncertainty, hyperparameters included; strongest first. `n_boot`:
    hyperparameter draws (8 function draws each). `gp`: a surrogate fitted before (fit_surrogate).
    `level`: of the intervals (--until-decisive looks at 0.99)."""
    categorical = {k: list(v) for k, v in (categorical or {}).items() if len(v) >= 2}
    ok = ok.dropna(subset=["val_loss", *params, *categorical])
    names = list(params) + list(categorical)
    if len(names) < 2 or len(ok) < coupling_min_trials(len(names)):
        return []
    index = {name: i for i, name in enumerate(names)}
    all_pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    if pairs is not None:
        wanted = {frozenset(p) for p in pairs}
        all_pairs = [p for p in all_pairs if frozenset(p) in wanted]
    if not all_pairs:
        return []
    import warnings

    from threadpoolctl import threadpool_limits

    # small matrices: BLAS threads only contend (7x slower on a loaded 2-core machine)
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")
        gp = gp or fit_surrogate(ok, params, categorical, seed=seed, n_hyper=max(4, n_boot))
        draws = gp.draws()
        mean = gp.mean()
    var = {}  # each component's variance over the space, per draw: by the grid's quadrature
    for c, v in draws.items():
        w = gp.component_weights(c)
        var[c] = ((v - (v @ w)[:, None]) ** 2) @ w
    total = sum(var.values())
    total = np.where(total > 0, total, np.nan)
    out = []
    n = len(ok)
    for a, b in all_pairs:
        ia, ib = index[a], index[b]
        shares = np.nan_to_num(var[(ia, ib)] / total)
        tail = 50 * (1 - level)
        med, lo, hi = (float(v) for v in np.percentile(shares, [50, tail, 100 - tail]))
        kinds = ["categorical" if p in categorical else "numeric" for p in (a, b)]
        kind, a_name, b_name = " x ".join(kinds), a, b
        if kinds == ["numeric", "categorical"]:  # the categorical knob first
            a_name, b_name, kind = b, a, "categorical x numeric"
        by_level: tuple[tuple[str, float, float, float], ...] = ()
        path: tuple[tuple[float, float], ...] = ()
        # the partial dependence on the pair: its two main effects and its interaction
        def surface(comp: Mapping[tuple[int, ...], np.ndarray]) -> np.ndarray:
            la, lb = len(gp.grid[ia]), len(gp.grid[ib])
            s = comp[(ia, ib)].reshape(-1, la, lb)
            return s + comp[(ia,)].reshape(-1, la, 1) + comp[(ib,)].reshape(-1, 1, lb)

        if (a in categorical) != (b in categorical):
            surf = surface(draws)  # (draws, levels or grid of a, levels or grid of b)
            if a in categorical:
                cat, num = a, b
            else:
                cat, num, surf = b, a, surf.transpose(0, 2, 1)
            pos, _ = _refined_argmin(surf, gp.grid[index[num]][:, 0])  # (draws, levels)
            rows = []
            for i_level, name in enumerate(categorical[cat]):
                best = np.percentile(pos[:, i_level], [50, 2.5, 97.5])
                rows.append((str(name), *(_taken(float(_unscale(np.array(v), params[num])), params[num])
                                          for v in best)))
            by_level = tuple(rows)
        elif a in params and b in params:
            surf = surface({c: v[None, :] for c, v in mean.items()})[0]
            ga, gb = gp.grid[ia][:, 0], gp.grid[ib][:, 0]
            pos, _ = _refined_argmin(surf[[0, -1]], gb)
            path = tuple((_taken(float(_unscale(np.array(ga[i]), params[a])), params[a]),
                          _taken(float(_unscale(np.array(p), params[b])), params[b]))
                         for i, p in zip((0, -1), pos))
        more = None if (lo > COUPLED_ABOVE or hi < COUPLED_ABOVE) else more_trials_to_decide(med, lo, hi, n)
        out.append(Coupling(a_name, b_name, med, lo, hi, n, kind, by_level, more, path))
    return sorted(out, key=lambda c: -c.strength)


def coupling_frame(couplings: list[Coupling]) -> pd.DataFrame:
    cols = ["param_a", "param_b", "strength", "ci_low", "ci_high", "n_trials", "kind", "verdict", "best_by_level",
            "more_trials"]
    rows = [{**{k: getattr(c, k) for k in cols[:7]}, "verdict": c.verdict().split(":")[0],
             "best_by_level": "; ".join(f"{lvl}={best:.4g} [{lo:.4g}, {hi:.4g}]"
                                        for lvl, best, lo, hi in c.best_by_level),
             "more_trials": c.more_trials} for c in couplings]
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
    params = dict(params or {})
    for name in (x, y):
        if name not in params:
            v = ok[name].astype(float)
            params[name] = {"low": float(v.min()), "high": float(v.max()), "log": True}
    params = {k: v for k, v in params.items() if k in ok.columns}
    cats = {k: list(v) for k, v in (categorical or {}).items() if k in ok.columns and len(v) >= 2}
    ok = ok.dropna(subset=[*params, *cats])
    names = list(params) + list(cats)
    ix, iy = names.index(x), names.index(y)

    def to_log(v: np.ndarray, name: str) -> np.ndarray:
        d = params[name]
        if d.get("log"):
            return math.log(float(d["low"])) + v * (math.log(float(d["high"])) - math.log(float(d["low"])))
        return np.log(np.maximum(_unscale(v, d), 1e-300))

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
    lgx = to_log(gx, x)

    def ystar(comp: Mapping[tuple[int, ...], np.ndarray]) -> np.ndarray:
        """(draws, x grid) the best y (scaled), NaN on the edge of y's range or outside the trials' x."""
        key = (min(ix, iy), max(ix, iy))
        inter = comp[key].reshape(-1, QUAD, QUAD)
        if ix > iy:
            inter = inter.transpose(0, 2, 1)
        surf = inter + comp[(iy,)].reshape(-1, 1, QUAD)  # x's own main effect moves no minimum
        pos, inner = _refined_argmin(surf, gy)
        return np.where(inner & cover[None, :], pos, np.nan)

    def regress(ys: np.ndarray) -> tuple[float, float, float] | None:
        keep = np.isfinite(ys)
        if keep.sum() < LAW_MIN_POINTS:
            return None
        # least squares over x's range: each point weighted by its node's quadrature weight
        ly, w = to_log(ys[keep], y), wx[keep] / wx[keep].sum()
        slope, icpt = np.polyfit(lgx[keep], ly, 1, w=np.sqrt(w))
        resid = ly - (slope * lgx[keep] + icpt)
        ss = float(w @ (ly - w @ ly) ** 2)
        return float(slope), float(icpt), (1 - float(w @ resid**2) / ss) if ss > 0 else 1.0

    central = ystar({c: v[None, :] for c, v in mean.items()})[0]
    fit = regress(central)
    per_draw = [regress(row) for row in ystar(draws)]
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
    icpt = float(np.average(to_log(central[keep], y) - slope * lgx[keep], weights=wx[keep]))
    pts = tuple((float(math.exp(a)), float(math.exp(b))) for a, b in zip(lgx[keep], to_log(central[keep], y)))
    return LawFit(x, y, "power", slope, min(lo, slope), max(hi, slope), float(math.exp(icpt)), fit[2], len(pts),
                  pts, len(ok))


def scaling_frame(fits: list[LawFit]) -> pd.DataFrame:
    cols = ["x", "y", "law", "alpha", "alpha_ci_low", "alpha_ci_high", "c", "r2", "n_points", "n_trials"]
    return pd.DataFrame([{k: getattr(f, k) for k in cols} for f in fits], columns=cols)
