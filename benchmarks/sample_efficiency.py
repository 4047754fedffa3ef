"""Sample efficiency: hypervolume after 30 trials with the default sampler (TPE) against random
search after 30 and 60, on the `lora_embed` space (real textual-inversion trials, few steps so a
2-core machine finishes), 3 seeds. The hypervolume of every study is computed against one common
reference point (the worst values over all studies plus 10% of the range), so they compare.

Run from the repository root: python benchmarks/sample_efficiency.py [--steps 8] [--seeds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())


def run(space, sampler: str, trials: int, seed: int, steps: int, workdir: Path) -> "object":
    import optuna

    from sweeps import default_storage, default_tracking
    from sweeps import RunConfig, run_sweep

    name = f"{sampler}-{trials}-{seed}"
    cfg = RunConfig(space=space, study_name=name, trials=trials, workers=2, workdir=workdir,
                    storage=default_storage(workdir), tracking_uri=default_tracking(workdir),
                    objective="textual_inversion", builtin=True, fixed={**space.fixed, "steps": steps},
                    sampler=sampler, seed=seed, progress=False, artifact_root=workdir / "mlartifacts",
                    reports=False)
    run_sweep(cfg)
    return optuna.load_study(study_name=name, storage=default_storage(workdir))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    import numpy as np

    from reports import hypervolume, reference_point
    from reports import trials_frame
    from search_spaces import load_space

    space = load_space("lora_embed")
    work = Path(tempfile.mkdtemp(prefix="csweep-se-"))
    print(f"# sample efficiency  {time.strftime('%Y-%m-%d')}  {platform.platform()}  {os.cpu_count()} CPUs; "
          f"lora_embed, {args.steps} steps per trial, 2 workers")
    studies = {}
    for seed in range(args.seeds):
        studies[("tpe", 30, seed)] = run(space, "tpe", 30, seed, args.steps, work)
        studies[("random", 60, seed)] = run(space, "random", 60, seed, args.steps, work)
    points = {}
    for key, study in studies.items():
        df = trials_frame(study)
        df = df[df["state"] == "COMPLETE"].sort_values("trial")
        points[key] = df[["val_loss", "peak_mem_mb"]].to_numpy()
    ref = reference_point(np.concatenate(list(points.values())))
    hv = {"tpe@30": [], "random@30": [], "random@60": []}
    for (sampler, n, seed), pts in points.items():
        if sampler == "tpe":
            hv["tpe@30"].append(hypervolume(pts[:30], ref))
        else:
            hv["random@30"].append(hypervolume(pts[:30], ref))
            hv["random@60"].append(hypervolume(pts[:60], ref))
    print(f"reference point {[round(v, 6) for v in ref]}")
    for k, v in hv.items():
        print(f"{k:10s} hypervolume mean {statistics.mean(v):.6g}  per seed {[f'{x:.6g}' for x in v]}")
    print(f"tpe@30 / random@30 = {statistics.mean(hv['tpe@30']) / statistics.mean(hv['random@30']):.3f}; "
          f"tpe@30 / random@60 = {statistics.mean(hv['tpe@30']) / statistics.mean(hv['random@60']):.3f}")


if __name__ == "__main__":
    main()
