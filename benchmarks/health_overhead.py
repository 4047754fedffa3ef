"""Step-time overhead of the training-health diagnostics (target: < 5%).

Runs the textual_inversion objective with diagnostics on and off, interleaved, on the same model,
data and config, and prints the ratio of median seconds per step. Run: python benchmarks/health_overhead.py
"""

from __future__ import annotations

import argparse
import statistics

from objectives import textual_inversion


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    configs = {
        "embedding_only": {},
        "lora_both_r8": {"lora_rank": 8, "lora_targets": "both"},
        "freeze_full": {"freeze": "full"},
    }
    off = {"enabled": False, "early_stop": False}
    print(f"health diagnostics overhead, model={args.model}, {args.steps} steps, {args.repeats} repeats")
    for name, extra in configs.items():
        params = {"steps": args.steps, **extra}
        textual_inversion(params, model=args.model)  # warm caches
        on_t, off_t = [], []
        for _ in range(args.repeats):
            for bucket, health in ((on_t, None), (off_t, off)):
                out = textual_inversion(params, model=args.model, health=health)
                bucket.append(out["train_seconds"] / args.steps)
        on_m, off_m = statistics.median(on_t), statistics.median(off_t)
        print(f"{name:16s} on {1000 * on_m:7.2f} ms/step  off {1000 * off_m:7.2f} ms/step  "
              f"overhead {100 * (on_m / off_m - 1):+5.1f}%")


if __name__ == "__main__":
    main()
