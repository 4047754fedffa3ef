"""Parameters of the built-in textual_inversion objective: defaults and rules, no torch.

Validation runs in the CLI before Ray starts or a model loads, on the fixed values and on
both bounds (or every choice) of the sampled ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParamRule:
    default: Any
    kind: type
    rule: str  # the rule, as an error message states it
    ok: Callable[[Any], bool]
    doc: str


def _int_ge(n: int) -> Callable[[Any], bool]:
    return lambda v: v >= n


def _init_from_ok(v: Any) -> bool:
    return v == "random" or (isinstance(v, str) and v.startswith("word:") and len(v) > 5)


FREEZE_MODES = ("embedding_only", "attention_only", "top_layers", "full")
LORA_TARGETS = ("unet", "text", "both")
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "adamw8bit", "prodigy", "adafactor")
LR_SCHEDULERS = ("constant_with_warmup", "constant", "linear", "cosine", "cosine_with_restarts")


def _one_of(values: tuple[str, ...]) -> Callable[[Any], bool]:
    return lambda v: v in values


TEXTUAL_INVERSION_PARAMS: dict[str, ParamRule] = {
    "steps": ParamRule(80, int, "an int >= 1", _int_ge(1), "optimizer steps"),
    "lr": ParamRule(
        5e-3, float, "a float > 0", lambda v: v > 0,
        "learning rate of LoRA / unfrozen encoder weights; the embedding's is lr x embedding_lr_ratio",
    ),
    "batch_size": ParamRule(4, int, "an int >= 1", _int_ge(1), "samples per step"),
    "resolution": ParamRule(
        0, int, "0 (the model's own) or a multiple of 8 >= 8", lambda v: v == 0 or (v >= 8 and v % 8 == 0),
        "image size in pixels; 0 = the model's native size",
    ),
    "seed": ParamRule(0, int, "an int >= 0", _int_ge(0), "seeds init, batches and noise of a trial"),
    "warmup_steps": ParamRule(
        0, int, "an int >= 0", _int_ge(0), "linear LR warmup steps (constant afterwards)"
    ),
    "init_std": ParamRule(
        0.02, float, "a float > 0", lambda v: v > 0, "std of the N(0, std^2) init of concept codes"
    ),
    "init_from": ParamRule(
        "random", str, "'random' or 'word:WORD'", _init_from_ok,
        "concept rows start random (init_std) or as a copy of WORD's row",
    ),
    "num_vectors": ParamRule(
        1, int, "an int >= 1", _int_ge(1), "embedding vectors (tokens) per concept"
    ),
    "token_weight_decay": ParamRule(
        1.0, float, "a float in (0, 1]", lambda v: 0 < v <= 1,
        "gradient of the k-th concept token of a prompt scaled by decay**k; 1 = off",
    ),
    "freeze": ParamRule(
        "embedding_only", str, f"one of {', '.join(FREEZE_MODES)}", _one_of(FREEZE_MODES),
        "how much of the text encoder(s) trains besides the concept rows",
    ),
    "unfreeze_layers": ParamRule(
        1, int, "an int >= 1", _int_ge(1), "with freeze=top_layers: the last k encoder layers train"
    ),
    "contrastive_margin": ParamRule(
        0.0, float, "a float >= 0", lambda v: v >= 0, "margin of the in-batch contrastive term"
    ),
    "contrastive_weight": ParamRule(
        0.0, float, "a float >= 0", lambda v: v >= 0, "weight of the contrastive term; 0 = off"
    ),
    "lora_rank": ParamRule(0, int, "an int >= 0", _int_ge(0), "LoRA rank; 0 = no LoRA"),
    "lora_alpha": ParamRule(
        None, float, "a float > 0 (or null = rank)", lambda v: v is None or v > 0, "LoRA alpha; null = rank"
    ),
    "lora_targets": ParamRule(
        "unet", str, f"one of {', '.join(LORA_TARGETS)}", _one_of(LORA_TARGETS),
        "LoRA on UNet attention (to_q/k/v/out.0), text encoder attention (q/k/v/out_proj), or both",
    ),
    "embedding_dim": ParamRule(
        0, int, "an int >= 0 (0 = the encoder's hidden size)", _int_ge(0),
        "width of the trained concept code z; vectors are P z with P a fixed projection",
    ),
    "embedding_lr_ratio": ParamRule(
        1.0, float, "a float > 0", lambda v: v > 0, "embedding lr = ratio x lr (folk default 0.3)"
    ),
    "max_grad_norm": ParamRule(
        0.0, float, "a float >= 0 (0 = no clipping)", lambda v: v >= 0, "gradient clipping norm"
    ),
    "precision": ParamRule(
        "fp32", str, f"one of {', '.join(PRECISIONS)}", _one_of(PRECISIONS),
        "compute dtype; trainable parameters stay fp32; fp16 needs CUDA (GradScaler)",
    ),
    "min_snr_gamma": ParamRule(
        0.0, float, "a float >= 0 (0 = off)", lambda v: v >= 0,
        "min-SNR loss weighting (Hang et al. 2023): each sample's loss x min(SNR(t), gamma) / SNR(t); 5 is the usual value",
    ),
    "noise_offset": ParamRule(
        0.0, float, "a float >= 0 (0 = off)", lambda v: v >= 0,
        "noise offset: the training noise gets offset x N(0, 1) per sample and channel (constant over pixels)",
    ),
    "caption_dropout": ParamRule(
        0.0, float, "a float in [0, 1)", lambda v: 0 <= v < 1,
        "each training sample's prompt is replaced by the empty prompt with this probability",
    ),
    "gradient_checkpointing": ParamRule(
        False, bool, "true or false", lambda v: True,
        "recompute the UNet's (and trained encoders') activations in backward instead of keeping them: less memory, more time",
    ),
    "ema_decay": ParamRule(
        0.0, float, "a float in [0, 1) (0 = off)", lambda v: 0 <= v < 1,
        "validate and export an exponential moving average of the trainables (diffusers' EMAModel, its decay "
        "ramping up as (1+t)/(10+t) to this value)",
    ),
    "weight_decay": ParamRule(
        1e-2, float, "a float >= 0", lambda v: v >= 0, "AdamW weight decay of the LoRA and unfrozen encoder weights",
    ),
    "embedding_weight_decay": ParamRule(
        1e-2, float, "a float >= 0", lambda v: v >= 0,
        "AdamW weight decay of the concept vectors (it shrinks them towards 0: diffusers #1009)",
    ),
    "crop": ParamRule(
        "center", str, "one of center, random", lambda v: v in ("center", "random"),
        "--data images keep their aspect (resized by the short side) and are cropped square: the centre, or "
        "each step one of 4 windows along the long side",
    ),
    "flip": ParamRule(
        0.0, float, "a float in [0, 1]", lambda v: 0 <= v <= 1, "probability of a horizontal flip of a training image",
    ),
    "learnable_property": ParamRule(
        "object", str, "one of object, style", lambda v: v in ("object", "style"),
        "prompt templates of an object concept ('a photo of <c>') or a style ('a painting in the style of <c>'); "
        "an image's .txt caption replaces them",
    ),
    "optimizer": ParamRule(
        "adamw", str, f"one of {', '.join(OPTIMIZERS)}", _one_of(OPTIMIZERS),
        "torch's AdamW; bitsandbytes' 8-bit AdamW (CUDA and the bitsandbytes package); Prodigy (the prodigyopt "
        "package: it adapts its own step size d, lr multiplies it, so set lr 1); transformers' Adafactor at a "
        "fixed lr. weight_decay and embedding_weight_decay apply to each",
    ),
    "prodigy_d_coef": ParamRule(
        1.0, float, "a float > 0", lambda v: v > 0,
        "Prodigy's d_coef: scales the step size it adapts (the trainers' 'consensus' for LoRAs: 2)",
    ),
    "lr_scheduler": ParamRule(
        "constant_with_warmup", str, f"one of {', '.join(LR_SCHEDULERS)}", _one_of(LR_SCHEDULERS),
        "the lr schedule (diffusers' get_scheduler) after warmup_steps of linear warmup (constant has none)",
    ),
    "lr_cycles": ParamRule(
        1, int, "an int >= 1", _int_ge(1), "cosine_with_restarts: how many cosine cycles (hard restarts) in the steps",
    ),
    "val_every": ParamRule(
        None, int, "an int >= 1 and <= steps (or null = auto)", lambda v: v is None or v >= 1,
        "validate every this many steps on the fixed validation draws (val_loss with its step); null = "
        "about 8 validations a trial (steps // 8), fewer on short trials (no more often than every "
        "8 x held-out images / batch_size steps)",
    ),
}


def _coerce(rule: ParamRule, value: Any) -> Any:
    if rule.kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def check_param(name: str, value: Any, *, known: Mapping[str, ParamRule]) -> str | None:
    """Why `name=value` is not allowed, or None."""
    if name not in known:
        return f"unknown parameter {name!r} (known: {', '.join(sorted(known))})"
    rule = known[name]
    value = _coerce(rule, value)
    if value is None and rule.default is None:
        return None
    if rule.kind is bool:
        return None if isinstance(value, bool) else f"{name} must be {rule.rule}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, rule.kind):
        return f"{name} must be {rule.rule}, got {value!r}"
    if not rule.ok(value):
        return f"{name} must be {rule.rule}, got {value!r}"
    return None


def resolve_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults filled in, types coerced; raises ValueError naming the first bad entry."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        err = check_param(name, value, known=TEXTUAL_INVERSION_PARAMS)
        if err:
            raise ValueError(err)
        out[name] = _coerce(TEXTUAL_INVERSION_PARAMS[name], value)
    for name, rule in TEXTUAL_INVERSION_PARAMS.items():
        out.setdefault(name, rule.default)
    if out["lora_alpha"] is None:
        out["lora_alpha"] = float(out["lora_rank"])
    err = check_val_every(out["val_every"], out["steps"])
    if err:
        raise ValueError(err)
    return out


def default_val_every(steps: int, held_out: int = 0, batch_size: int = 1) -> int:
    """`val_every: null`: about 8 validations a trial (steps // 8), but no more often than every
    8 x held_out / batch_size steps: a validation denoises every held-out image at 5 timesteps.
    Measured on the tiny model (time inside the validations, median of 3): one validation of its
    9 held-out images costs 0.19 s, about 3 of its training steps at batch 4, so the 80-step
    default's 4 validations during training are 14% of the trial (every 10th step: 22%); on real
    models' hundreds to thousands of steps the 8 validations are a few percent. At most `steps`
    (then only the last step is validated)."""
    return min(steps, max(1, steps // 8, math.ceil(8 * held_out / max(1, batch_size))))


def check_val_every(val_every: Any, steps: Any) -> str | None:
    """The one rule between two parameters: a trial must validate before its end."""
    if isinstance(val_every, int) and isinstance(steps, int) and val_every > steps:
        return f"val_every must be <= steps ({steps}), got {val_every}"
    return None


# Shapes of the built-in models, so that shape rules are checked without loading anything.
_BUILTIN_SHAPES = {"tiny": {"hidden": 32, "layers": 2}, "tiny-sdxl": {"hidden": 32, "layers": 1},
                   "random:sd15": {"hidden": 768, "layers": 12}, "random:sdxl": {"hidden": 768, "layers": 11}}


def model_limits(model: str) -> dict[str, int] | None:
    """Smallest text-encoder width and number of layers that reach the UNet, read from the
    config files alone (no torch); None when they cannot be read."""
    import json
    from pathlib import Path

    from ._single_file import config_source, is_single_file

    model = config_source(model)
    if model in _BUILTIN_SHAPES:
        return dict(_BUILTIN_SHAPES[model])
    if is_single_file(model):
        return None
    root = Path(model)
    configs = [root / "text_encoder" / "config.json", root / "text_encoder_2" / "config.json"]
    try:
        loaded = [json.loads(p.read_text()) for p in configs if p.is_file()]
        hidden = min(int(c["hidden_size"]) for c in loaded)
        # SDXL conditions on the first encoder's penultimate layer
        layers = int(loaded[0]["num_hidden_layers"]) - (1 if len(loaded) == 2 else 0)
    except (OSError, ValueError, KeyError):
        return None
    return {"hidden": hidden, "layers": layers}


def check_against_model(name: str, value: Any, limits: Mapping[str, int]) -> str | None:
    """Shape rules that depend on the model: embedding_dim and unfreeze_layers."""
    if name == "embedding_dim" and isinstance(value, int) and value > limits["hidden"]:
        return f"embedding_dim must be <= the model's text-encoder width {limits['hidden']}, got {value}"
    if name == "unfreeze_layers" and isinstance(value, int) and value > limits["layers"]:
        return f"unfreeze_layers must be <= the model's {limits['layers']} used encoder layers, got {value}"
    return None


@dataclass(frozen=True)
class Knobs:
    """A trial's parameters resolved once (defaults filled in, types coerced, lora_alpha
    defaulted to the rank): what `train` and its stages read. One field per entry of
    TEXTUAL_INVERSION_PARAMS (a test holds the two together)."""

    steps: int
    lr: float
    batch_size: int
    resolution: int
    seed: int
    warmup_steps: int
    init_std: float
    init_from: str
    num_vectors: int
    token_weight_decay: float
    freeze: str
    unfreeze_layers: int
    contrastive_margin: float
    contrastive_weight: float
    lora_rank: int
    lora_alpha: float
    lora_targets: str
    embedding_dim: int
    embedding_lr_ratio: float
    max_grad_norm: float
    precision: str
    min_snr_gamma: float
    noise_offset: float
    caption_dropout: float
    gradient_checkpointing: bool
    ema_decay: float
    weight_decay: float
    embedding_weight_decay: float
    crop: str
    flip: float
    learnable_property: str
    optimizer: str
    prodigy_d_coef: float
    lr_scheduler: str
    lr_cycles: int
    val_every: int | None

    @classmethod
    def resolve(cls, params: Mapping[str, Any]) -> Knobs:
        """Raises ValueError naming the first bad entry (resolve_params)."""
        return cls(**resolve_params(params))

    @property
    def lora_unet(self) -> bool:
        return self.lora_rank > 0 and self.lora_targets in ("unet", "both")

    @property
    def lora_text(self) -> bool:
        return self.lora_rank > 0 and self.lora_targets in ("text", "both")

    @property
    def copies_text_encoders(self) -> bool:
        """A trial trains its own copy of the text encoders when it unfreezes or adapts them: a copy
        of their structure over the shared frozen weights, with copies of the weights it trains."""
        return self.freeze != "embedding_only" or self.lora_text
