"""Sample images of what a trial learned, drawn by the real diffusers pipeline.

Every trial of every study draws the same grid (per concept: the same prompts x the same seeds,
the same scheduler and steps), so that grids compare side by side. The pipeline is the shared
base model plus the trial's exports loaded the way a user loads them
(`load_textual_inversion`; the trial's LoRA'd UNet / text encoders as trained).
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

# scheduler names of `samples.scheduler` -> diffusers class (imported only when drawing)
SCHEDULERS = {
    "ddim": "DDIMScheduler",
    "ddpm": "DDPMScheduler",
    "euler": "EulerDiscreteScheduler",
    "euler_a": "EulerAncestralDiscreteScheduler",
    "dpm++": "DPMSolverMultistepScheduler",
    "pndm": "PNDMScheduler",
}
PLACEHOLDER = "{concept}"
BATCH = 16  # images per pipeline call


@dataclass(frozen=True)
class SampleConfig:
    """What every trial draws: per concept, `prompts` (each naming the concept as
    "{concept}") x `seeds`, `steps` denoising steps of `scheduler`."""

    enabled: bool = True
    # the defaults keep the samples under 10% of a default trial's time on the tiny model
    prompts: tuple[str, ...] = ("a photo of {concept}",)
    seeds: tuple[int, ...] = (0, 1)
    steps: int = 8
    scheduler: str = "dpm++"
    guidance_scale: float = 4.0
    fidelity_model: str = ""  # a local CLIP / DINO folder; "" = the base model's own VAE

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any] | None) -> SampleConfig:
        """Raises ValueError naming the key and its rule."""
        m = dict(m or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(m) - known)
        if unknown:
            raise ValueError(f"samples: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        out: dict[str, Any] = {}
        if "enabled" in m:
            if not isinstance(m["enabled"], bool):
                raise ValueError(f"samples.enabled must be true or false, got {m['enabled']!r}")
            out["enabled"] = m["enabled"]
        if "prompts" in m:
            prompts = m["prompts"]
            if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
                raise ValueError(f"samples.prompts must be a non-empty list of prompts, got {prompts!r}")
            for p in prompts:
                if not isinstance(p, str) or PLACEHOLDER not in p:
                    raise ValueError(f"samples.prompts: {p!r} must name the concept as {PLACEHOLDER}")
            out["prompts"] = tuple(prompts)
        if "seeds" in m:
            seeds = m["seeds"]
            if isinstance(seeds, bool) or not isinstance(seeds, (int, Sequence)) or isinstance(seeds, str):
                raise ValueError(f"samples.seeds must be a count >= 1 or a list of seeds >= 0, got {seeds!r}")
            if isinstance(seeds, int):
                if seeds < 1:
                    raise ValueError(f"samples.seeds must be a count >= 1 or a list of seeds >= 0, got {seeds}")
                seeds = list(range(seeds))
            if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
                raise ValueError(f"samples.seeds must be a count >= 1 or a list of seeds >= 0, got {m['seeds']!r}")
            out["seeds"] = tuple(seeds)
        if "steps" in m:
            steps = m["steps"]
            if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 1000:
                raise ValueError(f"samples.steps must be an integer in 1..1000, got {steps!r}")
            out["steps"] = steps
        if "scheduler" in m:
            if m["scheduler"] not in SCHEDULERS:
                raise ValueError(f"samples.scheduler must be one of {', '.join(SCHEDULERS)}, got {m['scheduler']!r}")
            out["scheduler"] = m["scheduler"]
        if "guidance_scale" in m:
            g = m["guidance_scale"]
            if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 <= g <= 50:
                raise ValueError(f"samples.guidance_scale must be a number in 0..50, got {g!r}")
            out["guidance_scale"] = float(g)
        if m.get("fidelity_model"):
            from ._fidelity import check_fidelity_model

            err = check_fidelity_model(str(m["fidelity_model"]))
            if err:
                raise ValueError(err)
            out["fidelity_model"] = str(m["fidelity_model"])
        return cls(**out)

    def to_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "prompts": list(self.prompts), "seeds": list(self.seeds),
                "steps": self.steps, "scheduler": self.scheduler, "guidance_scale": self.guidance_scale,
                "fidelity_model": self.fidelity_model}


@dataclass
class Samples:
    """A trial's drawings: per concept an array (prompts, seeds, H, W, 3) in [0, 1]."""

    images: dict[str, Any] = field(default_factory=dict)

    def grid_png(self, name: str) -> bytes:
        """One concept's grid, a row per prompt, a column per seed, as PNG bytes."""
        import numpy as np
        from PIL import Image

        arr = self.images[name]
        rows = [np.concatenate(list(row), axis=1) for row in arr]
        grid = (np.concatenate(rows, axis=0) * 255).round().clip(0, 255).astype("uint8")
        buf = io.BytesIO()
        Image.fromarray(grid).save(buf, format="PNG")
        return buf.getvalue()


def draw_samples(
    base: Any, text_encoders: Sequence[Any], unet: Any, exports: Mapping[str, bytes],
    names: Sequence[str], cfg: SampleConfig, device: Any, autocast: Any = contextlib.nullcontext(),
) -> Samples:
    """Per concept, every prompt x seed, through StableDiffusion(XL)Pipeline, under the trial's
    `autocast` (its Denoiser's: in bf16 / fp16 the weights a freeze mode trains are fp32 beside
    the base's half-precision ones, as in training). `text_encoders` and `unet` are the trial's
    (the base's own where it trained none of them); the encoders are
    copied, their token embeddings alone with their weights (loading an embedding writes its rows
    there), the rest as structures over the same weights (an SDXL encoder pair is 3.3 GB)."""
    import diffusers
    import numpy as np
    import torch
    from safetensors.torch import load

    from ._trainables import over_same_weights

    encoders = [over_same_weights(te, except_=(te.get_input_embeddings().weight,)) for te in text_encoders]
    tokenizers = [copy.deepcopy(t) for t in base.tokenizers]
    sched = getattr(diffusers, SCHEDULERS[cfg.scheduler]).from_config(base.scheduler.config)
    common = dict(vae=base.vae, unet=unet, scheduler=sched)
    if base.is_sdxl:
        pipe = diffusers.StableDiffusionXLPipeline(
            text_encoder=encoders[0], text_encoder_2=encoders[1], tokenizer=tokenizers[0],
            tokenizer_2=tokenizers[1], **common)
    else:
        pipe = diffusers.StableDiffusionPipeline(
            text_encoder=encoders[0], tokenizer=tokenizers[0], safety_checker=None, feature_extractor=None,
            requires_safety_checker=False, **common)
    pipe.set_progress_bar_config(disable=True)
    for name in names:
        state = load(exports[f"concepts/{name}/learned_embeds.safetensors"])
        token = f"<{name}>"
        if base.is_sdxl:
            pipe.load_textual_inversion(state["clip_l"], token=token, text_encoder=pipe.text_encoder,
                                        tokenizer=pipe.tokenizer)
            pipe.load_textual_inversion(state["clip_g"], token=token, text_encoder=pipe.text_encoder_2,
                                        tokenizer=pipe.tokenizer_2)
        else:
            pipe.load_textual_inversion(state[token], token=token)
    out = Samples()
    n_p, n_s = len(cfg.prompts), len(cfg.seeds)
    size = base.resolution
    extra = {"original_size": (size, size), "target_size": (size, size)} if base.is_sdxl else {}
    jobs = [(name, p.replace(PLACEHOLDER, f"<{name}>"), s) for name in names for p in cfg.prompts for s in cfg.seeds]
    images = []
    with torch.no_grad(), autocast:
        for i in range(0, len(jobs), BATCH):  # a few pipeline calls, not one per image
            chunk = jobs[i: i + BATCH]
            images += list(pipe([j[1] for j in chunk],
                                generator=[torch.Generator(device="cpu").manual_seed(j[2]) for j in chunk],
                                num_inference_steps=cfg.steps, height=size, width=size,
                                guidance_scale=cfg.guidance_scale, output_type="np", **extra).images)
    per = n_p * n_s
    for k, name in enumerate(names):
        out.images[name] = np.asarray(images[k * per: (k + 1) * per], dtype=np.float32).reshape(n_p, n_s, size, size, 3)
    return out


def model_resolution(model: str) -> int:
    """The pixel size a base model draws at, read from its config files (no weights loaded)."""
    from ._model import TINY_MODELS, TINY_RESOLUTION
    from ._single_file import config_source

    model = config_source(model)
    if model in TINY_MODELS:
        return TINY_RESOLUTION
    if model in ("random:sd15", "random:sdxl"):
        return 512 if model == "random:sd15" else 1024
    import json

    unet = json.loads((Path(model) / "unet" / "config.json").read_text())
    vae = json.loads((Path(model) / "vae" / "config.json").read_text())
    return int(unet["sample_size"]) * 2 ** (len(vae["block_out_channels"]) - 1)


def data_digest(model: str, data: str | None, fixed: dict | None = None) -> str:
    """One digest of the training and validation data a trial of this model sees (with the
    study's fixed data settings: crop, flip, learnable_property)."""
    from ._data import DATA_SETTINGS, dataset_inputs

    settings = tuple((k, (fixed or {})[k]) for k in DATA_SETTINGS if k in (fixed or {}))
    return "-".join(d["digest"] for d in dataset_inputs(model_resolution(model), data, settings))


def training_grids(model: str, data: str | None) -> dict[str, bytes]:
    """Per concept, its training images side by side (PNG), for the study's parent run."""
    import numpy as np

    from ._data import folder_concepts, synthetic_concepts

    res = model_resolution(model)
    concepts = synthetic_concepts(res) if data is None else folder_concepts(Path(data), res)
    out = {}
    for ci, name in enumerate(concepts.names):
        images = [(im.transpose(1, 2, 0) + 1) / 2 for im, c in concepts.train if c == (ci,)]
        if images:
            out[name] = Samples({name: np.stack(images)[None]}).grid_png(name)
    return out
