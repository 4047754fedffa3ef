"""Is "inconclusive: about M more trials would likely decide it" right? Random designs of the
moderate planting of tests/synthetic.py (one pair's pure interaction 12% of the noise-free
variance, the configs' spread 2.8x the seed noise) and of the same objective without the
interaction, in-process: at N trials, every inconclusive pair's M; then the same study grown
(its first N trials kept, more drawn the same way) to N + M and to N + about M/2: is that pair
decided there?

    python benchmarks/more_trials.py                 # the table in benchmarks/RESULTS.md
    python benchmarks/more_trials.py --studies 20 --sizes 12,20,30

Prints per objective, kind of pair and N: the inconclusive pairs, their median M, how many of
them say "over 3 x N more" (M beyond it) and how many of those with N + M within the grown study
are decided at N + M and at N + M/2. A rough guide is right when most are decided at N + M and
fewer at half of it.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


class _Grown:
    """One study grown to its full size; `at(n)` analyses its first n trials (once)."""

    def __init__(self, trials, *, seed: int) -> None:
        self.trials, self.seed, self.seen = trials, seed, {}

    def __call__(self, n: int) -> dict:
        from synthetic import UNIT_SPACE

        from reports import coupling_analysis

        if n not in self.seen:
            got = coupling_analysis(self.trials.iloc[:n].reset_index(drop=True), UNIT_SPACE, seed=self.seed)
            self.seen[n] = {frozenset((c.param_a, c.param_b)): c for c in got}
        return self.seen[n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", type=int, default=12)
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--sizes", default="12,20,30")
    ap.add_argument("--cap", type=int, default=400, help="the grown study's size")
    a = ap.parse_args()

    from synthetic import moderate_study

    warnings.simplefilter("ignore")
    sizes = [int(v) for v in a.sizes.split(",")]
    cells: dict[tuple[str, str, int], list[dict]] = {}
    started = time.perf_counter()
    for coupled in (True, False):
        for s in range(a.studies):
            at = _Grown(moderate_study(a.first_seed + s, n=a.cap, coupled=coupled), seed=s)

            for n in sizes:
                for pair, c in at(n).items():
                    if c.decided or c.more_trials is None:
                        continue
                    kind = "planted" if coupled and pair == frozenset(("warm", "sigma")) else "additive"
                    row = {"M": c.more_trials, "over": c.more_trials > 3 * n}
                    if n + c.more_trials <= a.cap:
                        row["at M"] = at(n + c.more_trials)[pair].decided
                        row["at M/2"] = at(n + max(5, 5 * round(c.more_trials / 10)))[pair].decided
                    cells.setdefault(("moderate" if coupled else "null", kind, n), []).append(row)
        print(f"# {'moderate' if coupled else 'null'} done, {time.perf_counter() - started:.0f} s", flush=True)

    print("| objective | pair | N | inconclusive | median M | says over 3N | decided at N + M | at N + M/2 |")
    print("|---|---|---|---|---|---|---|---|")
    for (obj, kind, n), rows in sorted(cells.items(), key=lambda kv: (kv[0][0] != "moderate", kv[0][1], kv[0][2])):
        ms = sorted(r["M"] for r in rows)
        within = [r for r in rows if "at M" in r]
        print(f"| {obj} | {kind} | {n} | {len(rows)} | {ms[len(ms) // 2]} | {sum(r['over'] for r in rows)} | "
              f"{sum(r['at M'] for r in within)} of {len(within)} | {sum(r['at M/2'] for r in within)} of {len(within)} |")
    print(f"# {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
