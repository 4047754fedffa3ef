"""--data as trainers lay it out: aspect kept and cropped, flips, .webp, .txt captions, kohya's
N_name/ repeat folders, style templates; bad data refused up front."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from objectives._data import (
    CROP_WINDOWS,
    caption_of,
    check_data_dir,
    concept_folders,
    crop_windows,
    dataset_inputs,
    folder_concepts,
)


def _stripes(w: int, h: int) -> Image.Image:
    """A portrait or landscape image whose left third is red, the rest blue."""
    arr = np.zeros((h, w, 3), dtype=np.uint8)
    arr[:, :, 2] = 255
    arr[:, : w // 3, 0], arr[:, : w // 3, 2] = 255, 0
    return Image.fromarray(arr)


def test_a_non_square_image_keeps_its_aspect_and_is_cropped_not_squashed():
    im = _stripes(48, 32)  # 3:2 landscape
    center = crop_windows(im, 16, "center")
    assert center.shape == (1, 3, 16, 16)
    # resized by the short side to 24 x 16, the centre 16 x 16 cut: columns 4..20 of 24, so the
    # red third (0..8) shows in the first 4 columns only; a squash would show it in 5-6
    red = (center[0, 0] > 0.5).all(axis=0)
    assert red[:3].all() and not red[5:].any()
    windows = crop_windows(im, 16, "random")
    assert windows.shape == (1 + CROP_WINDOWS, 3, 16, 16)
    assert (windows[1, 0] > 0.5).all(axis=0)[:7].all()  # the leftmost window: mostly red
    assert not (windows[-1, 0] > 0.5).any()  # the rightmost: no red at all
    square = crop_windows(_stripes(32, 32), 16, "random")
    assert square.shape[0] == 1  # nothing to choose along a square image


@pytest.fixture
def kohya_folder(tmp_path):
    root = tmp_path / "data"
    (root / "10_mydog").mkdir(parents=True)
    (root / "cat").mkdir()
    for i in range(4):
        _stripes(40, 24).save(root / "10_mydog" / f"d{i}.png")
        _stripes(24, 40).save(root / "cat" / f"c{i}.webp")
    (root / "10_mydog" / "d0.txt").write_text("a photo of {concept} on a beach\n")
    (root / "10_mydog" / "d1.txt").write_text("my dog sleeping")
    return root


def test_repeat_folders_captions_and_webp_are_read(kohya_folder):
    folders = {f.name: f for f in concept_folders(kohya_folder)}
    assert folders["mydog"].repeats == 10 and folders["cat"].repeats == 1
    assert [p.suffix for p in folders["cat"].files] == [".webp"] * 4
    assert caption_of(kohya_folder / "10_mydog" / "d0.png") == "a photo of {concept} on a beach"
    assert caption_of(kohya_folder / "cat" / "c0.webp") is None
    cs = folder_concepts(kohya_folder, 16)
    assert cs.names == ("cat", "mydog")
    assert len(cs.train) == 6 and len(cs.val) == 2  # every 4th held out
    assert sorted(cs.repeats) == [1, 1, 1, 10, 10, 10]
    assert "a photo of {concept} on a beach" in cs.captions and "my dog sleeping" in cs.captions


def test_the_digest_covers_captions_repeats_and_settings(kohya_folder):
    digest = lambda **kw: "-".join(d["digest"] for d in dataset_inputs(16, str(kohya_folder), tuple(kw.items())))  # noqa: E731
    base = digest()
    assert digest(crop="center", flip=0.0, learnable_property="object") == base  # the defaults
    assert digest(flip=0.5) != base and digest(learnable_property="style") != base and digest(crop="random") != base
    (kohya_folder / "10_mydog" / "d1.txt").write_text("my dog awake")
    assert digest() != base
    (kohya_folder / "10_mydog").rename(kohya_folder / "3_mydog")
    assert digest() != base


@pytest.mark.parametrize("make,words", [
    (lambda r: (r / "0_dog").mkdir() or _stripes(8, 8).save(r / "0_dog" / "a.png"), ["'0_dog'", ">= 1"]),
    (lambda r: (r / "dog").mkdir() or (r / "dog" / "lonely.txt").write_text("x"),
     ["caption 'dog/lonely.txt'", "no image beside it"]),
    (lambda r: (r / "dog").mkdir() or (r / "dog" / "a.webp").write_bytes(b"not an image"),
     ["unreadable image 'a.webp'"]),
])
def test_bad_data_is_one_line_naming_it(tmp_path, make, words):
    root = tmp_path / "data"
    root.mkdir()
    _stripes(8, 8).save(root / "ok1.png")
    _stripes(8, 8).save(root / "ok2.png")
    make(root)
    err = check_data_dir(str(root))
    assert err is not None and all(w in err for w in words), err


def test_captions_and_style_templates_reach_the_prompts(kohya_folder, monkeypatch):
    """The token ids a trial trains on: a captioned image's own caption with the concept's token in
    it ({concept} replaced, or the token put in front), the style templates with
    learnable_property=style."""
    import copy

    from objectives import _prompts, train

    seen = []
    original = _prompts.token_rank_factors

    def spy(ids, first_id, decay):
        seen.append(ids.clone())
        return original(ids, first_id, decay)

    monkeypatch.setattr(_prompts, "token_rank_factors", spy)
    run = train({"steps": 2, "lr": 1e-3}, data=str(kohya_folder))
    tok = copy.deepcopy(run.base.tokenizers[0])
    tok.add_tokens(["<cat>", "<mydog>"])
    rows = {tuple(r.tolist()) for ids in seen for r in ids.reshape(-1, ids.shape[-1])}

    def ids(text):
        return tuple(tok([text], padding="max_length", max_length=tok.model_max_length, truncation=True,
                         return_tensors="pt").input_ids[0].tolist())

    assert ids("a photo of <mydog> on a beach") in rows
    assert ids("<mydog>, my dog sleeping") in rows
    assert ids("a photo of <cat>") in rows  # uncaptioned images keep the object templates
    seen.clear()
    train({"steps": 1, "lr": 1e-3, "learnable_property": "style"}, data=str(kohya_folder))
    rows = {tuple(r.tolist()) for ids_ in seen for r in ids_.reshape(-1, ids_.shape[-1])}
    assert ids("a painting in the style of <cat>") in rows and ids("a photo of <cat>") not in rows


def test_random_crop_and_flip_train_on_other_views(kohya_folder):
    from objectives import train

    plain = train({"steps": 6, "lr": 1e-3}, data=str(kohya_folder)).result
    again = train({"steps": 6, "lr": 1e-3}, data=str(kohya_folder)).result
    flipped = train({"steps": 6, "lr": 1e-3, "flip": 0.5, "crop": "random"}, data=str(kohya_folder)).result
    assert plain["history"]["train_loss"] == again["history"]["train_loss"]
    assert flipped["history"]["train_loss"] != plain["history"]["train_loss"]
    # the held-out images are the centre crops either way: the same validation before training
    assert flipped["val_loss_init"] == plain["val_loss_init"]
