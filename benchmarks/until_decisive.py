"""--until-decisive's sequential looks against known truth: seeded studies of the moderate planting
and of the same objective without the interaction (tests/synthetic.py), random designs (or,
with `--sampler coupling`, the configs the coupling design picks), a look
after every trial from the first that --until-decisive takes (10 trials for four knobs) to the
budget, at the 99% level as csweep looks; at the stop (or the budget), the report's 95% verdicts
are scored against the truth.

    python benchmarks/until_decisive.py [--studies 10] [--budget 30] [--sampler random|coupling]

In-process (reports.coupling_analysis on the trials so far), not through `csweep run`: the same
analysis `decision_looks` runs after each trial, without a sweep's fixed cost per look.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=10)
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--sampler", choices=("random", "coupling"), default="random",
                    help="coupling: the design's first N trials are those a study stopped at N had")
    a = ap.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    from synthetic import UNIT_SPACE, designed_moderate_study, moderate_study

    from reports import coupling_analysis

    t0 = time.time()
    for coupled in (True, False):
        stops, wrong, stopped_wrong = [], 0, 0
        for s in range(a.studies):
            full = (designed_moderate_study(s, a.budget, coupled=coupled) if a.sampler == "coupling"
                    else moderate_study(s, n=a.budget, coupled=coupled))
            stop = a.budget
            for n in range(10, a.budget + 1):
                look = coupling_analysis(full.iloc[:n], UNIT_SPACE, seed=s, level=0.99, n_boot=16)
                if look and all(c.decided for c in look):
                    stop = n
                    break
            final = coupling_analysis(full.iloc[:stop], UNIT_SPACE, seed=s)
            bad = [c for c in final if c.decided and (c.verdict_key == "coupled") !=
                   (coupled and {c.param_a, c.param_b} == {"warm", "sigma"})]
            wrong += bool(bad)
            stopped_wrong += bool(bad) and stop < a.budget
            stops.append(stop)
        label = "moderate planting" if coupled else "no interaction"
        early = sum(1 for n in stops if n < a.budget)
        print(f"{label}: stopped early in {early} of {a.studies} studies (at {sorted(n for n in stops if n < a.budget)}); "
              f"studies with a wrong verdict at the stop: {wrong} of {a.studies} ({stopped_wrong} of them stopped early)",
              flush=True)
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
