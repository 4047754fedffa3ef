"""Loss phase of a training curve, by stated rules (numpy/scipy only).

Rules, on the last `window` values L of train_loss (all of them when fewer):
- S = moving median of L over 9 steps (diffusion losses are noisy step to step: random t);
- trend: Theil–Sen slope of L against the step, its significance from Kendall's tau (both on
  the raw values, whose noise is independent step to step, so the p-value is honest);
  rel_change = slope * len(L) / median(|L|), the relative change the trend makes over the window;
- noise = 1.4826 * MAD(L - S), the robust per-step noise level;
  oscillation = std(S - the Theil–Sen line) / noise: swings of the smoothed curve measured against
  the per-step noise (about 0.4 for pure noise, well above 1 when the loss bounces over tens of
  steps);
- degrading: p < degrade_p and rel_change > +degrade_rel;
- converging: p < degrade_p and rel_change < -degrade_rel;
- oscillating: otherwise, when oscillation > oscillation_ratio;
- flat: otherwise (no significant trend, noise only: a converged or stalled run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

@dataclass(frozen=True)
class PhaseRules:
    window: int = 60
    smooth: int = 9
    degrade_p: float = 0.01
    degrade_rel: float = 0.05
    oscillation_ratio: float = 1.5


def _moving_median(x: np.ndarray, k: int) -> np.ndarray:
    half = k // 2
    padded = np.pad(x, half, mode="edge")
    return np.array([np.median(padded[i: i + k]) for i in range(len(x))])


def classify_phase(losses: Any, rules: PhaseRules = PhaseRules()) -> tuple[str, dict[str, float]]:
    """(phase, stats) of a loss curve; 'flat' when it is too short to tell."""
    from scipy import stats

    values = np.asarray([v for v in losses if math.isfinite(v)], dtype=float)[-rules.window:]
    if len(values) < max(10, rules.smooth + 2):
        return "flat", {"n": float(len(values))}
    smooth = _moving_median(values, rules.smooth)
    steps = np.arange(len(smooth), dtype=float)
    slope, intercept, _, _ = stats.theilslopes(values, steps)
    tau = stats.kendalltau(steps, values)
    p = float(tau.pvalue) if math.isfinite(tau.pvalue) else 1.0
    level = float(np.median(np.abs(values))) or 1e-12
    rel_change = float(slope * len(values) / level)
    resid = values - smooth
    noise = 1.4826 * float(np.median(np.abs(resid - np.median(resid)))) or 1e-12
    oscillation = float(np.std(smooth - (intercept + slope * steps)) / noise)
    out = {"slope": float(slope), "p_value": p, "rel_change": rel_change, "oscillation": oscillation,
           "n": float(len(values))}
    if p < rules.degrade_p and rel_change > rules.degrade_rel:
        return "degrading", out
    if p < rules.degrade_p and rel_change < -rules.degrade_rel:
        return "converging", out
    if oscillation > rules.oscillation_ratio:
        return "oscillating", out
    return "flat", out
