"""What one trial produced, as one typed record: workers return it, one function maps it onto
Optuna (`tell`) and one onto MLflow (`mlflow_record`). With `--seeds K` a trial's K replicates
are combined into one record (`combine`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from common import attrs as A

REQUIRED = ("val_loss", "peak_mem_mb")
# scores whose seed noise --seeds K measures: (metric, its std, sem and replicates attrs)
NOISY = (("val_loss", A.VAL_LOSS_STD, A.VAL_LOSS_SEM, A.VAL_LOSS_REPLICATES),
         (A.FIDELITY, A.FIDELITY_STD, A.FIDELITY_SEM, A.FIDELITY_REPLICATES))


class Kind(str, Enum):
    OK = "ok"
    PRUNED = "pruned"  # stopped early by the objective (diverging, TrialPruned)
    OUT_OF_MEMORY = "out_of_memory"  # the config does not fit: a fact about it, not a bug
    FAILED = "failed"  # raised, returned garbage, or its worker died too often


@dataclass
class TrialResult:
    kind: Kind
    metrics: dict[str, float] = field(default_factory=dict)
    history: dict[str, list[float]] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, bytes] = field(default_factory=dict)
    reason: str = ""  # why it failed, ran out of memory or was pruned
    traceback: str = ""
    node: str = ""  # the Ray node it ran on
    seconds: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)  # fully resolved (defaults included)
    seed: int | None = None  # the replicate's seed, when it had one
    replicates: list[TrialResult] = field(default_factory=list)  # with --seeds K > 1
    datasets: list[dict[str, Any]] = field(default_factory=list)  # the data it saw (MLflow dataset inputs)
    # validations during training: {"step": s, "val_loss": v, "val_loss/t100": ...} per point
    curve: list[dict[str, float]] = field(default_factory=list)
    # what its worker still held on the GPU once it was done (the cached base model): packing
    # counts it against the GPU while the worker waits (sweeps._packing)
    resident_mb: float = 0.0

    @classmethod
    def failed(cls, reason: str, **kw: Any) -> TrialResult:
        return cls(Kind.FAILED, reason=reason, **kw)

    @property
    def seeds(self) -> list[int]:
        if self.replicates:
            return [r.seed for r in self.replicates if r.seed is not None]
        return [self.seed] if self.seed is not None else []


def normalize(raw: Any) -> dict[str, Any]:
    """Split an objective's return value into metrics / history / tags / artifacts.

    Raises ValueError when it is not a mapping with finite val_loss and peak_mem_mb.
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"objective returned {type(raw).__name__}, expected a mapping")
    metrics: dict[str, float] = {}
    for key, value in raw.items():
        if key in ("history", "tags", "artifacts", "health", "datasets", "curve"):
            continue
        try:
            metrics[str(key)] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"objective returned non-numeric {key}={value!r}") from None
    for key in REQUIRED:
        if key not in metrics:
            raise ValueError(f"objective result lacks {key!r} (got {sorted(metrics)})")
        if not math.isfinite(metrics[key]):
            raise ValueError(f"objective returned non-finite {key}={metrics[key]}")
    return {
        "metrics": metrics,
        "history": {k: [float(x) for x in v] for k, v in dict(raw.get("history", {})).items()},
        "tags": {k: str(v) for k, v in dict(raw.get("tags", {})).items()},
        "artifacts": {str(k): bytes(v) for k, v in dict(raw.get("artifacts", {})).items()},
        "datasets": [dict(d) for d in raw.get("datasets", [])],
        "curve": parse_curve(raw.get("curve", [])),
    }


def parse_curve(points: Any) -> list[dict[str, float]]:
    """A curve as the objective reported it: points with an int `step` >= 0 and a finite val_loss,
    in increasing step order; raises ValueError naming what is wrong."""
    out: list[dict[str, float]] = []
    for point in points or []:
        if not isinstance(point, Mapping) or "step" not in point or "val_loss" not in point:
            raise ValueError(f"a curve point must be a mapping with step and val_loss, got {point!r}")
        step = point["step"]
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step < 0 or int(step) != step:
            raise ValueError(f"a curve point's step must be an int >= 0, got {step!r}")
        try:
            values = {str(k): float(v) for k, v in point.items() if k != "step"}
        except (TypeError, ValueError):
            raise ValueError(f"a curve point's values must be numbers, got {point!r}") from None
        if not math.isfinite(values["val_loss"]):
            raise ValueError(f"a curve point's val_loss must be finite, got {values['val_loss']} at step {step}")
        if out and int(step) <= out[-1]["step"]:
            raise ValueError(f"curve steps must increase, got {int(step)} after {int(out[-1]['step'])}")
        out.append({"step": int(step), **values})
    return out


def best_point(curve: Sequence[Mapping[str, float]]) -> tuple[int, float]:
    """(best step, its val_loss): the lowest val_loss, the earliest of equals."""
    best = min(curve, key=lambda p: (p["val_loss"], p["step"]))
    return int(best["step"]), float(best["val_loss"])


def curve_metrics(curve: Sequence[Mapping[str, float]]) -> dict[str, float]:
    if not curve:
        return {}
    step, value = best_point(curve)
    return {"best_step": float(step), "val_loss_at_best": value}


def mean_curve(curves: Sequence[Sequence[Mapping[str, float]]]) -> list[dict[str, float]]:
    """The replicates' mean at the steps every replicate validated."""
    if not curves or any(not c for c in curves):
        return []
    by_step = [{int(p["step"]): p for p in c} for c in curves]
    steps = sorted(set.intersection(*(set(b) for b in by_step)))
    out = []
    for s in steps:
        keys = set.intersection(*(set(b[s]) for b in by_step)) - {"step"}
        out.append({"step": s, **{k: float(sum(b[s][k] for b in by_step) / len(by_step)) for k in sorted(keys)}})
    return out


# --- K seed replicates -> one trial ---------------------------------------------------------
def replicate_seeds(base: int, k: int, *, offset: int = 0) -> list[int]:
    """The seeds of a trial's K replicates: the trial's own seed first, then the next ones."""
    return [base + offset + i for i in range(k)]


def combine(replicates: Sequence[TrialResult]) -> TrialResult:
    """One trial from its seed replicates: val_loss and the other metrics are the mean, with
    std and sem of val_loss and fidelity; peak memory the max. A replicate that ran out of memory, failed or
    was pruned makes the trial so (the config is judged by its worst seed)."""
    if len(replicates) == 1:
        return replicates[0]
    first = replicates[0]
    node = ",".join(dict.fromkeys(r.node for r in replicates if r.node))
    seconds = max(r.seconds for r in replicates)
    for kind in (Kind.OUT_OF_MEMORY, Kind.FAILED, Kind.PRUNED):
        bad = [r for r in replicates if r.kind == kind]
        if bad:
            return replace(bad[0], node=node, seconds=seconds, replicates=list(replicates),
                           reason=f"seed {bad[0].seed}: {bad[0].reason}")
    import numpy as np

    keys = [k for k in first.metrics if all(k in r.metrics for r in replicates)]
    metrics = {k: float(np.mean([r.metrics[k] for r in replicates])) for k in keys}
    metrics["peak_mem_mb"] = max(r.metrics["peak_mem_mb"] for r in replicates)
    history = dict(first.history)
    artifacts = dict(first.artifacts)
    for r in replicates[1:]:
        history |= {f"seed{r.seed}/{k}": v for k, v in r.history.items()}
        artifacts |= {f"replicates/seed{r.seed}/{k}": v for k, v in r.artifacts.items()}
    # the seed noise of each noisy score: the replicates' values, their std and sem
    for name, std_key, sem_key, _ in NOISY:
        if name not in keys:
            continue
        values = np.array([r.metrics[name] for r in replicates], dtype=float)
        std = float(values.std(ddof=1))
        metrics |= {std_key: std, sem_key: std / math.sqrt(len(values))}
        history[f"replicate_{name}"] = [float(v) for v in values]
    metrics[A.N_SEEDS] = float(len(replicates))
    curve = mean_curve([r.curve for r in replicates])
    if curve:  # the best step of the mean curve (each replicate's own is in its history)
        metrics |= curve_metrics(curve)
    return TrialResult(Kind.OK, metrics, history, dict(first.tags), artifacts, node=node, seconds=seconds,
                       config=dict(first.config), seed=first.seed, replicates=list(replicates),
                       datasets=list(first.datasets), curve=curve)


def require(result: TrialResult, objectives: Sequence[str]) -> TrialResult:
    """An ok result lacking a finite value of one of the study's objectives (a plug-in that
    returns no `fidelity`, samples that could not be scored) is a failed trial that says so."""
    if result.kind is not Kind.OK:
        return result
    missing = [o for o in objectives if not math.isfinite(result.metrics.get(o, math.nan))]
    if not missing:
        return result
    got = ", ".join(f"{k}={result.metrics[k]}" for k in missing if k in result.metrics) or "absent"
    return replace(result, kind=Kind.FAILED,
                   reason=f"the study's objective {', '.join(missing)} has no finite value ({got})")


def replicate_health(replicates: Sequence[TrialResult]) -> list[str]:
    """Each replicate's health label: its objective's (`tags: {health: ...}`), "pruned" for one
    the objective stopped (diverging), "beaten" for one stopped at a rung (--early-stop dominated:
    it says nothing of its health), "failed" for one that raised or ran out of memory, "" when
    it said none."""
    out = []
    for r in replicates:
        if r.kind is Kind.PRUNED:
            out.append("beaten" if r.metrics.get(A.RUNG) else r.tags.get(A.HEALTH) or "pruned")
        elif r.kind is not Kind.OK:
            out.append("failed")
        else:
            out.append(r.tags.get(A.HEALTH, ""))
    return out


# --- onto Optuna --------------------------------------------------------------------------
def tell(study: Any, trial: Any, result: TrialResult, *, max_mem_mb: float | None,
         objectives: Sequence[str] = REQUIRED) -> None:
    """Record a trial's result in the study (the source of truth). Only a COMPLETE trial has
    objective values: out-of-memory, failed and pruned trials carry their reason instead, never
    placeholder numbers."""
    from optuna.trial import TrialState

    # every attr is a storage write: what the state already says (an ok outcome, the seed of a
    # one-seed trial) is not written again, so that --seeds 1 costs about what a trial cost
    trial.set_user_attr(A.NODE_ID, result.node)
    if result.kind is not Kind.OK:
        trial.set_user_attr(A.OUTCOME, result.kind.value)
    if "health" in result.tags:
        trial.set_user_attr(A.HEALTH, result.tags["health"])
    trial.set_user_attr(A.N_SEEDS, max(1, len(result.replicates)))  # part of the user-facing contract
    if result.curve:
        trial.set_user_attr(A.VAL_CURVE, [[int(p["step"]), p["val_loss"]] for p in result.curve])
        for key in (A.BEST_STEP, A.VAL_LOSS_AT_BEST):
            if key in result.metrics:
                value = result.metrics[key]
                trial.set_user_attr(key, int(value) if key == A.BEST_STEP else value)
    for key in (A.STEPS_RUN, A.STEPS_PLANNED, A.RUNG):
        if key in result.metrics:
            trial.set_user_attr(key, int(result.metrics[key]))
    if len(result.replicates) > 1:
        trial.set_user_attr(A.SEEDS, result.seeds)
        trial.set_user_attr(A.REPLICATE_HEALTH, replicate_health(result.replicates))
    if result.kind is Kind.OK:
        m = result.metrics
        if A.FIDELITY in m:  # the reports show it beside the objectives
            trial.set_user_attr(A.FIDELITY, m[A.FIDELITY])
        shown = {k.split("/", 1)[1]: m[k] for k in m if k.startswith("shows/")}
        if shown:  # the gallery says which concepts the samples show
            trial.set_user_attr(A.CONCEPTS_SHOWN, shown)
        for name, std_key, sem_key, replicates_key in NOISY:
            if std_key in m:
                trial.set_user_attr(std_key, m[std_key])
                trial.set_user_attr(sem_key, m[sem_key])
                trial.set_user_attr(replicates_key, [r.metrics[name] for r in result.replicates])
        if max_mem_mb is not None:
            trial.set_constraint("peak_mem_mb", m["peak_mem_mb"] - max_mem_mb)
        study.tell(trial, [m[o] for o in objectives])
    elif result.kind is Kind.PRUNED:
        trial.set_user_attr(A.PRUNE_REASON, result.reason or "pruned by the objective")
        if math.isfinite(result.metrics.get("peak_mem_mb", math.nan)):
            trial.set_user_attr(A.PEAK_MEM_SEEN, result.metrics["peak_mem_mb"])
        study.tell(trial, state=TrialState.PRUNED)
    elif result.kind is Kind.OUT_OF_MEMORY:
        trial.set_user_attr(A.OUT_OF_MEMORY, True)
        trial.set_user_attr(A.FAIL_REASON, f"out of memory: {result.reason}")
        study.tell(trial, state=TrialState.FAIL)
    else:
        trial.set_user_attr(A.FAIL_REASON, result.reason or "unknown error")
        study.tell(trial, state=TrialState.FAIL)


# --- onto MLflow --------------------------------------------------------------------------
_STATUS = {Kind.OK: "FINISHED", Kind.PRUNED: "KILLED", Kind.OUT_OF_MEMORY: "FAILED", Kind.FAILED: "FAILED"}
_STATE = {Kind.OK: "COMPLETE", Kind.PRUNED: "PRUNED", Kind.OUT_OF_MEMORY: "FAIL", Kind.FAILED: "FAIL"}


def mlflow_record(result: TrialResult) -> tuple[str, dict[str, Any]]:
    """(run status, the keyword arguments of Tracker.finish_trial) of a trial's result."""
    tags = {**result.tags, A.TAG_NODE: result.node, A.TAG_STATE: _STATE[result.kind],
            A.TAG_OUTCOME: result.kind.value}
    if result.seeds:
        tags[A.SEEDS] = ",".join(str(s) for s in result.seeds)
    if result.reason:
        tags[A.PRUNE_REASON if result.kind is Kind.PRUNED else A.FAIL_REASON] = result.reason[:5000]
    if result.kind is Kind.OUT_OF_MEMORY:
        tags[A.TAG_INFEASIBLE] = "out of memory"
    artifacts = dict(result.artifacts)
    if result.kind is Kind.FAILED:
        artifacts["traceback.txt"] = (result.traceback or result.reason).encode()
    record = {"metrics": dict(result.metrics), "history": dict(result.history), "tags": tags,
              "artifacts": artifacts, "config": dict(result.config) or None}
    if result.curve:
        record["curve"] = curve_series(result.curve)
    if result.datasets:
        record["datasets"] = list(result.datasets)
    return _STATUS[result.kind], record


def curve_series(curve: Sequence[Mapping[str, float]]) -> dict[str, list[list[float]]]:
    """A curve as MLflow metric series: {"val_loss": [[step, value], ...], "val_loss/t100": ...}."""
    out: dict[str, list[list[float]]] = {}
    for p in curve:
        for k, v in p.items():
            if k != "step":
                out.setdefault(k, []).append([int(p["step"]), float(v)])
    return out
