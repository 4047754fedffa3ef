"""The tiny world the built-in models live in: captioned coloured shapes, and the seeded
pretraining that teaches the tiny models to draw them.

Two stages, both deterministic for a given torch build and thread count:
1. the VAE learns to reconstruct the shapes (so that decoded latents are pictures, not noise);
2. the UNet and the text encoder(s) learn to denoise those latents given the caption (10% of
   captions dropped, as SD does, so that classifier-free guidance works in the pipelines).

`scripts/build_tiny_models.py` runs this and writes the shipped weights; `measure_colour` is the
simple picture measure the tests use: which palette colour an image shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ._data import COLORS, SHAPES, TEMPLATES, draw

WORLD_PRETRAIN = {
    "seed": 0,
    "vae_steps": 800, "vae_batch": 32, "vae_lr": 2e-3, "kl_weight": 1e-5,
    "steps": 2000, "batch_size": 32, "lr": 2e-3, "images_per_caption": 48, "caption_dropout": 0.1,
}
# tiny-sdxl exists to exercise the SDXL code paths (two encoders, pooled text, time ids); it is
# pretrained for less, to keep its build short
WORLD_OVERRIDES = {"tiny-sdxl": {"vae_steps": 400, "steps": 600}}
Progress = Callable[[str, int, int], None]


def world_captions() -> list[tuple[str, str]]:
    return [(c, s) for c in COLORS for s in SHAPES]


def _images(rng: np.random.Generator, n_per: int, res: int) -> tuple[torch.Tensor, torch.Tensor]:
    combos = world_captions()
    images, labels = [], []
    for i, (color, shape) in enumerate(combos):
        images += [draw(color, shape, rng, res) for _ in range(n_per)]
        labels += [i] * n_per
    return torch.from_numpy(np.stack(images)), torch.tensor(labels)


def train_vae(vae: Any, *, seed: int, steps: int, batch: int, lr: float, kl_weight: float, res: int,
              progress: Progress | None = None) -> None:
    """Reconstruction (+ a small KL) on freshly drawn shapes: an autoencoder for this world."""
    from diffusers.optimization import get_scheduler

    rng = np.random.default_rng(seed + 1)
    gen = torch.Generator().manual_seed(seed + 1)
    vae.train().requires_grad_(True)
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    sched = get_scheduler("cosine", opt, num_warmup_steps=steps // 20, num_training_steps=steps)
    combos = world_captions()
    for step in range(steps):
        picks = rng.integers(0, len(combos), size=batch)
        x = torch.from_numpy(np.stack([draw(*combos[k], rng, res) for k in picks]))
        post = vae.encode(x).latent_dist
        z = post.mean + post.std * torch.randn(post.mean.shape, generator=gen)
        recon = vae.decode(z).sample
        loss = F.mse_loss(recon, x) + kl_weight * post.kl().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if progress is not None:
            progress("vae", step + 1, steps)
    vae.eval().requires_grad_(False)


def pretrain_world(parts: dict[str, Any], *, res: int, progress: Progress | None = None,
                   **overrides: Any) -> dict[str, float]:
    """Both stages on the components of `_model._tiny_components`; returns the final losses."""
    from diffusers.optimization import get_scheduler

    from ._condition import condition

    cfg = {**WORLD_PRETRAIN, **overrides}
    tok, encoders, unet, vae, sched = (
        parts["tokenizers"][0], parts["text_encoders"], parts["unet"], parts["vae"], parts["scheduler"]
    )
    train_vae(vae, seed=cfg["seed"], steps=cfg["vae_steps"], batch=cfg["vae_batch"], lr=cfg["vae_lr"],
              kl_weight=cfg["kl_weight"], res=res, progress=progress)
    rng = np.random.default_rng(cfg["seed"])
    images, labels = _images(rng, cfg["images_per_caption"], res)
    with torch.no_grad():
        raw = torch.cat([vae.encode(chunk).latent_dist.mean for chunk in images.split(256)])
        recon_err = float(F.mse_loss(vae.decode(raw[:256]).sample, images[:256]))
    # as SD's 0.18215: the factor that gives the latents unit variance
    vae.register_to_config(scaling_factor=round(1.0 / float(raw.std()), 4))
    latents = raw * vae.config.scaling_factor
    combos = world_captions()
    prompts = [t.format(f"a {c} {s}") for c, s in combos for t in TEMPLATES] + [""]
    ids = tok(prompts, padding="max_length", max_length=tok.model_max_length, return_tensors="pt").input_ids
    empty = len(prompts) - 1
    gen = torch.Generator().manual_seed(cfg["seed"])
    for module in [unet, *encoders]:
        module.train().requires_grad_(True)
    params = [p for m in [unet, *encoders] for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=1e-2)
    steps, b = cfg["steps"], cfg["batch_size"]
    lr_sched = get_scheduler("cosine", opt, num_warmup_steps=steps // 20, num_training_steps=steps)
    ema, loss_value = None, float("nan")
    for step in range(steps):
        idx = torch.randint(0, len(labels), (b,), generator=gen)
        lat = latents[idx]
        noise = torch.randn(lat.shape, generator=gen)
        t = torch.randint(0, sched.config.num_train_timesteps, (b,), generator=gen)
        which = labels[idx] * len(TEMPLATES) + torch.randint(0, len(TEMPLATES), (b,), generator=gen)
        drop = torch.rand(b, generator=gen) < cfg["caption_dropout"]
        batch_ids = ids[torch.where(drop, torch.full_like(which, empty), which)]
        cond, added = condition(encoders, [batch_ids] * len(encoders), resolution=res)
        pred = unet(sched.add_noise(lat, noise, t), t, encoder_hidden_states=cond, added_cond_kwargs=added).sample
        loss = F.mse_loss(pred, noise)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        lr_sched.step()
        opt.zero_grad(set_to_none=True)
        loss_value = float(loss.detach())
        ema = loss_value if ema is None else 0.98 * ema + 0.02 * loss_value
        if progress is not None:
            progress("denoiser", step + 1, steps)
    for module in [unet, *encoders]:
        module.eval().requires_grad_(False)
    return {"vae_recon_mse": recon_err, "denoise_loss_ema": float(ema or loss_value)}


PALETTE = np.array(list(COLORS.values()), dtype=np.float32)  # rows in COLORS order


def measure_colour(image: np.ndarray) -> tuple[str | None, float]:
    """The palette colour an image (H, W, 3 in [0, 1]) shows, and the share of its pixels that
    show it. A pixel shows a colour when it is bright and saturated and nearest to that colour;
    the image shows the colour most of its such pixels show (None when it has none)."""
    px = image.reshape(-1, 3).astype(np.float32)
    vivid = (px.max(axis=1) > 0.5) & (px.max(axis=1) - px.min(axis=1) > 0.35)
    if not vivid.any():
        return None, 0.0
    d = ((px[vivid, None, :] - PALETTE[None]) ** 2).sum(-1)
    votes = np.bincount(d.argmin(axis=1), minlength=len(PALETTE))
    k = int(votes.argmax())
    return list(COLORS)[k], float(votes[k]) / len(px)
