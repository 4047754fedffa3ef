"""Exports in kohya's layouts, which AUTOMATIC1111 and ComfyUI load (`csweep pull --format kohya`).

- Embeddings: one `NAME.safetensors` per concept, its file name the trigger word. SD 1.x: the key
  `emb_params` holding (vectors, 768) (kohya's sd-scripts write it; A1111's
  modules/textual_inversion/textual_inversion.py takes a single-tensor file, ComfyUI's
  comfy/sd1_clip.py load_embed reads `emb_params`); SDXL: `clip_l` and `clip_g`, one row set per
  text encoder (both loaders read those two keys).
- LoRA: one `NAME.safetensors` with kohya's key names (`lora_unet_<diffusers module path with
  underscores>`, `lora_te_text_model_encoder_layers_<i>_self_attn_<q|k|v|out>_proj` for SD 1.x,
  `lora_te1_` / `lora_te2_` for SDXL's two encoders; `.lora_down.weight`, `.lora_up.weight`,
  `.alpha`), the names ComfyUI's comfy/lora.py (model_lora_keys_unet, model_lora_keys_clip) and
  A1111's Lora extension map onto the model. The conversion is diffusers' own
  (convert_unet_state_dict_to_peft / convert_state_dict_to_peft, then convert_state_dict_to_kohya); csweep adds what it leaves out:
  each module's `alpha` is the trial's lora_alpha (diffusers writes the rank, which would change
  the LoRA's scale whenever alpha != rank), and the `text_model_` segment that transformers 5 no
  longer puts in the encoders' module paths.
"""

from __future__ import annotations

from pathlib import Path

import torch


def embedding_to_kohya(state: dict[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    """A concept's diffusers embedding file ({"<name>": rows} or {clip_l, clip_g}) in kohya's keys."""
    if "clip_l" in state and "clip_g" in state:
        return {"clip_l": state["clip_l"].contiguous(), "clip_g": state["clip_g"].contiguous()}
    rows = state.get(f"<{name}>", next(iter(state.values())))
    return {"emb_params": (rows[None] if rows.dim() == 1 else rows).contiguous()}


def lora_to_kohya(state: dict[str, torch.Tensor], *, alpha: float, sdxl: bool) -> dict[str, torch.Tensor]:
    """diffusers' pytorch_lora_weights.safetensors in kohya's key names, alpha per module."""
    from diffusers.utils.state_dict_utils import (
        convert_state_dict_to_kohya,
        convert_state_dict_to_peft,
        convert_unet_state_dict_to_peft,
    )

    # the file holds the UNet's layers as `lora.down/up`, the encoders' as `lora_linear_layer`:
    # each part has diffusers' converter of its own
    peft: dict[str, torch.Tensor] = {}
    for prefix in ("unet.", "text_encoder.", "text_encoder_2."):
        part = {k: v for k, v in state.items() if k.startswith(prefix)}
        if part:
            peft |= (convert_unet_state_dict_to_peft(part) if prefix == "unet." else convert_state_dict_to_peft(part))
    kohya = convert_state_dict_to_kohya(peft)
    out: dict[str, torch.Tensor] = {}
    for key, value in kohya.items():
        for te in ("lora_te1_", "lora_te2_"):
            if key.startswith(te) and not key.startswith(te + "text_model_"):
                key = te + "text_model_" + key[len(te):]
        if not sdxl and key.startswith("lora_te1_"):
            key = "lora_te_" + key[len("lora_te1_"):]  # SD 1.x has one text encoder: kohya's `lora_te_`
        if key.endswith(".alpha"):
            value = torch.tensor(float(alpha))
        out[key] = value.contiguous()
    return out


def write_kohya(folder: Path, target: Path, *, prefix: str, alpha: float | None) -> list[Path]:
    """The kohya files of a pulled trial folder (diffusers layout) into `target`; returns them."""
    from safetensors.torch import load_file, save_file

    written = []
    concepts = folder / "concepts"
    sdxl = False
    for concept in sorted(p for p in concepts.iterdir() if p.is_dir()) if concepts.is_dir() else []:
        state = load_file(str(concept / "learned_embeds.safetensors"))
        sdxl = sdxl or "clip_g" in state
        path = target / f"{concept.name}.safetensors"
        save_file(embedding_to_kohya(state, concept.name), str(path))
        written.append(path)
    lora = folder / "pytorch_lora_weights.safetensors"
    if lora.is_file():
        state = load_file(str(lora))
        sdxl = sdxl or any(k.startswith("text_encoder_2.") for k in state)
        rank = next(v.shape[0] for k, v in state.items() if "down" in k or "lora_A" in k)
        path = target / f"{prefix}.safetensors"
        save_file(lora_to_kohya(state, alpha=float(alpha or rank), sdxl=sdxl), str(path),
                  metadata={"ss_network_module": "networks.lora", "ss_network_dim": str(rank),
                            "ss_network_alpha": str(float(alpha or rank))})
        written.append(path)
    return written
