"""Where the coupling design's small-N verdicts lose to what its trials allow (issue 47, item 1).

The moderate planting (tests/synthetic.py: warm x sigma 12% of the noise-free variance, configs'
spread 2.8x the seed noise) on the coupling design's own trials (`--sampler coupling`, in-process,
one ask/tell loop as the calibration tests run it; a 20-trial study is the first 20 trials of the
30-trial one, as the seeded design is sequential). Each study is read several ways, the trials
held fixed, one suspect changed at a time:

- `csweep`: the analysis as a report runs it (reports.coupling_analysis);
- `midpoints`: its variances over 12 equally weighted midpoints per knob (the quadrature until
  2026-12-07) instead of Gauss-Legendre nodes;
- `long chains`: 12 chains of burn-in 400 instead of 6 of 100 (as many draws);
- `prior at truth`: the pair prior's median (common.gp.LOG_PAIR) at 0.12, the planted share,
  instead of the 5% line;
- `known form`: the planted terms fitted by least squares (benchmarks/oracle_power.py), the
  ceiling of any analysis that must find the form.

Per reading: the planted pair called coupled, called "no sign", and its median estimate.

    python benchmarks/power_gap.py [--studies 20] [--sizes 20,30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

LINE = 0.05


def _midpoints(levels):
    if levels:
        return np.eye(levels), np.full(levels, 1.0 / levels)
    import common.gp as gp

    return ((np.arange(gp.QUAD) + 0.5) / gp.QUAD)[:, None], np.full(gp.QUAD, 1.0 / gp.QUAD)


def reading(name: str, df, seed: int):
    """(lower, upper, median) of the planted pair's share under reading `name`."""
    import common.gp as gp
    from reports import coupling_analysis

    saved = gp.quadrature, gp.LOG_PAIR, gp.BayesGP.__init__.__kwdefaults__.copy()
    try:
        if name == "midpoints":
            gp.quadrature = _midpoints
        elif name == "long chains":
            gp.BayesGP.__init__.__kwdefaults__.update(chains=12, burn=400)
        elif name == "prior at truth":
            gp.LOG_PAIR = (np.log(0.12), gp.LOG_PAIR[1])
        pair = next(c for c in coupling_analysis(df, {k: {"low": 0.0, "high": 1.0} for k in ("warm", "sigma", "lr", "decay")},
                                                 seed=seed)
                    if {c.param_a, c.param_b} == {"warm", "sigma"})
        return pair.ci_low, pair.ci_high, pair.strength
    finally:
        gp.quadrature, gp.LOG_PAIR = saved[0], saved[1]
        gp.BayesGP.__init__.__kwdefaults__.clear()
        gp.BayesGP.__init__.__kwdefaults__.update(saved[2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=20)
    ap.add_argument("--sizes", default="20,30")
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    import optuna

    import synthetic as S
    from oracle_power import _share_interval

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sizes = [int(s) for s in a.sizes.split(",")]
    t0 = time.perf_counter()
    studies = [S.designed_moderate_study(7000 + s, max(sizes)) for s in range(a.studies)]
    print(f"{a.studies} designed studies of {max(sizes)} trials: {time.perf_counter() - t0:.0f} s")
    readings = ["csweep", "midpoints", "long chains", "prior at truth", "known form"]
    print("| trials | reading | coupled | \"no sign\" | median estimate |")
    print("|---|---|---|---|---|")
    for n in sizes:
        for name in readings:
            coupled = nosign = 0
            estimates = []
            for s, full in enumerate(studies):
                df = full.head(n).copy()
                if name == "known form":
                    x = {k: df[k].to_numpy(float) for k in S.UNIT_SPACE}
                    lo, hi = _share_interval(x, df["val_loss"].to_numpy(float), np.random.default_rng(s))
                    est = float("nan")
                else:
                    lo, hi, est = reading(name, df, s)
                coupled += lo > LINE
                nosign += hi < LINE
                estimates.append(est)
            med = statistics.median(estimates) if name != "known form" else float("nan")
            print(f"| {n} | {name} | {coupled}/{a.studies} | {nosign} | {med:.3f} |", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s; the planted share 0.12)")


if __name__ == "__main__":
    main()
