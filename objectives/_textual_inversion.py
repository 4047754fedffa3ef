"""The textual_inversion objective: one real diffusers training run per trial."""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ._data import TEMPLATES, VAL_TEMPLATE, ConceptSet, folder_concepts, synthetic_concepts
from ._memory import MemoryMeter
from ._model import BaseModel, load_base_model
from ._params import resolve_params

# Validation draws are constants of csweep, not of a trial: every trial of every study is scored
# on the same timesteps and the same noise.
VAL_TIMESTEPS = (100, 300, 500, 700, 900)
VAL_NOISE_SEED = 1234

StepCallback = Callable[[int, Mapping[str, float]], None]


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@functools.lru_cache(maxsize=2)
def cached_base_model(spec: str, device: str) -> BaseModel:
    """Built or loaded once per process: a Ray worker reuses it for every trial it runs."""
    base = load_base_model(spec)
    for module in (base.text_encoder, base.unet, base.vae):
        module.to(device)
    return base


@functools.lru_cache(maxsize=4)
def _cached_latents(spec: str, device: str, data: str | None, resolution: int) -> dict[str, Any]:
    base = cached_base_model(spec, device)
    concepts = synthetic_concepts(resolution) if data is None else folder_concepts_path(data, resolution)
    return {"concepts": concepts, **_encode(base, concepts, torch.device(device))}


def folder_concepts_path(data: str, resolution: int) -> ConceptSet:
    from pathlib import Path

    return folder_concepts(Path(data), resolution)


@torch.no_grad()
def _encode(base: BaseModel, concepts: ConceptSet, device: torch.device) -> dict[str, torch.Tensor]:
    """1) latents of the frozen VAE, once (not every step as the reference script does)."""

    def enc(items: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.stack([torch.from_numpy(im) for im, _ in items]).to(device)
        lat = base.vae.encode(images).latent_dist.mean * base.vae.config.scaling_factor
        return lat, torch.tensor([c for _, c in items], device=device)

    train_lat, train_cls = enc(concepts.train)
    val_lat, val_cls = enc(concepts.val) if concepts.val else enc(concepts.train)
    return {"train_lat": train_lat, "train_cls": train_cls, "val_lat": val_lat, "val_cls": val_cls}


class ConceptEmbedding(torch.nn.Module):
    """Token embedding whose placeholder rows (ids >= first_id) come from a trainable tensor.

    The base matrix stays frozen and shared, so no row but the concept rows can ever change.
    """

    def __init__(self, base: torch.nn.Embedding, first_id: int, rows: torch.Tensor) -> None:
        super().__init__()
        self.base = base
        self.first_id = first_id
        self.rows = torch.nn.Parameter(rows)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        is_new = input_ids >= self.first_id
        old = self.base(input_ids.clamp(max=self.first_id - 1))
        new = F.embedding((input_ids - self.first_id).clamp(min=0), self.rows)
        return torch.where(is_new.unsqueeze(-1), new.to(old.dtype), old)


def _embeddings_module(text_encoder: torch.nn.Module) -> torch.nn.Module:
    # transformers 5 dropped `.text_model` on some CLIP classes
    return getattr(text_encoder, "text_model", text_encoder).embeddings


def textual_inversion(
    params: Mapping[str, Any],
    *,
    model: str = "tiny",
    data: str | None = None,
    on_step: StepCallback | None = None,
) -> dict[str, Any]:
    """Train concept embeddings; returns val_loss, peak_mem_mb and what the trial learned."""
    cfg = resolve_params(params)
    device = pick_device()
    base = cached_base_model(model, device.type)
    resolution = cfg["resolution"] or base.resolution
    cache = _cached_latents(model, device.type, data, resolution)
    concepts: ConceptSet = cache["concepts"]
    gen = torch.Generator(device="cpu").manual_seed(cfg["seed"])
    started = time.perf_counter()

    # 2) placeholder tokens on a per-trial tokenizer; their rows in a fresh trainable tensor
    tokenizer = copy.deepcopy(base.tokenizer)
    nv = cfg["num_vectors"]
    tokens = [[f"{ph}" if nv == 1 else f"{ph}_{k}" for k in range(nv)] for ph in concepts.placeholders]
    flat = [t for group in tokens for t in group]
    if tokenizer.add_tokens(flat) != len(flat):
        raise ValueError(f"placeholder tokens {flat} clash with the tokenizer's vocabulary")
    first_id = tokenizer.convert_tokens_to_ids(flat[0])
    emb = _embeddings_module(base.text_encoder)
    base_tok = emb.token_embedding
    if first_id != base_tok.num_embeddings:
        raise ValueError("the tokenizer and the text encoder disagree on the vocabulary size")
    hidden = base_tok.embedding_dim
    if cfg["init_from"] == "random":
        rows = torch.randn(len(flat), hidden, generator=gen) * cfg["init_std"]
    else:
        word = cfg["init_from"][5:]
        ids = base.tokenizer(word, add_special_tokens=False).input_ids
        if len(ids) != 1:
            raise ValueError(f"init_from word {word!r} must be a single token, got {len(ids)} tokens")
        rows = base_tok.weight[ids[0]].detach().float().cpu().repeat(len(flat), 1)
    concept_emb = ConceptEmbedding(base_tok, first_id, rows.to(device))

    def ids_for(template: str) -> torch.Tensor:
        prompts = [template.format(" ".join(group)) for group in tokens]
        return tokenizer(
            prompts, padding="max_length", max_length=tokenizer.model_max_length,
            truncation=True, return_tensors="pt",
        ).input_ids.to(device)

    train_ids = torch.stack([ids_for(t) for t in TEMPLATES])  # (templates, concepts, L)
    val_ids = ids_for(VAL_TEMPLATE)

    unet, text_encoder, sched = base.unet, base.text_encoder, base.scheduler

    def denoise_loss(lat: torch.Tensor, ids: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        noisy = sched.add_noise(lat, noise, t)
        cond = text_encoder(ids)[0]
        pred = unet(noisy, t, encoder_hidden_states=cond).sample
        return F.mse_loss(pred.float(), noise.float())

    @torch.no_grad()
    def val_loss() -> float:
        vg = torch.Generator(device="cpu").manual_seed(VAL_NOISE_SEED)
        lat, cls = cache["val_lat"], cache["val_cls"]
        total = 0.0
        for tv in VAL_TIMESTEPS:
            noise = torch.randn(lat.shape, generator=vg).to(device)
            t = torch.full((lat.shape[0],), tv, device=device, dtype=torch.long)
            total += float(denoise_loss(lat, val_ids[cls], t, noise))
        return total / len(VAL_TIMESTEPS)

    emb.token_embedding = concept_emb
    try:
        val_init = val_loss()
        # 3) AdamW on the concept rows only, LR warmup from diffusers.optimization
        from diffusers.optimization import get_scheduler

        opt = torch.optim.AdamW([concept_emb.rows], lr=cfg["lr"], weight_decay=1e-2)
        lr_sched = get_scheduler(
            "constant_with_warmup", opt, num_warmup_steps=cfg["warmup_steps"],
            num_training_steps=cfg["steps"],
        )
        meter = MemoryMeter(device, [text_encoder, unet])
        lat_all, cls_all = cache["train_lat"], cache["train_cls"]
        history: dict[str, list[float]] = {"train_loss": [], "lr": []}
        # 4) epsilon-prediction MSE on cached latents
        for step in range(cfg["steps"]):
            idx = torch.randint(0, lat_all.shape[0], (cfg["batch_size"],), generator=gen)
            tmpl = torch.randint(0, len(TEMPLATES), (cfg["batch_size"],), generator=gen)
            lat = lat_all[idx.to(device)]
            noise = torch.randn(lat.shape, generator=gen).to(device)
            t = torch.randint(0, sched.config.num_train_timesteps, (lat.shape[0],), generator=gen).to(device)
            ids = train_ids[tmpl.to(device), cls_all[idx.to(device)]]
            with meter.step([concept_emb.rows]):
                loss = denoise_loss(lat, ids, t, noise)
                loss.backward()
            lr_now = opt.param_groups[0]["lr"]
            opt.step()
            lr_sched.step()
            opt.zero_grad(set_to_none=True)
            value = float(loss.detach())
            history["train_loss"].append(value)
            history["lr"].append(lr_now)
            if on_step is not None:
                on_step(step, {"train_loss": value, "lr": lr_now})
            if not math.isfinite(value):
                break
        peak = meter.peak_mb([concept_emb.rows], opt)
        final = val_loss()
        learned = concept_emb.rows.detach().float().cpu().clone()
    finally:
        emb.token_embedding = base_tok
    return {
        "val_loss": final,
        "peak_mem_mb": peak,
        "val_loss_init": val_init,
        "train_seconds": time.perf_counter() - started,
        "history": history,
        "tags": {"peak_mem_source": meter.source, "device": device.type},
        "embeddings": {tok: learned[i] for i, tok in enumerate(flat)},
    }

