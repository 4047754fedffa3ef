"""Where a coupling study's training runs do most for its verdict: more seeds per config, or
more configs? The coupling design (`--sampler coupling`) on the moderate planting of
tests/synthetic.py (the pair's interaction 12% of the noise-free variance, the configs' spread
2.8x one seed's noise), in-process (Optuna's ask/tell, one trial at a time, the report's
analysis at the end), at equal numbers of training runs: N configs x K seeds (each trial's value
the mean of K seeds, its replicate standard error the surrogate's known noise, as `--seeds K`
gives it) against N x K configs of one seed, and against `--seed-plan design` (an arm `NxKd`: the
same N x K runs, K seeds on each config of the design's space-filling start, one on each after).

    python benchmarks/seed_budget.py                      # the table in benchmarks/RESULTS.md
    python benchmarks/seed_budget.py --arms 30x1,30x2,30x2d,60x1 --studies 20 --first-seed 7000

Prints per arm: the planted pair called coupled / "no sign" over the studies, and other pairs
called coupled (wrong) over all of them. `--null`: the same objective without the interaction
(every pair additive: any "coupled" is wrong, the planted pair's included).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", default="30x1,30x2,30x2d,60x1",
                    help="NxK: N configs of K seeds each; NxKd: N x K runs spent by the design")
    ap.add_argument("--studies", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=7000)
    ap.add_argument("--null", action="store_true", help="no planted interaction")
    a = ap.parse_args()

    import optuna
    from synthetic import UNIT_SPACE, designed_moderate_study

    from reports import coupling_analysis

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")
    print(f"{'arm':>6} {'runs':>5} {'configs':>8} {'coupled':>8} {'no sign':>8} {'wrong':>6} {'seconds':>8}")
    for arm in a.arms.split(","):
        plan = "design" if arm.endswith("d") else "every"
        n, k = (int(v) for v in arm.rstrip("d").split("x"))
        called = nosign = wrong = configs = 0
        t0 = time.perf_counter()
        for s in range(a.studies):
            df = designed_moderate_study(a.first_seed + s, n, n_seeds=k, seed_plan=plan, coupled=not a.null)
            configs += len(df)
            for c in coupling_analysis(df, UNIT_SPACE, seed=s):
                verdict = c.verdict()
                if {c.param_a, c.param_b} == {"warm", "sigma"}:
                    called += verdict.startswith("coupled")
                    nosign += verdict.startswith("no sign")
                else:
                    wrong += verdict.startswith("coupled")
        print(f"{arm:>6} {n * k:>5} {configs / a.studies:>8.0f} {called:>5}/{a.studies} {nosign:>8} {wrong:>6} "
              f"{time.perf_counter() - t0:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
