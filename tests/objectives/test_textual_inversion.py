from __future__ import annotations

import pytest
import torch

from objectives import export_model, resolve_params
from objectives import textual_inversion, train
from objectives._textual_inversion import cached_base_model
from objectives._trainables import _embeddings_module

FAST = {"steps": 30, "lr": 2e-2, "batch_size": 4}
# one test process (-n: --dist loadgroup) runs this module, so that `trained` is trained once
pytestmark = pytest.mark.xdist_group("trained")


def with_embeddings(params, **kw):
    """The objective's result and the learned rows (`train` is what textual_inversion runs)."""
    run = train(params, **kw)
    return {**run.result, "embeddings": run.embeddings}


@pytest.fixture(scope="module")
def trained():
    base = cached_base_model("tiny", "cpu")
    before = {k: v.clone() for k, v in base.text_encoder.state_dict().items()}
    unet_before = {k: v.clone() for k, v in base.unet.state_dict().items()}
    out = with_embeddings({**FAST, "seed": 3})
    return base, before, unet_before, out


def test_training_lowers_validation_loss(trained):
    _, _, _, out = trained
    assert out["val_loss"] < out["val_loss_init"]
    assert len(out["history"]["train_loss"]) == FAST["steps"]


def test_only_placeholder_rows_change(trained):
    base, before, unet_before, out = trained
    after = base.text_encoder.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key
    for key, value in base.unet.state_dict().items():
        assert torch.equal(value, unet_before[key]), key
    # the shared encoder got its own embedding module back, unwrapped
    assert isinstance(_embeddings_module(base.text_encoder).token_embedding, torch.nn.Embedding)
    # and the concept rows did move away from their N(0, init_std^2) start
    learned = torch.stack(list(out["embeddings"].values()))
    gen = torch.Generator().manual_seed(3)
    init = torch.randn(learned.shape, generator=gen) * resolve_params({})["init_std"]
    assert not torch.allclose(learned, init, atol=1e-4)


@pytest.mark.slow
def test_same_params_and_seed_give_same_result(trained):
    _, _, _, first = trained
    again = textual_inversion({**FAST, "seed": 3})
    assert again["val_loss"] == first["val_loss"]
    assert again["peak_mem_mb"] == first["peak_mem_mb"]
    other_seed = textual_inversion({**FAST, "seed": 4})
    assert other_seed["val_loss"] != first["val_loss"]


def test_a_lora_trial_does_not_depend_on_what_its_worker_ran_before():
    """peft initialises the adapters from torch's global generator: a trial seeds it, so the
    same config and seed give the same result whatever state a worker's earlier trials left."""
    import torch

    config = {"steps": 2, "lr": 1e-2, "batch_size": 2, "seed": 5, "lora_rank": 2, "lora_targets": "both"}
    torch.manual_seed(123)
    first = textual_inversion(config)
    torch.manual_seed(999)
    torch.rand(7)
    again = textual_inversion(config)
    assert again["val_loss"] == first["val_loss"]
    other = textual_inversion({**config, "seed": 6})
    assert other["val_loss"] != first["val_loss"]


@pytest.mark.slow
def test_validation_draws_do_not_depend_on_the_trial():
    # before any training, every trial is scored on the same draws
    a = textual_inversion({"steps": 1, "lr": 1e-9, "seed": 1, "init_std": 0.02})
    b = textual_inversion({"steps": 1, "lr": 1e-9, "seed": 1, "init_std": 0.02, "warmup_steps": 7})
    assert a["val_loss_init"] == b["val_loss_init"]


@pytest.mark.slow
def test_cpu_peak_memory_is_deterministic_and_grows_with_batch():
    small = [textual_inversion({"steps": 2, "batch_size": 2, "seed": s})["peak_mem_mb"] for s in (0, 1)]
    large = textual_inversion({"steps": 2, "batch_size": 8})
    assert small[0] == small[1]
    assert large["peak_mem_mb"] > small[0]
    assert large["tags"]["peak_mem_source"] == "cpu_accounting"


def test_init_from_word_copies_that_row():
    base = cached_base_model("tiny", "cpu")
    out = with_embeddings({"steps": 1, "lr": 1e-12, "init_from": "word:dog"})
    dog = base.tokenizer("dog", add_special_tokens=False).input_ids
    row = _embeddings_module(base.text_encoder).token_embedding.weight[dog[0]]
    for vec in out["embeddings"].values():
        assert torch.allclose(vec, row, atol=1e-6)


def test_init_from_multi_token_word_is_refused():
    with pytest.raises(ValueError, match="single token"):
        textual_inversion({"steps": 1, "init_from": "word:zebrafish"})


def test_lr_warmup_follows_diffusers_schedule():
    out = textual_inversion({"steps": 6, "warmup_steps": 4, "lr": 1e-2})
    assert out["history"]["lr"] == pytest.approx([0.0, 0.0025, 0.005, 0.0075, 0.01, 0.01])


@pytest.mark.slow
def test_local_diffusers_folder_loads_the_same_model(tmp_path):
    path = export_model("tiny", tmp_path / "tiny-sd")
    assert (path / "model_index.json").is_file()
    loaded = textual_inversion({"steps": 3, "seed": 2}, model=str(path))
    built = textual_inversion({"steps": 3, "seed": 2})
    assert loaded["val_loss"] == pytest.approx(built["val_loss"], rel=1e-6)
    assert loaded["peak_mem_mb"] == built["peak_mem_mb"]
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(str(path), local_files_only=True)
    image = pipe("a photo of a dog", num_inference_steps=2, height=32, width=32, output_type="np").images
    assert image.shape == (1, 32, 32, 3)


def test_user_image_folder(tmp_path):
    from PIL import Image
    import numpy as np

    rng = np.random.default_rng(0)
    for concept in ("mug", "lamp"):
        (tmp_path / concept).mkdir()
        for i in range(4):
            arr = (rng.random((40, 40, 3)) * 255).astype("uint8")
            Image.fromarray(arr).save(tmp_path / concept / f"{i}.png")
    out = with_embeddings({"steps": 2}, data=str(tmp_path))
    assert sorted(out["embeddings"]) == ["<lamp>", "<mug>"]


def test_build_tiny_is_deterministic(tmp_path):
    """The build itself, twice from scratch (components, then a short run of both pretraining
    stages), not the cached model loaded twice: the same seed gives the same bytes, which is what
    lets scripts/build_tiny_models.py regenerate the shipped weights."""
    from objectives._model import build_tiny_parts, _tiny_components

    short = {"vae_steps": 2, "vae_batch": 4, "steps": 3, "batch_size": 4, "images_per_caption": 2}
    builds = [build_tiny_parts("tiny", tmp_path / f"b{k}", **short) for k in range(2)]
    for part in ("unet", "vae"):
        a, b = (p[part].state_dict() for p in builds)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), part
    ta, tb = (p["text_encoders"][0].state_dict() for p in builds)
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    assert builds[0]["vae"].config.scaling_factor == builds[1]["vae"].config.scaling_factor
    # and the pretraining moved the weights: a build that skipped it would differ
    fresh = _tiny_components(tmp_path / "tok-fresh")
    for part in ("unet", "vae"):
        a, f = builds[0][part].state_dict(), fresh[part].state_dict()
        assert any(not torch.equal(f[k], a[k]) for k in a), part


