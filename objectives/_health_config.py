"""Health thresholds and the early-stop signal (no torch: the CLI checks them up front)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ._phase import PhaseRules

@dataclass(frozen=True)
class HealthConfig:
    """Thresholds, with their defaults; `csweep run --health KEY=VALUE` overrides them."""

    enabled: bool = True  # per-step statistics (off: only the final checks)
    early_stop: bool = True  # stop hopeless trials at once (PRUNED with the reason)
    max_norm_ratio: float = 20.0  # diverged: a concept vector's norm > this x max(its initial norm, vocab's mean row norm)
    min_steps: int = 30  # no phase verdict before this many steps
    check_every: int = 10  # steps between phase checks while training
    patience: int = 3  # consecutive 'degrading' checks that stop a trial
    collapse_cos: float = 0.98  # collapsed: mean cosine similarity of different concepts' vectors above
    collapse_std: float = 1e-6  # collapsed: a concept vector whose entries have std below
    window: int = 60  # phase window (steps)
    degrade_p: float = 0.01
    degrade_rel: float = 0.05
    oscillation_ratio: float = 1.5

    @property
    def rules(self) -> PhaseRules:
        return PhaseRules(window=self.window, degrade_p=self.degrade_p, degrade_rel=self.degrade_rel,
                          oscillation_ratio=self.oscillation_ratio)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "HealthConfig":
        """Raises ValueError naming an unknown key or a value of the wrong type."""
        known = {f.name: f.type for f in fields(cls)}
        out: dict[str, Any] = {}
        for key, value in values.items():
            if key not in known:
                raise ValueError(f"health setting {key!r} is unknown (known: {', '.join(known)})")
            default = getattr(cls(), key)
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"health setting {key} must be true or false, got {value!r}")
            elif isinstance(default, int):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"health setting {key} must be an int >= 1, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"health setting {key} must be a number > 0, got {value!r}")
            out[key] = value
        return cls(**out)


class TrialStopped(Exception):
    """A hopeless trial stopped early; carries what it logged so far. `rung`: the rung of
    csweep's --early-stop dominated that stopped it (0: stopped for its health)."""

    def __init__(self, reason: str, step: int, partial: dict[str, Any] | None = None, rung: int = 0) -> None:
        super().__init__(reason)
        self.reason, self.step, self.partial, self.rung = reason, step, partial or {}, rung
