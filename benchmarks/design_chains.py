"""The coupling design with its chains warm-started (where the previous trial's chains ended: the
boundary posterior's walkers, the surrogate's hyperparameters) against cold starts on every
trial, side by side on the same seeded studies of the planted lr ceiling that falls with
lora_rank (tests/synthetic.py): the time per study, and the verdicts and divergence each gives.

    python benchmarks/design_chains.py --studies 10 --trials 40
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))


def one(seed: int, n: int, warm: bool) -> tuple[float, str, float]:
    import synthetic as S
    from reports import stability_analysis, stability_runs

    started = time.perf_counter()
    df = S.boundary_study(seed, n=n, kind="rank", sampler="coupling", warm_start=warm)
    seconds = time.perf_counter() - started
    res = stability_analysis(stability_runs(df), S.boundary_space("rank"), seed=seed)
    verdict = next(b.verdict_key for b in res.boundaries if {b.param, b.by} == {"lr", "lora_rank"})
    return seconds, verdict, float(df["health"].eq("diverged").mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=10)
    ap.add_argument("--trials", type=int, default=40)
    a = ap.parse_args()
    from threadpoolctl import threadpool_limits

    rows = {True: [], False: []}
    with threadpool_limits(1):
        for seed in range(a.studies):
            for warm in (False, True):
                rows[warm].append(one(seed, a.trials, warm))
                s, v, d = rows[warm][-1]
                print(f"seed {seed} {'warm' if warm else 'cold'}: {s:.1f} s, lr x lora_rank {v}, {d:.0%} diverged",
                      flush=True)
    for warm in (False, True):
        secs = [r[0] for r in rows[warm]]
        coupled = sum(r[1] == "coupled" for r in rows[warm])
        div = sum(r[2] for r in rows[warm]) / len(rows[warm])
        print(f"{'warm' if warm else 'cold'} starts: {sum(secs) / len(secs):.1f} s a study, moved pair coupled "
              f"{coupled} of {len(secs)}, {div:.0%} of runs diverged")
    print(f"time ratio cold / warm: {sum(r[0] for r in rows[False]) / sum(r[0] for r in rows[True]):.2f}x")


if __name__ == "__main__":
    main()
