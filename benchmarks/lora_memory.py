"""What a LoRA trial holds beyond the worker's base model, on the real SD 1.5 shapes: each target
(unet, text, both, none for plain textual inversion, and freeze:MODE for a freeze mode that trains
encoder weights, top_layers with one layer) in a process of its own, the process's
resident peak over what the built model holds, beside the trial's own memory figure (CPU
accounting: weights, gradients, optimizer state, saved activations; on CUDA the allocator's
peak, where the resident figure is the host's alone) and its time. One step at 32 px, batch 1,
rank 4, two threads.

    python benchmarks/lora_memory.py [--model random:sd15] [--targets unet,text,both,none,freeze:top_layers]

A trial adds its adapters to a copy of the modules' structure over the base's own weights; before
that it copied the weights (the whole UNet for a UNet LoRA, the whole encoder for a freeze mode):
benchmarks/RESULTS.md, "A LoRA trial over the worker's weights".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
from PIL import Image
torch.set_num_threads(2)
from objectives import pick_device
from objectives._textual_inversion import cached_base_model, train
data = Path(tempfile.mkdtemp())
for i in range(2):
    Image.fromarray((np.random.default_rng(i).random((64, 64, 3)) * 255).astype(np.uint8)).save(data / f"{i}.png")
model, target = sys.argv[2], sys.argv[3]
params = {"steps": 1, "val_every": 1, "resolution": 32, "batch_size": 1, "lr": 1e-4}
if target.startswith("freeze:"):
    params |= {"freeze": target[7:], "unfreeze_layers": 1}
elif target != "none":
    params |= {"lora_targets": target, "lora_rank": 4}
cached_base_model(model, pick_device().type, "fp32")  # the model train() uses
held = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
started = time.perf_counter()
result = train(params, model=model, data=str(data)).result
print(json.dumps({"held": held, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "seconds": time.perf_counter() - started, "accounted": result["peak_mem_mb"],
                  "val_loss": result["val_loss"], "source": result["tags"]["peak_mem_source"]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:sd15")
    ap.add_argument("--targets", default="unet,text,both,none,freeze:top_layers,freeze:full")
    a = ap.parse_args()
    import torch

    print(f"# LoRA trial memory  {time.strftime('%Y-%m-%d')}  {platform.platform()}  {os.cpu_count()} CPUs  "
          f"torch {torch.__version__}  {a.model}", flush=True)
    print("| trial | resident peak over the built model | the trial's own figure (its source) | trial | val_loss |")
    print("|---|---|---|---|---|")
    for target in a.targets.split(","):
        out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), a.model, target], capture_output=True,
                             text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {target} | {r['peak'] - r['held']:.0f} MB (model {r['held']:.0f} MB) | {r['accounted']:.0f} MB ({r['source']}) | "
              f"{r['seconds']:.1f} s | {r['val_loss']:.6f} |", flush=True)


if __name__ == "__main__":
    main()
