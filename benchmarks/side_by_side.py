"""csweep's coupling verdicts side by side with Ax/BoTorch's second-order Sobol indices and SALib's
Saltelli estimator, on the same designs of test functions whose second-order indices are known.

Functions (the sensitivity-analysis literature's, and csweep's own planting):
- Ishigami (a=7, b=0.1) on [-pi, pi]^3: S13 = 0.2437, S12 = S23 = 0 (noise-free);
- Sobol' G with a = (0, 1, 4.5) on [0, 1]^3: S_ij = V_i V_j / V (S12 = 0.060, S13 = 0.008,
  S23 = 0.002; noise-free);
- the moderate planting (tests/synthetic.py): four knobs on [0, 1], warm x sigma carries 12% of
  the noise-free variance, every other pair none, seed noise at 1/2.8 of the configs' spread.

Each (function, trials, seed) is one seeded random design. csweep reads it through
reports.coupling_analysis, as a report does; Ax through `SobolSensitivityGPSampling` on a BoTorch
GP fitted to the same trials (a standard `SingleTaskGP`, method `ax`, and the fully Bayesian SAAS
GP fitted by NUTS, method `ax-saas`), its interval the mean +- 1.96 sd over GP samples; SALib by Saltelli's
sampling at its own points (N (2k + 2) evaluations), its interval S2 +- S2_conf. Each method's
interval is read by csweep's rule: coupled when it starts above 5% of the variance, no sign when it
ends below, inconclusive otherwise. A pair is scored against its known index: "coupled" is right
where the index is above 5%, "no sign" where it is below.

    pip install -e '.[bench]'
    python benchmarks/side_by_side.py                          # 10 seeds, 20/30/60/100 trials
    python benchmarks/side_by_side.py --seeds 3 --sizes 30 --functions ishigami,moderate --methods ax-saas
    python benchmarks/side_by_side.py --methods csweep,salib --salib-n 256,1024,4096

Prints per method and function: the pair verdicts right / inconclusive / wrong, the planted pairs
called "no sign", the zero pairs called "coupled", and how often the interval covers the truth.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

LINE = 0.05  # csweep's coupled line (reports._analysis.COUPLED_ABOVE)
SAAS_MC = 128  # Monte Carlo points for the SAAS GP's indices (see by_ax)


@dataclass(frozen=True)
class TestFunction:
    name: str
    knobs: tuple[str, ...]
    low: float
    high: float
    truth: dict[tuple[int, int], float]  # second-order index per pair (knob indices)
    f: Callable[[np.ndarray, np.random.Generator], np.ndarray]  # rows in [low, high]^k -> values


def _ishigami(x: np.ndarray, _rng: np.random.Generator) -> np.ndarray:
    from synthetic import ishigami

    return ishigami(x[:, 0], x[:, 1], x[:, 2])


def _g(x: np.ndarray, _rng: np.random.Generator) -> np.ndarray:
    from synthetic import g_function

    return g_function(x[:, 0], x[:, 1], x[:, 2])


MODERATE = ("warm", "sigma", "lr", "decay")


def _moderate(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The moderate planting's values at `x`, its seed noise drawn from `rng`."""
    from synthetic import moderate_study

    df = moderate_study(int(rng.integers(2**31)), n=len(x), x={k: x[:, i] for i, k in enumerate(MODERATE)})
    return df["val_loss"].to_numpy()


def functions() -> dict[str, TestFunction]:
    from synthetic import ISHIGAMI_RANGE, ISHIGAMI_S2, g_exact

    return {
        "ishigami": TestFunction("ishigami", ("x1", "x2", "x3"), *ISHIGAMI_RANGE, ISHIGAMI_S2, _ishigami),
        "g": TestFunction("g", ("x1", "x2", "x3"), 0.0, 1.0, g_exact(), _g),
        "moderate": TestFunction("moderate", MODERATE, 0.0, 1.0,
                                 {p: (0.12 if p == (0, 1) else 0.0) for p in itertools.combinations(range(4), 2)},
                                 _moderate),
    }


@dataclass(frozen=True)
class Interval:
    pair: tuple[int, int]
    estimate: float
    low: float
    high: float


def design(fn: TestFunction, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded random design on [0, 1]^k and the function's values there."""
    rng = np.random.default_rng(seed)
    u = rng.random((n, len(fn.knobs)))
    return u, fn.f(fn.low + (fn.high - fn.low) * u, rng)


# --- the methods ---------------------------------------------------------------------------
def by_csweep(fn: TestFunction, u: np.ndarray, y: np.ndarray, seed: int) -> list[Interval]:
    from reports import coupling_analysis

    df = pd.DataFrame({k: u[:, i] for i, k in enumerate(fn.knobs)} | {"val_loss": y})
    out = coupling_analysis(df, {k: {"low": 0.0, "high": 1.0} for k in fn.knobs}, seed=seed)
    index = {k: i for i, k in enumerate(fn.knobs)}
    return [Interval(tuple(sorted((index[c.param_a], index[c.param_b]))), c.strength, c.ci_low, c.ci_high)
            for c in out]


def by_ax(fn: TestFunction, u: np.ndarray, y: np.ndarray, seed: int, *, saas: bool = False,
          gp_samples: int = 64, mc_samples: int = 512) -> list[Interval]:
    """Ax's Sobol indices on GP samples (ax.utils.sensitivity.sobol_measures), on a BoTorch GP of
    the trials: the standard SingleTaskGP (type-II maximum likelihood), or the SAAS GP by NUTS.
    Its GP samples are joint over mc_samples (k + 2) points: at 2048 a study took 40 s here."""
    import torch
    from ax.utils.sensitivity.sobol_measures import SobolSensitivityGPSampling
    from botorch.models.transforms import Standardize

    torch.manual_seed(seed)
    x = torch.tensor(u, dtype=torch.double)
    yy = torch.tensor(y, dtype=torch.double)[:, None]
    if saas:
        from botorch.fit import fit_fully_bayesian_model_nuts
        from botorch.models.fully_bayesian import SaasFullyBayesianSingleTaskGP

        model = SaasFullyBayesianSingleTaskGP(x, yy, outcome_transform=Standardize(m=1))
        fit_fully_bayesian_model_nuts(model, warmup_steps=128, num_samples=64, thinning=4, disable_progbar=True)
        # its GP samples are joint per MCMC draw (16 of them): at 512 points the process ran out of
        # 24 GB here; at 128 a study took 22 s
        mc_samples = min(mc_samples, SAAS_MC)
    else:
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskGP
        from gpytorch.mlls import ExactMarginalLogLikelihood

        model = SingleTaskGP(x, yy, outcome_transform=Standardize(m=1))
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    k = len(fn.knobs)
    bounds = torch.stack([torch.zeros(k, dtype=torch.double), torch.ones(k, dtype=torch.double)])
    sens = SobolSensitivityGPSampling(model, bounds=bounds, num_gp_samples=gp_samples,
                                      num_mc_samples=mc_samples, second_order=True)
    sens.first_order_indices()  # the second-order indices are read off the first-order ones
    rows = sens.second_order_indices().detach().numpy()  # per pair: mean, var over GP samples, stderr
    mean, sd = rows[:, 0], np.sqrt(np.clip(rows[:, 1], 0.0, None))
    pairs = list(itertools.combinations(range(k), 2))  # Ax's order of the pairs
    return [Interval(p, float(m), float(m - 1.96 * s), float(m + 1.96 * s)) for p, m, s in zip(pairs, mean, sd)]


def by_salib(fn: TestFunction, base: int, seed: int) -> tuple[list[Interval], int]:
    """SALib's Saltelli estimator at its own N (2k + 2) points (Sobol' sampling, seeded):
    (every pair's S2 with S2 +- S2_conf, the evaluations it spent)."""
    from SALib.analyze import sobol
    from SALib.sample import sobol as sobol_sample

    k = len(fn.knobs)
    problem = {"num_vars": k, "names": list(fn.knobs), "bounds": [[0.0, 1.0]] * k}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u = sobol_sample.sample(problem, base, calc_second_order=True, seed=seed)
        y = fn.f(fn.low + (fn.high - fn.low) * u, np.random.default_rng(seed))
        si = sobol.analyze(problem, y, calc_second_order=True, seed=seed)
    return [Interval(p, float(si["S2"][p]), float(si["S2"][p] - si["S2_conf"][p]),
                     float(si["S2"][p] + si["S2_conf"][p])) for p in itertools.combinations(range(k), 2)], len(u)


# --- scoring --------------------------------------------------------------------------------
def score(fn: TestFunction, found: list[Interval], tally: dict[str, int]) -> None:
    for iv in found:
        truth = fn.truth[iv.pair]
        coupled, no_sign = iv.low > LINE, iv.high < LINE
        right = (coupled and truth > LINE) or (no_sign and truth <= LINE)
        tally["right"] += right
        tally["inconclusive"] += not (coupled or no_sign)
        tally["wrong"] += (coupled or no_sign) and not right
        tally["planted no sign"] += no_sign and truth > LINE
        tally["zero coupled"] += coupled and truth <= LINE
        if truth > 0:  # a share's interval lies above zero by construction: coverage of the pairs that interact
            tally["interacting"] += 1
            tally["covered"] += iv.low <= truth <= iv.high
        tally["planted"] += truth > LINE
        tally["planted coupled"] += coupled and truth > LINE


def line(method: str, fn: str, size: str, t: dict[str, int], seconds: float | None = None) -> str:
    return (f"{method:10s} {fn:9s} {size:>9s}  {t['right']:4d} / {t['inconclusive']:4d} / {t['wrong']:3d}"
            f"   {t['planted coupled']:3d} of {t['planted']:3d}   {t['planted no sign']:3d}   {t['zero coupled']:3d}"
            f"   {t['covered']:4d} of {t['interacting']:4d}" + (f"   {seconds:7.1f} s" if seconds is not None else ""))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--sizes", default="20,30,60,100")
    ap.add_argument("--functions", default="ishigami,g,moderate")
    ap.add_argument("--methods", default="csweep,ax,salib",
                    help="csweep, ax, salib, ax-saas (Ax on the fully Bayesian SAAS GP, NUTS: about 20 s a study)")
    ap.add_argument("--ax-mc", type=int, default=512, help="Ax's Monte Carlo points (its GP samples are joint)")
    ap.add_argument("--salib-n", default="64,256,1024,4096", help="SALib's base samples N (N (2k + 2) evaluations)")
    args = ap.parse_args(argv)
    fns = functions()
    methods = [m for m in args.methods.split(",") if m]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(f"{args.seeds} seeded random designs per cell; a pair's interval read by csweep's rule (coupled above "
          f"{LINE:.0%} of the variance, no sign below); scored against the known second-order index")
    print("method     function      trials  right / inconc. / wrong   planted coupled   planted no-sign   "
          "zero coupled   covered   time")
    total: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for name in args.functions.split(","):
        fn = fns[name]
        for method in methods:
            if method == "salib":
                for base in (int(b) for b in args.salib_n.split(",")):
                    t: dict[str, int] = defaultdict(int)
                    started, spent = time.perf_counter(), 0
                    for seed in range(args.seeds):
                        found, spent = by_salib(fn, base, seed)
                        score(fn, found, t)
                    print(line("SALib", name, f"{spent}", t, time.perf_counter() - started), flush=True)
                continue
            for n in sizes:
                t = defaultdict(int)
                started = time.perf_counter()
                for seed in range(args.seeds):
                    u, y = design(fn, n, seed)
                    if method == "csweep":
                        found = by_csweep(fn, u, y, seed)
                    else:
                        found = by_ax(fn, u, y, seed, saas=method == "ax-saas", mc_samples=args.ax_mc)
                    score(fn, found, t)
                for key, v in t.items():
                    total[method][key] += v
                print(line(method, name, str(n), t, time.perf_counter() - started), flush=True)
    print("\nall functions and sizes:")
    for method, t in total.items():
        print(line(method, "all", "", t))


if __name__ == "__main__":
    main()
