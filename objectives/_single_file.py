"""Single-file checkpoints: the original (CompVis / AUTOMATIC1111 / kohya) layout of SD 1.x and
SDXL, as one `.safetensors`.

Reading is diffusers' `from_single_file`, offline: the configs come from csweep's own models
(the tiny ones, and the published SD 1.5 / SDXL shapes that `random:sd15` / `random:sdxl` use),
chosen by the file's keys (the family) and shapes (which model of it). Writing (`csweep
export-model --format single-file`) is the key map of the original layout, written here and
checked against diffusers' reader by the tests.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")
# the header key csweep writes: the built-in model a file was exported from (its tokenizer is
# csweep's own, not CLIP's)
MODEL_KEY = "csweep_model"
CLIP_TOKENIZER = "openai/clip-vit-large-patch14"

UNET = "model.diffusion_model."
VAE = "first_stage_model."
SD1_TEXT = "cond_stage_model.transformer."
SDXL_TEXT = "conditioner.embedders.0.transformer."
SDXL_TEXT_2 = "conditioner.embedders.1.model."


class CheckpointError(ValueError):
    """A single file csweep cannot read, with the reason in one line."""


def is_single_file(spec: str) -> bool:
    return Path(spec).suffix.lower() in SUFFIXES + PICKLE_SUFFIXES


def config_source(model: str) -> str:
    """The model whose config files describe `model`: a single file's matching csweep model
    (tiny, tiny-sdxl, random:sd15, random:sdxl), anything else itself."""
    if not is_single_file(model):
        return model
    try:
        return inspect(Path(model)).configs
    except CheckpointError:
        return model


# --- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileShape:
    """What a checkpoint's header says: its family, the csweep model whose configs fit it, and
    the built-in model it was exported from (if any)."""

    family: str  # sd15 | sdxl
    configs: str  # tiny | tiny-sdxl | random:sd15 | random:sdxl
    exported_from: str | None


def _header(path: Path) -> tuple[dict[str, list[int]], dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:  # the header only: no torch
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        return shapes, dict(f.metadata() or {})


def _family(keys: set[str], name: str) -> str:
    if any(k.startswith(SDXL_TEXT_2) for k in keys):
        return "sdxl"
    if any(k.startswith(SD1_TEXT) for k in keys):
        return "sd15"
    if any(k.startswith("cond_stage_model.model.") for k in keys):
        raise CheckpointError(f"--model {name!r}: an SD 2.x checkpoint (OpenCLIP text encoder); csweep reads "
                              "SD 1.x and SDXL single files")
    if not any(k.startswith(UNET) for k in keys):
        raise CheckpointError(f"--model {name!r}: not a Stable Diffusion checkpoint in the original layout "
                              f"(no {UNET}* keys; a LoRA or an embedding file is not a model)")
    raise CheckpointError(f"--model {name!r}: no text encoder in the file (no {SD1_TEXT}* or {SDXL_TEXT_2}* keys)")


def _widths(configs: str) -> tuple[int, int]:
    """(UNet's first block width, first text encoder's width) of a csweep model's configs."""
    from ._configs import CLIP_L, RANDOM_MODELS, SD15_UNET, SDXL_UNET

    if configs in RANDOM_MODELS:
        unet_config = SDXL_UNET if configs == "random:sdxl" else SD15_UNET
        return int(unet_config["block_out_channels"][0]), int(CLIP_L["hidden_size"])
    folder = config_dir(configs)
    unet = json.loads((folder / "unet" / "config.json").read_text())
    text = json.loads((folder / "text_encoder" / "config.json").read_text())
    return int(unet["block_out_channels"][0]), int(text["hidden_size"])


def inspect(path: Path, name: str | None = None) -> FileShape:
    """The family and the configs that fit a single file, from its header alone (no weights are
    read); CheckpointError with the reason otherwise."""
    name = name or str(path)
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        raise CheckpointError(f"--model {name!r}: a pickle checkpoint ({suffix}) can run code when loaded; "
                              "convert it to .safetensors, or pass --allow-pickle if you trust its source")
    if not path.is_file():
        raise CheckpointError(f"--model {name!r}: no such file")
    try:
        shapes, meta = _header(path)
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise CheckpointError(f"--model {name!r}: not a readable safetensors file ({exc})") from None
    family = _family(set(shapes), name)
    conv_in = shapes.get(UNET + "input_blocks.0.0.weight")
    text = SDXL_TEXT if family == "sdxl" else SD1_TEXT
    token = shapes.get(text + "text_model.embeddings.token_embedding.weight")
    if conv_in is None or token is None:
        raise CheckpointError(f"--model {name!r}: the file lacks the UNet's conv_in or the text encoder's "
                              "token embedding")
    got = (conv_in[0], token[1])
    candidates = ("tiny-sdxl", "random:sdxl") if family == "sdxl" else ("tiny", "random:sd15")
    for configs in candidates:
        if _widths(configs) == got:
            return FileShape(family, configs, meta.get(MODEL_KEY))
    label = "SDXL" if family == "sdxl" else "SD 1.x"
    raise CheckpointError(f"--model {name!r}: an {label} checkpoint with UNet width {got[0]} and text width "
                          f"{got[1]}, which none of csweep's configs has ({', '.join(candidates)})")


def config_dir(configs: str) -> Path:
    """A diffusers folder of configs and tokenizers (no weights) for one of csweep's models: the
    shipped tiny folders, or for the published shapes a folder written once into the cache."""
    from ._configs import RANDOM_MODELS, cache_root, shipped_dir

    if configs not in RANDOM_MODELS:
        return shipped_dir(configs)
    from ._configs import CLIP_G, CLIP_L, SCHEDULER, SD15_UNET, SDXL_UNET, VAE

    recipe = json.dumps([configs, SD15_UNET, SDXL_UNET, VAE, CLIP_L, CLIP_G, SCHEDULER], default=list)
    folder = cache_root() / "configs" / f"{configs.split(':')[1]}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    if not (folder / "model_index.json").is_file():
        _write_config_dir(configs, folder)
    return folder


def _write_config_dir(configs: str, folder: Path) -> None:
    import os
    import shutil
    import tempfile

    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig

    from ._configs import CLIP_G, CLIP_L, SCHEDULER, SD15_UNET, SDXL_UNET, VAE
    from ._tokenizer import padded_tokenizer

    sdxl = configs == "random:sdxl"
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".writing-"))
    try:
        tok = padded_tokenizer(tmp / "tokenizer-src")
        ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        with torch.device("meta"):  # configs only: no weights are allocated
            UNet2DConditionModel(**(SDXL_UNET if sdxl else SD15_UNET)).save_config(str(tmp / "out" / "unet"))
            AutoencoderKL(**VAE, sample_size=1024 if sdxl else 512,
                          scaling_factor=0.13025 if sdxl else 0.18215).save_config(str(tmp / "out" / "vae"))
        DDPMScheduler(**SCHEDULER).save_config(str(tmp / "out" / "scheduler"))
        encoders = [("text_encoder", "tokenizer", CLIP_L, "CLIPTextModel")]
        if sdxl:
            encoders.append(("text_encoder_2", "tokenizer_2", CLIP_G, "CLIPTextModelWithProjection"))
        for enc, tok_dir, cfg, cls in encoders:
            CLIPTextConfig(**cfg, **ids, architectures=[cls]).save_pretrained(str(tmp / "out" / enc))
            tok.save_pretrained(str(tmp / "out" / tok_dir))
        index = json.loads((_tiny_index("tiny-sdxl" if sdxl else "tiny")).read_text())
        (tmp / "out" / "model_index.json").write_text(json.dumps(index, indent=2))
        if not folder.exists():  # another process may have written it meanwhile
            os.replace(tmp / "out", folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _tiny_index(name: str) -> Path:
    from ._configs import shipped_dir

    return shipped_dir(name) / "model_index.json"


def _tokenizer_source(shape: FileShape, name: str) -> str:
    """Where the prompts' tokenizer comes from: csweep's own for a file exported from a built-in
    model, else CLIP's from the Hugging Face cache (a single file carries none)."""
    if shape.exported_from is not None:
        return str(config_dir(shape.configs))
    from huggingface_hub import try_to_load_from_cache

    # transformers 5 builds an empty tokenizer for a repo id it cannot find, so the cache is
    # asked for the files themselves
    for filename in ("tokenizer.json", "vocab.json"):
        found = try_to_load_from_cache(CLIP_TOKENIZER, filename)
        if isinstance(found, str):
            return str(Path(found).parent)
    raise CheckpointError(
        f"--model {name!r}: a single file carries no tokenizer, and {CLIP_TOKENIZER}'s is not in the Hugging "
        f"Face cache; fetch it once where the hub is reachable (hf download {CLIP_TOKENIZER} vocab.json "
        "merges.txt tokenizer_config.json special_tokens_map.json)"
    )


def check_single_file(path: Path, name: str | None = None) -> FileShape:
    """Everything `load_single_file` needs, checked from the header and the cache."""
    shape = inspect(path, name)
    _tokenizer_source(shape, name or str(path))
    return shape


def safe_copy_of_pickle(path: Path) -> Path:
    """A pickle checkpoint (.ckpt) the user trusts, converted once to .safetensors in the cache,
    so that it is unpickled once, here, and the trials read a safe file."""
    import torch
    from safetensors.torch import save_file

    from ._configs import cache_root

    stat = path.resolve().stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_root() / "converted" / f"{path.stem}-{key}.safetensors"
    if target.is_file():
        return target
    try:
        loaded = torch.load(str(path), map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - a broken pickle is bad input
        raise CheckpointError(f"--model {str(path)!r}: cannot be unpickled ({exc.__class__.__name__}: {exc})") from None
    state = loaded.get("state_dict", loaded) if isinstance(loaded, dict) else None
    if not isinstance(state, dict):
        raise CheckpointError(f"--model {str(path)!r}: holds no state dict")
    tensors = {k: v.contiguous() for k, v in state.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".partial")
    save_file(tensors, str(tmp), metadata={"converted_from": str(path.resolve())})
    tmp.replace(target)
    return target


def load_single_file(path: Path) -> dict[str, Any]:
    """The modules of a single-file checkpoint (diffusers' reader, offline, csweep's configs)."""
    import torch
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer

    shape = inspect(path)
    folder = config_dir(shape.configs)
    source = _tokenizer_source(shape, str(path))
    tokenizer = CLIPTokenizer.from_pretrained(source, subfolder="tokenizer" if source == str(folder) else "",
                                              local_files_only=True)
    extra: dict[str, Any] = {"tokenizer": tokenizer}
    if shape.family == "sdxl":
        # diffusers tells the two encoders apart by width; csweep's tiny SDXL has two of one
        # width, so the second (OpenCLIP layout) is converted here with diffusers' own routine.
        from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:  # its tensors only; the pipeline reads the rest
            weights = {k: f.get_tensor(k) for k in f.keys() if k.startswith(SDXL_TEXT_2)}
        encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig.from_pretrained(str(folder), subfolder="text_encoder_2"))
        state = convert_open_clip_checkpoint(encoder_2, weights, prefix=SDXL_TEXT_2)
        missing, unexpected = encoder_2.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("position_ids")]
        if missing or unexpected:
            raise CheckpointError(f"--model {str(path)!r}: the second text encoder does not match SDXL's layout "
                                  f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        extra.update(text_encoder_2=encoder_2, tokenizer_2=tokenizer)
    pipeline_cls = StableDiffusionXLPipeline if shape.family == "sdxl" else StableDiffusionPipeline
    pipe = pipeline_cls.from_single_file(str(path), config=str(folder), local_files_only=True,
                                         torch_dtype=torch.float32, **extra)
    encoders = [pipe.text_encoder] + ([pipe.text_encoder_2] if shape.family == "sdxl" else [])
    from diffusers import DDPMScheduler

    return dict(tokenizers=[tokenizer] * len(encoders), text_encoders=encoders, unet=pipe.unet, vae=pipe.vae,
                scheduler=DDPMScheduler.from_pretrained(str(folder), subfolder="scheduler", local_files_only=True),
                configs=shape.configs)


# --- writing ----------------------------------------------------------------------------------


def _unet_prefixes(config: Any) -> list[tuple[str, str]]:
    """(diffusers prefix, original prefix) of every resnet, attention and resampler of a UNet:
    the original numbers its blocks in one run, `layers_per_block + 1` to a level."""
    n = int(config.layers_per_block)
    levels = len(config.block_out_channels)
    down_attn = ["CrossAttn" in t for t in config.down_block_types]
    up_attn = ["CrossAttn" in t for t in config.up_block_types]
    out: list[tuple[str, str]] = []
    for i in range(levels):
        for j in range(n):
            out.append((f"down_blocks.{i}.resnets.{j}.", f"input_blocks.{(n + 1) * i + j + 1}.0."))
            if down_attn[i]:
                out.append((f"down_blocks.{i}.attentions.{j}.", f"input_blocks.{(n + 1) * i + j + 1}.1."))
        if i < levels - 1:
            out.append((f"down_blocks.{i}.downsamplers.0.conv.", f"input_blocks.{(n + 1) * (i + 1)}.0.op."))
        for j in range(n + 1):
            out.append((f"up_blocks.{i}.resnets.{j}.", f"output_blocks.{(n + 1) * i + j}.0."))
            if up_attn[i]:
                out.append((f"up_blocks.{i}.attentions.{j}.", f"output_blocks.{(n + 1) * i + j}.1."))
        if i < levels - 1:
            out.append((f"up_blocks.{i}.upsamplers.0.", f"output_blocks.{(n + 1) * i + n}.{2 if up_attn[i] else 1}."))
    out += [("mid_block.resnets.0.", "middle_block.0."), ("mid_block.attentions.0.", "middle_block.1."),
            ("mid_block.resnets.1.", "middle_block.2.")]
    return out


_UNET_LAYERS = {"time_embedding.linear_1.": "time_embed.0.", "time_embedding.linear_2.": "time_embed.2.",
                "add_embedding.linear_1.": "label_emb.0.0.", "add_embedding.linear_2.": "label_emb.0.2.",
                "conv_in.": "input_blocks.0.0.", "conv_norm_out.": "out.0.", "conv_out.": "out.2."}
_RESNET = {"norm1.": "in_layers.0.", "conv1.": "in_layers.2.", "norm2.": "out_layers.0.", "conv2.": "out_layers.3.",
           "time_emb_proj.": "emb_layers.1.", "conv_shortcut.": "skip_connection."}


def _rename(key: str, table: list[tuple[str, str]] | dict[str, str]) -> str | None:
    for new, old in (table.items() if isinstance(table, dict) else table):
        if key.startswith(new):
            return old + key[len(new):]
    return None


def unet_to_original(unet: Any) -> dict[str, Any]:
    prefixes = _unet_prefixes(unet.config)
    out = {}
    for key, value in unet.state_dict().items():
        top = _rename(key, _UNET_LAYERS)
        if top is None:
            new, old = next(((n, o) for n, o in prefixes if key.startswith(n)), (None, None))
            if new is None:
                raise KeyError(f"no original name for UNet weight {key}")
            rest = key[len(new):]
            top = old + ((_rename(rest, _RESNET) or rest) if ".resnets." in new else rest)
        out[UNET + top] = value
    return out


def vae_to_original(vae: Any) -> dict[str, Any]:
    levels = len(vae.config.block_out_channels)
    n = int(vae.config.layers_per_block)
    table: list[tuple[str, str]] = [("encoder.conv_norm_out.", "encoder.norm_out."),
                                    ("decoder.conv_norm_out.", "decoder.norm_out.")]
    for part in ("encoder", "decoder"):
        table += [(f"{part}.mid_block.resnets.0.", f"{part}.mid.block_1."),
                  (f"{part}.mid_block.resnets.1.", f"{part}.mid.block_2."),
                  (f"{part}.mid_block.attentions.0.", f"{part}.mid.attn_1.")]
    for i in range(levels):
        table += [(f"encoder.down_blocks.{i}.resnets.{j}.", f"encoder.down.{i}.block.{j}.") for j in range(n)]
        table.append((f"encoder.down_blocks.{i}.downsamplers.0.", f"encoder.down.{i}.downsample."))
        up = levels - 1 - i  # the original numbers the decoder's levels from the bottom
        table += [(f"decoder.up_blocks.{i}.resnets.{j}.", f"decoder.up.{up}.block.{j}.") for j in range(n + 1)]
        table.append((f"decoder.up_blocks.{i}.upsamplers.0.", f"decoder.up.{up}.upsample."))
    attn = {"group_norm.": "norm.", "to_q.": "q.", "to_k.": "k.", "to_v.": "v.", "to_out.0.": "proj_out."}
    out = {}
    for key, value in vae.state_dict().items():
        new = _rename(key, table) or key
        new = new.replace("conv_shortcut.", "nin_shortcut.")
        if ".attn_1." in new:
            head, _, rest = new.partition(".attn_1.")
            rest = _rename(rest, attn) or rest
            new = f"{head}.attn_1.{rest}"
            if value.ndim == 2:  # the original's attention projections are 1x1 convolutions
                value = value[:, :, None, None]
        out[VAE + new] = value
    return out


def clip_to_original(encoder: Any, prefix: str) -> dict[str, Any]:
    """A CLIPTextModel in the original layout: transformers' names under `prefix`, `text_model.`
    included (transformers 5 dropped that level from CLIPTextModel's own names)."""
    out = {}
    for key, value in encoder.state_dict().items():
        if key.endswith("position_ids"):
            continue
        out[prefix + (key if key.startswith("text_model.") else "text_model." + key)] = value
    return out


def open_clip_to_original(encoder: Any, prefix: str) -> dict[str, Any]:
    """SDXL's second encoder in OpenCLIP's layout: fused q/k/v, `resblocks`, a text projection
    applied as `x @ P`."""
    state = encoder.state_dict()
    out = {prefix + "token_embedding.weight": state["text_model.embeddings.token_embedding.weight"],
           prefix + "positional_embedding": state["text_model.embeddings.position_embedding.weight"],
           prefix + "ln_final.weight": state["text_model.final_layer_norm.weight"],
           prefix + "ln_final.bias": state["text_model.final_layer_norm.bias"],
           prefix + "text_projection": state["text_projection.weight"].T.contiguous()}
    import torch

    for i in range(encoder.config.num_hidden_layers):
        src, dst = f"text_model.encoder.layers.{i}.", f"{prefix}transformer.resblocks.{i}."
        for kind in ("weight", "bias"):
            out[dst + f"attn.in_proj_{kind}"] = torch.cat([state[src + f"self_attn.{p}_proj.{kind}"] for p in "qkv"])
            out[dst + f"attn.out_proj.{kind}"] = state[src + f"self_attn.out_proj.{kind}"]
            out[dst + f"ln_1.{kind}"] = state[src + f"layer_norm1.{kind}"]
            out[dst + f"ln_2.{kind}"] = state[src + f"layer_norm2.{kind}"]
            out[dst + f"mlp.c_fc.{kind}"] = state[src + f"mlp.fc1.{kind}"]
            out[dst + f"mlp.c_proj.{kind}"] = state[src + f"mlp.fc2.{kind}"]
    return out


def write_single_file(parts: dict[str, Any], path: Path, *, exported_from: str | None = None) -> Path:
    """Write a model's modules as one `.safetensors` of the original layout."""
    from safetensors.torch import save_file

    encoders = parts["text_encoders"]
    weights = {**unet_to_original(parts["unet"]), **vae_to_original(parts["vae"])}
    if len(encoders) == 2:
        weights.update(clip_to_original(encoders[0], SDXL_TEXT))
        weights.update(open_clip_to_original(encoders[1], SDXL_TEXT_2))
    else:
        weights.update(clip_to_original(encoders[0], SD1_TEXT))
    meta = {MODEL_KEY: exported_from} if exported_from else None
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in weights.items()}, str(path), metadata=meta)
    return path
