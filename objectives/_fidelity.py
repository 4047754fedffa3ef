"""Concept fidelity of a trial's samples: how alike its drawings of a concept are to that
concept's training images, as the DreamBooth paper's CLIP-I / DINO scores (mean pairwise cosine
similarity of image embeddings, generated x real).

The image encoder runs offline: a local CLIP or DINO folder (`--fidelity-model PATH`), or, by
default, one derived from the base model itself: its VAE encoder's latent means, average-pooled
to 4x4 (colour and coarse layout, as these tiny worlds need).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

VISION_TYPES = {"clip": "clip", "clip_vision_model": "clip", "dinov2": "dino", "vit": "dino"}


def check_fidelity_model(value: str) -> str | None:
    """Why `--fidelity-model PATH` is unusable, or None. Cheap: reads two JSON files."""
    root = Path(value)
    if not root.is_dir():
        return f"--fidelity-model {value!r}: not a directory"
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return f"--fidelity-model {value!r}: no readable config.json ({exc.__class__.__name__})"
    kind = config.get("model_type")
    if kind not in VISION_TYPES:
        return (f"--fidelity-model {value!r}: model_type {kind!r} is not a CLIP or DINO image encoder "
                f"(one of {', '.join(VISION_TYPES)})")
    if not (root / "preprocessor_config.json").is_file():
        return f"--fidelity-model {value!r}: no preprocessor_config.json (save the image processor with the model)"
    if not any(root.glob("*.safetensors")) and not any(root.glob("*.bin")):
        return f"--fidelity-model {value!r}: no weights (*.safetensors or *.bin)"
    return None


class VaeEncoder:
    """The base model's own VAE as an image encoder."""

    name = "vae"

    def __init__(self, vae: Any) -> None:
        self.vae = vae

    def embed(self, images: np.ndarray) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        p = next(self.vae.parameters())
        x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))).to(p.device, p.dtype) * 2 - 1
        with torch.no_grad():
            lat = self.vae.encode(x).latent_dist.mean.float()
            return F.adaptive_avg_pool2d(lat, 4).flatten(1).cpu().numpy()


class VisionEncoder:
    """A local CLIP (image_embeds) or DINO (CLS token) folder, loaded once per process."""

    def __init__(self, path: str, device: Any) -> None:
        from transformers import AutoImageProcessor

        config = json.loads((Path(path) / "config.json").read_text())
        self.kind = VISION_TYPES[config["model_type"]]
        self.name = f"{self.kind}:{Path(path).name}"
        self.processor = AutoImageProcessor.from_pretrained(path, local_files_only=True)
        if self.kind == "clip":
            from transformers import CLIPVisionModelWithProjection

            self.model = CLIPVisionModelWithProjection.from_pretrained(path, local_files_only=True)
        else:
            from transformers import AutoModel

            self.model = AutoModel.from_pretrained(path, local_files_only=True)
        self.model.to(device).eval()
        self.device = device

    def embed(self, images: np.ndarray) -> np.ndarray:
        import torch

        batch = self.processor(images=list((images * 255).round().astype("uint8")), return_tensors="pt")
        with torch.no_grad():
            out = self.model(pixel_values=batch["pixel_values"].to(self.device))
        feats = out.image_embeds if self.kind == "clip" else out.last_hidden_state[:, 0]
        return feats.float().cpu().numpy()


def fidelity(encoder: Any, samples: Mapping[str, np.ndarray], real: Mapping[str, Sequence[np.ndarray]]) -> dict[str, float]:
    """Per concept and overall: mean pairwise cosine similarity of its samples' embeddings with
    its training images' embeddings; with several concepts, per concept whether most of its
    samples, each on its own, are more alike its own training images than any other concept's
    (`shows/NAME`: 1 or 0), and the share of concepts that hold (`concepts_shown`). `samples[name]`: (..., H, W, 3), `real[name]`:
    images (H, W, 3), all in [0, 1]."""

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    out: dict[str, float] = {}
    reals = {name: unit(encoder.embed(np.stack(imgs))) for name, imgs in real.items() if len(imgs)}
    shown: list[float] = []
    for name, drawn in samples.items():
        if name not in reals:
            continue
        a = unit(encoder.embed(drawn.reshape(-1, *drawn.shape[-3:])))
        per_sample = {other: (a @ b.T).mean(axis=1) for other, b in reals.items()}  # each sample's likeness
        out[f"fidelity/{name}"] = float(per_sample[name].mean())
        if len(reals) > 1:  # most of its samples, each on its own, look most like their own concept
            own = np.all([per_sample[name] >= v for v in per_sample.values()], axis=0)
            out[f"shows/{name}"] = float(own.mean() > 0.5)
            shown.append(out[f"shows/{name}"])
    if out:
        out["fidelity"] = float(np.mean([v for k, v in out.items() if k.startswith("fidelity/")]))
    if shown:
        out["concepts_shown"] = float(np.mean(shown))  # the share of concepts whose samples show them
    return out
