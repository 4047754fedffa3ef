"""Sample grids' share of a trial: the same default trial (objective defaults, tiny model, one
torch thread) trained with and without samples, side by side in one run, alternating, several
repeats; also the shipped model's load time.

Run from the repository root: python benchmarks/samples.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    started = time.perf_counter()
    from objectives._model import build_tiny, shipped_dir

    build_tiny("tiny")
    load_s = time.perf_counter() - started
    from objectives import SampleConfig
    from objectives import textual_inversion

    textual_inversion({"steps": 2}, samples={})  # warm: data, pipeline classes
    with_s, without_s, share = [], [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        textual_inversion({})
        without_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        r = textual_inversion({}, samples={})
        with_s.append(time.perf_counter() - t)
        share.append(r["sample_seconds"] / with_s[-1])
    cfg = SampleConfig()
    print(f"shipped model {shipped_dir('tiny').is_dir()}: load (imports included) {load_s:.1f} s")
    print(f"default trial, {len(cfg.prompts)} prompt(s) x {len(cfg.seeds)} seeds x 3 concepts, "
          f"{cfg.steps} {cfg.scheduler} steps:")
    print(f"  without samples {statistics.median(without_s):.2f} s, with {statistics.median(with_s):.2f} s "
          f"(median of {args.repeats}); samples' share of the trial {statistics.median(share):.1%} "
          f"(wall ratio with/without {statistics.median(with_s) / statistics.median(without_s):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
