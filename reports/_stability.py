"""Where training breaks: the stability boundary of the knobs, read from every run that ran.

The loss analyses (`_analysis`) fit the runs that converged; this one reads which runs trained
stably and which did not (diverged, degrading: the built-in health monitor's labels or a
plug-in's `tags: {health: ...}`, and runs the objective stopped as diverging) and asks, per pair
of sampled knobs, whether one knob moves the region where the other trains stably.

The model: a Bayesian logistic regression of P(a run does not converge) on the knobs, each
scaled to [0, 1] of its searched range (log-scaled where the knob is log; categorical knobs one-hot),
with Cauchy(0, 5) priors on the slopes (Gelman et al. 2008's weakly informative prior, scaled to
a unit range) so that a sharp, fully separated boundary still has a proper posterior, drawn by
emcee's affine-invariant ensemble sampler. Its decision boundary is where a knob's stable range
ends: `param`'s ceiling (or floor) is the value where P = 1/2, inside the searched range.

A pair's statistic is how far each knob moves the other's boundary across its own range, in
units of the moved knob's range, averaged over the other knobs: D(A, B) for A's boundary moved
by B, and the pair reads min(|D(A, B)|, |D(B, A)|). A boundary that one knob alone sets is
moved by none (D = 0 one way), and a knob without a boundary has none to move; an oblique
boundary moves both. Verdicts as the loss's: *coupled* when the 95% interval starts above
MOVED_ABOVE (a tenth of the range), *no sign* when it ends below, else *inconclusive*.
docs/reports.md says why this model (benchmarks/stability.py measured it against a bootstrapped
penalised logistic regression).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from common.boundary import kept_columns, posterior_draws
from common.runs import run_labels

from ._analysis import _design, _unscale

MOVED_ABOVE = 0.1  # a boundary moved by more than a tenth of the knob's range is coupled
MIN_RUNS = 10  # below this, or with fewer than MIN_EACH of each kind of run, no verdict
MIN_EACH = 2
LEVEL = 0.95


@dataclass(frozen=True)
class Boundary:
    """One ordered pair: how `by` moves the stable range of `param`."""

    param: str
    by: str
    shift: float  # the pair's statistic (posterior median): min over both directions, in range units
    shift_ci_low: float
    shift_ci_high: float
    ratio: float  # param's boundary at by's high end over its low end (natural units; nan if undefined)
    ratio_ci_low: float
    ratio_ci_high: float
    side: str  # "ceiling" (runs break above it), "floor" (below it), "levels" (categorical param)
    n_runs: int
    n_unstable: int
    # param's boundary at by's ends (numeric by) or levels (categorical by): (label, median, low, high)
    at: tuple[tuple[str, float, float, float], ...] = ()
    param_range: tuple[float, float] = (math.nan, math.nan)
    law: Any = None  # BoundaryLaw where decided and both knobs are numeric with param log-scaled

    @property
    def verdict_key(self) -> str:
        if self.shift_ci_low > MOVED_ABOVE:
            return "coupled"
        if self.shift_ci_high < MOVED_ABOVE:
            return "no sign of coupling"
        return "inconclusive"

    def verdict(self) -> str:
        return {"coupled": "coupled: choose them together (the stable range moves)",
                "no sign of coupling": "no sign of coupling: the stable range does not move",
                "inconclusive": "inconclusive: the runs cannot decide it yet"}[self.verdict_key]

    def advice(self) -> str:
        """One sentence a user acts on."""
        a, b = self.param, self.by
        if self.verdict_key == "no sign of coupling":
            return (f"{b} does not move where {a} trains stably (it moves it by under {MOVED_ABOVE:.0%} of {a}'s "
                    f"range; 95% upper bound {100 * self.shift_ci_high:.0f}%).")
        if self.verdict_key == "inconclusive":
            return (f"Whether {b} moves where {a} trains stably: {self.verdict()} ({self.n_unstable} of {self.n_runs} "
                    f"runs broke; it moves it by {100 * self.shift_ci_low:.0f}-{100 * self.shift_ci_high:.0f}% of the "
                    f"range, 95%, and {MOVED_ABOVE:.0%} is the line: runs near the boundary decide it, which "
                    "--sampler coupling spends every second trial on).")
        if self.side == "levels":
            return f"Choose {a} and {b} together: which {a} levels train stably changes with {b}."
        word = "below" if self.side == "ceiling" else "above"
        top = self.param_range[1] if self.side == "ceiling" else self.param_range[0]
        parts = []
        for label, med, lo, hi in self.at:
            if math.isclose(med, top, rel_tol=1e-6):
                parts.append(f"at {b} {label} it trains over the whole searched range")
            else:
                parts.append(f"at {b} {label} keep {a} {word} {med:.3g} (95%: {lo:.3g}-{hi:.3g})")
        text = f"Choose {a} and {b} together: " + "; ".join(parts)
        if self.law is not None:
            text += f". {self.law.sentence()}"
        return text + "."


@dataclass(frozen=True)
class BoundaryLaw:
    """param* = c * g(by)^beta, g(by) = by (a log-scaled knob) or 1 + by."""

    param: str
    by: str
    beta: float
    beta_ci_low: float
    beta_ci_high: float
    c: float
    plus_one: bool

    def sentence(self) -> str:
        g = f"(1 + {self.by})" if self.plus_one else self.by
        return (f"The boundary's law: {self.param}* = {self.c:.3g} x {g}^{self.beta:.2f} "
                f"(95%: exponent {self.beta_ci_low:.2f} to {self.beta_ci_high:.2f})")


@dataclass
class StabilityResult:
    boundaries: list[Boundary] = field(default_factory=list)
    n_runs: int = 0
    n_unstable: int = 0
    reason: str = ""  # why there is no verdict, when there is none
    draws: np.ndarray | None = None  # the model's weight draws (intercept first)
    groups: dict[str, list[int]] = field(default_factory=dict)  # each knob's feature columns

    def grid(self, x: str, y: str, numeric: Mapping[str, Mapping[str, Any]], n: int = 60
             ) -> dict[str, np.ndarray] | None:
        """For a numeric pair's health plot: over an n x n grid of (x, y), the other knobs at the
        middle of their ranges (categorical ones at their first level), the share of the model's
        draws that put a run there past the boundary: the fitted boundary is its 1/2 contour, the
        95% band its 0.025 and 0.975 contours. None without a fit or for a categorical knob."""
        if self.draws is None or x not in numeric or y not in numeric or x not in self.groups or y not in self.groups:
            return None
        width = self.draws.shape[1] - 1
        u = (np.arange(n) + 0.5) / n
        gx, gy = np.meshgrid(u, u)
        z = np.zeros((n * n, width))
        for name, cols in self.groups.items():
            if name in numeric:
                z[:, cols[0]] = 0.5
        z[:, self.groups[x][0]], z[:, self.groups[y][0]] = gx.ravel(), gy.ravel()
        eta = self.draws[:, :1] + self.draws[:, 1:] @ z.T
        share = (eta > 0).mean(axis=0).reshape(n, n)
        return {"x": _unscale(u, numeric[x]), "y": _unscale(u, numeric[y]), "share": share}


def pair_conclusions(couplings: Sequence[Any], stability: StabilityResult) -> list[dict[str, Any]]:
    """Per pair of knobs, whether they must be chosen together because of the loss (the runs
    that converged), because of the boundary (where runs break), both, or neither; `because` is
    "undecided" while either verdict is open and neither says together."""
    loss = {frozenset((c.param_a, c.param_b)): c for c in couplings}
    bounds: dict[frozenset[str], list[Boundary]] = {}
    for b in stability.boundaries:
        bounds.setdefault(frozenset((b.param, b.by)), []).append(b)
    out = []
    for key in list(dict.fromkeys([*loss, *bounds])):
        c, bs = loss.get(key), bounds.get(key, [])
        lv = c.verdict_key if c else ""
        bv = bs[0].verdict_key if bs else ""
        together = [w for w, v in (("loss", lv), ("boundary", bv)) if v == "coupled"]
        if together:
            because = " and ".join(together)
        elif lv == "no sign of coupling" and bv in ("no sign of coupling", ""):
            because = "neither"
        elif bv == "no sign of coupling" and lv == "":
            because = "neither"
        else:
            because = "undecided"
        a, b = (c.param_a, c.param_b) if c else (bs[0].by, bs[0].param)
        moved = next((x for x in bs if x.side != "levels" and x.verdict_key == "coupled"), bs[0] if bs else None)
        if because == "neither":
            text = f"{a} and {b}: tune one at a time (neither the loss nor where runs break ties them)."
        elif because == "undecided":
            text = f"{a} and {b}: not decided yet (loss: {lv or 'no fit'}; boundary: {bv or 'no fit'})."
        else:
            parts = []
            if "boundary" in together and moved is not None:
                parts.append(moved.advice())
            if "loss" in together:
                parts.append(c.advice())
            text = f"{a} and {b}: choose together because of the {because}. " + " ".join(parts)
        out.append({"param_a": a, "param_b": b, "loss": lv, "boundary": bv, "because": because, "sentence": text})
    rank = {"loss and boundary": 0, "boundary": 1, "loss": 2, "undecided": 3, "neither": 4}
    return sorted(out, key=lambda r: rank[r["because"]])


# --- the runs ------------------------------------------------------------------------------
def stability_runs(trials: pd.DataFrame, replicate_health: Mapping[int, Sequence[str]] | None = None) -> pd.DataFrame:
    """One row per training run that tells whether its config trains stably (`unstable`: run_labels)."""
    rows = []
    replicate_health = replicate_health or {}
    rung = trials["rung"] if "rung" in trials.columns else pd.Series([None] * len(trials), index=trials.index)
    for (_, r), stop in zip(trials.iterrows(), rung):
        labels = run_labels(str(r["state"]), str(r["health"] or "") if "health" in r.index else "",
                            outcome=str(r["outcome"]) if "outcome" in r.index else "ok",
                            at_rung=not (stop is None or pd.isna(stop)),
                            replicates=replicate_health.get(int(r["trial"])) or ())
        rows += [{**r.to_dict(), "unstable": label} for label in labels]
    return pd.DataFrame(rows, columns=[*trials.columns, "unstable"])


# --- the model -----------------------------------------------------------------------------
def _features(runs: pd.DataFrame, numeric: Mapping[str, Mapping[str, Any]],
              categorical: Mapping[str, Sequence[Any]], *, plus_one: str | None = None
              ) -> tuple[np.ndarray, dict[str, list[int]]]:
    """The loss surrogate's design (reports._analysis._design: numeric knobs on [0, 1] of their
    range, log where log; categorical ones one-hot) less each categorical knob's first level;
    `plus_one`: that knob as log(1 + v), so that a straight boundary in it is a power law in 1 + v.
    Returns the design and each knob's columns."""
    if plus_one is not None:
        d = numeric[plus_one]
        runs = runs.assign(**{plus_one: np.log1p(runs[plus_one].astype(float))})
        numeric = {**numeric, plus_one: {"low": math.log1p(float(d["low"])), "high": math.log1p(float(d["high"])),
                                         "log": False}}
    full, groups = _design(runs, numeric, categorical)
    keep = kept_columns(groups, categorical)
    index = {c: i for i, c in enumerate(keep)}
    return full[:, keep], {name: [index[c] for c in cols if c in index] for name, cols in groups.items()}


# --- what the draws say -----------------------------------------------------------------------
def _others(numeric: Mapping[str, Any], categorical: Mapping[str, Sequence[Any]], groups: dict[str, list[int]],
            width: int, skip: Sequence[str], n: int, rng: np.random.Generator) -> np.ndarray:
    """n settings of the knobs not in `skip`: numeric ones on an even grid (shuffled per knob),
    categorical ones cycling through their levels; the skipped knobs' columns 0."""
    z = np.zeros((n, width))
    for name in numeric:
        if name not in skip:
            z[:, groups[name][0]] = rng.permutation((np.arange(n) + 0.5) / n)
    for name, choices in categorical.items():
        if name in skip:
            continue
        level = rng.permutation(np.arange(n) % len(choices))
        for j, col in enumerate(groups[name]):
            z[:, col] = (level == j + 1).astype(float)
    return z


def _set(z: np.ndarray, groups: dict[str, list[int]], name: str, value: Any, categorical: Mapping[str, Sequence[Any]]
         ) -> np.ndarray:
    out = z.copy()
    if name in categorical:
        for j, col in enumerate(groups[name]):
            out[:, col] = float(value == j + 1)
    else:
        out[:, groups[name][0]] = float(value)
    return out


def _position(w: np.ndarray, z: np.ndarray, col: int) -> np.ndarray:
    """(draws x settings) the boundary of the knob in column `col` on [0, 1], at settings z."""
    rest = w[:, :1] + w[:, 1:] @ z.T - w[:, 1 + col][:, None] * z[:, col][None, :]
    slope = w[:, 1 + col][:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        pos = -rest / slope
    return np.clip(np.nan_to_num(pos, nan=0.5, posinf=1.0, neginf=0.0), 0.0, 1.0)


def _levels_stable(w: np.ndarray, z: np.ndarray, groups: dict[str, list[int]], name: str, k: int) -> np.ndarray:
    """(levels x draws x settings) whether each level of a categorical knob trains stably."""
    out = []
    for j in range(k):
        zj = z.copy()
        for i, col in enumerate(groups[name]):
            zj[:, col] = float(j == i + 1)
        out.append((w[:, :1] + w[:, 1:] @ zj.T) < 0)
    return np.array(out)


def _shift(w: np.ndarray, z: np.ndarray, groups: dict[str, list[int]], a: str, b: str,
           numeric: Mapping[str, Any], categorical: Mapping[str, Sequence[Any]]) -> tuple[np.ndarray, np.ndarray]:
    """D(a, b) per draw (signed for numeric a and b), and a's mean boundary per level of b
    (levels x draws; for numeric b its low and high end)."""
    levels = list(range(len(categorical[b]))) if b in categorical else [0.0, 1.0]
    if a in numeric:
        col = groups[a][0]
        pos = np.array([_position(w, _set(z, groups, b, v, categorical), col).mean(axis=1) for v in levels])
        d = pos[-1] - pos[0] if b in numeric else pos.max(axis=0) - pos.min(axis=0)
        return d, pos
    k = len(categorical[a])
    stable = [_levels_stable(w, _set(z, groups, b, v, categorical), groups, a, k) for v in levels]
    flips = np.zeros(w.shape[0])
    for s in stable[1:]:
        flips = np.maximum(flips, (s != stable[0]).mean(axis=(0, 2)))
    return flips, np.zeros((len(levels), w.shape[0]))


def _q(v: np.ndarray, level: float = LEVEL) -> tuple[float, float, float]:
    tail = (1 - level) / 2
    v = v[np.isfinite(v)]
    if not len(v):
        return math.nan, math.nan, math.nan
    return float(np.median(v)), float(np.quantile(v, tail)), float(np.quantile(v, 1 - tail))


def _label(v: Any, d: Mapping[str, Any] | None) -> str:
    if d is None:
        return str(v)
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


def stability_analysis(runs: pd.DataFrame, numeric: Mapping[str, Mapping[str, Any]], *,
                       categorical: Mapping[str, Sequence[Any]] | None = None, seed: int = 0,
                       level: float = LEVEL, settings: int = 24) -> StabilityResult:
    """The stability verdict of every ordered pair of sampled knobs, from `runs` (stability_runs)."""
    categorical = {k: list(v) for k, v in (categorical or {}).items() if len(v) >= 2}
    names = [*numeric, *categorical]
    runs = runs.dropna(subset=names) if names else runs
    n, bad = len(runs), int(runs["unstable"].sum()) if len(runs) else 0
    out = StabilityResult(n_runs=n, n_unstable=bad)
    if len(names) < 2:
        out.reason = "No stability verdict: the study samples fewer than two knobs."
        return out
    if bad < MIN_EACH:
        out.reason = (f"No stability verdict: {bad} of {n} runs did not converge; the boundary shows where runs "
                      "break, and none (or one) did." if n else "No stability verdict: no run finished.")
        return out
    if n - bad < MIN_EACH or n < MIN_RUNS:
        out.reason = (f"No stability verdict yet: {n} runs, {n - bad} converged and {bad} did not; "
                      f"at least {MIN_RUNS} runs with {MIN_EACH} of each are needed.")
        return out
    x, groups = _features(runs, numeric, categorical)
    y = runs["unstable"].astype(float).to_numpy()
    w = posterior_draws(x, y, seed=seed)
    out.draws, out.groups = w, groups
    rng = np.random.default_rng(seed)
    shifts: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    for a in names:
        for b in names:
            if a != b:
                z = _others(numeric, categorical, groups, x.shape[1], (a, b), settings, rng)
                shifts[(a, b)] = _shift(w, z, groups, a, b, numeric, categorical)
    for a in names:
        for b in names:
            if a == b:
                continue
            d_ab, pos = shifts[(a, b)]
            d_ba = shifts[(b, a)][0]
            stat = np.minimum(np.abs(d_ab), np.abs(d_ba))
            med, lo, hi = _q(stat, level)
            side, ratio, at, rng_a = "levels", (math.nan,) * 3, (), (math.nan, math.nan)
            if a in numeric:
                slope = np.median(w[:, 1 + groups[a][0]])
                side = "ceiling" if slope > 0 else "floor"
                nat = _unscale(pos, numeric[a])
                with np.errstate(divide="ignore", invalid="ignore"):  # a range starting at 0: ratio inf or nan
                    r = nat[-1] / nat[0] if b in numeric else nat.max(axis=0) / nat.min(axis=0)
                ratio = _q(r, level)
                ends = ([numeric[b]["low"], numeric[b]["high"]] if b in numeric else categorical[b])
                at = tuple((_label(v, numeric.get(b)), *_q(nat[i], level)) for i, v in enumerate(ends))
                rng_a = (float(numeric[a]["low"]), float(numeric[a]["high"]))
            bnd = Boundary(a, b, med, lo, hi, *ratio, side=side, n_runs=n, n_unstable=bad, at=at, param_range=rng_a)
            if bnd.verdict_key == "coupled" and a in numeric and b in numeric and numeric[a].get("log"):
                bnd = _with_law(bnd, runs, y, numeric, categorical, seed=seed, level=level)
            out.boundaries.append(bnd)
    order = {"coupled": 0, "inconclusive": 1, "no sign of coupling": 2}
    out.boundaries.sort(key=lambda bd: (order[bd.verdict_key], -bd.shift))
    return out


def _with_law(bnd: Boundary, runs: pd.DataFrame, y: np.ndarray, numeric: Mapping[str, Mapping[str, Any]],
              categorical: Mapping[str, Sequence[Any]], *, seed: int, level: float) -> Boundary:
    """The boundary's power law, param* = c g(by)^beta: the same model with `by` as log(by) (a
    log-scaled knob) or log(1 + by) (a knob whose range starts at 0), so that the boundary is a
    straight line in (log param, log g)."""
    from dataclasses import replace

    a, b = bnd.param, bnd.by
    db = numeric[b]
    plus_one = not db.get("log")
    if plus_one and float(db["low"]) < 0:
        return bnd
    x, groups = _features(runs, numeric, categorical, plus_one=b if plus_one else None)
    w = posterior_draws(x, y, seed=seed + 1)
    ca, cb = groups[a][0], groups[b][0]
    la = math.log(float(numeric[a]["high"])) - math.log(float(numeric[a]["low"]))
    g = (np.log1p if plus_one else np.log)(np.array([float(db["low"]), float(db["high"])]))
    lg = float(g[1] - g[0])
    beta = -(w[:, 1 + cb] / w[:, 1 + ca]) * la / lg
    # c: the boundary at g = 1 (by = 0, or by = 1 for a log knob), the other knobs at their middle
    z = np.full(x.shape[1], 0.5)
    for name, cols in groups.items():
        if name in categorical:
            z[cols] = 0.0
    z[cb] = (0.0 - g[0]) / lg
    rest = w[:, 0] + w[:, 1:] @ z - w[:, 1 + ca] * z[ca]
    log_c = math.log(float(numeric[a]["low"])) - rest / w[:, 1 + ca] * la
    med, lo, hi = _q(beta, level)
    return replace(bnd, law=BoundaryLaw(a, b, med, lo, hi, float(np.exp(np.median(log_c))), plus_one))


def stability_frame(result: StabilityResult) -> pd.DataFrame:
    """stability.csv: one row per ordered pair."""
    cols = ["param", "by", "verdict", "ratio", "ratio_ci_low", "ratio_ci_high", "shift", "shift_ci_low",
            "shift_ci_high", "side", "n_runs", "n_unstable", "law_exponent", "law_exponent_ci_low",
            "law_exponent_ci_high", "law_c", "law_of", "advice"]
    rows = []
    for b in result.boundaries:
        law = b.law
        rows.append({
            "param": b.param, "by": b.by, "verdict": b.verdict_key, "ratio": b.ratio, "ratio_ci_low": b.ratio_ci_low,
            "ratio_ci_high": b.ratio_ci_high, "shift": b.shift, "shift_ci_low": b.shift_ci_low,
            "shift_ci_high": b.shift_ci_high, "side": b.side, "n_runs": b.n_runs, "n_unstable": b.n_unstable,
            "law_exponent": law.beta if law else math.nan, "law_exponent_ci_low": law.beta_ci_low if law else math.nan,
            "law_exponent_ci_high": law.beta_ci_high if law else math.nan, "law_c": law.c if law else math.nan,
            "law_of": (f"1 + {law.by}" if law.plus_one else law.by) if law else "", "advice": b.advice()})
    return pd.DataFrame(rows, columns=cols)
