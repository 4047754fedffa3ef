"""Base models: the tiny SD-shaped model built from config, or a local diffusers folder."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Words that get whole-word tokens in the offline tokenizer, so templates tokenize compactly
# and `init_from: word:WORD` has real rows to copy from.
_WORDS = (
    "a photo of the an in on with and style picture rendering painting close up cropped "
    "dark bright small large good clean nice dog cat toy object thing shape circle square "
    "ring cross stripes red green blue yellow art sketch"
).split()

TINY_RESOLUTION = 32


def _bytes_to_unicode() -> dict[int, str]:
    # NOTE: the byte->char table of byte-level BPE (GPT-2/CLIP); transformers 5 no longer exports it.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_tiny_tokenizer(directory: Path) -> Path:
    """Write a byte-level CLIP vocab.json + merges.txt (offline) that CLIPTokenizer loads."""
    directory.mkdir(parents=True, exist_ok=True)
    chars = list(_bytes_to_unicode().values())
    vocab: list[str] = chars + [c + "</w>" for c in chars]
    merges: list[str] = []
    seen = set(vocab)
    for word in _WORDS:
        symbols = list(word[:-1]) + [word[-1] + "</w>"]
        cur = symbols[0]
        for nxt in symbols[1:]:
            merge, cur = f"{cur} {nxt}", cur + nxt
            if cur not in seen:
                merges.append(merge)
                vocab.append(cur)
                seen.add(cur)
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return directory


@dataclass
class BaseModel:
    """Frozen parts shared by every trial of a worker, plus what a trial copies."""

    tokenizer: Any
    text_encoder: Any
    unet: Any
    vae: Any
    scheduler: Any
    source: str
    resolution: int

    @property
    def hidden_size(self) -> int:
        return int(self.text_encoder.config.hidden_size)


def _tiny_components(tokenizer_dir: Path) -> dict[str, Any]:
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(
        str(write_tiny_tokenizer(tokenizer_dir)), model_max_length=77
    )
    torch.manual_seed(0)  # the tiny model's random weights are part of its definition
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            projection_dim=32,
        )
    )
    unet = UNet2DConditionModel(
        sample_size=TINY_RESOLUTION // 2,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=16,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(16, 32),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=16,
        sample_size=TINY_RESOLUTION,
    )
    scheduler = DDPMScheduler(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        steps_offset=1,
        clip_sample=False,
    )
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, unet=unet, vae=vae, scheduler=scheduler)


def build_tiny(cache_dir: Path | None = None) -> BaseModel:
    """The default model: SD 1.x-shaped, built from config with seeded random weights."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        parts = _tiny_components(Path(cache_dir or tmp) / "tokenizer")
    for module in (parts["text_encoder"], parts["unet"], parts["vae"]):
        module.requires_grad_(False).eval()
    return BaseModel(**parts, source="tiny", resolution=TINY_RESOLUTION)


def export_tiny(directory: Path) -> Path:
    """Write the tiny model as a diffusers folder that StableDiffusionPipeline loads."""
    from diffusers import StableDiffusionPipeline

    base = build_tiny()
    pipe = StableDiffusionPipeline(
        vae=base.vae,
        text_encoder=base.text_encoder,
        tokenizer=base.tokenizer,
        unet=base.unet,
        scheduler=base.scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(str(directory))
    return directory


def load_local(path: Path) -> BaseModel:
    """Load an SD 1.x diffusers folder from disk, never from a hub."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    kw = dict(local_files_only=True)
    tokenizer = CLIPTokenizer.from_pretrained(str(path), subfolder="tokenizer", **kw)
    text_encoder = CLIPTextModel.from_pretrained(str(path), subfolder="text_encoder", **kw)
    unet = UNet2DConditionModel.from_pretrained(str(path), subfolder="unet", **kw)
    vae = AutoencoderKL.from_pretrained(str(path), subfolder="vae", **kw)
    scheduler = DDPMScheduler.from_pretrained(str(path), subfolder="scheduler", **kw)
    for module in (text_encoder, unet, vae):
        module.requires_grad_(False).eval()
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    resolution = int(unet.config.sample_size) * factor
    return BaseModel(tokenizer, text_encoder, unet, vae, scheduler, source=str(path), resolution=resolution)


def load_base_model(spec: str) -> BaseModel:
    """`tiny` or a path to a local diffusers folder."""
    if spec == "tiny":
        return build_tiny()
    return load_local(Path(spec))
