"""Prompt token ids -> UNet conditioning, as the SD and SDXL pipelines compute it."""

from __future__ import annotations

from typing import Any

import torch


def condition(
    text_encoders: list[Any], ids: list[torch.Tensor], *, resolution: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """Prompt token ids (one tensor per encoder) -> UNet conditioning, as the pipelines do:
    SD 1.x the last hidden state; SDXL both encoders' penultimate states side by side, plus the
    second encoder's pooled projection and the six size/crop time ids."""
    if len(text_encoders) == 1:
        return text_encoders[0](ids[0])[0], None
    outs = [te(i, output_hidden_states=True) for te, i in zip(text_encoders, ids)]
    hidden = torch.cat([o.hidden_states[-2] for o in outs], dim=-1)
    pooled = outs[1].text_embeds
    time_ids = torch.tensor([resolution, resolution, 0, 0, resolution, resolution], device=pooled.device)
    added = {"text_embeds": pooled, "time_ids": time_ids.to(pooled.dtype).repeat(pooled.shape[0], 1)}
    return hidden, added
