"""The coupling design when a region of the space diverges. On the moderate planting of
tests/synthetic.py (four knobs on [0, 1], warm x sigma's pure interaction 12% of the noise-free
variance, the configs' spread 2.8x one seed's noise), runs in a cut region are told to Optuna as
PRUNED (the divergence stop) or FAIL, with no value, as `csweep run` leaves them; the design
(`--sampler coupling`, in-process, Optuna's ask/tell) and the report's analysis on the usable
trials at the end. Regions: `corner` (lr > 0.7 and sigma > 0.5, 15% of the space), `lr`
(lr > 0.8, 20%) and `pair` (warm + sigma > 1.3, 24.5%: a cut across the whole box of the coupled
pair itself, so the interaction is seen on what is left of its square).

    python benchmarks/diverging_region.py                       # the table in benchmarks/RESULTS.md
    python benchmarks/diverging_region.py --trials 30 --studies 20 --first-seed 9010 --state FAIL

Prints per region: the planted pair called coupled / "no sign" over the studies, the pairs of the
same objective without the interaction called coupled (wrong), the trials proposed inside the
region (the design's start included) and the usable trials per study.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

REGIONS = {"corner": lambda p: p["lr"] > 0.7 and p["sigma"] > 0.5, "lr": lambda p: p["lr"] > 0.8,
           "pair": lambda p: p["warm"] + p["sigma"] > 1.3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--studies", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=9010)
    ap.add_argument("--state", choices=("PRUNED", "FAIL"), default="PRUNED")
    ap.add_argument("--regions", default="corner,lr")
    a = ap.parse_args()

    import optuna
    from synthetic import UNIT_SPACE, designed_moderate_study

    from reports import coupling_analysis

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    state = getattr(optuna.trial.TrialState, a.state)
    print(f"{a.studies} studies of {a.trials} trials per region, seeds {a.first_seed}+, runs in the region {a.state}")
    print("| region | planted: coupled / no sign | null pairs called coupled | trials in the region | usable per study |")
    print("|---|---|---|---|---|")
    for name in a.regions.split(","):
        cut, started = REGIONS[name], time.perf_counter()
        coupled = no_sign = wrong = inside = usable = 0
        for s in range(a.first_seed, a.first_seed + a.studies):
            planted = designed_moderate_study(s, a.trials, diverges=cut, diverged_state=state)
            null = designed_moderate_study(s, a.trials, diverges=cut, diverged_state=state, coupled=False)
            inside += planted.attrs["pruned"] + null.attrs["pruned"]
            usable += len(planted)
            for c in coupling_analysis(planted, UNIT_SPACE, seed=s):
                if {c.param_a, c.param_b} == {"warm", "sigma"}:
                    coupled += c.verdict_key == "coupled"
                    no_sign += c.verdict_key == "no sign of coupling"
            wrong += sum(c.verdict_key == "coupled" for c in coupling_analysis(null, UNIT_SPACE, seed=s))
        print(f"| {name} | {coupled} / {no_sign} of {a.studies} | {wrong} of {6 * a.studies} | "
              f"{inside} of {2 * a.trials * a.studies} | {usable / a.studies:.1f} |  ({time.perf_counter() - started:.0f} s)",
              flush=True)


if __name__ == "__main__":
    main()
