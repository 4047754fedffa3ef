"""Seed replicates: wall time per config with --seeds K on K free workers against one seed on
one worker, side by side in one run (1 s sleep objective, same Ray, same storage kind).

Run from the repository root: python benchmarks/seeds.py [--configs 8] [--k 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
sys.path.insert(0, str(Path(__file__).resolve().parent))


def run(configs: int, workers: int, seeds: int, sleep: float, workdir: Path, name: str) -> float:
    from search_spaces import parse_space
    from sweeps import default_storage, default_tracking
    from sweeps import RunConfig, run_sweep

    space = parse_space({"name": name, "params": {"x": {"type": "float", "low": 0, "high": 1},
                                                  "y": {"type": "float", "low": 0, "high": 1}},
                         "fixed": {"sleep": sleep}}, source="<bench>")
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = RunConfig(space=space, study_name=name, trials=configs, workers=workers, workdir=workdir,
                    storage=default_storage(workdir), tracking_uri=default_tracking(workdir),
                    objective="sleep_objective:objective", builtin=False, fixed={"sleep": sleep},
                    sampler="random", seed=0, seeds=seeds, progress=False,
                    artifact_root=workdir / "mlartifacts", reports=False)
    t0 = time.perf_counter()
    run_sweep(cfg)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", type=int, default=8)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--sleep", type=float, default=1.0)
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from sweeps._workers import runtime_env, start_ray

    tmp = Path(tempfile.mkdtemp(prefix="csweep-seeds-"))
    os.chdir(Path(__file__).resolve().parent)  # the sleep objective travels from here
    start_ray(None, num_cpus=max(2, args.k), runtime_env=runtime_env(cluster=False))  # the local Ray csweep starts
    print(f"# seed replicates  {time.strftime('%Y-%m-%d')}  {platform.platform()}  {os.cpu_count()} CPUs")
    run(2, args.k, 1, 0.0, tmp / "warm", "warm")  # the first Ray use pays worker start-up
    one = run(args.configs, 1, 1, args.sleep, tmp / "one", "one")
    many = run(args.configs, args.k, args.k, args.sleep, tmp / "many", "many")
    print(f"{args.configs} configs of a {args.sleep:.1f} s objective:")
    print(f"  --seeds 1 on 1 worker:            {one / args.configs:.3f} s per config")
    print(f"  --seeds {args.k} on {args.k} workers:           {many / args.configs:.3f} s per config")
    print(f"  ratio: {many / one:.3f} (target <= 1.2)")
    ray.shutdown()


if __name__ == "__main__":
    main()
