"""What a trial trains, built fresh for it: its placeholder tokens, its concept rows, copies of
the text encoders it unfreezes or adapts, its LoRA adapters (peft), and what it learned in the
layouts diffusers loads. The frozen rest of the base model is shared by every trial of a worker."""

from __future__ import annotations

import contextlib
import copy
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ._data import ConceptSet
from ._model import BaseModel
from ._params import Knobs

PROJECTION_SEED = 4321  # the fixed projection P of embedding_dim < hidden size
LORA_UNET_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
LORA_TEXT_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj"]


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
    itself never trains, nor do layers whose output is unused. `text_encoder` is the trial's
    copy over the base's frozen weights (over_same_weights): each weight it trains becomes a copy
    of its own (the base's stays frozen and as it was); the rest stays shared."""
    layer_list = _inner(text_encoder).encoder.layers
    if mode == "embedding_only":
        return
    if layers > len(used) and mode == "top_layers":
        raise ValueError(f"unfreeze_layers must be <= the encoder's {len(used)} used layers, got {layers}")
    if mode == "attention_only":
        chosen = [getattr(layer_list[i].self_attn, name) for i in used for name in LORA_TEXT_TARGETS]
        owners = [sub for m in chosen for sub in m.modules()]
    elif mode == "top_layers":
        owners = [sub for i in used[len(used) - layers:] for sub in layer_list[i].modules()]
    else:  # full: every weight but the token embedding matrix, the unused layers' and then the final norm's
        unused = {f"layers.{i}." for i in range(len(layer_list)) if i not in used}
        owners = [m for name, m in text_encoder.named_modules()
                  if "token_embedding" not in name and not any(u in name + "." for u in unused)
                  and not (unused and "final_layer_norm" in name)]
    for owner in owners:  # each weight it trains a copy of its own (a LoRA's adapters are already)
        for name, p in list(owner.named_parameters(recurse=False)):
            if not p.requires_grad:
                owner.register_parameter(name, torch.nn.Parameter(p.detach().clone(), requires_grad=True))


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


@dataclass
class TrialParts:
    """A trial's own model parts: its tokenizers (with the placeholder tokens), the text encoders
    and UNet it runs (copies where it trains them), and what trains."""

    tokens: list[list[str]]  # per concept its placeholder tokens (num_vectors of them)
    tokenizers: list[Any]
    encoders: list[torch.nn.Module]
    unet: torch.nn.Module
    trainables: Trainables
    embeddings: list[tuple[torch.nn.Module, torch.nn.Embedding]]  # per encoder: its embeddings, the base rows
    checkpointed: list[torch.nn.Module]

    @property
    def flat_tokens(self) -> list[str]:
        return [t for group in self.tokens for t in group]

    @property
    def first_id(self) -> int:
        return self.trainables.concepts[0].first_id

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The concept rows in the encoders while inside; on the way out, however it is left,
        the encoders' own rows back and gradient checkpointing off, so that a worker's shared base
        model is left as it was found."""
        for (emb, _), ce in zip(self.embeddings, self.trainables.concepts):
            emb.token_embedding = ce
        try:
            yield
        finally:
            for emb, base_tok in self.embeddings:
                emb.token_embedding = base_tok
            checkpointing(self.checkpointed, False)


def build_parts(base: BaseModel, knobs: Knobs, concepts: ConceptSet, gen: torch.Generator,
                device: torch.device) -> TrialParts:
    """Placeholder tokens on per-trial tokenizers; fresh copies of what trains, LoRA adapters
    seeded from the trial's seed, the concept rows drawn from `gen` (or a word's row)."""
    nv = knobs.num_vectors
    tokens = [[ph if nv == 1 else f"{ph}_{k}" for k in range(nv)] for ph in concepts.placeholders]
    flat = [t for group in tokens for t in group]
    tokenizers = [copy.deepcopy(tok) for tok in base.tokenizers]
    for tok in tokenizers:
        if tok.add_tokens(flat) != len(flat):
            raise ValueError(f"placeholder tokens {flat} clash with the tokenizer's vocabulary")
    # the encoders a trial adapts or unfreezes and the UNet a LoRA is added to are copied as
    # structures over the base's weights: the adapters go on the copy, and of the frozen weights
    # only those the freeze mode trains are copied (unfreeze)
    encoders = [over_same_weights(te) if knobs.copies_text_encoders else te for te in base.text_encoders]
    unet = over_same_weights(base.unet) if knobs.lora_unet else base.unet
    encoders = _adapted(base, knobs, encoders, unet)
    concept_embs, embeddings = [], []
    for i, (te, tok) in enumerate(zip(encoders, tokenizers)):
        emb = _embeddings_module(te)
        concept_embs.append(_concept_rows(base, i, knobs, emb.token_embedding, tok.convert_tokens_to_ids(flat[0]),
                                          len(flat), gen, device))
        embeddings.append((emb, emb.token_embedding))

    from diffusers.training_utils import cast_training_params

    cast_training_params([unet, *encoders], dtype=torch.float32)  # trainable weights stay fp32
    if knobs.freeze == "full" and knobs.precision != "fp32":
        for te in encoders:
            _after_trained_in_fp32(te)
    # the UNet (shared, or the trial's LoRA copy) and the encoders this trial trains (its copies)
    checkpointed = (checkpointing([unet, *(encoders if knobs.copies_text_encoders else [])], True)
                    if knobs.gradient_checkpointing else [])
    trainables = Trainables(
        concept_embs,
        [{n: p for n, p in te.named_parameters() if p.requires_grad} for te in encoders],
        {n: p for n, p in unet.named_parameters() if p.requires_grad} if knobs.lora_unet else {},
    )
    return TrialParts(tokens, tokenizers, encoders, unet, trainables, embeddings, checkpointed)


def _after_trained_in_fp32(text_encoder: torch.nn.Module) -> None:
    """freeze full in bf16/fp16: the weights that stay frozen past the trained ones (SDXL's first
    encoder's unused last layer and final norm) get fp32 copies of their own, still frozen: the
    trained layers' fp32 stream runs into them, and the CPU's layer_norm takes no fp32 input with
    half-precision weights ("mixed dtype (CPU)"). The token embedding matrix, before the stream,
    stays as it is."""
    token_embedding = _embeddings_module(text_encoder).token_embedding
    for module in text_encoder.modules():
        if module is token_embedding:
            continue
        for name, p in list(module.named_parameters(recurse=False)):
            if not p.requires_grad and p.dtype != torch.float32:
                module.register_parameter(name, torch.nn.Parameter(p.detach().float(), requires_grad=False))


def over_same_weights(module: torch.nn.Module, *, except_: tuple[torch.Tensor, ...] = ()) -> torch.nn.Module:
    """A copy of `module`'s structure (its submodules, their attributes) whose parameters and
    buffers are the original's own tensors, but for `except_`, which are copied: what a trial adds
    its adapters to without copying the frozen weights under them (an SDXL UNet's 10 GB in fp32,
    its text encoders' 3.3 GB). Only for modules whose other weights stay as they are."""
    copied = {id(t) for t in except_}
    shared = {id(t): t for t in (*module.parameters(), *module.buffers()) if id(t) not in copied}
    return copy.deepcopy(module, shared)


def _adapted(base: BaseModel, knobs: Knobs, encoders: list[torch.nn.Module],
             unet: torch.nn.Module) -> list[torch.nn.Module]:
    """LoRA adapters (peft) on the UNet and the used encoder layers, and the freeze mode's
    unfrozen weights. peft draws the adapters' initial weights from torch's global generator:
    seeded from the trial's seed here (and the caller's state restored after), so that a trial's
    result does not depend on which worker ran it or on what that worker ran before."""
    from peft import LoraConfig, inject_adapter_in_model

    def lora_config(targets: list[str] | str) -> LoraConfig:
        return LoraConfig(r=knobs.lora_rank, lora_alpha=knobs.lora_alpha, init_lora_weights="gaussian",
                          target_modules=targets)

    encoders = list(encoders)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(knobs.seed)
        if knobs.lora_unet:
            unet.add_adapter(lora_config(LORA_UNET_TARGETS))
        for i, te in enumerate(encoders):
            used = used_layers(te, i, sdxl=base.is_sdxl)
            if knobs.lora_text:
                encoders[i] = te = inject_adapter_in_model(lora_config(lora_text_pattern(used)), te)
            unfreeze(te, knobs.freeze, knobs.unfreeze_layers, used)
    return encoders


def _concept_rows(base: BaseModel, i: int, knobs: Knobs, base_tok: torch.nn.Embedding, first_id: int,
                  count: int, gen: torch.Generator, device: torch.device) -> ConceptEmbedding:
    """Encoder i's concept rows P z: z ~ N(0, .) scaled so that the rows have entries of std
    init_std, or every row a word's own row (init_from word:WORD)."""
    if first_id != base_tok.num_embeddings:
        raise ValueError("the tokenizer and the text encoder disagree on the vocabulary size")
    hidden = base_tok.embedding_dim
    dim = knobs.embedding_dim or hidden
    if dim > hidden:
        raise ValueError(f"embedding_dim must be <= the encoder's hidden size {hidden}, got {dim}")
    proj = _projection(hidden, dim)
    if knobs.init_from == "random":
        z = torch.randn(count, dim, generator=gen) * knobs.init_std * math.sqrt(hidden / dim)
    else:
        word = knobs.init_from[5:]
        ids = base.tokenizers[i](word, add_special_tokens=False).input_ids
        if len(ids) != 1:
            raise ValueError(f"init_from word {word!r} must be a single token, got {len(ids)} tokens")
        row = base_tok.weight[ids[0]].detach().float().cpu()
        z = (row if proj is None else proj.T @ row).repeat(count, 1)
    return ConceptEmbedding(base_tok, first_id, z.to(device), None if proj is None else proj.to(device))


def optimizer_groups(trainables: Trainables, knobs: Knobs) -> list[dict[str, Any]]:
    """AdamW parameter groups: the concept codes at lr x embedding_lr_ratio with
    embedding_weight_decay, the rest at lr with weight_decay."""
    out = [{"params": [ce.z for ce in trainables.concepts], "lr": knobs.lr * knobs.embedding_lr_ratio,
            "weight_decay": knobs.embedding_weight_decay}]
    others = [p for e in trainables.encoders for p in e.values()] + list(trainables.unet.values())
    if others:
        out.append({"params": others, "lr": knobs.lr, "weight_decay": knobs.weight_decay})
    return out


def checkpointing(modules: list[torch.nn.Module], on: bool) -> list[torch.nn.Module]:
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


def trial_exports(
    base: BaseModel, tokens: list[list[str]], names: tuple[str, ...], learned: list[torch.Tensor],
    unet: torch.nn.Module | None, text_encoders: list[torch.nn.Module], knobs: Knobs,
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

    meta = {"r": knobs.lora_rank, "lora_alpha": knobs.lora_alpha}
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

