"""Validation: the held-out images denoised at fixed timesteps under fixed noise (the same for
every trial of every study), and the curve of a trial's validations with its best step."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ._prompts import Prompts
from ._step import Denoiser, errors

# Validation draws are constants of csweep, not of a trial: every trial of every study is scored
# on the same timesteps and the same noise.
VAL_TIMESTEPS = (100, 300, 500, 700, 900)
VAL_NOISE_SEED = 1234


@torch.no_grad()
def validate(model: Denoiser, data: Mapping[str, Any], prompts: Prompts, concepts: int, sched: Any,
             *, final: bool) -> dict[str, float]:
    """val_loss (the mean over VAL_TIMESTEPS) and its per-timestep parts; `final` adds
    concept_separation: the share of single-concept held-out images that their own concept's
    prompt denoises best."""
    device = data["val_lat"].device
    combos = data["combos"]
    vg = torch.Generator(device="cpu").manual_seed(VAL_NOISE_SEED)
    lat, combo = data["val_lat"], data["val_combo"]
    total = 0.0
    singles = [i for i, c in enumerate(combo.tolist()) if len(combos[c]) == 1]
    own = [combos[combo[i]][0] for i in singles]
    single_combo = [combos.index((c,)) for c in range(concepts)]
    sep_err = torch.zeros(len(singles), len(single_combo), device=device)
    per_t: dict[str, float] = {}
    vids = prompts.val_caption_ids if prompts.val_caption_ids is not None else [v[combo] for v in prompts.val_ids]
    with model.autocast:  # the held-out prompts once, not once per timestep (on SDXL the encoders
        cond = model.encode(vids)  # cost about a UNet call)
    # with one concept there is nothing to tell apart: its separation is 1 without a forward
    separate = final and singles and len(single_combo) > 1
    if separate:  # each concept's own prompt, for the held-out images of one concept
        with model.autocast:
            sep_cond = [model.encode([v[sc].expand(len(singles), -1) for v in prompts.val_ids])
                        for sc in single_combo]
    for tv in VAL_TIMESTEPS:
        noise = torch.randn(lat.shape, generator=vg).to(device, lat.dtype)
        t = torch.full((lat.shape[0],), tv, device=device, dtype=torch.long)
        noisy = sched.add_noise(lat, noise, t)
        with model.autocast:
            per_t[f"val_loss/t{tv}"] = float(errors(model.denoise(noisy, t, cond), noise).mean())
            total += per_t[f"val_loss/t{tv}"]
            if separate:
                for k, cond_k in enumerate(sep_cond):
                    sep_err[:, k] += errors(model.denoise(noisy[singles], t[singles], cond_k), noise[singles])
    out = {"val_loss": total / len(VAL_TIMESTEPS), **per_t}
    if final and singles:
        hits = int((sep_err.argmin(dim=1).cpu() == torch.tensor(own)).sum()) if separate else len(singles)
        out["concept_separation"] = hits / len(singles)
    return out


class ValidationCurve:
    """The validations of one trial: (step, val_loss and its per-timestep parts) per point, the
    best step (lowest val_loss, the earliest of equals) and, with `keep` (the trainables by name),
    a copy of them at the best step, in memory: no checkpoint per validation."""

    def __init__(self, keep: Mapping[str, torch.Tensor] | None) -> None:
        self.points: list[dict[str, float]] = []
        self.keep = dict(keep) if keep is not None else None
        self.best: dict[str, torch.Tensor] = {}
        self.best_step, self.best_value, self.seconds = 0, math.inf, 0.0

    def add(self, step: int, values: Mapping[str, float], seconds: float) -> None:
        self.points.append({"step": step, **{k: float(v) for k, v in values.items()
                                             if k == "val_loss" or k.startswith("val_loss/")}})
        self.seconds += seconds
        value = float(values["val_loss"])
        if value < self.best_value:
            self.best_step, self.best_value = step, value
            if self.keep is not None:
                self.best = {k: t.detach().clone() for k, t in self.keep.items()}

    @torch.no_grad()
    def restore(self) -> None:
        for k, t in (self.keep or {}).items():
            t.copy_(self.best[k])

    def metrics(self) -> dict[str, float]:
        return {"best_step": float(self.best_step), "val_loss_at_best": self.best_value,
                "val_seconds": self.seconds, "val_points": float(len(self.points))}


@contextlib.contextmanager
def evaluated(ema: Any, params: list[torch.Tensor]) -> Iterator[None]:
    """The trainables as they are evaluated: their moving average while inside, when there is one."""
    if ema is None:
        yield
        return
    ema.store(params)
    ema.copy_to(params)
    try:
        yield
    finally:
        ema.restore(params)
