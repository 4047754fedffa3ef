"""A trial's prompts as token ids, once: the templates for every concept combination, each
image's own caption where it has one, the held-out prompts, the empty prompt of caption dropout,
and per concept-token position its gradient factor (token_weight_decay)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._data import ConceptSet, templates
from ._params import Knobs
from ._trainables import TrialParts, token_rank_factors


@dataclass
class Prompts:
    train_ids: list[torch.Tensor]  # per encoder: (templates, combos, L)
    train_scale: torch.Tensor  # (templates, combos, L): gradient factor per position
    templates: int
    val_ids: list[torch.Tensor]  # per encoder: (combos, L)
    empty_ids: list[torch.Tensor]  # per encoder: (1, L)
    # an image's own caption, where it has one (per train image; None: no image has one)
    caption_ids: list[torch.Tensor] | None = None
    caption_scale: torch.Tensor | None = None
    has_caption: torch.Tensor | None = None
    val_caption_ids: list[torch.Tensor] | None = None  # per held-out image; None: the templates
    weights: torch.Tensor | None = None  # kohya's repeats: an image's weight in the draw


def with_concept(caption: str, name: str, words: str) -> str:
    """A caption with the concept's placeholder tokens in it: `{concept}` or `<name>` replaced, or
    the tokens put in front ("<dog>, a dog on a beach") when it names neither."""
    if "{concept}" in caption or f"<{name}>" in caption:
        return caption.replace("{concept}", words).replace(f"<{name}>", words)
    return f"{words}, {caption}"


def tokenize_prompts(parts: TrialParts, knobs: Knobs, concepts: ConceptSet, combos: list[tuple[int, ...]],
                     val_combo: torch.Tensor, device: torch.device) -> Prompts:
    tokens, first_id = parts.tokens, parts.first_id

    def tokenized(prompts: list[str]) -> list[torch.Tensor]:
        return [tok(prompts, padding="max_length", max_length=tok.model_max_length, truncation=True,
                    return_tensors="pt").input_ids for tok in parts.tokenizers]

    def ids_for(template: str) -> list[torch.Tensor]:
        return tokenized([template.format(" and ".join(" ".join(tokens[c]) for c in combo)) for combo in combos])

    train_templates, val_template = templates(knobs.learnable_property)
    per_template = [ids_for(t) for t in train_templates]
    train_ids = [torch.stack([pt[e] for pt in per_template]).to(device) for e in range(len(parts.encoders))]
    out = Prompts(
        train_ids=train_ids,
        train_scale=token_rank_factors(train_ids[0].cpu(), first_id, knobs.token_weight_decay).to(device),
        templates=len(train_templates),
        val_ids=[ids.to(device) for ids in ids_for(val_template)],
        empty_ids=[ids.to(device) for ids in tokenized([""])],
    )
    words = {c: " ".join(tokens[c]) for c in range(len(concepts.names))}
    captioned = {k: with_concept(cap, concepts.names[concepts.train[k][1][0]], words[concepts.train[k][1][0]])
                 for k, cap in enumerate(concepts.captions) if cap is not None}
    if captioned:
        has_caption = torch.tensor([k in captioned for k in range(len(concepts.train))])
        out.caption_ids = [ids.to(device) for ids in
                           tokenized([captioned.get(k, "") for k in range(len(concepts.train))])]
        out.caption_scale = token_rank_factors(out.caption_ids[0].cpu(), first_id, knobs.token_weight_decay).to(device)
        out.has_caption = has_caption.to(device)
    val_captioned = {k: with_concept(cap, concepts.names[concepts.val[k][1][0]], words[concepts.val[k][1][0]])
                     for k, cap in enumerate(concepts.val_captions) if cap is not None}
    if val_captioned:
        rows = [tokenized([val_captioned[k]]) if k in val_captioned else
                [v[val_combo[k]][None].cpu() for v in out.val_ids] for k in range(len(concepts.val))]
        out.val_caption_ids = [torch.cat([r[e] for r in rows]).to(device) for e in range(len(parts.encoders))]
    if concepts.repeats and len(set(concepts.repeats)) > 1:
        out.weights = torch.tensor([float(r) for r in concepts.repeats])
    return out

