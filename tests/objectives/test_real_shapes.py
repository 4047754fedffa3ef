"""The published SD 1.5 and SDXL architectures with seeded random weights (`random:sd15`,
`random:sdxl`): their shapes, and a trial on the real shapes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from objectives._model import random_parts

# parameter counts of the published models (runwayml/stable-diffusion-v1-5,
# stabilityai/stable-diffusion-xl-base-1.0; the text encoders with CLIP's 49,408-token vocabulary)
PUBLISHED = {
    "random:sd15": {"unet": 859_520_964, "vae": 83_653_863, "text_encoders": [123_060_480]},
    "random:sdxl": {"unet": 2_567_463_684, "vae": 83_653_863, "text_encoders": [123_060_480, 694_659_840]},
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_the_architectures_have_the_published_parameter_counts(name):
    """Built on the meta device (no memory): every module's parameter count is the published one."""
    with torch.device("meta"), tempfile.TemporaryDirectory() as tmp:
        parts = random_parts(name, Path(tmp))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    want = PUBLISHED[name]
    assert count(parts["unet"]) == want["unet"] and count(parts["vae"]) == want["vae"]
    assert [count(t) for t in parts["text_encoders"]] == want["text_encoders"]
    assert all(len(t) == 49408 for t in parts["tokenizers"])


@pytest.mark.slow
def test_a_trial_on_the_sd15_shapes_orders_memory_as_the_knobs_say(tmp_path):
    """Two steps at 64 px, batch 1, on the SD 1.5 architecture (two images of one concept, so that
    validation is one image): gradient checkpointing lowers peak memory at the same config and
    keeps the loss; a rank-16 LoRA on the text encoder holds more than a rank-4 one."""
    import numpy as np
    from PIL import Image

    from objectives._textual_inversion import cached_base_model, train

    for i in range(2):
        Image.fromarray((np.random.default_rng(i).random((64, 64, 3)) * 255).astype(np.uint8)).save(tmp_path / f"{i}.png")
    torch.set_num_threads(2)
    base = {"steps": 2, "val_every": 2, "resolution": 64, "batch_size": 1, "lr": 1e-4, "lora_targets": "text"}
    runs = {key: train({**base, **extra}, model="random:sd15", data=str(tmp_path)).result
            for key, extra in {"r4": {"lora_rank": 4}, "r4-ckpt": {"lora_rank": 4, "gradient_checkpointing": True},
                               "r16": {"lora_rank": 16}}.items()}
    cached_base_model.cache_clear()  # 4 GB: not kept for the tests after this one
    assert runs["r4-ckpt"]["peak_mem_mb"] < runs["r4"]["peak_mem_mb"] < runs["r16"]["peak_mem_mb"]
    assert runs["r4-ckpt"]["val_loss"] == pytest.approx(runs["r4"]["val_loss"], rel=1e-4)
    assert runs["r4"]["peak_mem_mb"] > 3000  # the real model is there: its weights alone are ~4 GB
