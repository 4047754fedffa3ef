"""A trial's exports load into a diffusers pipeline outside csweep and generate an image."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from safetensors.torch import load

from objectives import export_model
from objectives import textual_inversion, train


def with_embeddings(params, **kw):
    """The objective's result and the learned rows (`train` is what textual_inversion runs)."""
    run = train(params, **kw)
    return {**run.result, "embeddings": run.embeddings}


def _load_into(pipe, out: dict, tmp_path, *, sdxl: bool) -> list[str]:
    tokens = []
    for name, blob in out["artifacts"].items():
        if not name.endswith("learned_embeds.safetensors"):
            continue
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
        token = f"<{path.parent.name}>"
        if sdxl:
            state = load(blob)
            pipe.load_textual_inversion(state["clip_l"], token=token, text_encoder=pipe.text_encoder,
                                        tokenizer=pipe.tokenizer)
            pipe.load_textual_inversion(state["clip_g"], token=token, text_encoder=pipe.text_encoder_2,
                                        tokenizer=pipe.tokenizer_2)
        else:
            pipe.load_textual_inversion(str(path), token=token)
        tokens.append(token)
    if "pytorch_lora_weights.safetensors" in out["artifacts"]:
        lora = tmp_path / "lora"
        lora.mkdir()
        (lora / "pytorch_lora_weights.safetensors").write_bytes(out["artifacts"]["pytorch_lora_weights.safetensors"])
        pipe.load_lora_weights(str(lora))
    return tokens


@pytest.mark.parametrize("model,pipe_name,params", [
    ("tiny", "StableDiffusionPipeline", {"num_vectors": 2, "lora_rank": 4, "lora_targets": "both",
                                          "lora_alpha": 2.0}),
    ("tiny-sdxl", "StableDiffusionXLPipeline", {"lora_rank": 2, "lora_targets": "both"}),
])
@pytest.mark.slow
def test_exports_load_into_a_pipeline_and_generate(tmp_path, model, pipe_name, params):
    import diffusers

    folder = export_model(model, tmp_path / model)
    out = with_embeddings({"steps": 3, "lr": 5e-2, **params}, model=model)
    pipe = getattr(diffusers, pipe_name).from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    tokens = _load_into(pipe, out, tmp_path, sdxl=model == "tiny-sdxl")
    assert sorted(tokens) == ["<blue-stripes>", "<green-square>", "<red-circle>"]
    # the learned rows are the ones now in the pipeline's embedding matrix (diffusers names a
    # concept's k-th vector <name>_k, the first one <name>)
    nv = params.get("num_vectors", 1)
    weight = pipe.text_encoder.get_input_embeddings().weight
    for k in range(nv):
        ours = out["embeddings"]["<red-circle>" if nv == 1 else f"<red-circle>_{k}"]
        theirs = pipe.tokenizer.convert_tokens_to_ids("<red-circle>" + (f"_{k}" if k else ""))
        assert torch.allclose(weight[theirs], ours, atol=1e-6)
    # LoRA layers of both kinds were loaded with the trial's alpha
    lora_names = [n for n, _ in pipe.unet.named_parameters() if "lora_A" in n]
    assert lora_names
    assert any("lora_A" in n for n, _ in pipe.text_encoder.named_parameters())
    gen = torch.Generator().manual_seed(0)
    image = pipe(f"a photo of {tokens[0]}", num_inference_steps=2, height=32, width=32,
                 generator=gen, output_type="np").images
    assert image.shape == (1, 32, 32, 3) and np.isfinite(image).all()


@pytest.mark.slow
def test_lora_export_carries_alpha_metadata():
    from safetensors import safe_open

    out = textual_inversion({"steps": 1, "lora_rank": 4, "lora_alpha": 2.0})
    blob = out["artifacts"]["pytorch_lora_weights.safetensors"]
    path = io.BytesIO(blob)
    import tempfile, os, json

    with tempfile.NamedTemporaryFile(suffix=".safetensors", delete=False) as f:
        f.write(path.getvalue())
    try:
        with safe_open(f.name, framework="pt") as st:
            meta = st.metadata()
            keys = list(st.keys())
    finally:
        os.unlink(f.name)
    assert any(k.startswith("unet.") for k in keys)
    # diffusers keeps the LoRA config as adapter metadata: alpha and rank survive the file
    adapter = json.loads(meta["lora_adapter_metadata"])
    assert adapter["unet.lora_alpha"] == 2.0 and adapter["unet.r"] == 4


def test_kohya_layout_is_what_a1111_and_comfyui_read(tmp_path):
    """`csweep pull --format kohya`: embeddings under `emb_params` (SD 1.x), LoRA keys as ComfyUI's
    comfy/lora.py maps them (lora_unet_ + the diffusers module path with underscores; the text
    encoder's lora_te_text_model_encoder_layers_<i>_self_attn_<q|k|v|out>_proj), each module's
    alpha the trial's lora_alpha, and the same weight update as the diffusers file."""
    import torch
    from safetensors.torch import load_file

    from objectives import write_kohya
    from objectives import train

    run = train({"steps": 2, "lora_rank": 2, "lora_alpha": 4.0, "lora_targets": "both"})
    pulled = tmp_path / "pulled"
    for name, blob in run.result["artifacts"].items():
        (pulled / name).parent.mkdir(parents=True, exist_ok=True)
        (pulled / name).write_bytes(blob)
    out = tmp_path / "kohya"
    out.mkdir()
    written = write_kohya(pulled, out, prefix="mystudy-trial-0", alpha=4.0)
    names = sorted(p.name for p in written)
    assert names == sorted(["red-circle.safetensors", "green-square.safetensors", "blue-stripes.safetensors",
                            "mystudy-trial-0.safetensors"])
    emb = load_file(str(out / "red-circle.safetensors"))
    assert list(emb) == ["emb_params"] and emb["emb_params"].shape == (1, 32)
    lora = load_file(str(out / "mystudy-trial-0.safetensors"))
    modules = {k.split(".")[0] for k in lora}
    unet_paths = {n.replace(".", "_") for n, _ in run.unet.named_modules()}
    for m in modules:
        assert {f"{m}.lora_down.weight", f"{m}.lora_up.weight", f"{m}.alpha"} <= set(lora), m
        assert float(lora[f"{m}.alpha"]) == 4.0
        if m.startswith("lora_unet_"):
            assert m[len("lora_unet_"):] in unet_paths, m
        else:
            assert m.startswith("lora_te_text_model_encoder_layers_"), m
            assert m.rsplit("_", 2)[-2:][0] in ("q", "k", "v", "out") and m.endswith("_proj"), m
    assert any(m.startswith("lora_unet_") for m in modules) and any(m.startswith("lora_te_") for m in modules)
    # the update kohya's loaders apply, up @ down x alpha / rank, equals the adapter's own
    diffusers = load_file(str(pulled / "pytorch_lora_weights.safetensors"))
    key = next(k for k in diffusers if k.startswith("unet.") and k.endswith("to_q.lora.down.weight"))
    down, up = diffusers[key], diffusers[key.replace(".lora.down.", ".lora.up.")]
    m = "lora_unet_" + key[len("unet."):].split(".lora")[0].replace(".", "_")
    k_delta = lora[f"{m}.lora_up.weight"] @ lora[f"{m}.lora_down.weight"] * float(lora[f"{m}.alpha"]) / 2
    assert torch.allclose(k_delta, up @ down * 4.0 / 2)
