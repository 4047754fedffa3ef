"""What the demo's space does, measured on a grid: val_loss of the README demo's settings (the
`demo` space's fixed values, 2 seeds per config) at LoRA ranks x lrs, one init_std. It is the
truth the demo's verdict on lora_rank x lr is checked against (benchmarks/RESULTS.md, "The demo's
missed coupling"): a LoRA makes val_loss rise with lr at the high end; without one it does not.

    python benchmarks/demo_truth.py                    # ranks 0,4,8; lrs 0.003-0.1; init_std 0.01
    python benchmarks/demo_truth.py --ranks 0,2 --lrs 0.01,0.06 --init-std 0.2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="0,4,8")
    ap.add_argument("--lrs", default="0.003,0.01,0.03,0.06,0.1")
    ap.add_argument("--init-std", type=float, default=0.01)
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args(argv)

    import statistics

    import torch

    from objectives import HealthConfig
    from objectives import textual_inversion
    from search_spaces import load_space

    torch.set_num_threads(1)  # small models: threads only contend on a loaded machine
    fixed = dict(load_space("demo").fixed)
    ranks = [int(v) for v in args.ranks.split(",")]
    lrs = [float(v) for v in args.lrs.split(",")]
    health = HealthConfig(early_stop=False)  # the grid's diverging corner is measured, not stopped
    print(f"demo settings {fixed}, init_std {args.init_std}, {args.seeds} seeds per config; "
          "val_loss (mean of seeds); early stops off", flush=True)
    print("lora_rank " + "".join(f"{'lr ' + format(lr, 'g'):>12}" for lr in lrs), flush=True)
    for r in ranks:
        row = []
        for lr in lrs:
            vals = [textual_inversion({**fixed, "lora_rank": r, "lr": lr, "init_std": args.init_std, "seed": s},
                                      health=health)["val_loss"] for s in range(args.seeds)]
            row.append(statistics.fmean(vals))
        print(f"{r:>9} " + "".join(f"{v:>12.4f}" for v in row), flush=True)


if __name__ == "__main__":
    main()
