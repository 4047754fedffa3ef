"""The textual_inversion objective: one real diffusers training run per trial.

One narrated loop: the frozen base model is shared by every trial a worker runs; each trial
builds fresh trainable parts (concept codes, and copies of whatever else it unfreezes or adapts).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ._data import ConceptSet, dataset_inputs, folder_concepts, synthetic_concepts, templates
from ._health import HealthMonitor
from ._health_config import HealthConfig, TrialStopped
from ._memory import MemoryMeter
from ._condition import condition
from ._model import BaseModel, load_base_model
from ._params import default_val_every, resolve_params
from ._fidelity import VaeEncoder, VisionEncoder, fidelity
from ._samples import SampleConfig, draw_samples

# Validation draws are constants of csweep, not of a trial: every trial of every study is scored
# on the same timesteps and the same noise.
VAL_TIMESTEPS = (100, 300, 500, 700, 900)
VAL_NOISE_SEED = 1234
PROJECTION_SEED = 4321  # the fixed projection P of embedding_dim < hidden size
LORA_UNET_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
LORA_TEXT_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

StepCallback = Callable[[int, Mapping[str, float]], None]
# called after every validation during training with (step, {"val_loss", "peak_mem_mb"}); a
# non-empty answer is the reason to stop the trial there (csweep's --early-stop dominated)
Reporter = Callable[[int, Mapping[str, float]], "str | None"]
SCORES = ("final", "best")


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@functools.lru_cache(maxsize=2)
def cached_base_model(spec: str, device: str, precision: str = "fp32") -> BaseModel:
    """Built or loaded once per process: a Ray worker reuses it for every trial it runs."""
    base = load_base_model(spec)
    for module in base.modules():
        module.to(device=device, dtype=DTYPES[precision])
    return base


@functools.lru_cache(maxsize=4)
def _cached_data(spec: str, device: str, precision: str, data: str | None, resolution: int,
                 crop: str = "center", flipped: bool = False) -> dict[str, Any]:
    base = cached_base_model(spec, device, precision)
    concepts = synthetic_concepts(resolution) if data is None else folder_concepts(Path(data), resolution, crop)
    return {"concepts": concepts, **_encode(base, concepts, torch.device(device), flipped=flipped)}


@torch.no_grad()
def _encode(base: BaseModel, concepts: ConceptSet, device: torch.device, *, flipped: bool = False) -> dict[str, Any]:
    """1) latents of the frozen VAE, once (not every step as the reference script does); with
    crop windows or flips, of every view of every training image (`train_views`: (images,
    views, ...), the unflipped views first, then their mirror images)."""
    combos = sorted({c for _, c in concepts.train + concepts.val}, key=lambda c: (len(c), c))

    def enc(items: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = base.vae.dtype
        images = torch.stack([torch.from_numpy(im) for im, _ in items]).to(device, dtype)
        lat = base.vae.encode(images).latent_dist.mean * base.vae.config.scaling_factor
        return lat, torch.tensor([combos.index(c) for _, c in items], device=device)

    train_lat, train_combo = enc(concepts.train)
    val_lat, val_combo = enc(concepts.val) if concepts.val else enc(concepts.train)
    out = {"combos": combos, "train_lat": train_lat, "train_combo": train_combo,
           "val_lat": val_lat, "val_combo": val_combo, "train_views": None}
    views = [v[1:] if len(v) > 1 else v[:1] for v in concepts.views] if concepts.views else \
        [im[None] for im, _ in concepts.train]
    if flipped or any(len(v) > 1 for v in views):
        stack = np.stack(views)  # (images, windows, 3, R, R)
        if flipped:
            stack = np.concatenate([stack, stack[..., ::-1]], axis=1)
        n, v = stack.shape[:2]
        flat = torch.from_numpy(np.ascontiguousarray(stack.reshape(n * v, *stack.shape[2:]))).to(device, base.vae.dtype)
        lat = torch.cat([base.vae.encode(flat[i:i + 32]).latent_dist.mean for i in range(0, len(flat), 32)])
        out["train_views"] = (lat * base.vae.config.scaling_factor).reshape(n, v, *lat.shape[1:])
    return out


class ConceptEmbedding(torch.nn.Module):
    """Token embedding whose placeholder rows (ids >= first_id) are P z, z trainable.

    The base matrix stays frozen and shared, so no row but the concept rows can ever change.
    `grad_scale` (per prompt position) scales the gradient reaching z, not the forward value.
    """

    def __init__(self, base: torch.nn.Embedding, first_id: int, z: torch.Tensor, proj: torch.Tensor | None):
        super().__init__()
        self.base = base
        self.first_id = first_id
        self.z = torch.nn.Parameter(z)
        self.register_buffer("proj", proj)
        self.grad_scale: torch.Tensor | None = None

    def rows(self) -> torch.Tensor:
        return self.z if self.proj is None else self.z @ self.proj.T

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        is_new = input_ids >= self.first_id
        old = self.base(input_ids.clamp(max=self.first_id - 1))
        new = F.embedding((input_ids - self.first_id).clamp(min=0), self.rows())
        if self.grad_scale is not None:
            f = self.grad_scale.unsqueeze(-1).to(new.dtype)
            new = new.detach() + (new - new.detach()) * f  # value exactly `new`, gradient x f
        return torch.where(is_new.unsqueeze(-1), new.to(old.dtype), old)


def _inner(text_encoder: torch.nn.Module) -> torch.nn.Module:
    # transformers 5 dropped `.text_model` on some CLIP classes
    return getattr(text_encoder, "text_model", text_encoder)


def _embeddings_module(text_encoder: torch.nn.Module) -> torch.nn.Module:
    return _inner(text_encoder).embeddings


def token_rank_factors(ids: torch.Tensor, first_id: int, decay: float) -> torch.Tensor:
    """decay**k at each concept-token position, k = rank of that token's first occurrence
    among the concept tokens of its prompt; 1 elsewhere. ids: (..., L)."""
    flat = ids.reshape(-1, ids.shape[-1]).tolist()
    out = torch.ones(len(flat), ids.shape[-1])
    for r, row in enumerate(flat):
        seen: dict[int, int] = {}
        for pos, tok in enumerate(row):
            if tok >= first_id:
                out[r, pos] = decay ** seen.setdefault(tok, len(seen))
    return out.reshape(ids.shape)


def used_layers(text_encoder: torch.nn.Module, index: int, *, sdxl: bool) -> list[int]:
    """Encoder layers whose output reaches the UNet. SDXL conditions on the penultimate hidden
    state of both encoders and pools only the second, so the first encoder's last layer (and
    final norm) can never get a gradient: csweep neither unfreezes nor adapts them."""
    n = len(_inner(text_encoder).encoder.layers)
    return list(range(n - 1)) if sdxl and index == 0 else list(range(n))


def unfreeze(text_encoder: torch.nn.Module, mode: str, layers: int, used: list[int]) -> None:
    """Freeze modes beyond the concept rows (which always train). The token embedding matrix
    itself never trains, nor do layers whose output is unused."""
    layer_list = _inner(text_encoder).encoder.layers
    if mode == "embedding_only":
        return
    if layers > len(used) and mode == "top_layers":
        raise ValueError(f"unfreeze_layers must be <= the encoder's {len(used)} used layers, got {layers}")
    if mode == "attention_only":
        for i in used:
            for name in LORA_TEXT_TARGETS:
                getattr(layer_list[i].self_attn, name).requires_grad_(True)
    elif mode == "top_layers":
        for i in used[len(used) - layers:]:
            layer_list[i].requires_grad_(True)
    elif mode == "full":
        unused = {f"layers.{i}." for i in range(len(layer_list)) if i not in used}
        for name, p in text_encoder.named_parameters():
            if "token_embedding" in name or any(u in name for u in unused):
                continue
            if unused and "final_layer_norm" in name:
                continue
            p.requires_grad_(True)


def lora_text_pattern(used: list[int]) -> str:
    """peft target_modules regex: the attention projections of the used layers."""
    return rf".*layers\.({'|'.join(map(str, used))})\.self_attn\.({'|'.join(LORA_TEXT_TARGETS)})"


def _projection(hidden: int, dim: int) -> torch.Tensor | None:
    if dim == hidden:
        return None
    gen = torch.Generator().manual_seed(PROJECTION_SEED + hidden * 7919 + dim)
    q, _ = torch.linalg.qr(torch.randn(hidden, dim, generator=gen))
    return q  # orthonormal columns


@dataclass
class Trainables:
    """What a trial trains, named once: per text encoder its concept code and its own unfrozen
    or LoRA weights, and the UNet's LoRA. Optimizer groups, parameter counts, per-group gradient
    norms and the health monitor's names all derive from here."""

    concepts: list[ConceptEmbedding]
    encoders: list[dict[str, torch.nn.Parameter]]  # per encoder: name -> trainable weight
    unet: dict[str, torch.nn.Parameter]  # name -> UNet LoRA weight

    def of_encoder(self, i: int) -> list[torch.Tensor]:
        """Encoder i's trainables, its concept code first."""
        return [self.concepts[i].z, *self.encoders[i].values()]

    def counts(self) -> dict[str, int]:
        return {"embedding": sum(ce.z.numel() for ce in self.concepts),
                "text": sum(p.numel() for e in self.encoders for p in e.values()),
                "unet_lora": sum(p.numel() for p in self.unet.values())}

    def norm_groups(self) -> dict[str, list[torch.Tensor]]:
        """Gradient norms are logged per step per group: each encoder's concept code, each
        encoder's own weights, the UNet's LoRA."""
        out: dict[str, list[torch.Tensor]] = {f"embedding_{i}": [ce.z] for i, ce in enumerate(self.concepts)}
        out |= {f"text_encoder_{i}": list(e.values()) for i, e in enumerate(self.encoders) if e}
        if self.unet:
            out["unet_lora"] = list(self.unet.values())
        return out

    def named(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {f"concept_embedding_{i}": ce.z for i, ce in enumerate(self.concepts)}
        for i, e in enumerate(self.encoders):
            out |= {f"text_encoder_{i}.{n}": p for n, p in e.items()}
        return out | {f"unet.{n}": p for n, p in self.unet.items()}


class ValidationCurve:
    """The validations of one trial: (step, val_loss and its per-timestep parts) per point, the
    best step (lowest val_loss, the earliest of equals) and, with `keep` (the trainables by name),
    a copy of them at the best step, in memory: no checkpoint per validation."""

    def __init__(self, keep: Mapping[str, torch.Tensor] | None) -> None:
        self.points: list[dict[str, float]] = []
        self.keep = dict(keep) if keep is not None else None
        self.best: dict[str, torch.Tensor] = {}
        self.best_step, self.best_value, self.seconds = 0, math.inf, 0.0

    def add(self, step: int, values: Mapping[str, float], seconds: float) -> None:
        self.points.append({"step": step, **{k: float(v) for k, v in values.items()
                                             if k == "val_loss" or k.startswith("val_loss/")}})
        self.seconds += seconds
        value = float(values["val_loss"])
        if value < self.best_value:
            self.best_step, self.best_value = step, value
            if self.keep is not None:
                self.best = {k: t.detach().clone() for k, t in self.keep.items()}

    @torch.no_grad()
    def restore(self) -> None:
        for k, t in (self.keep or {}).items():
            t.copy_(self.best[k])

    def metrics(self) -> dict[str, float]:
        return {"best_step": float(self.best_step), "val_loss_at_best": self.best_value,
                "val_seconds": self.seconds, "val_points": float(len(self.points))}


@dataclass
class Trained:
    """A finished training run: the objective's result and the trained parts."""

    result: dict[str, Any]
    embeddings: dict[str, torch.Tensor]  # placeholder token -> its learned row (first encoder)
    base: BaseModel
    text_encoders: list[torch.nn.Module]
    unet: torch.nn.Module
    trainables: Trainables


def textual_inversion(
    params: Mapping[str, Any],
    *,
    model: str = "tiny",
    data: str | None = None,
    health: HealthConfig | Mapping[str, Any] | None = None,
    samples: SampleConfig | Mapping[str, Any] | None = None,
    score: str = "final",
    report: Reporter | None = None,
) -> dict[str, Any]:
    """Train concept embeddings (and what the knobs unfreeze); returns val_loss, peak_mem_mb,
    metrics, per-step history, the validation curve, the learned weights as diffusers-loadable
    files and, when `samples` is given and enabled, a grid of sample images per concept.
    `score="best"`: val_loss, the exports and the samples are those of the best validated step."""
    return train(params, model=model, data=data, health=health, samples=samples, score=score,
                 report=report).result


def train(
    params: Mapping[str, Any],
    *,
    model: str = "tiny",
    data: str | None = None,
    health: HealthConfig | Mapping[str, Any] | None = None,
    samples: SampleConfig | Mapping[str, Any] | None = None,
    on_step: StepCallback | None = None,
    score: str = "final",
    report: Reporter | None = None,
) -> Trained:
    """The textual-inversion run itself (`on_step(step, metrics)` after every step)."""
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    cfg = resolve_params(params)
    hcfg = health if isinstance(health, HealthConfig) else HealthConfig.from_mapping(health or {})
    scfg = (samples if isinstance(samples, SampleConfig) else
            SampleConfig(enabled=False) if samples is None else SampleConfig.from_mapping(samples))
    device = pick_device()
    if cfg["precision"] == "fp16" and device.type != "cuda":
        raise ValueError("precision fp16 needs a CUDA device (GradScaler); this worker has none: use bf16 or fp32")
    base = cached_base_model(model, device.type, cfg["precision"])
    resolution = cfg["resolution"] or base.resolution
    cache = _cached_data(model, device.type, cfg["precision"], data, resolution, cfg["crop"], cfg["flip"] > 0)
    concepts: ConceptSet = cache["concepts"]
    combos: list[tuple[int, ...]] = cache["combos"]
    gen = torch.Generator(device="cpu").manual_seed(cfg["seed"])
    started = time.perf_counter()
    rank, lora_text = cfg["lora_rank"], cfg["lora_rank"] > 0 and cfg["lora_targets"] in ("text", "both")
    lora_unet = cfg["lora_rank"] > 0 and cfg["lora_targets"] in ("unet", "both")

    # 2) placeholder tokens on per-trial tokenizers
    nv = cfg["num_vectors"]
    tokens = [[ph if nv == 1 else f"{ph}_{k}" for k in range(nv)] for ph in concepts.placeholders]
    flat = [t for group in tokens for t in group]
    tokenizers = [copy.deepcopy(tok) for tok in base.tokenizers]
    for tok in tokenizers:
        if tok.add_tokens(flat) != len(flat):
            raise ValueError(f"placeholder tokens {flat} clash with the tokenizer's vocabulary")

    # 3) trainable parts: fresh copies of what trains, the frozen rest shared
    copy_text = cfg["freeze"] != "embedding_only" or lora_text
    encoders = [copy.deepcopy(te) if copy_text else te for te in base.text_encoders]
    unet = copy.deepcopy(base.unet) if lora_unet else base.unet
    from peft import LoraConfig, inject_adapter_in_model

    def lora_config(targets: list[str] | str) -> LoraConfig:
        return LoraConfig(r=rank, lora_alpha=cfg["lora_alpha"], init_lora_weights="gaussian",
                          target_modules=targets)

    # peft draws the adapters' initial weights from torch's global generator: seeded from the
    # trial's seed here (and the caller's state restored after), so that a trial's result does
    # not depend on which worker ran it or on what that worker ran before
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg["seed"])
        if lora_unet:
            unet.add_adapter(lora_config(LORA_UNET_TARGETS))
        for i, te in enumerate(encoders):
            used = used_layers(te, i, sdxl=base.is_sdxl)
            if lora_text:
                encoders[i] = te = inject_adapter_in_model(lora_config(lora_text_pattern(used)), te)
            unfreeze(te, cfg["freeze"], cfg["unfreeze_layers"], used)
    concept_embs, saved_embs = [], []
    for i, (te, tok) in enumerate(zip(encoders, tokenizers)):
        emb = _embeddings_module(te)
        base_tok = emb.token_embedding
        first_id = tok.convert_tokens_to_ids(flat[0])
        if first_id != base_tok.num_embeddings:
            raise ValueError("the tokenizer and the text encoder disagree on the vocabulary size")
        hidden = base_tok.embedding_dim
        dim = cfg["embedding_dim"] or hidden
        if dim > hidden:
            raise ValueError(f"embedding_dim must be <= the encoder's hidden size {hidden}, got {dim}")
        proj = _projection(hidden, dim)
        if cfg["init_from"] == "random":
            # z scaled so that the rows P z have entries of std init_std
            z = torch.randn(len(flat), dim, generator=gen) * cfg["init_std"] * math.sqrt(hidden / dim)
        else:
            word = cfg["init_from"][5:]
            ids = base.tokenizers[i](word, add_special_tokens=False).input_ids
            if len(ids) != 1:
                raise ValueError(f"init_from word {word!r} must be a single token, got {len(ids)} tokens")
            row = base_tok.weight[ids[0]].detach().float().cpu()
            z = (row if proj is None else proj.T @ row).repeat(len(flat), 1)
        ce = ConceptEmbedding(base_tok, first_id, z.to(device), None if proj is None else proj.to(device))
        concept_embs.append(ce)
        saved_embs.append((emb, base_tok))

    from diffusers.training_utils import cast_training_params

    cast_training_params([unet, *encoders], dtype=torch.float32)  # trainable weights stay fp32
    # the UNet (shared, or the trial's LoRA copy) and the encoders this trial trains (its copies)
    checkpointed = (_checkpointing([unet, *(encoders if copy_text else [])], True)
                    if cfg["gradient_checkpointing"] else [])
    trainables = Trainables(
        concept_embs,
        [{n: p for n, p in te.named_parameters() if p.requires_grad} for te in encoders],
        {n: p for n, p in unet.named_parameters() if p.requires_grad} if lora_unet else {},
    )
    counts = trainables.counts()

    first_id = concept_embs[0].first_id

    def tokenized(prompts: list[str]) -> list[torch.Tensor]:
        return [tok(prompts, padding="max_length", max_length=tok.model_max_length, truncation=True,
                    return_tensors="pt").input_ids for tok in tokenizers]

    def ids_for(template: str) -> list[torch.Tensor]:
        return tokenized([template.format(" and ".join(" ".join(tokens[c]) for c in combo)) for combo in combos])

    train_templates, val_template = templates(cfg["learnable_property"])
    per_template = [ids_for(t) for t in train_templates]
    train_ids = [torch.stack([pt[e] for pt in per_template]).to(device) for e in range(len(encoders))]
    train_scale = token_rank_factors(train_ids[0].cpu(), first_id, cfg["token_weight_decay"]).to(device)
    val_ids = [ids.to(device) for ids in ids_for(val_template)]
    # an image's own caption, where it has one, instead of the templates (its concept's tokens
    # where it names the concept, else in front)
    words = {c: " ".join(tokens[c]) for c in range(len(concepts.names))}
    captioned = {k: with_concept(cap, concepts.names[concepts.train[k][1][0]], words[concepts.train[k][1][0]])
                 for k, cap in enumerate(concepts.captions) if cap is not None}
    caption_ids = caption_scale = has_caption = None
    if captioned:
        has_caption = torch.tensor([k in captioned for k in range(len(concepts.train))])
        caption_ids = [ids.to(device) for ids in tokenized([captioned.get(k, "") for k in range(len(concepts.train))])]
        caption_scale = token_rank_factors(caption_ids[0].cpu(), first_id, cfg["token_weight_decay"]).to(device)
        has_caption = has_caption.to(device)
    val_captioned = {k: with_concept(cap, concepts.names[concepts.val[k][1][0]], words[concepts.val[k][1][0]])
                     for k, cap in enumerate(concepts.val_captions) if cap is not None}
    val_caption_ids = None
    if val_captioned:
        rows = [tokenized([val_captioned[k]]) if k in val_captioned else
                [v[cache["val_combo"][k]][None].cpu() for v in val_ids] for k in range(len(concepts.val))]
        val_caption_ids = [torch.cat([r[e] for r in rows]).to(device) for e in range(len(encoders))]
    weights = torch.tensor([float(r) for r in concepts.repeats]) if concepts.repeats and len(set(concepts.repeats)) > 1 else None
    empty_ids = [ids.to(device) for ids in tokenized([""])]
    sched = base.scheduler
    autocast = (
        contextlib.nullcontext() if cfg["precision"] == "fp32"
        else torch.autocast(device.type, dtype=DTYPES[cfg["precision"]])
    )

    def denoise(noisy: torch.Tensor, t: torch.Tensor, cond: tuple[torch.Tensor, Any]) -> torch.Tensor:
        """The UNet's noise prediction under an encoded prompt (condition()'s answer)."""
        return unet(noisy, t, encoder_hidden_states=cond[0], added_cond_kwargs=cond[1]).sample

    def predict(noisy: torch.Tensor, t: torch.Tensor, ids: list[torch.Tensor]) -> torch.Tensor:
        return denoise(noisy, t, condition(encoders, ids, resolution=resolution))

    def errors(pred: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return ((pred.float() - noise.float()) ** 2).mean(dim=(1, 2, 3))

    @torch.no_grad()
    def validate(final: bool) -> dict[str, float]:
        vg = torch.Generator(device="cpu").manual_seed(VAL_NOISE_SEED)
        lat, combo = cache["val_lat"], cache["val_combo"]
        total, hits, n_single = 0.0, 0, 0
        singles = [i for i, c in enumerate(combo.tolist()) if len(combos[c]) == 1]
        own = [combos[combo[i]][0] for i in singles]
        single_combo = [combos.index((c,)) for c in range(len(concepts.names))]
        sep_err = torch.zeros(len(singles), len(single_combo), device=device)
        per_t: dict[str, float] = {}
        vids = val_caption_ids if val_caption_ids is not None else [v[combo] for v in val_ids]
        with autocast:  # the held-out prompts once, not once per timestep (on SDXL the encoders
            cond = condition(encoders, vids, resolution=resolution)  # cost about a UNet call)
        # with one concept there is nothing to tell apart: its separation is 1 without a forward
        separate = final and singles and len(single_combo) > 1
        if separate:  # each concept's own prompt, for the held-out images of one concept
            with autocast:
                sep_cond = [condition(encoders, [v[sc].expand(len(singles), -1) for v in val_ids], resolution=resolution)
                            for sc in single_combo]
        for tv in VAL_TIMESTEPS:
            noise = torch.randn(lat.shape, generator=vg).to(device, lat.dtype)
            t = torch.full((lat.shape[0],), tv, device=device, dtype=torch.long)
            noisy = sched.add_noise(lat, noise, t)
            with autocast:
                per_t[f"val_loss/t{tv}"] = float(errors(denoise(noisy, t, cond), noise).mean())
                total += per_t[f"val_loss/t{tv}"]
                if separate:
                    for k, cond_k in enumerate(sep_cond):
                        sep_err[:, k] += errors(denoise(noisy[singles], t[singles], cond_k), noise[singles])
        out = {"val_loss": total / len(VAL_TIMESTEPS), **per_t}
        if final and singles:
            hits = int((sep_err.argmin(dim=1).cpu() == torch.tensor(own)).sum()) if separate else len(singles)
            n_single = len(singles)
            out["concept_separation"] = hits / n_single
        return out

    for (emb, _), ce in zip(saved_embs, concept_embs):
        emb.token_embedding = ce
    val_every = cfg["val_every"] or default_val_every(cfg["steps"], int(cache["val_lat"].shape[0]), cfg["batch_size"])
    # with `val_every` left to its default and early stops on, also validate at each rung, so that
    # a rung judges the trial at its own step (at 1/9 of the steps, not at the next validation)
    rung_at = set(report.rung_steps()) if cfg["val_every"] is None and hasattr(report, "rung_steps") else set()
    try:
        val_started = time.perf_counter()
        first = validate(final=False)
        val_init = first["val_loss"]
        curve = ValidationCurve(trainables.named() if score == "best" else None)
        curve.add(0, first, time.perf_counter() - val_started)
        if report is not None:  # the curve's first point, as a plug-in yields it (no rung at step 0;
            report(0, {"val_loss": val_init})  # its memory is known from the first step on)
        # 4) AdamW: embedding lr = ratio x lr; LR warmup from diffusers.optimization
        from diffusers.optimization import get_scheduler

        param_groups = optimizer_groups(trainables, cfg)
        trainable = [p for g in param_groups for p in g["params"]]
        vocab_norm = float(torch.stack([
            ce.base.weight[: ce.first_id].detach().float().norm(dim=-1).mean() for ce in concept_embs
        ]).mean())
        monitor = HealthMonitor(hcfg, trainables.norm_groups(), trainables.named(),
                                lambda: [ce.rows() for ce in concept_embs],
                                vocab_norm)
        opt = torch.optim.AdamW(param_groups)
        ema = None
        if cfg["ema_decay"] > 0:
            from diffusers.training_utils import EMAModel

            ema = EMAModel(trainable, decay=cfg["ema_decay"])
        lr_sched = get_scheduler(
            "constant_with_warmup", opt, num_warmup_steps=cfg["warmup_steps"],
            num_training_steps=cfg["steps"],
        )
        scaler = torch.amp.GradScaler("cuda") if cfg["precision"] == "fp16" else None
        meter = MemoryMeter(device, [*encoders, unet])
        lat_all, combo_all = cache["train_lat"], cache["train_combo"]
        cw, margin = cfg["contrastive_weight"], cfg["contrastive_margin"]
        history: dict[str, list[float]] = {"train_loss": [], "lr": []}
        if cw > 0:
            history["contrastive"] = []
        stopped: TrialStopped | None = None
        # 5) epsilon-prediction MSE on cached latents (+ the in-batch contrastive margin term)
        for step in range(cfg["steps"]):
            if weights is None:
                idx = torch.randint(0, lat_all.shape[0], (cfg["batch_size"],), generator=gen).to(device)
            else:  # kohya's N_name/ folders: an image's repeat count is its weight in the draw
                idx = torch.multinomial(weights, cfg["batch_size"], replacement=True, generator=gen).to(device)
            tmpl = torch.randint(0, len(train_templates), (cfg["batch_size"],), generator=gen).to(device)
            lat, combo = lat_all[idx], combo_all[idx]
            if cache["train_views"] is not None:  # a crop window and a flip per sample
                lat = cache["train_views"][idx, view_of(cfg, cache["train_views"].shape[1], len(idx), gen).to(device)]
            noise = torch.randn(lat.shape, generator=gen)
            if cfg["noise_offset"] > 0:  # a constant per sample and channel
                noise = noise + cfg["noise_offset"] * torch.randn((*lat.shape[:2], 1, 1), generator=gen)
            noise = noise.to(device, lat.dtype)
            t = torch.randint(0, sched.config.num_train_timesteps, (lat.shape[0],), generator=gen).to(device)
            noisy = sched.add_noise(lat, noise, t)
            ids = [ti[tmpl, combo] for ti in train_ids]
            scale = train_scale[tmpl, combo]
            if caption_ids is not None:
                own = has_caption[idx]
                ids = [torch.where(own[:, None], ci[idx], i) for ci, i in zip(caption_ids, ids)]
                scale = torch.where(own[:, None], caption_scale[idx], scale)
            if cfg["caption_dropout"] > 0:
                drop = (torch.rand(lat.shape[0], generator=gen) < cfg["caption_dropout"]).to(device)
                ids = [torch.where(drop[:, None], e.expand_as(i), i) for i, e in zip(ids, empty_ids)]
            weight = loss_weights(sched, t, cfg["min_snr_gamma"])
            with meter.step(trainable):
                with autocast:
                    if cw > 0:
                        b = lat.shape[0]
                        ii = torch.arange(b, device=device).repeat_interleave(b)
                        jj = torch.arange(b, device=device).repeat(b)
                        for ce in concept_embs:
                            ce.grad_scale = scale[jj]
                        err = errors(predict(noisy[ii], t[ii], [x[jj] for x in ids]), noise[ii]).view(b, b)
                        s = -err
                        different = (combo[:, None] != combo[None, :])
                        gap = s.diagonal()[:, None] - s
                        term = F.relu(margin - gap)[different].mean() if bool(different.any()) else err.sum() * 0
                        loss_main = (err.diagonal() * weight).mean()
                        loss = loss_main + cw * term
                    else:
                        for ce in concept_embs:
                            ce.grad_scale = scale
                        loss_main = (errors(predict(noisy, t, ids), noise) * weight).mean()
                        loss = loss_main
                (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.unscale_(opt)
            value = float(loss_main.detach())
            history["train_loss"].append(value)
            # 6) health: gradient statistics now, norms and the phase after the update
            try:
                # with a GradScaler, non-finite gradients are skipped steps, not divergence
                monitor.after_backward(step, value, grads_may_overflow=scaler is not None)
            except TrialStopped as exc:
                stopped = exc
                break
            if cfg["max_grad_norm"] > 0:
                torch.nn.utils.clip_grad_norm_(trainable, cfg["max_grad_norm"])
            lr_now = opt.param_groups[0]["lr"]
            if scaler:
                before = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
                monitor.record_scaler(before, skipped=scaler.get_scale() < before)
            else:
                opt.step()
            lr_sched.step()
            opt.zero_grad(set_to_none=True)
            if ema is not None:
                ema.step(trainable)
            history["lr"].append(lr_now)
            if cw > 0:
                history["contrastive"].append(float(term.detach()))
            if on_step is not None:
                on_step(step, {"train_loss": value, "lr": lr_now})
            try:
                monitor.after_step(step, history["train_loss"])
            except TrialStopped as exc:
                stopped = exc
                break
            done = step + 1  # steps trained; the last one is validated with the final checks below
            if (done % val_every == 0 or done in rung_at) and done < cfg["steps"]:
                val_started = time.perf_counter()
                for ce in concept_embs:
                    ce.grad_scale = None
                with _evaluated(ema, trainable):
                    curve.add(done, validate(final=False), time.perf_counter() - val_started)
                reason = report(done, {"val_loss": curve.points[-1]["val_loss"],
                                       "peak_mem_mb": meter.peak_mb(trainable, opt)}) if report else None
                if reason:
                    stopped = TrialStopped(reason, step, rung=getattr(report, "last_rung", 0))
                    break
        for ce in concept_embs:
            ce.grad_scale = None
        health_report = monitor.finish(history["train_loss"], stopped=stopped.reason if stopped else None)
        history |= monitor.history
        peak = meter.peak_mb(trainable, opt)
        health_json = json.dumps(health_report, indent=2, default=float).encode()
        tags = {"peak_mem_source": meter.source, "device": device.type, "model": base.source,
                "health": health_report["health"], "loss_phase": health_report["phase"]}
        health_metrics = {k: health_report[k] for k in ("embed_norm", "embed_norm_max_ratio", "embed_norm_growth",
                                                 "embed_vector_std_min", "cos_sim_mean", "cos_sim_spread")
                          if health_report[k] is not None and math.isfinite(health_report[k])}
        if stopped is not None:
            raise TrialStopped(stopped.reason, stopped.step, rung=stopped.rung, partial={
                "history": history, "tags": tags, "peak_mem_mb": peak, "health": health_report,
                "metrics": {"val_loss_init": val_init, "steps_run": stopped.step + 1, **health_metrics,
                            **curve.metrics(), "peak_mem_mb": peak},
                "artifacts": {"health.json": health_json}, "curve": curve.points,
            })
        if ema is not None:  # from here on (the last validation, exports, samples) the average
            ema.copy_to(trainable)
        val_started = time.perf_counter()
        final = validate(final=True)
        curve.add(cfg["steps"], final, time.perf_counter() - val_started)
        if report is not None:  # the last point, for the rungs of trials with more steps
            report(cfg["steps"], {"val_loss": final["val_loss"], "peak_mem_mb": peak})
        val_final = final["val_loss"]
        if score == "best" and curve.best_step != cfg["steps"]:
            curve.restore()  # the best step's trainables, for the score, exports and samples
            final = validate(final=True)
        learned = [ce.rows().detach().float().cpu().clone() for ce in concept_embs]
        artifacts = _exports(base, tokens, concepts.names, learned, unet if lora_unet else None,
                             encoders if lora_text else [], cfg)
        artifacts["health.json"] = health_json
    finally:
        for emb, base_tok in saved_embs:
            emb.token_embedding = base_tok
        _checkpointing(checkpointed, False)
    sample_metrics: dict[str, float] = {}
    if scfg.enabled:
        drawn_at = time.perf_counter()
        drawn = draw_samples(base, encoders, unet, artifacts, concepts.names, scfg, device)
        for name in concepts.names:
            artifacts[f"samples/{name}.png"] = drawn.grid_png(name)
        real = {name: [(im.transpose(1, 2, 0) + 1) / 2 for im, c in concepts.train if c == (ci,)]
                for ci, name in enumerate(concepts.names)}
        sample_metrics |= fidelity(_fidelity_encoder(scfg.fidelity_model, base, device.type), drawn.images, real)
        sample_metrics["sample_seconds"] = time.perf_counter() - drawn_at
    result = {
        **final,
        "peak_mem_mb": peak,
        "val_loss_init": val_init,
        "val_loss_final": val_final,
        "steps_run": cfg["steps"],
        "val_every": val_every,
        **curve.metrics(),
        "train_seconds": time.perf_counter() - started - sample_metrics.get("sample_seconds", 0.0),
        **sample_metrics,
        "trainable_params": sum(counts.values()),
        **{f"trainable_params_{k}": v for k, v in counts.items()},
        **health_metrics,
        "history": history,
        "tags": tags,
        "health": health_report,
        "artifacts": artifacts,
        "curve": curve.points,
        "datasets": _datasets(resolution, data, tuple((k, cfg[k]) for k in ("crop", "flip", "learnable_property"))),
    }
    return Trained(result, {tok: learned[0][i] for i, tok in enumerate(flat)}, base, encoders, unet, trainables)


@functools.lru_cache(maxsize=4)
def _datasets(resolution: int, data: str | None, settings: tuple = ()) -> list[dict[str, Any]]:
    return dataset_inputs(resolution, data, settings)


def with_concept(caption: str, name: str, words: str) -> str:
    """A caption with the concept's placeholder tokens in it: `{concept}` or `<name>` replaced, or
    the tokens put in front ("<dog>, a dog on a beach") when it names neither."""
    if "{concept}" in caption or f"<{name}>" in caption:
        return caption.replace("{concept}", words).replace(f"<{name}>", words)
    return f"{words}, {caption}"


def view_of(cfg: Mapping[str, Any], views: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """Per sample, which view of its image it trains on: a crop window at random (crop=random),
    mirrored with probability `flip` (the mirrored views are the second half)."""
    flipped = cfg["flip"] > 0
    windows = views // 2 if flipped else views
    out = torch.randint(0, windows, (n,), generator=gen) if windows > 1 else torch.zeros(n, dtype=torch.long)
    if flipped:
        out = out + windows * (torch.rand(n, generator=gen) < cfg["flip"]).long()
    return out


def _fidelity_encoder(path: str, base: BaseModel, device: str) -> Any:
    return _vision_encoder(path, device) if path else VaeEncoder(base.vae)


@functools.lru_cache(maxsize=1)
def _vision_encoder(path: str, device: str) -> Any:
    return VisionEncoder(path, device)


def optimizer_groups(trainables: Trainables, cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """AdamW parameter groups: the concept codes at lr x embedding_lr_ratio with
    embedding_weight_decay, the rest at lr with weight_decay."""
    out = [{"params": [ce.z for ce in trainables.concepts], "lr": cfg["lr"] * cfg["embedding_lr_ratio"],
            "weight_decay": cfg["embedding_weight_decay"]}]
    others = [p for e in trainables.encoders for p in e.values()] + list(trainables.unet.values())
    if others:
        out.append({"params": others, "lr": cfg["lr"], "weight_decay": cfg["weight_decay"]})
    return out


def loss_weights(sched: Any, t: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per-sample loss weights: min-SNR-gamma for epsilon prediction, min(SNR(t), gamma) / SNR(t)
    (SNR from diffusers' compute_snr); ones when gamma is 0."""
    if gamma <= 0:
        return torch.ones(t.shape[0], device=t.device)
    from diffusers.training_utils import compute_snr

    snr = compute_snr(sched, t).float()
    return torch.clamp(snr, max=gamma) / snr


def _checkpointing(modules: list[torch.nn.Module], on: bool) -> list[torch.nn.Module]:
    """Gradient checkpointing on (or back off) for the modules that support it; returns those
    switched, so that a worker's shared base model is left as it was found."""
    if not on:
        for m in modules:
            if hasattr(m, "disable_gradient_checkpointing"):
                m.disable_gradient_checkpointing()
            else:  # transformers 5 renamed it activation_checkpointing_*
                (getattr(m, "activation_checkpointing_disable", None) or m.gradient_checkpointing_disable)()
        return []
    switched = []
    for m in modules:
        if hasattr(m, "enable_gradient_checkpointing"):  # diffusers models
            m.enable_gradient_checkpointing()
            switched.append(m)
        elif getattr(m, "supports_gradient_checkpointing", False):  # transformers models (a trial's copy)
            if hasattr(m, "activation_checkpointing_enable"):
                m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            m.train()  # transformers checkpoints in training mode only (CLIP's dropout is 0)
            switched.append(m)
    return switched


@contextlib.contextmanager
def _evaluated(ema: Any, params: list[torch.Tensor]) -> Any:
    """The trainables as they are evaluated: their moving average while inside, when there is one."""
    if ema is None:
        yield
        return
    ema.store(params)
    ema.copy_to(params)
    try:
        yield
    finally:
        ema.restore(params)


def _exports(
    base: BaseModel, tokens: list[list[str]], names: tuple[str, ...], learned: list[torch.Tensor],
    unet: torch.nn.Module | None, text_encoders: list[torch.nn.Module], cfg: Mapping[str, Any],
) -> dict[str, bytes]:
    """What the trial learned, in the layouts diffusers loads: one learned_embeds.safetensors per
    concept (load_textual_inversion; SDXL keys clip_l / clip_g) and pytorch_lora_weights.safetensors
    (load_lora_weights, with the LoRA config as adapter metadata so alpha survives)."""
    from safetensors.torch import save

    out: dict[str, bytes] = {}
    offset = 0
    for name, group in zip(names, tokens):
        rows = [m[offset: offset + len(group)].contiguous() for m in learned]
        offset += len(group)
        if base.is_sdxl:
            state = {"clip_l": rows[0], "clip_g": rows[1]}
        else:
            state = {f"<{name}>": rows[0]}
        out[f"concepts/{name}/learned_embeds.safetensors"] = save(state)
    if unet is None and not text_encoders:
        return out
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft.utils import get_peft_model_state_dict

    def layers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
        return convert_state_dict_to_diffusers(
            {k: v.detach().float().cpu().contiguous() for k, v in get_peft_model_state_dict(module).items()}
        )

    meta = {"r": cfg["lora_rank"], "lora_alpha": cfg["lora_alpha"]}
    kwargs: dict[str, Any] = {}
    if unet is not None:
        kwargs |= {"unet_lora_layers": layers(unet),
                   "unet_lora_adapter_metadata": {**meta, "target_modules": LORA_UNET_TARGETS}}
    text_meta = {**meta, "target_modules": LORA_TEXT_TARGETS}
    for i, te in enumerate(text_encoders):
        suffix = "" if i == 0 else "_2"
        kwargs |= {f"text_encoder{suffix}_lora_layers": layers(te),
                   f"text_encoder{suffix}_lora_adapter_metadata": text_meta}
    pipe_cls = StableDiffusionXLPipeline if base.is_sdxl else StableDiffusionPipeline
    with tempfile.TemporaryDirectory() as tmp:
        pipe_cls.save_lora_weights(tmp, **kwargs)
        out["pytorch_lora_weights.safetensors"] = (Path(tmp) / "pytorch_lora_weights.safetensors").read_bytes()
    return out

