"""Verdicts on random designs, in-process: docs/calibration.md's table "Measured on the moderate
planting, random designs".

The moderate planting of tests/synthetic.py (one pair's pure interaction 12% of the noise-free
variance, the configs' spread 2.8x the seed noise, an additive pair beside it) and the same
objective without the interaction, uniform random configs, read by `reports.coupling_analysis`
as the report reads a study (the analysis seeded with the study's seed).

    python benchmarks/random_designs.py                      # 20 studies at 12, 20, 30, 60 trials
    python benchmarks/random_designs.py --studies 10 --sizes 20,30

Prints per size the counts of [coupled / inconclusive / no sign] for the planted pair, the
additive pair, and all six pairs of the objective without the interaction.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

KINDS = ("coupled", "inconclusive", "no sign")


def _kind(verdict: str) -> str:
    return next(k for k in KINDS if verdict.startswith(k))


def main() -> None:
    from reports import coupling_analysis
    from synthetic import UNIT_SPACE, moderate_study

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=20)
    ap.add_argument("--sizes", default="12,20,30,60")
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    print("| trials | planted pair (truth: coupled) | additive pair (truth: no sign) | "
          "no interaction, all pairs (truth: no sign) |")
    print("|---|---|---|---|")
    for n in (int(s) for s in a.sizes.split(",")):
        t0 = time.time()
        planted, additive, null = Counter(), Counter(), Counter()
        for s in range(a.studies):
            got = {frozenset((c.param_a, c.param_b)): _kind(c.verdict())
                   for c in coupling_analysis(moderate_study(s, n=n), UNIT_SPACE, seed=s)}
            planted[got[frozenset(("warm", "sigma"))]] += 1
            additive[got[frozenset(("lr", "decay"))]] += 1
            for c in coupling_analysis(moderate_study(s, n=n, coupled=False), UNIT_SPACE, seed=s):
                null[_kind(c.verdict())] += 1
        cells = [" / ".join(str(c[k]) for k in KINDS) for c in (planted, additive, null)]
        print(f"| {n} | {' | '.join(cells)} |   ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
