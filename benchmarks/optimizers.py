"""Each optimizer's step time and peak memory on the same trial (the `optimizer` knob): AdamW,
AdamW 8-bit (bitsandbytes, CUDA only), Prodigy (prodigyopt), Adafactor (transformers), side by side
in one run, the step time the median after the first steps.

Run from the repository root:
  python benchmarks/optimizers.py --model random:sd15 --resolution 512 --steps 20   (a GPU)
  python benchmarks/optimizers.py --steps 12                                         (CPU, tiny)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--resolution", type=int, default=0)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lora-rank", type=int, default=16)
    args = ap.parse_args()
    import torch

    from objectives import pick_device, train

    cuda = torch.cuda.is_available()
    names = ["adamw", *(["adamw8bit"] if cuda else []), "prodigy", "adafactor"]
    print(f"optimizers on {args.model}, LoRA rank {args.lora_rank}, {args.steps} steps, on "
          f"{torch.cuda.get_device_name(0) if cuda else pick_device().type}")
    print("  optimizer    step s (median)   peak MB   vs adamw")
    base = None
    for name in names:
        params = {"optimizer": name, "steps": args.steps, "val_every": args.steps, "lora_rank": args.lora_rank,
                  "lr": 1.0 if name == "prodigy" else 1e-3, "seed": 0}
        if args.resolution:
            params["resolution"] = args.resolution
        stamps: list[float] = []
        try:
            res = train(params, model=args.model, health={"early_stop": False},
                        on_step=lambda s, m: stamps.append(time.perf_counter())).result
        except Exception as exc:  # noqa: BLE001 - a row that says why beats a stopped benchmark
            print(f"  {name:11s}  {exc.__class__.__name__}: {str(exc)[:120]}")
            continue
        gaps = [b - a for a, b in zip(stamps[2:], stamps[3:])] or [float("nan")]
        step = statistics.median(gaps)
        base = base or step
        print(f"  {name:11s}  {step:15.4f}   {res['peak_mem_mb']:7.1f}   x{step / base:.2f}")


if __name__ == "__main__":
    main()
