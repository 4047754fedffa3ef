"""`csweep run SPACE --dry-run N`: a few configs trained for 2 steps here, nothing written."""

from __future__ import annotations

import os
from typing import Any

from ._options import UsageError


def dry_run(cfg: Any, n: int) -> int:
    """`csweep run SPACE --dry-run N`: N configs of the space (a scrambled Sobol sequence, seeded
    by --seed) trained for 2 steps each in this process on whatever device there is, with no
    validation during training, no samples and no early stop; per config its peak memory, its
    step time and whether it fits --max-mem-mb. Nothing is written: no storage, no MLflow."""
    if not cfg.builtin:
        raise UsageError("--dry-run trains the built-in objective's configs; a plug-in objective runs them itself")
    import time
    import warnings

    import optuna
    import torch

    from objectives import pick_device, train

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # every core of this machine, unless OMP_NUM_THREADS says how many this process may use
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS") or 0) or os.cpu_count() or 1))
    dists = cfg.space.distributions()
    sampler = optuna.samplers.QMCSampler(seed=cfg.seed if cfg.seed is not None else 0, warn_independent_sampling=False)
    study = optuna.create_study(sampler=sampler, directions=["minimize"])
    device = pick_device()
    print(f"dry run of {cfg.space.name}: {n} configs, 2 steps each, model {cfg.model}, on {device.type}")
    over = 0
    for i in range(n):
        trial = study.ask(fixed_distributions=dists)
        params = {**cfg.fixed, **trial.params, "steps": 2, "val_every": 2}
        stamps: list[float] = []
        started = time.perf_counter()
        try:
            res = train(params, model=cfg.model, data=cfg.data, health={"early_stop": False},
                        on_step=lambda s, m: stamps.append(time.perf_counter())).result
        except Exception as exc:  # noqa: BLE001 - a config that does not run is what a dry run is for
            name = "out of memory" if exc.__class__.__name__ == "OutOfMemoryError" else exc.__class__.__name__
            print(f"  {i}: {_params_text(trial.params)}: {name}: {str(exc)[:200]}")
            over += 1
            continue
        step = (stamps[-1] - stamps[-2]) if len(stamps) >= 2 else time.perf_counter() - started
        flag = ""
        if cfg.max_mem_mb is not None and res["peak_mem_mb"] > cfg.max_mem_mb:
            flag, over = f"  ABOVE --max-mem-mb {cfg.max_mem_mb:g}", over + 1
        print(f"  {i}: {_params_text(trial.params)}: peak {res['peak_mem_mb']:.1f} MB "
              f"({res['tags']['peak_mem_source']}), step {step:.3f} s{flag}")
    print(f"{over} of {n} configs above the budget or failing; nothing was added to any study")
    return 0


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())

