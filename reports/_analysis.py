"""The surrogate over a study's knobs (common.gp on the usable trials) and the coupling
verdicts read from it: each pair's interaction share of val_loss variance, with its interval.
Plain records (pandas frames of trials), never torch."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ._front import trial_sems


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

    @property
    def verdict_key(self) -> str:
        """"coupled", "no sign of coupling" or "inconclusive" (as a boundary's verdict_key, and
        coupling.csv's verdict column)."""
        if self.ci_low > COUPLED_ABOVE:
            return "coupled"
        if self.ci_high < COUPLED_ABOVE:
            return "no sign of coupling"
        return "inconclusive"

    def verdict(self) -> str:
        if self.verdict_key == "coupled":
            return "coupled: tune them together"
        if self.verdict_key == "no sign of coupling":
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
    var = _component_variances(gp, draws)
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
        if (a in categorical) != (b in categorical):
            cat, num = (a, b) if a in categorical else (b, a)
            by_level = _best_by_level(gp, draws, index[cat], index[num], categorical[cat], params[num])
        elif a in params and b in params:
            path = _best_path(gp, mean, ia, ib, params[a], params[b])
        more = None if (lo > COUPLED_ABOVE or hi < COUPLED_ABOVE) else more_trials_to_decide(med, lo, hi, n)
        out.append(Coupling(a_name, b_name, med, lo, hi, n, kind, by_level, more, path))
    return sorted(out, key=lambda c: -c.strength)


def _component_variances(gp: Any, draws: Mapping[tuple[int, ...], np.ndarray]) -> dict[tuple[int, ...], np.ndarray]:
    """Each component's variance over the space, per draw: by the grid's quadrature."""
    var = {}
    for c, v in draws.items():
        w = gp.component_weights(c)
        var[c] = ((v - (v @ w)[:, None]) ** 2) @ w
    return var


def _pair_surface(gp: Any, comp: Mapping[tuple[int, ...], np.ndarray], ia: int, ib: int) -> np.ndarray:
    """The partial dependence on the pair (ia, ib): its two main effects and its interaction,
    (draws, grid of ia, grid of ib)."""
    la, lb = len(gp.grid[ia]), len(gp.grid[ib])
    s = comp[(ia, ib)].reshape(-1, la, lb)
    return s + comp[(ia,)].reshape(-1, la, 1) + comp[(ib,)].reshape(-1, 1, lb)


def _best_by_level(gp: Any, draws: Mapping[tuple[int, ...], np.ndarray], icat: int, inum: int,
                   levels: Sequence[Any], dist: Mapping[str, Any]) -> tuple[tuple[str, float, float, float], ...]:
    """Per level of the categorical knob `icat`, the best value of the numeric knob `inum` (its
    distribution `dist`): the median and 95% interval over the draws."""
    surf = _pair_surface(gp, draws, icat, inum) if icat < inum else \
        _pair_surface(gp, draws, inum, icat).transpose(0, 2, 1)  # (draws, levels, grid of the numeric knob)
    pos, _ = _refined_argmin(surf, gp.grid[inum][:, 0])  # (draws, levels)
    return tuple((str(name), *(_taken(float(_unscale(np.array(v), dist)), dist)
                               for v in np.percentile(pos[:, i], [50, 2.5, 97.5])))
                 for i, name in enumerate(levels))


def _best_path(gp: Any, mean: Mapping[tuple[int, ...], np.ndarray], ia: int, ib: int,
               dist_a: Mapping[str, Any], dist_b: Mapping[str, Any]) -> tuple[tuple[float, float], ...]:
    """Where the best b lies at either end of a's range, on the posterior mean: ((a, best b), ...)."""
    surf = _pair_surface(gp, {c: v[None, :] for c, v in mean.items()}, ia, ib)[0]
    ga, gb = gp.grid[ia][:, 0], gp.grid[ib][:, 0]
    pos, _ = _refined_argmin(surf[[0, -1]], gb)
    return tuple((_taken(float(_unscale(np.array(ga[i]), dist_a)), dist_a),
                  _taken(float(_unscale(np.array(p), dist_b)), dist_b))
                 for i, p in zip((0, -1), pos))


def coupling_frame(couplings: list[Coupling]) -> pd.DataFrame:
    cols = ["param_a", "param_b", "strength", "ci_low", "ci_high", "n_trials", "kind", "verdict", "best_by_level",
            "more_trials"]
    rows = [{**{k: getattr(c, k) for k in cols[:7]}, "verdict": c.verdict_key,
             "best_by_level": "; ".join(f"{lvl}={best:.4g} [{lo:.4g}, {hi:.4g}]"
                                        for lvl, best, lo, hi in c.best_by_level),
             "more_trials": c.more_trials} for c in couplings]
    return pd.DataFrame(rows, columns=cols)
