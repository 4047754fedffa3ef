#!/usr/bin/env bash
# Items 3 and 5 of the benchmarks on a CUDA machine, in under 5 minutes of device time:
# throughput and peak memory (the allocator's) of csweep's objective against the reference loop,
# on the tiny model and on an SD-1.5-sized model at 512 px. Writes its output to ${OUT:-.}/gpu.txt.
#   bash benchmarks/gpu.sh      (from the repository root, with the project installed)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}/gpu.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out"
timeout 270 python benchmarks/throughput.py --steps 50 --sd15 --sd15-steps 20 2>&1 \
  | grep -v -i warning | tee -a "$out"
