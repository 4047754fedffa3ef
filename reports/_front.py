"""The Pareto front and its hypervolume, and the seed-noise floor: what the trials say as they
are, before any surrogate. Plain records (pandas frames of trials), never torch."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

OBJECTIVES = ("val_loss", "peak_mem_mb")




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
