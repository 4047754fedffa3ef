"""The embedded default draws, and what a trial teaches it shows in the pictures: measured on
the pixels (which palette colour a picture shows), not on the loss."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from objectives._data import COLORS, SHAPES, SYNTHETIC_CONCEPTS
from objectives._model import TINY_RESOLUTION, shipped_dir
from objectives import textual_inversion
from objectives._world import measure_colour

pytestmark = pytest.mark.slow  # draws a few dozen pictures with the real pipeline

SEEDS = list(range(6))
SAMPLES = {"prompts": ["a photo of {concept}"], "seeds": SEEDS}


def _cells(png: bytes) -> list[np.ndarray]:
    grid = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float32) / 255
    r = TINY_RESOLUTION
    return [grid[i:i + r, j:j + r] for i in range(0, grid.shape[0], r) for j in range(0, grid.shape[1], r)]


def _share_showing_own_colour(result: dict) -> float:
    """Over every concept's samples: the share that show the concept's colour."""
    hits = []
    for name in SYNTHETIC_CONCEPTS:
        colour = name.split("-")[0]
        hits += [measure_colour(c)[0] == colour for c in _cells(result["artifacts"][f"samples/{name}.png"])]
    return float(np.mean(hits))


def test_the_shipped_model_loads_in_seconds_and_draws_the_captions_it_learned(tmp_path):
    import time

    import diffusers

    assert (shipped_dir("tiny") / "model_index.json").is_file(), "the tiny model's weights ship with the package"
    started = time.perf_counter()
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(str(shipped_dir("tiny")), local_files_only=True)
    assert time.perf_counter() - started < 60  # a generous bound; README has the measured figure
    pipe.scheduler = diffusers.DDIMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    import torch

    def colours(prompts: list[str]) -> list[str | None]:
        gens = [torch.Generator().manual_seed(s) for s in range(len(prompts))]
        images = pipe(prompts, generator=gens, num_inference_steps=10, guidance_scale=4.0, height=32, width=32,
                      output_type="np").images
        return [measure_colour(im)[0] for im in images]

    asked = [(c, s) for c in COLORS for s in SHAPES[:2] for _ in range(2)]
    got = colours([f"a photo of a {c} {s}" for c, s in asked])
    trained = np.mean([g == c for g, (c, _) in zip(got, asked)])
    # the same colours asked of captions that name none: what the picture shows is then chance
    other = colours([f"a photo of a {w}" for w in ("dog", "cat", "toy", "thing")] * 4)
    chance = np.mean([g == c for g, (c, _) in zip(other, asked)])
    assert trained >= 0.75 and trained >= chance + 0.4, (trained, chance, got)


def test_textual_inversion_teaches_the_concept_and_bad_knobs_do_worse():
    """(b) a well-configured trial makes each concept's colour more present in its samples than
    the untrained placeholder does; (c) a badly configured one (init_std and lr far too large)
    does worse than the good one."""
    untrained = textual_inversion({"steps": 1, "lr": 1e-9, "seed": 0}, samples=SAMPLES)
    good = textual_inversion({"steps": 120, "lr": 2e-2, "init_std": 0.02, "seed": 0}, samples=SAMPLES)
    bad = textual_inversion({"steps": 120, "lr": 1.0, "init_std": 3.0, "seed": 0},
                            samples=SAMPLES, health={"early_stop": False})
    shares = {k: _share_showing_own_colour(r) for k, r in (("untrained", untrained), ("good", good), ("bad", bad))}
    assert shares["good"] >= shares["untrained"] + 0.3, shares
    assert shares["bad"] <= shares["good"] - 0.2, shares
    assert good["fidelity"] > untrained["fidelity"], (good["fidelity"], untrained["fidelity"])
