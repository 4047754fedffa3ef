"""What a run's workers get: CPUs and GPU shares per trial, how many workers the machine or
cluster holds, and the packing of trials onto GPUs by their predicted memory (sweeps._packing)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from ._packing import Packing
from ._settings import RunConfig
from ._workers import RayPool, in_ray_job


def cpus_per_trial(cfg: RunConfig) -> float:
    """--cpus-per-trial, else the trials in flight share the machine's (or cluster's) CPUs."""
    if cfg.cpus_per_trial is not None:
        return cfg.cpus_per_trial
    if cfg.ray_address is None and not in_ray_job():
        return max(1.0, float((os.cpu_count() or 1) // cfg.workers))
    import ray

    return max(1.0, float(int(ray.cluster_resources().get("CPU", 1)) // cfg.workers))


def _gpus_for(cfg: RunConfig) -> float:
    if cfg.gpus_per_trial is not None:
        return cfg.gpus_per_trial
    import ray

    return 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0


CUDA_CONTEXT_MB = 512.0  # what each worker process's CUDA context holds beyond its trial's tensors


def workers_that_fit(workers: int, cpus: float, gpus: float, have: Mapping[str, float]) -> int:
    """--workers, less those whose CPUs or GPU share (each worker's `cpus`, `gpus`) the cluster
    (`have`: Ray's cluster resources) cannot give: they would wait forever. Says so on stderr."""
    fit = workers
    for need, name in ((cpus, "CPU"), (gpus, "GPU")):
        if need > 0:
            total = float(have.get(name, 0))
            # GPU shares below one pack per GPU (Ray never splits a share across GPUs)
            fit = min(fit, int(total) * int(1 / need + 1e-9) if name == "GPU" and need < 1 else int(total / need + 1e-9))
    if fit >= workers:
        return workers
    print(f"--workers {workers}: the cluster's {float(have.get('CPU', 0)):g} CPU(s) and {float(have.get('GPU', 0)):g} "
          f"GPU(s) hold {max(fit, 1)} workers of {cpus:g} CPU and {gpus:g} GPU each; running {max(fit, 1)}",
          file=sys.stderr, flush=True)
    return max(fit, 1)


def gpu_plan(cfg: RunConfig) -> tuple[bool, float, tuple[float, bool]]:
    """Whether trials are packed onto the GPUs by memory, the cluster's GPUs, and the card's
    (MB, CUDA?), read before the workers take every GPU share. A fraction the user picked
    (--gpus-per-trial) is theirs."""
    import ray

    gpus = 0.0 if cfg.gpus_per_trial is not None else float(ray.cluster_resources().get("GPU", 0))
    packed = gpus >= 1
    if cfg.gpu_mem_mb is not None and not packed:
        print("--gpu-mem-mb: " + ("--gpus-per-trial sets each trial's share; trials are not packed"
                                  if cfg.gpus_per_trial is not None else "the Ray cluster has no GPU; trials are not packed"),
              file=sys.stderr, flush=True)
    card = _card_of_cluster() if packed and cfg.gpu_mem_mb is None else (0.0, False)
    if packed and cfg.gpu_mem_mb is None and not card[1]:
        print("GPUs without a CUDA card to read their memory from: one trial per GPU (--gpu-mem-mb packs them)",
              file=sys.stderr, flush=True)
        packed = False
    return packed, gpus, card


def _card() -> tuple[float, bool]:
    """(MB of memory, whether it is a CUDA card) of the GPU this process was given."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / 2**20, True
    return 0.0, False


def packing_for(cfg: RunConfig, pool: RayPool, gpus: int, study: Any, card: tuple[float, bool]) -> Packing:
    """The packing of trials onto GPUs by predicted memory (sweeps._packing): the budget per GPU
    from --gpu-mem-mb (what the trials' own peaks may sum to), else the card's memory less a CUDA
    context per worker; the study's finished trials teach the predictor."""
    from ._packing import MEMORY_KNOBS, MemoryPredictor, describe_packing

    card_mb, cuda = card
    budget = cfg.gpu_mem_mb if cfg.gpu_mem_mb is not None else card_mb
    predictor = MemoryPredictor(MEMORY_KNOBS if cfg.builtin else None)
    packing = Packing(budget, pool.gpu_of, predictor, can_probe=cfg.builtin,
                      per_process_mb=CUDA_CONTEXT_MB if cuda and cfg.gpu_mem_mb is None else 0.0)
    for params, peak in measured_peaks(study, cfg.fixed):
        predictor.observe(params, peak)
    if cfg.progress:
        print(describe_packing(packing, gpus), file=sys.stderr, flush=True)
    return packing


def _card_of_cluster() -> tuple[float, bool]:
    """The first GPU's memory as the driver sees it, else as a GPU task on the cluster sees it."""
    card = _card()
    if card[1]:
        return card
    import ray

    try:
        return ray.get(ray.remote(num_gpus=0.01)(_card).remote(), timeout=120)
    except Exception:  # noqa: BLE001 - no GPU task could run: no card to read
        return 0.0, False


def measured_peaks(study: Any, fixed: Mapping[str, Any]) -> list[tuple[dict[str, Any], float]]:
    """(config, peak MB) of the study's finished trials (a resume's packing starts from them)."""
    from optuna.trial import TrialState

    names = list(study.metric_names or ())
    if "peak_mem_mb" not in names:
        return []
    return [({**fixed, **t.params}, float(t.values[names.index("peak_mem_mb")]))
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.values is not None]
