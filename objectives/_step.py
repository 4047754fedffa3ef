"""One training step's parts: the model as a denoiser of prompts, a batch drawn from the trial's
generator, and its loss (epsilon-prediction MSE with min-SNR weights, plus the in-batch
contrastive margin term)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ._condition import condition
from ._params import Knobs
from ._prompts import Prompts
from ._trainables import ConceptEmbedding


@dataclass
class Denoiser:
    """The trial's text encoders and UNet as one noise predictor of prompt ids."""

    encoders: list[torch.nn.Module]
    unet: torch.nn.Module
    resolution: int
    autocast: Any  # a context: torch.autocast for bf16 / fp16, else nothing

    def encode(self, ids: list[torch.Tensor]) -> tuple[torch.Tensor, Any]:
        return condition(self.encoders, ids, resolution=self.resolution)

    def denoise(self, noisy: torch.Tensor, t: torch.Tensor, cond: tuple[torch.Tensor, Any]) -> torch.Tensor:
        """The UNet's noise prediction under an encoded prompt (encode()'s answer)."""
        return self.unet(noisy, t, encoder_hidden_states=cond[0], added_cond_kwargs=cond[1]).sample

    def predict(self, noisy: torch.Tensor, t: torch.Tensor, ids: list[torch.Tensor]) -> torch.Tensor:
        return self.denoise(noisy, t, self.encode(ids))


def autocast_for(precision: str, device: torch.device, dtype: torch.dtype) -> Any:
    return contextlib.nullcontext() if precision == "fp32" else torch.autocast(device.type, dtype=dtype)


def errors(pred: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Per-sample mean squared error."""
    return ((pred.float() - noise.float()) ** 2).mean(dim=(1, 2, 3))


@dataclass
class Batch:
    noisy: torch.Tensor
    noise: torch.Tensor
    t: torch.Tensor
    combo: torch.Tensor  # per sample, its concept combination
    ids: list[torch.Tensor]  # per encoder, per sample its prompt's ids
    scale: torch.Tensor  # per sample and position, the concept token's gradient factor
    weight: torch.Tensor  # per sample, its loss weight


def view_of(knobs: Knobs, views: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """Per sample, which view of its image it trains on: a crop window at random (crop=random),
    mirrored with probability `flip` (the mirrored views are the second half)."""
    flipped = knobs.flip > 0
    windows = views // 2 if flipped else views
    out = torch.randint(0, windows, (n,), generator=gen) if windows > 1 else torch.zeros(n, dtype=torch.long)
    if flipped:
        out = out + windows * (torch.rand(n, generator=gen) < knobs.flip).long()
    return out


def loss_weights(sched: Any, t: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per-sample loss weights: min-SNR-gamma for epsilon prediction, min(SNR(t), gamma) / SNR(t)
    (SNR from diffusers' compute_snr); ones when gamma is 0."""
    if gamma <= 0:
        return torch.ones(t.shape[0], device=t.device)
    from diffusers.training_utils import compute_snr

    snr = compute_snr(sched, t).float()
    return torch.clamp(snr, max=gamma) / snr


def draw_batch(knobs: Knobs, data: dict[str, Any], prompts: Prompts, sched: Any, gen: torch.Generator,
               device: torch.device) -> Batch:
    """Images (kohya's repeats weigh the draw), a template each, a crop window and flip, noise
    (with its offset) and a timestep, the prompts (an image's own caption where it has one, the
    empty prompt at the caption dropout's rate); every draw from `gen`, in this order."""
    lat_all, combo_all = data["train_lat"], data["train_combo"]
    if prompts.weights is None:
        idx = torch.randint(0, lat_all.shape[0], (knobs.batch_size,), generator=gen).to(device)
    else:
        idx = torch.multinomial(prompts.weights, knobs.batch_size, replacement=True, generator=gen).to(device)
    tmpl = torch.randint(0, prompts.templates, (knobs.batch_size,), generator=gen).to(device)
    lat, combo = lat_all[idx], combo_all[idx]
    if data["train_views"] is not None:  # a crop window and a flip per sample
        lat = data["train_views"][idx, view_of(knobs, data["train_views"].shape[1], len(idx), gen).to(device)]
    noise = torch.randn(lat.shape, generator=gen)
    if knobs.noise_offset > 0:  # a constant per sample and channel
        noise = noise + knobs.noise_offset * torch.randn((*lat.shape[:2], 1, 1), generator=gen)
    noise = noise.to(device, lat.dtype)
    t = torch.randint(0, sched.config.num_train_timesteps, (lat.shape[0],), generator=gen).to(device)
    noisy = sched.add_noise(lat, noise, t)
    ids = [ti[tmpl, combo] for ti in prompts.train_ids]
    scale = prompts.train_scale[tmpl, combo]
    if prompts.caption_ids is not None:
        own = prompts.has_caption[idx]
        ids = [torch.where(own[:, None], ci[idx], i) for ci, i in zip(prompts.caption_ids, ids)]
        scale = torch.where(own[:, None], prompts.caption_scale[idx], scale)
    if knobs.caption_dropout > 0:
        drop = (torch.rand(lat.shape[0], generator=gen) < knobs.caption_dropout).to(device)
        ids = [torch.where(drop[:, None], e.expand_as(i), i) for i, e in zip(ids, prompts.empty_ids)]
    return Batch(noisy, noise, t, combo, ids, scale, loss_weights(sched, t, knobs.min_snr_gamma))


def batch_loss(model: Denoiser, concepts: list[ConceptEmbedding], knobs: Knobs,
               b: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(the loss to step on, its denoising part, the contrastive term or None). With a
    contrastive weight every image is denoised under every prompt of the batch: a prompt's own
    image must come out at least `contrastive_margin` better than another concept's."""
    with model.autocast:
        if knobs.contrastive_weight <= 0:
            for ce in concepts:
                ce.grad_scale = b.scale
            loss_main = (errors(model.predict(b.noisy, b.t, b.ids), b.noise) * b.weight).mean()
            return loss_main, loss_main, None
        n, device = b.noisy.shape[0], b.noisy.device
        ii = torch.arange(n, device=device).repeat_interleave(n)
        jj = torch.arange(n, device=device).repeat(n)
        for ce in concepts:
            ce.grad_scale = b.scale[jj]
        err = errors(model.predict(b.noisy[ii], b.t[ii], [x[jj] for x in b.ids]), b.noise[ii]).view(n, n)
        s = -err
        different = (b.combo[:, None] != b.combo[None, :])
        gap = s.diagonal()[:, None] - s
        term = F.relu(knobs.contrastive_margin - gap)[different].mean() if bool(different.any()) else err.sum() * 0
        loss_main = (err.diagonal() * b.weight).mean()
        return loss_main + knobs.contrastive_weight * term, loss_main, term
