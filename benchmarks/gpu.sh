#!/usr/bin/env bash
# The benchmarks that need a CUDA machine, in one call of under 10 minutes of device time:
#   throughput  csweep's objective against the reference loop (steps/s, allocator peak), on the tiny
#               model and on an SD-1.5-sized model at 512 px (benchmarks/throughput.py);
#   optimizers  each optimizer's step time and peak on the SD 1.5 shapes (benchmarks/optimizers.py);
#   packing     memory-aware packing against one trial per GPU on the same configs: wall time,
#               trials at once, each trial's allocator peak against its reservation (benchmarks/packing.py).
#   lora        (not in all: about a minute more) a LoRA trial's allocator peak per target, the UNet
#               LoRA's no longer holding a second UNet (benchmarks/lora_memory.py).
# Writes its output to ${OUT:-.}/gpu.txt.
#   bash benchmarks/gpu.sh [all|throughput|optimizers|packing|lora]   (from the repository root, installed)
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
out="${OUT:-.}/gpu.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out"
run() { timeout "$1" "${@:2}" 2>&1 | grep -v -i warning | tee -a "$out" || echo "($2 ${3:-}: stopped or failed)" | tee -a "$out"; }
if [[ "$what" == all || "$what" == throughput ]]; then
  run 200 python benchmarks/throughput.py --steps 50 --sd15 --sd15-steps 20
fi
if [[ "$what" == all || "$what" == optimizers ]]; then
  run 120 python benchmarks/optimizers.py --model random:sd15 --resolution 512 --steps 12
fi
if [[ "$what" == all || "$what" == packing ]]; then
  run 240 python benchmarks/packing.py --model random:sd15 --resolution 256 --trials 6 --workers 6 --steps 20
fi
if [[ "$what" == lora ]]; then
  run 150 python benchmarks/lora_memory.py --targets unet,text,none
fi
