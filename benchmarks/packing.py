"""Memory-aware packing against one trial per GPU, on the same configs: wall time of the study,
trials at once, and each trial's allocator peak against the peak the packing reserved for it.

Both runs are `csweep run` with `--sampler random --seed S`, so they train the same configs; the
first gives each trial a whole GPU (`--gpus-per-trial 1`, as many workers as GPUs), the second packs them by predicted
memory (no `--gpus-per-trial`; the budget from the card, or `--gpu-mem-mb`). On a machine without
CUDA, `--logical-gpu` starts Ray with one logical GPU and a budget of `--gpu-mem-mb` so that the
mechanism runs here (CPU peaks are csweep's accounting, not an allocator's).

Run from the repository root:
  python benchmarks/packing.py --model random:sd15 --resolution 256 --trials 12 --workers 8   (a GPU)
  python benchmarks/packing.py --logical-gpu --gpu-mem-mb 60 --trials 6 --workers 3 --steps 20 (CPU)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())

from common import attrs as A  # noqa: E402

SPACE = """name: packing
description: memory varies with the LoRA rank and the batch; lr only changes what is learned
params:
  lora_rank: {type: categorical, choices: [0, 4, 16, 64]}
  batch_size: {type: categorical, choices: [1, 2, 4]}
  lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
"""


def run(args: argparse.Namespace, workdir: Path, *, packed: bool, gpus: int) -> tuple[float, object]:
    import optuna

    from sweeps import main

    argv = ["run", str(workdir.parent / "packing.yaml"), "--sampler", "random", "--seed", "0", "--model", args.model,
            "--trials", str(args.trials), "--workers", str(args.workers if packed else gpus), "--workdir", str(workdir),
            "--set", f"steps={args.steps}", "--no-progress", "--no-samples"]
    if args.resolution:
        argv += ["--set", f"resolution={args.resolution}"]
    argv += (["--gpu-mem-mb", str(args.gpu_mem_mb)] if args.gpu_mem_mb else []) if packed else ["--gpus-per-trial", "1"]
    started = time.perf_counter()
    rc = main(argv)
    seconds = time.perf_counter() - started
    assert rc == 0, f"csweep run exited {rc}"
    study = optuna.load_study(study_name="packing", storage=f"sqlite:///{workdir / 'optuna.db'}")
    return seconds, study


def at_once(study) -> int:
    """Most trials running at once: from each trial's placement (`packed_start`, when packing
    started it) or, one trial per GPU, its ask, to its end."""
    spans = [(t.user_attrs.get(A.PACKED_START, t.datetime_start.timestamp()), t.datetime_complete.timestamp())
             for t in study.trials if t.datetime_complete is not None]
    return max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--resolution", type=int, default=0)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--gpu-mem-mb", type=float, default=None)
    ap.add_argument("--logical-gpu", action="store_true")
    args = ap.parse_args()
    import ray
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not (args.logical_gpu and args.gpu_mem_mb):
        raise SystemExit("no CUDA here: pass --logical-gpu --gpu-mem-mb MB to run the mechanism on CPU")
    ray.init(num_cpus=max(os.cpu_count() or 1, args.workers), include_dashboard=False, log_to_driver=False, logging_level="error",
             _node_ip_address="127.0.0.1", **({} if cuda else {"num_gpus": 1}))
    root = Path(tempfile.mkdtemp(prefix="csweep-packing-"))
    (root / "packing.yaml").write_text(SPACE)
    try:
        gpus = torch.cuda.device_count() if cuda else 1
        whole_s, whole = run(args, root / "whole", packed=False, gpus=gpus)
        packed_s, packed = run(args, root / "packed", packed=True, gpus=gpus)
    finally:
        ray.shutdown()
    device = torch.cuda.get_device_name(0) if cuda else "CPU, 1 logical GPU"
    print(f"packing, {args.trials} trials of {args.model} ({args.steps} steps"
          f"{f', {args.resolution} px' if args.resolution else ''}), --workers {args.workers}, on {device}")
    print(f"  one trial per GPU: {whole_s:7.1f} s, at most {at_once(whole)} at once")
    print(f"  packed by memory:  {packed_s:7.1f} s, at most {at_once(packed)} at once   "
          f"(x{whole_s / packed_s:.2f} throughput)")
    names = list(packed.metric_names)
    print("  trial  config                               reserved MB   peak MB   peak/reserved")
    for t in packed.trials:
        if t.values is None:
            print(f"  {t.number:5d}  {t.state.name}")
            continue
        peak = t.values[names.index("peak_mem_mb")]
        reserved = t.user_attrs.get(A.PREDICTED_MEM)
        cfg = f"rank {t.params['lora_rank']}, batch {t.params['batch_size']}"
        ratio = f"{peak / reserved:.2f}" if reserved else "-"
        oom = "  (ran out of memory sharing, re-ran alone)" if t.user_attrs.get(A.REPACKED) else ""
        print(f"  {t.number:5d}  {cfg:35s}  {reserved if reserved else '-':>11}  {peak:8.1f}   {ratio}{oom}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
