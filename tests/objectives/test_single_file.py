"""`--model FILE.safetensors`: the single-file checkpoint a practitioner keeps (the original
CompVis / AUTOMATIC1111 layout), read offline by diffusers' `from_single_file` with the configs
csweep ships. The files here are written by `csweep export-model --format single-file`, whose key
map is not the reader's: a wrong name in it leaves a weight unloaded or misplaced, and the
comparisons below see it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sweeps import main


def _state_equal(a: torch.nn.Module, b: torch.nn.Module) -> list[str]:
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    return [k for k in sa if not torch.equal(sa[k], sb[k])]


def _export(model: str, path: Path) -> Path:
    assert main(["export-model", model, str(path), "--format", "single-file"]) == 0
    return path


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    return _export("tiny", tmp_path_factory.mktemp("ckpt") / "tiny.safetensors")


@pytest.mark.parametrize("model", ["tiny", "tiny-sdxl"])
def test_a_single_file_loads_every_weight_of_the_model_it_was_written_from(tmp_path, model):
    from objectives._model import build_tiny, load_base_model

    path = tiny_file_of(model, tmp_path)
    keys = load_file(str(path))
    # the original layout, as other tools write it
    assert any(k.startswith("model.diffusion_model.input_blocks.") for k in keys)
    assert any(k.startswith("first_stage_model.decoder.up.") for k in keys)
    assert any(k.startswith("conditioner.embedders.1.model.transformer.resblocks." if model == "tiny-sdxl"
                            else "cond_stage_model.transformer.text_model.") for k in keys)
    loaded, built = load_base_model(str(path)), build_tiny(model)
    assert loaded.is_sdxl == built.is_sdxl and loaded.resolution == built.resolution
    for a, b in [(built.unet, loaded.unet), (built.vae, loaded.vae), *zip(built.text_encoders, loaded.text_encoders)]:
        assert _state_equal(a, b) == []
    assert not any(p.requires_grad for m in loaded.modules() for p in m.parameters())


def tiny_file_of(model: str, tmp_path: Path) -> Path:
    return _export(model, tmp_path / f"{model}.safetensors")


def test_a_trial_on_the_single_file_trains_as_on_the_model_it_holds(tiny_file):
    from objectives import train

    params = {"steps": 4, "lr": 0.02, "lora_rank": 2, "seed": 3}
    on_file, on_builtin = train(params, model=str(tiny_file)), train(params, model="tiny")
    assert on_file.result["val_loss"] == on_builtin.result["val_loss"]
    assert on_file.output.history == on_builtin.output.history  # every step's loss


def test_csweep_run_dry_runs_a_single_file(tiny_file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "demo", "--model", str(tiny_file), "--dry-run", "1"]) == 0
    out = capsys.readouterr().out
    assert f"model {tiny_file}" in out and "0 of 1 configs above the budget or failing" in out
    assert not (tmp_path / "csweep-runs").exists()


def _write(path: Path, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> Path:
    save_file(tensors, str(path), metadata=metadata)
    return path


def _without_header_mark(src: Path, dst: Path) -> Path:
    """The same weights as another tool saves them: no csweep mark in the header."""
    return _write(dst, load_file(str(src)))


def _bad_files(tmp: Path, tiny: Path) -> list[tuple[str, list[str]]]:
    unet = {"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(320, 4, 3, 3)}
    _write(tmp / "sd2.safetensors", {**unet, "cond_stage_model.model.token_embedding.weight": torch.zeros(8, 4)})
    _write(tmp / "lora.safetensors", {"lora_unet_down_blocks_0.lora_down.weight": torch.zeros(4, 4)})
    _write(tmp / "wide.safetensors", {"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(448, 4, 3, 3),
                                      "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight":
                                          torch.zeros(8, 1024)})
    (tmp / "junk.safetensors").write_bytes(b"not a safetensors file")
    torch.save(load_file(str(tiny)), tmp / "model.ckpt")
    _without_header_mark(tiny, tmp / "theirs.safetensors")
    return [
        ("nothere.safetensors", ["'nothere.safetensors'", "no such file"]),
        ("junk.safetensors", ["'junk.safetensors'", "not a readable safetensors file"]),
        ("sd2.safetensors", ["'sd2.safetensors'", "SD 2.x", "SD 1.x and SDXL"]),
        ("lora.safetensors", ["'lora.safetensors'", "not a Stable Diffusion checkpoint", "LoRA"]),
        ("wide.safetensors", ["'wide.safetensors'", "UNet width 448 and text width 1024", "tiny, random:sd15"]),
        ("model.ckpt", ["'model.ckpt'", "pickle", "--allow-pickle"]),
        ("theirs.safetensors", ["'theirs.safetensors'", "no tokenizer", "openai/clip-vit-large-patch14"]),
    ]


def test_a_file_csweep_cannot_read_is_refused_in_one_line_before_anything_runs(tiny_file, tmp_path, monkeypatch,
                                                                                 capsys):
    import huggingface_hub.constants

    (tmp_path / "s.yaml").write_text("name: s\nparams:\n  init_std: {type: float, low: 0.001, high: 0.3, log: true}\n")
    cases = _bad_files(tmp_path, tiny_file)
    before = sorted(tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache
    monkeypatch.setenv("CSWEEP_CACHE", str(tmp_path / "c"))
    for name, words in cases:
        assert main(["run", "s.yaml", "--model", name, "--workdir", "wd"]) == 2, name
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("csweep: error: --model"), (name, lines)
        assert all(w in lines[0] for w in words), (name, lines[0])
    assert sorted(tmp_path.rglob("*")) == before


def _fake_hub_tokenizer(hub: Path, monkeypatch) -> None:
    """A Hugging Face cache holding a tokenizer under CLIP's repo id, as `hf download` leaves it
    (csweep's own tokenizer stands in for CLIP's, which this machine has no copy of), made this
    process's cache (HF_HUB_CACHE as huggingface_hub read it at import)."""
    import huggingface_hub.constants
    from transformers import CLIPTokenizer

    from objectives._model import shipped_dir

    repo = hub / "models--openai--clip-vit-large-patch14"
    snapshot = repo / "snapshots" / "0123456789abcdef"
    CLIPTokenizer.from_pretrained(str(shipped_dir("tiny") / "tokenizer")).save_pretrained(str(snapshot))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123456789abcdef")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))


def test_a_file_from_another_tool_takes_clips_tokenizer_from_the_hub_cache(tiny_file, tmp_path, monkeypatch):
    from objectives import check_single_file
    from objectives._model import load_base_model

    theirs = _without_header_mark(tiny_file, tmp_path / "theirs.safetensors")
    _fake_hub_tokenizer(tmp_path / "hub", monkeypatch)
    assert check_single_file(theirs).configs == "tiny"
    base = load_base_model(str(theirs))
    assert base.tokenizer.name_or_path.endswith("0123456789abcdef")  # the hub cache's copy


def test_a_pickle_checkpoint_runs_only_when_allowed_and_then_from_a_safe_copy(tiny_file, tmp_path, monkeypatch):
    from objectives._model import build_tiny, load_base_model
    from sweeps.commands._run_checks import check_model

    monkeypatch.setenv("CSWEEP_CACHE", str(tmp_path / "cache"))
    ckpt = tmp_path / "model.ckpt"
    torch.save({"state_dict": load_file(str(tiny_file)), "global_step": 1000}, ckpt)
    # its header mark does not survive the pickle: the tokenizer must come from the hub cache
    _fake_hub_tokenizer(tmp_path / "hub", monkeypatch)
    spec = check_model(str(ckpt), allow_pickle=True)
    assert spec.endswith(".safetensors") and Path(spec).parent == tmp_path / "cache" / "converted"
    assert check_model(str(ckpt), allow_pickle=True) == spec  # converted once
    assert _state_equal(build_tiny("tiny").unet, load_base_model(spec).unet) == []


@pytest.mark.slow
def test_random_sd15_round_trips_through_the_original_layout(tmp_path, monkeypatch):
    """The published SD 1.5 shapes: the file has the key names and shapes of a real SD 1.5
    checkpoint, and diffusers reads it back with csweep's shipped configs, offline."""
    from objectives._model import load_base_model, random_parts

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = _export("random:sd15", tmp_path / "sd15.safetensors")
    keys = load_file(str(path))
    assert keys["model.diffusion_model.output_blocks.11.0.skip_connection.weight"].shape == (320, 640, 1, 1)
    assert keys["first_stage_model.encoder.mid.attn_1.q.weight"].shape == (512, 512, 1, 1)
    assert keys["cond_stage_model.transformer.text_model.embeddings.token_embedding.weight"].shape == (49408, 768)
    del keys
    loaded = load_base_model(str(path))
    assert loaded.resolution == 512
    built = random_parts("random:sd15", tmp_path / "tok")
    for a, b in [(built["unet"], loaded.unet), (built["vae"], loaded.vae), (built["text_encoders"][0], loaded.text_encoder)]:
        assert _state_equal(a, b) == []
