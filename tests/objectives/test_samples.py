"""Sample grids and concept fidelity, as a trial produces them."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from objectives import SampleConfig
from objectives import SYNTHETIC_CONCEPTS
from objectives import textual_inversion

SMALL = {"seeds": 2, "steps": 4}


def _grid(blob: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))


def test_sample_settings_accept_what_users_write():
    cfg = SampleConfig.from_mapping({"prompts": ["a photo of {concept}"], "seeds": [3, 7], "steps": 5,
                                     "scheduler": "euler", "guidance_scale": 1})
    assert cfg.seeds == (3, 7) and cfg.steps == 5 and cfg.scheduler == "euler" and cfg.guidance_scale == 1.0
    assert SampleConfig.from_mapping({"seeds": 3}).seeds == (0, 1, 2)
    assert SampleConfig.from_mapping(SampleConfig().to_dict()) == SampleConfig()


@pytest.mark.parametrize("knobs", [{"freeze": "top_layers", "unfreeze_layers": 1},
                                   {"freeze": "attention_only", "lora_rank": 2, "lora_targets": "text"}])
def test_a_bf16_trial_that_trains_encoder_weights_draws_its_samples(knobs):
    """In bf16 the weights a freeze mode trains are fp32 beside the base's bf16 ones; the samples'
    pipeline runs under autocast as training does (it stopped at the first such layer before:
    "mat1 and mat2 must have the same dtype")."""
    out = textual_inversion({"steps": 2, "precision": "bf16", **knobs}, samples={"seeds": [0], "steps": 2})
    for name in SYNTHETIC_CONCEPTS:
        grid = _grid(out["artifacts"][f"samples/{name}.png"])
        assert grid.shape == (32, 32, 3) and grid.std() > 0
    assert np.isfinite(out["fidelity"])


@pytest.mark.parametrize("model", ["tiny", "tiny-sdxl"])
def test_every_trial_draws_the_same_fixed_grid_per_concept(model):
    """A grid per concept (a row per prompt, a column per seed), identical when the trial is
    repeated, so that grids of different trials compare side by side; fidelity is logged."""
    runs = [textual_inversion({"steps": 2, "seed": 1}, model=model, samples=SMALL) for _ in range(2)]
    out = runs[0]
    cfg = SampleConfig.from_mapping(SMALL)
    for name in SYNTHETIC_CONCEPTS:
        a, b = (_grid(r["artifacts"][f"samples/{name}.png"]) for r in runs)
        assert np.array_equal(a, b)
        assert a.shape == (32 * len(cfg.prompts), 32 * len(cfg.seeds), 3)
        assert a.std() > 0  # not a blank image
        assert -1 <= out[f"fidelity/{name}"] <= 1
    assert out["fidelity"] == pytest.approx(np.mean([out[f"fidelity/{n}"] for n in SYNTHETIC_CONCEPTS]))
    assert out["sample_seconds"] > 0
    off = textual_inversion({"steps": 2, "seed": 1}, model=model)
    assert not any(k.startswith("samples/") for k in off["artifacts"]) and "fidelity" not in off


def test_fidelity_with_a_local_clip_folder(tmp_path):
    """--fidelity-model PATH: a local CLIP vision folder scores the samples (offline)."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    from objectives import check_fidelity_model

    import torch

    torch.manual_seed(0)
    config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=32, patch_size=8, projection_dim=16)
    CLIPVisionModelWithProjection(config).save_pretrained(tmp_path / "clip")
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(tmp_path / "clip")
    assert check_fidelity_model(str(tmp_path / "clip")) is None
    out = textual_inversion({"steps": 2}, samples={**SMALL, "fidelity_model": str(tmp_path / "clip")})
    default = textual_inversion({"steps": 2}, samples=SMALL)
    assert -1 <= out["fidelity"] <= 1 and out["fidelity"] != default["fidelity"]


def test_the_samples_say_which_concepts_they_show(monkeypatch):
    """Issue 45, item 3: samples that look more like another concept's training images than like
    their own do not show their concept, and the gallery says so per trial."""
    import numpy as np

    from objectives._fidelity import fidelity

    class Mean:  # an image's mean colour as its embedding
        def embed(self, images):
            return images.reshape(len(images), -1, 3).mean(1)

    red, blue = np.zeros((2, 8, 8, 3)), np.zeros((2, 8, 8, 3))
    red[..., 0], blue[..., 2] = 1.0, 1.0
    real = {"red": list(red), "blue": list(blue)}
    right = fidelity(Mean(), {"red": red[None], "blue": blue[None]}, real)
    assert right["shows/red"] == right["shows/blue"] == 1.0 and right["concepts_shown"] == 1.0
    swapped = fidelity(Mean(), {"red": blue[None], "blue": blue[None]}, real)
    assert swapped["shows/red"] == 0.0 and swapped["shows/blue"] == 1.0 and swapped["concepts_shown"] == 0.5
    one = fidelity(Mean(), {"red": red[None]}, {"red": list(red)})  # one concept: nothing to tell apart
    assert "concepts_shown" not in one and one["fidelity"] == pytest.approx(1.0)

    from types import SimpleNamespace

    import pandas as pd

    from reports._gallery import gallery_html

    row = {"trial": 3, "state": "COMPLETE", "val_loss": 0.1, "peak_mem_mb": 5.0, "fidelity": 0.4,
           "concepts_shown": "blue", "concepts_not_shown": "red", "health": "ok", "outcome": "ok"}
    rep = SimpleNamespace(front=pd.DataFrame([row]), ok=pd.DataFrame([row]), trials=pd.DataFrame([row]), params=[])
    import reports._gallery as G

    monkeypatch.setattr(G, "gallery_rows", lambda rep, samples: [("front", pd.Series(row), {"red": "data:,"})])
    page = gallery_html(rep, None)
    assert "its samples do not show red (they show blue)" in page
