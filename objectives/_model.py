"""Base models: the tiny SD-shaped model built from config, or a local diffusers folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ._configs import (  # noqa: F401 - the published shapes and the caches, re-exported
    CLIP_G, CLIP_L, RANDOM_MODELS, SCHEDULER, SD15_UNET, SDXL_UNET, SHIPPED, TINY_MODELS, VAE, VOCAB, cache_root,
    shipped_dir,
)
from ._tokenizer import _WORDS, padded_tokenizer, write_tiny_tokenizer  # noqa: F401 - re-exported

TINY_RESOLUTION = 32


def _quiet_hf() -> None:
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog

    for lib in (dlog, tlog):
        lib.disable_progress_bar()
        lib.set_verbosity_error()


@dataclass
class BaseModel:
    """Frozen parts shared by every trial of a worker. SD 1.x has one text encoder, SDXL two
    (CLIP-L-shaped, then OpenCLIP-G-shaped with projection)."""

    tokenizers: list[Any]
    text_encoders: list[Any]
    unet: Any
    vae: Any
    scheduler: Any
    source: str
    resolution: int

    @property
    def is_sdxl(self) -> bool:
        return len(self.text_encoders) == 2

    @property
    def tokenizer(self) -> Any:
        return self.tokenizers[0]

    @property
    def text_encoder(self) -> Any:
        return self.text_encoders[0]

    def modules(self) -> list[Any]:
        return [*self.text_encoders, self.unet, self.vae]


def _clip_config(tokenizer: Any) -> Any:
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=77, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, projection_dim=32,
    )


def _tiny_components(tokenizer_dir: Path, *, sdxl: bool = False) -> dict[str, Any]:
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(
        str(write_tiny_tokenizer(tokenizer_dir)), model_max_length=77
    )
    torch.manual_seed(0)  # the tiny model's random weights are part of its definition
    text_encoders = [CLIPTextModel(_clip_config(tokenizer))]
    unet_extra: dict[str, Any] = {"cross_attention_dim": 32}
    if sdxl:
        text_encoders.append(CLIPTextModelWithProjection(_clip_config(tokenizer)))
        # SDXL: both encoders' penultimate states side by side; pooled text + 6 time ids
        unet_extra = {
            "cross_attention_dim": 64, "addition_embed_type": "text_time", "addition_time_embed_dim": 8,
            "projection_class_embeddings_input_dim": 6 * 8 + 32, "use_linear_projection": True,
        }
    unet = UNet2DConditionModel(
        sample_size=TINY_RESOLUTION // 2,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        attention_head_dim=8,
        norm_num_groups=16,
        **unet_extra,
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
        steps_offset=1, clip_sample=False,
    )
    return dict(tokenizers=[tokenizer] * len(text_encoders), text_encoders=text_encoders, unet=unet,
                vae=vae, scheduler=scheduler)


# The tiny models' definition: the config above, seeded weights, then the world pretraining of
# `_world` (a VAE for coloured shapes, a denoiser that draws captions). Bump TINY_VERSION when any
# of it changes, and rerun scripts/build_tiny_models.py, which writes the shipped weights.
TINY_VERSION = "4"


def tiny_cache_dir(name: str = "tiny") -> Path:
    from ._world import WORLD_OVERRIDES, WORLD_PRETRAIN

    recipe = [TINY_VERSION, WORLD_PRETRAIN, WORLD_OVERRIDES.get(name, {}), _WORDS, name]
    key = hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]
    return cache_root() / f"{name}-{key}"


def tiny_dir(name: str) -> Path:
    """Where built-in model `name` is read from: the weights shipped with the package, else the
    machine's build cache (after `build_tiny` has filled it)."""
    shipped = shipped_dir(name)
    return shipped if (shipped / "model_index.json").is_file() else tiny_cache_dir(name)


def build_tiny_parts(name: str, tmp: Path, progress: Any = None, **overrides: Any) -> dict[str, Any]:
    """The model from scratch: seeded components, then the world pretraining."""
    from ._world import WORLD_OVERRIDES, pretrain_world

    parts = _tiny_components(tmp / "tokenizer-src", sdxl=name == "tiny-sdxl")
    pretrain_world(parts, res=TINY_RESOLUTION, progress=progress, **{**WORLD_OVERRIDES.get(name, {}), **overrides})
    return parts


def build_tiny(name: str = "tiny", progress: Any = None) -> BaseModel:
    """A built-in model (tiny: SD 1.x-shaped; tiny-sdxl: SDXL-shaped).

    Loaded from the weights shipped with the package; where they are missing, built once per
    machine into the cache (CSWEEP_CACHE, else ~/.cache/csweep) under a file lock, so that
    workers starting together build it once and later loads read the cache.
    """
    import fcntl

    if name not in TINY_MODELS:
        raise ValueError(f"model {name!r} is not built in (built-ins: {', '.join(TINY_MODELS)})")
    target = tiny_dir(name)
    if target != shipped_dir(name):
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (target / "model_index.json").is_file():
                tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".building-"))
                try:
                    _save_pipeline(build_tiny_parts(name, tmp, progress), tmp / "model")
                    os.replace(tmp / "model", target)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    base = load_local(target)
    base.source = name
    return base


def _save_pipeline(parts: dict[str, Any], directory: Path) -> None:
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    common = dict(vae=parts["vae"], unet=parts["unet"], scheduler=parts["scheduler"])
    tok, enc = parts["tokenizers"], parts["text_encoders"]
    if len(enc) == 2:
        pipe = StableDiffusionXLPipeline(
            text_encoder=enc[0], text_encoder_2=enc[1], tokenizer=tok[0], tokenizer_2=tok[1], **common
        )
    else:
        pipe = StableDiffusionPipeline(
            text_encoder=enc[0], tokenizer=tok[0], safety_checker=None, feature_extractor=None,
            requires_safety_checker=False, **common,
        )
    pipe.save_pretrained(str(directory))


def export_tiny(name: str, directory: Path) -> Path:
    """Write a built-in model as a diffusers folder that its pipeline class loads."""
    base = build_tiny(name)
    _save_pipeline(
        dict(vae=base.vae, text_encoders=base.text_encoders, tokenizers=base.tokenizers,
             unet=base.unet, scheduler=base.scheduler),
        directory,
    )
    return directory


def load_local(path: Path) -> BaseModel:
    """Load an SD 1.x or SDXL diffusers folder from disk, never from a hub."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    _quiet_hf()
    kw = dict(local_files_only=True)
    tokenizers = [CLIPTokenizer.from_pretrained(str(path), subfolder="tokenizer", **kw)]
    text_encoders = [CLIPTextModel.from_pretrained(str(path), subfolder="text_encoder", **kw)]
    if (path / "text_encoder_2").is_dir():
        tokenizers.append(CLIPTokenizer.from_pretrained(str(path), subfolder="tokenizer_2", **kw))
        text_encoders.append(
            CLIPTextModelWithProjection.from_pretrained(str(path), subfolder="text_encoder_2", **kw)
        )
    unet = UNet2DConditionModel.from_pretrained(str(path), subfolder="unet", **kw)
    vae = AutoencoderKL.from_pretrained(str(path), subfolder="vae", **kw)
    scheduler = DDPMScheduler.from_pretrained(str(path), subfolder="scheduler", **kw)
    for module in (*text_encoders, unet, vae):
        module.requires_grad_(False).eval()
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    resolution = int(unet.config.sample_size) * factor
    return BaseModel(tokenizers, text_encoders, unet, vae, scheduler, source=str(path), resolution=resolution)


def load_base_model(spec: str) -> BaseModel:
    """`tiny`, `tiny-sdxl`, `random:sd15`, `random:sdxl` (built in memory, seeded), a path to a
    local diffusers folder, or a single-file checkpoint (.safetensors, original layout)."""
    from ._single_file import is_single_file, load_single_file

    if spec in TINY_MODELS:
        return build_tiny(spec)
    if is_single_file(spec):
        _quiet_hf()
        parts = load_single_file(Path(spec))
        return _frozen(parts, source=spec)
    if spec in RANDOM_MODELS:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            parts = random_parts(spec, Path(tmp))
        return _frozen(parts, source=spec)
    return load_local(Path(spec))


def _frozen(parts: dict[str, Any], source: str) -> BaseModel:
    for module in (*parts["text_encoders"], parts["unet"], parts["vae"]):
        module.requires_grad_(False).eval()
    vae = parts["vae"]
    resolution = int(parts["unet"].config.sample_size) * 2 ** (len(vae.config.block_out_channels) - 1)
    return BaseModel(parts["tokenizers"], parts["text_encoders"], parts["unet"], vae, parts["scheduler"],
                     source=source, resolution=resolution)


def random_parts(name: str, tokenizer_dir: Path) -> dict[str, Any]:
    """The modules of `random:sd15` or `random:sdxl`: published configs, weights seeded at the
    scale of PyTorch's default initialisation (`_seeded_fill`), a tokenizer of csweep's own padded with unused tokens to CLIP's 49,408 so that the
    embedding matrices have their real size."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    if name not in RANDOM_MODELS:
        raise ValueError(f"model {name!r} is not one of {', '.join(RANDOM_MODELS)}")
    sdxl = name == "random:sdxl"
    tok = padded_tokenizer(tokenizer_dir)
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.device("meta"):  # shapes only: the weights are filled below, seeded
        encoders = [CLIPTextModel(CLIPTextConfig(**CLIP_L, **ids))]
        if sdxl:
            encoders.append(CLIPTextModelWithProjection(CLIPTextConfig(**CLIP_G, **ids)))
        unet = UNet2DConditionModel(**(SDXL_UNET if sdxl else SD15_UNET))
        vae = AutoencoderKL(**VAE, sample_size=1024 if sdxl else 512,
                            scaling_factor=0.13025 if sdxl else 0.18215)
    if torch.empty(0).device.type != "meta":  # a caller's meta context asks for the shapes alone
        generator = torch.Generator(device="cpu").manual_seed(0)
        pool = torch.rand(POOL, generator=generator, device="cpu") * 2 - 1
        for module in (*encoders, unet, vae):
            _seeded_fill(module.to_empty(device="cpu"), pool, generator)
    return dict(tokenizers=[tok] * len(encoders), text_encoders=encoders, unet=unet, vae=vae,
                scheduler=DDPMScheduler(**SCHEDULER))


POOL = 1 << 22  # the seeded uniform values random:* weights are drawn from (16 MB)


@torch.no_grad()
def _seeded_fill(module: torch.nn.Module, pool: torch.Tensor, generator: torch.Generator) -> None:
    """Weights at the scale of PyTorch's default layer initialisation, seeded: Linear and Conv
    weights and biases uniform within 1/sqrt(fan_in), norms at 1 and 0, embeddings at CLIP's
    std 0.02; the values are runs of a seeded pool of uniform values, each tensor starting at a
    seeded offset (building random:sdxl's 3.5B parameters one uniform_ at a time took 46 s on two
    cores; this is memory-bound). The position ids are the only buffers these modules hold."""
    for name, buf in module.named_buffers():
        if not name.endswith("position_ids"):
            raise RuntimeError(f"random weights: no rule for the buffer {name!r}")
        buf.copy_(torch.arange(buf.shape[-1]).expand_as(buf))
    for sub in module.modules():
        if isinstance(sub, (torch.nn.LayerNorm, torch.nn.GroupNorm)):
            sub.weight.fill_(1.0)
            sub.bias.fill_(0.0)
        elif isinstance(sub, torch.nn.Embedding):
            _from_pool(sub.weight, pool, generator, 0.02 * 3 ** 0.5)
        elif isinstance(sub, (torch.nn.Linear, torch.nn.Conv2d)):
            bound = sub.weight[0].numel() ** -0.5
            for p in (sub.weight, sub.bias):
                if p is not None:
                    _from_pool(p, pool, generator, bound)
        elif any(True for _ in sub.parameters(recurse=False)):
            raise RuntimeError(f"random weights: no rule for {type(sub).__name__}")


def _from_pool(tensor: torch.Tensor, pool: torch.Tensor, generator: torch.Generator, bound: float) -> None:
    flat, done = tensor.view(-1), 0
    start = int(torch.randint(len(pool), (1,), generator=generator))
    while done < len(flat):
        k = min(len(flat) - done, len(pool) - start)
        torch.mul(pool[start:start + k], bound, out=flat[done:done + k])
        done, start = done + k, 0


def export_random(name: str, directory: Path) -> Path:
    """Write `random:sd15` / `random:sdxl` as a diffusers folder (fp32: about 4 GB / 14 GB)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        _save_pipeline(random_parts(name, Path(tmp)), directory)
    return directory
