"""Training-health diagnostics computed on every trial, and divergence-aware early stopping.

Per step: gradient L2 norm and non-finite count per parameter group, the concept-embedding norm
(and its ratio to the vocabulary's mean row norm and growth over its initial norm). At the end:
collapse checks, dead adapters, the loss phase (see _phase), and one health label:
diverged > collapsed > dead_adapter > degrading > oscillating > ok.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ._health_config import HealthConfig, TrialStopped
from ._phase import classify_phase

def _unit(name: str) -> str:
    # LoRA: a module's A and B matrices are one adapter
    for marker in (".lora_A", ".lora_B"):
        if marker in name:
            return name.split(marker)[0]
    return name


@dataclass
class HealthMonitor:
    cfg: HealthConfig
    groups: Mapping[str, list[torch.Tensor]]  # grad-norm groups
    named: Mapping[str, torch.Tensor]  # every trainable parameter by name (dead-adapter check)
    rows: Callable[[], list[torch.Tensor]]  # concept vectors per encoder
    vocab_norm: float
    history: dict[str, list[float]] = field(default_factory=dict)
    scale_history: list[float] = field(default_factory=list)
    skipped_steps: int = 0
    _grad_seen: set[str] = field(default_factory=set)
    _fingerprints: dict[str, tuple[float, float]] = field(default_factory=dict)
    _degrading_checks: int = 0
    unit_history: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._unit_names = self._units()
        self._fingerprints = {u: self._fingerprint(u) for u in self._unit_names}
        self.init_norm, init_max = self._norms()
        # a norm is judged against the larger of where it started and the vocabulary's rows, so a
        # deliberately large init (init_std ~ 1) is not divergence, growth from there is
        self.norm_ref = max(init_max, self.vocab_norm)
        for key in self.groups:
            self.history[f"grad_norm.{key}"] = []
        if self.cfg.enabled:
            self.history |= {"embed_norm": [], "embed_norm_ratio": [], "embed_norm_growth": []}

    def _units(self) -> dict[str, list[str]]:
        units: dict[str, list[str]] = {}
        for name in self.named:
            units.setdefault(_unit(name), []).append(name)
        return units

    def _fingerprint(self, unit: str) -> tuple[float, float]:
        ps = [self.named[n].detach().double() for n in self._unit_names[unit]]
        return (sum(float(p.sum()) for p in ps), sum(float((p * p).sum()) for p in ps))

    def _norms(self) -> tuple[float, float]:
        """(mean, max) L2 norm of the concept vectors, over every encoder."""
        norms = torch.cat([r.detach().float().norm(dim=-1) for r in self.rows()])
        return float(norms.mean()), float(norms.max())

    # --- per step ------------------------------------------------------------------------
    def after_backward(self, step: int, loss: float, *, grads_may_overflow: bool = False) -> None:
        """Gradient statistics; raises TrialStopped on a non-finite loss or gradient."""
        if not self.cfg.enabled:
            if self.cfg.early_stop and not math.isfinite(loss):
                raise TrialStopped(f"diverged: non-finite loss at step {step}", step)
            return
        bad = []
        for key, ps in self.groups.items():
            sq = sum(float(p.grad.detach().float().pow(2).sum()) for p in ps if p.grad is not None)
            norm = math.sqrt(sq) if math.isfinite(sq) else math.inf
            self.history[f"grad_norm.{key}"].append(norm)
            if not math.isfinite(norm):
                count = sum(int((~torch.isfinite(p.grad)).sum()) for p in ps if p.grad is not None)
                self.history.setdefault(f"grad_nonfinite.{key}", []).append(float(count))
                bad.append(key)
        for name, p in self.named.items():
            unit = _unit(name)
            if unit not in self._grad_seen and p.grad is not None and bool(p.grad.detach().abs().sum() > 0):
                self._grad_seen.add(unit)
        if step % self.cfg.check_every == 0:
            # per module (each LoRA module, each unfrozen encoder parameter, each concept code),
            # every check_every steps, into health.json: finer than the per-step group norms
            for unit, names in self._unit_names.items():
                grads = [self.named[n].grad for n in names if self.named[n].grad is not None]
                sq = sum(float(g.detach().float().pow(2).sum()) for g in grads)
                rec = self.unit_history.setdefault(unit, {"step": [], "grad_norm": [], "nonfinite": []})
                rec["step"].append(step)
                rec["grad_norm"].append(math.sqrt(sq) if math.isfinite(sq) else math.inf)
                rec["nonfinite"].append(float(sum(int((~torch.isfinite(g)).sum()) for g in grads))
                                        if not math.isfinite(sq) else 0.0)
        if self.cfg.early_stop and not math.isfinite(loss):
            raise TrialStopped(f"diverged: non-finite loss at step {step}", step)
        if self.cfg.early_stop and bad and not grads_may_overflow:
            raise TrialStopped(f"diverged: non-finite gradients in {', '.join(bad)} at step {step}", step)

    def record_scaler(self, scale: float, skipped: bool) -> None:
        self.scale_history.append(scale)
        self.skipped_steps += int(skipped)

    def after_step(self, step: int, losses: list[float]) -> None:
        """Embedding norms and the sustained-degradation check; raises TrialStopped."""
        if self.cfg.enabled:
            mean, top = self._norms()
            self.history["embed_norm"].append(mean)
            self.history["embed_norm_ratio"].append(top / self.norm_ref)
            self.history["embed_norm_growth"].append(mean / self.init_norm if self.init_norm > 0 else math.inf)
            if self.cfg.early_stop and (not math.isfinite(top) or top / self.norm_ref > self.cfg.max_norm_ratio):
                raise TrialStopped(
                    f"diverged: concept-embedding norm {top:.3g} is {top / self.norm_ref:.1f}x its reference "
                    f"{self.norm_ref:.3g} (bound {self.cfg.max_norm_ratio:g}) at step {step}", step)
        n = step + 1
        if self.cfg.early_stop and n >= self.cfg.min_steps and n % self.cfg.check_every == 0:
            phase, stats = classify_phase(losses, self.cfg.rules)
            self._degrading_checks = self._degrading_checks + 1 if phase == "degrading" else 0
            if self._degrading_checks >= self.cfg.patience:
                raise TrialStopped(
                    f"degrading: train_loss rose {100 * stats['rel_change']:.0f}% over the last "
                    f"{int(stats['n'])} steps (p={stats['p_value']:.2g}) for {self.cfg.patience} checks "
                    f"in a row, at step {step}", step)

    # --- at the end ----------------------------------------------------------------------
    def finish(self, losses: list[float], *, stopped: str | None = None) -> dict[str, Any]:
        rows = torch.cat([r.detach().float() for r in self.rows()[:1]])
        mean, top = self._norms()
        vec_std = rows.std(dim=-1) if rows.shape[-1] > 1 else torch.zeros(len(rows))
        cos_mean = cos_spread = None
        if len(rows) >= 2:
            unit = torch.nn.functional.normalize(rows, dim=-1)
            sims = unit @ unit.T
            off = sims[~torch.eye(len(rows), dtype=torch.bool)]
            cos_mean, cos_spread = float(off.mean()), float(off.max() - off.min())
        dead = sorted(
            u for u in self._unit_names
            if u not in self._grad_seen or self._fingerprint(u) == self._fingerprints[u]
        )
        phase, phase_stats = classify_phase(losses, self.cfg.rules)
        finite = all(math.isfinite(v) for v in losses) and math.isfinite(top)
        if stopped and stopped.startswith("diverged") or not finite or top / self.norm_ref > self.cfg.max_norm_ratio:
            health = "diverged"
        elif (cos_mean is not None and cos_mean > self.cfg.collapse_cos) or float(vec_std.min()) < self.cfg.collapse_std:
            health = "collapsed"
        elif dead:
            health = "dead_adapter"
        elif phase in ("degrading", "oscillating"):
            health = phase
        else:
            health = "ok"
        return {
            "health": health,
            "phase": phase,
            "phase_stats": phase_stats,
            "stopped": stopped,
            "embed_norm": mean,
            "embed_norm_max_ratio": top / self.norm_ref,
            "embed_norm_reference": self.norm_ref,
            "embed_norm_growth": mean / self.init_norm if self.init_norm > 0 else None,
            "embed_vector_std_min": float(vec_std.min()),
            "cos_sim_mean": cos_mean,
            "cos_sim_spread": cos_spread,
            "dead_adapters": dead,
            "grad_norm_max": {k[len("grad_norm."):]: max(v, default=0.0)
                              for k, v in self.history.items() if k.startswith("grad_norm.")},
            "grad_norm_per_module": self.unit_history,
            "grad_scaler_scales": self.scale_history,
            "grad_scaler_skipped_steps": self.skipped_steps,
            "thresholds": asdict(self.cfg),
        }
