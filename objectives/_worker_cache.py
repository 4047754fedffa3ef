"""What a worker process keeps across the trials it runs: the frozen base model on its device and
precision, the concept images and their VAE latents (encoded once, not every step), the
datasets' inputs and the fidelity encoders; and the device a trial runs on."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._data import ConceptSet, dataset_inputs, folder_concepts, synthetic_concepts
from ._fidelity import VaeEncoder, VisionEncoder
from ._model import BaseModel, load_base_model


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cached_base_model(spec: str, device: str, precision: str = "fp32") -> BaseModel:
    """Built or loaded once per process: a Ray worker reuses it for every trial it runs. One per
    (spec, device, precision) however it is called: `cached_base_model("tiny", "cpu")` is the
    model a trial of precision fp32 trains on, not a second one (an lru_cache keys a call by the
    arguments it was given, so a defaulted precision would be another key)."""
    return _base_model(spec, device, precision)


@functools.lru_cache(maxsize=2)
def _base_model(spec: str, device: str, precision: str) -> BaseModel:
    base = load_base_model(spec)
    for module in base.modules():
        module.to(device=device, dtype=DTYPES[precision])
    return base


cached_base_model.cache_clear = _base_model.cache_clear  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=4)
def _cached_data(spec: str, device: str, precision: str, data: str | None, resolution: int,
                 crop: str = "center", flipped: bool = False) -> dict[str, Any]:
    base = cached_base_model(spec, device, precision)
    concepts = synthetic_concepts(resolution) if data is None else folder_concepts(Path(data), resolution, crop)
    return {"concepts": concepts, **_encode(base, concepts, torch.device(device), flipped=flipped)}


@torch.no_grad()
def _encode(base: BaseModel, concepts: ConceptSet, device: torch.device, *, flipped: bool = False) -> dict[str, Any]:
    """1) latents of the frozen VAE, once (not every step as the reference script does); with
    crop windows or flips, of every view of every training image (`train_views`: (images,
    views, ...), the unflipped views first, then their mirror images)."""
    combos = sorted({c for _, c in concepts.train + concepts.val}, key=lambda c: (len(c), c))

    def enc(items: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = base.vae.dtype
        images = torch.stack([torch.from_numpy(im) for im, _ in items]).to(device, dtype)
        lat = base.vae.encode(images).latent_dist.mean * base.vae.config.scaling_factor
        return lat, torch.tensor([combos.index(c) for _, c in items], device=device)

    train_lat, train_combo = enc(concepts.train)
    val_lat, val_combo = enc(concepts.val) if concepts.val else enc(concepts.train)
    out = {"combos": combos, "train_lat": train_lat, "train_combo": train_combo,
           "val_lat": val_lat, "val_combo": val_combo, "train_views": None}
    views = [v[1:] if len(v) > 1 else v[:1] for v in concepts.views] if concepts.views else \
        [im[None] for im, _ in concepts.train]
    if flipped or any(len(v) > 1 for v in views):
        stack = np.stack(views)  # (images, windows, 3, R, R)
        if flipped:
            stack = np.concatenate([stack, stack[..., ::-1]], axis=1)
        n, v = stack.shape[:2]
        flat = torch.from_numpy(np.ascontiguousarray(stack.reshape(n * v, *stack.shape[2:]))).to(device, base.vae.dtype)
        lat = torch.cat([base.vae.encode(flat[i:i + 32]).latent_dist.mean for i in range(0, len(flat), 32)])
        out["train_views"] = (lat * base.vae.config.scaling_factor).reshape(n, v, *lat.shape[1:])
    return out


@functools.lru_cache(maxsize=4)
def _datasets(resolution: int, data: str | None, settings: tuple = ()) -> list[dict[str, Any]]:
    return dataset_inputs(resolution, data, settings)


def _fidelity_encoder(path: str, base: BaseModel, device: str) -> Any:
    return _vision_encoder(path, device) if path else VaeEncoder(base.vae)


@functools.lru_cache(maxsize=1)
def _vision_encoder(path: str, device: str) -> Any:
    return VisionEncoder(path, device)
