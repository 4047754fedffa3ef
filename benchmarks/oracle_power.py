"""What the trials themselves can show: the moderate planting's verdict under the correctly
specified model, as a ceiling for any calibrated analysis.

The objective is tests/synthetic.py's `moderate_study` (four knobs on [0, 1]; the (warm, sigma)
pair's pure interaction carries 12% of the noise-free variance). Here the analysis *knows* the
objective's form: it fits the planted terms by least squares (intercept, warm, sigma, lr, lr^2,
decay, (warm - .5)(sigma - .5)), draws the coefficients from their sampling distribution (the
noise variance estimated from the residuals) and reads the pair's share of the variance over
the space, uniform on each knob, on each draw. The pair is called coupled when the 2.5% point of
the share is above the 5% line, as csweep's verdict does. No analysis that does not know the
form can do better than this one on the same trials, so where it falls short of 8 of 10 at a
study size, no calibrated surrogate reaches it there either.

Designs: `random` (uniform) and `corners` (each coordinate pushed to its range's ends with
probability 0.7, as the coupling design's candidates are; the design that suits a product term
best), and `extremes`: every knob at its range's ends only (lr also at its middle, for its
curvature), the design that estimates the product term most precisely, which knows the form
(no design that must find the form can use it). Noise levels as benchmarks/verdicts.py's objectives: `quiet` 0.4x, `moderate` 1x, `noisy`
2x of the issue's noise.

    python benchmarks/oracle_power.py [--designs 400] [--sizes 20,30,40,60]
    python benchmarks/oracle_power.py --skip-designs --coupling-design 20 --sizes 30,60

`--coupling-design K` also reads K studies of the coupling design's own trials per cell by the
known-form fit and by csweep's analysis: where the surrogate loses to the ceiling, the design or
the analysis.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import synthetic as S

SNR = {"quiet": 2.8 / 0.4, "moderate": 2.8, "noisy": 2.8 / 2}
PUSH = 0.7
LINE = 0.05


def _design(rng: np.random.Generator, n: int, kind: str) -> dict[str, np.ndarray]:
    x = {k: rng.uniform(0, 1, n) for k in S.UNIT_SPACE}
    if kind == "corners":
        for k, v in list(x.items()):
            push = rng.uniform(0, 1, n) < PUSH
            x[k] = np.where(push, rng.integers(0, 2, n).astype(float), v)
    if kind == "extremes":  # every knob at its range's ends, lr also at its middle (its curvature)
        x = {k: rng.integers(0, 2, n).astype(float) for k in x}
        x["lr"] = rng.integers(0, 3, n) / 2.0
    return x


def _share_interval(x: dict[str, np.ndarray], y: np.ndarray, rng: np.random.Generator,
                    draws: int = 2000) -> tuple[float, float]:
    w, s, lr, d = x["warm"], x["sigma"], x["lr"], x["decay"]
    a = np.column_stack([np.ones_like(w), w, s, lr, lr**2, d, (w - 0.5) * (s - 0.5)])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    dof = len(y) - a.shape[1]
    s2 = float(np.sum((y - a @ coef) ** 2) / dof)
    cov = s2 * np.linalg.pinv(a.T @ a)
    b = rng.multivariate_normal(coef, cov, draws)
    # variances over the unit cube: a linear term b x: b^2/12; b3 lr + b4 lr^2: exact moments of U(0,1)
    v_lr = b[:, 3] ** 2 / 12 + b[:, 4] ** 2 * (1 / 5 - 1 / 9) + 2 * b[:, 3] * b[:, 4] * (1 / 4 - 1 / 6)
    inter = b[:, 6] ** 2 / 144
    total = (b[:, 1] ** 2 + b[:, 2] ** 2 + b[:, 5] ** 2) / 12 + v_lr + inter
    share = inter / total
    return float(np.percentile(share, 2.5)), float(np.percentile(share, 97.5))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--designs", type=int, default=400)
    ap.add_argument("--sizes", default="20,30,40,60")
    ap.add_argument("--coupling-design", type=int, default=0, metavar="STUDIES",
                    help="also read the coupling design's own trials both ways (STUDIES per cell)")
    ap.add_argument("--noises", default="moderate,noisy", help="the noise levels of --coupling-design")
    ap.add_argument("--skip-designs", action="store_true", help="only --coupling-design's table")
    a = ap.parse_args()
    sizes = [int(v) for v in a.sizes.split(",")]
    t0 = time.perf_counter()
    print(f"the planted pair called coupled (2.5% point of its share > {LINE:.0%}) under the correctly "
          f"specified model, {a.designs} seeded studies per cell; in brackets called 'no sign' "
          f"(97.5% point < {LINE:.0%})")
    print("| noise | design | " + " | ".join(f"n={n}" for n in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for noise, snr in ({} if a.skip_designs else SNR).items():
        for kind in ("random", "corners", "extremes"):
            cells = []
            for n in sizes:
                coupled = nosign = 0
                for i in range(a.designs):
                    rng = np.random.default_rng(10_000 * n + i)
                    x = _design(rng, n, kind)
                    y = S.moderate_study(i, n=n, snr=snr, x=x)["val_loss"].to_numpy(float)
                    lo, hi = _share_interval(x, y, rng)
                    coupled += lo > LINE
                    nosign += hi < LINE
                cells.append(f"{coupled / a.designs:.0%} ({nosign / a.designs:.1%})")
            print(f"| {noise} | {kind} | " + " | ".join(cells) + " |", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s; the true share {S.true_share():.0%}, one seed per trial)")
    if a.coupling_design:
        split_the_gap(a.coupling_design, sizes, a.noises.split(","))


def split_the_gap(studies: int, sizes: list[int], noises: list[str]) -> None:
    """The coupling design's own trials (`--sampler coupling`, in-process, as the calibration
    tests run it), each study read twice: by the known-form fit above and by csweep's analysis.
    The first against the corner-pushed row is what the design costs or gains; the second against
    the first is what the surrogate's not knowing the form costs on the same trials."""
    import warnings

    import optuna

    from reports import coupling_analysis

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    t0 = time.perf_counter()
    print(f"\nthe coupling design's trials, {studies} seeded studies per cell: planted pair called coupled "
          "by the known-form fit / by csweep's analysis (in brackets: 'no sign' by csweep's analysis)")
    print("| noise | n | known form | csweep |")
    print("|---|---|---|---|")
    for noise in noises:
        for n in sizes:
            oracle = surrogate = nosign = 0
            for s in range(studies):
                df = S.designed_moderate_study(7000 + s, n, snr=SNR[noise])
                x = {k: df[k].to_numpy(float) for k in S.UNIT_SPACE}
                lo, _ = _share_interval(x, df["val_loss"].to_numpy(float), np.random.default_rng(s))
                oracle += lo > LINE
                pair = next(c for c in coupling_analysis(df, S.UNIT_SPACE, seed=s)
                            if {c.param_a, c.param_b} == {"warm", "sigma"})
                surrogate += pair.verdict_key == "coupled"
                nosign += pair.verdict_key == "no sign of coupling"
            print(f"| {noise} | {n} | {oracle}/{studies} | {surrogate}/{studies} ({nosign}) |", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
