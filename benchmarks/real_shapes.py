"""Step time and peak memory on the real architectures (random:sd15, random:sdxl: the published
configs with seeded random weights), with and without gradient checkpointing, side by side with
a loop written as diffusers' examples/textual_inversion does it (SD 1.5 only: that recipe has one
text encoder), on the same model, 64 px, batch 1.

    python benchmarks/real_shapes.py [--models random:sd15,random:sdxl] [--steps 4]

SDXL holds about 14 GB in fp32: run it alone on a 24 GB machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="random:sd15,random:sdxl")
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    import torch

    import objectives._textual_inversion as ti
    from objectives import pick_device, train

    torch.set_num_threads(os.cpu_count() or 1)
    print(f"# real shapes  {time.strftime('%Y-%m-%d')}  {platform.platform()}  {os.cpu_count()} CPUs  "
          f"torch {torch.__version__}  device {pick_device()}", flush=True)
    for model in a.models.split(","):
        started = time.perf_counter()
        base = ti.cached_base_model(model, pick_device().type, "fp32")  # the key train() uses
        print(f"{model}: built in {time.perf_counter() - started:.0f} s", flush=True)
        for ckpt in (False, True):
            stamps: list[float] = []
            res = train({"steps": a.steps, "val_every": a.steps, "batch_size": 1, "resolution": 64,
                         "gradient_checkpointing": ckpt}, model=model, health={"early_stop": False},
                        on_step=lambda s, m: stamps.append(time.perf_counter())).result
            step = statistics.median(b - a_ for a_, b in zip(stamps, stamps[1:]))
            print(f"  csweep, checkpointing {'on ' if ckpt else 'off'}: step {step:.2f} s, peak_mem_mb "
                  f"{res['peak_mem_mb']:.0f} ({res['tags']['peak_mem_source']})", flush=True)
        if model == "random:sd15":
            from throughput import reference_loop

            rate, mem = reference_loop(base, steps=a.steps, batch=1, resolution=64)
            print(f"  diffusers-recipe loop: step {1 / rate:.2f} s, peak_mem_mb {mem:.0f}", flush=True)
        ti.cached_base_model.cache_clear()
        ti._cached_data.cache_clear()
        del base


if __name__ == "__main__":
    main()
