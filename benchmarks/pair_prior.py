"""How much the pair prior's median pulls the small-N estimates (issue 47, item 1): the coupling
analysis of the moderate planting (tests/synthetic.py: warm x sigma 12% of the noise-free
variance, configs' spread 2.8x the seed noise) on random designs, with `common.gp.LOG_PAIR`'s median
at 0.01, at 0.05 (csweep's) and at 0.12 (the planted share), its spread unchanged. Per prior: the
planted pair's median estimate, how many studies decide it (lower bound above 5%), and the wrong
calls (the planted pair "no sign", or any pair of a planted or a null study called coupled).

    python benchmarks/pair_prior.py [--trials 30] [--studies 20]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--studies", type=int, default=20)
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    import common.gp as gp
    from reports import coupling_analysis
    from synthetic import UNIT_SPACE, moderate_study

    spread = gp.LOG_PAIR[1]
    for label, median in (("0.01", 0.01), ("0.05 (csweep's)", 0.05), ("0.12 (the planted share)", 0.12)):
        gp.LOG_PAIR = (math.log(median), spread)
        for coupled in (True, False):
            est, decided, wrong = [], 0, 0
            for s in range(a.studies):
                for c in coupling_analysis(moderate_study(s, n=a.trials, coupled=coupled), UNIT_SPACE, seed=s):
                    if coupled and {c.param_a, c.param_b} == {"warm", "sigma"}:
                        est.append(c.strength)
                        decided += c.ci_low > 0.05
                        wrong += c.verdict_key == "no sign of coupling"
                    else:
                        wrong += c.ci_low > 0.05
            what = (f"planted median {statistics.median(est):.3f}, decided {decided} of {a.studies}" if coupled
                    else "null")
            print(f"{a.trials} trials, pair prior median {label}, {what}, wrong calls {wrong}", flush=True)


if __name__ == "__main__":
    main()
