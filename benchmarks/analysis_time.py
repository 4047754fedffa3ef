"""How a report's time grows with the study: `reports.write_study_report` on studies of 60 to 3,000
trials of a four-knob objective (two numeric pairs declared, one with a law), each part timed.

    python benchmarks/analysis_time.py [--sizes 60,300,1000,3000] [--sampler-sizes 30,100,500]

`--sampler-sizes`: also the coupling sampler's own time per suggestion (`Study.ask` on a study of
that many finished trials of the same four knobs; the median of 5 asks, the first of the process
paying its imports apart). `--sizes ''` times the sampler alone. `--kernels 20,30,60`: the coupling
analysis of the moderate synthetic planting (tests/synthetic.py) with the hyperparameter chains'
likelihoods evaluated one chain at a time and together (`common.gp.BATCH_CELLS`, what the
surrogate does), alternately on the same studies: seconds per analysis, their ratio, and whether
the verdicts' figures are the same to the bit.

The surrogate conditions on at most common.gp.MAX_FIT trials (a seeded random subset beyond),
so the coupling and law analyses stop growing with the study; what still grows is linear or
close to it (tables, the front, the hypervolume history, p_front's Monte Carlo).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def study_of(n: int, seed: int = 0):
    import numpy as np
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=f"s{n}", directions=["minimize", "minimize"])
    study.set_user_attr("space", {"params": {}, "hypotheses": [{"x": "W", "y": "sigma", "law": "power"},
                                                                 {"x": "lr", "y": "decay"}]})
    d = {"W": FloatDistribution(16, 1024, log=True), "sigma": FloatDistribution(1e-3, 1, log=True),
         "lr": FloatDistribution(1e-4, 1e-1, log=True), "decay": FloatDistribution(0, 1)}
    rng = np.random.default_rng(seed)
    trials = []
    for i in range(n):
        p = {"W": float(np.exp(rng.uniform(math.log(16), math.log(1024)))),
             "sigma": float(np.exp(rng.uniform(math.log(1e-3), 0))),
             "lr": float(np.exp(rng.uniform(math.log(1e-4), math.log(1e-1)))), "decay": float(rng.uniform())}
        loss = (0.3 * (math.log(p["sigma"]) - math.log(0.05) + 0.35 * math.log(p["W"])) ** 2
                + 0.2 * (math.log10(p["lr"]) + 2.5) ** 2 + 0.5 * p["decay"] + rng.normal(0, 0.05))
        trials.append(create_trial(values=[loss, 10 * p["W"] ** 0.5], params=p, distributions=d,
                                   user_attrs={"mlflow_run_id": f"run{i}"}))
    study.add_trials(trials)
    return study


def sampler_time(sizes: list[int]) -> None:
    import statistics
    import warnings

    import optuna

    from sweeps import CouplingSampler

    warnings.filterwarnings("ignore")
    for n in sizes:
        stored = study_of(n)
        study = optuna.create_study(directions=["minimize", "minimize"], sampler=CouplingSampler(seed=0))
        study.add_trials(stored.trials)
        dists = stored.trials[0].distributions
        times = []
        for _ in range(6):
            t = time.perf_counter()
            trial = study.ask(dists)
            times.append(time.perf_counter() - t)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)  # leaves the design as it was
        print(f"coupling sampler, {n} trials: {statistics.median(times[1:]):.2f} s per suggestion "
              f"(median of {len(times) - 1}; max {max(times[1:]):.2f}; first ask {times[0]:.2f})", flush=True)


def kernel_time(sizes: list[int], rounds: int = 3) -> None:
    import statistics
    import warnings

    sys.path.insert(0, str(ROOT / "tests"))
    from synthetic import UNIT_SPACE, moderate_study

    import common.gp as gp
    from reports import coupling_analysis

    warnings.filterwarnings("ignore")
    together = gp.BATCH_CELLS
    for n in sizes:
        times: dict[str, list[float]] = {"one at a time": [], "together": []}
        same = True
        for r in range(rounds):
            figures = []
            for name, cells in (("one at a time", 1), ("together", together)):
                gp.BATCH_CELLS = cells
                t = time.perf_counter()
                out = coupling_analysis(moderate_study(r, n=n), UNIT_SPACE, seed=0)
                times[name].append(time.perf_counter() - t)
                figures.append([(c.param_a, c.param_b, c.strength, c.ci_low, c.ci_high) for c in out])
            same = same and figures[0] == figures[1]
        gp.BATCH_CELLS = together
        a, b = (statistics.median(times[k]) for k in ("one at a time", "together"))
        print(f"coupling analysis, {n} trials: chains' likelihoods one at a time {a:.2f} s, together {b:.2f} s, "
              f"ratio {b / a:.2f} (median of {rounds}); figures identical: {same}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="60,300,1000,3000")
    ap.add_argument("--sampler-sizes", default="")
    ap.add_argument("--kernels", default="")
    a = ap.parse_args()
    if a.kernels:
        kernel_time([int(v) for v in a.kernels.split(",")])
    if a.sampler_sizes:
        sampler_time([int(v) for v in a.sampler_sizes.split(",")])
    import reports._summary as R  # the analyses analyse() calls, timed where it looks them up
    from reports import write_study_report

    timed: dict[str, float] = {}

    def timer(name, fn):
        def wrapped(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                timed[name] = timed.get(name, 0.0) + time.perf_counter() - t
        return wrapped

    for name in ("coupling_analysis", "fit_power_law", "hypervolume_history", "pareto_frame", "trials_frame"):
        setattr(R, name, timer(name, getattr(R, name)))
    if not a.sizes:
        return
    print(f"{'trials':>7} {'report s':>9} " + " ".join(f"{k:>20}" for k in ("coupling_analysis", "fit_power_law",
                                                                             "hypervolume_history", "pareto_frame")))
    for n in (int(v) for v in a.sizes.split(",") if v):
        study = study_of(n)
        timed.clear()
        t = time.perf_counter()
        write_study_report(study, Path(tempfile.mkdtemp()) / "out")
        total = time.perf_counter() - t
        print(f"{n:>7} {total:>9.1f} " + " ".join(f"{timed.get(k, 0.0):>20.1f}" for k in (
            "coupling_analysis", "fit_power_law", "hypervolume_history", "pareto_frame")), flush=True)


if __name__ == "__main__":
    main()
