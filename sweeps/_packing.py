"""Memory-aware packing: as many trials in flight on a GPU as their predicted peak memory fits.

Ray's fractional GPUs are not memory-aware (a fraction is a count, not megabytes), so csweep
gives each worker an equal share of the GPUs only to place it, and decides itself which worker
may start a task: the one whose GPU has room for the task's predicted peak under the budget
(`--gpu-mem-mb` per GPU, else the card's memory). The prediction comes from the study's own
measurements (every finished trial reports its peak):

1. the largest peak measured for the same memory shape (the knobs that change memory: batch
   size, resolution, LoRA rank and targets, precision, ...), times a margin;
2. else, once enough shapes are measured, a least-squares line through them (numeric knobs as
   they are, categorical ones as indicators), plus twice its residual spread, times the margin;
3. else a probe: the config trained for 2 steps on an empty GPU, its peak taken as a
   measurement (the built-in objective; a plug-in's unknown config runs alone instead).

A task that still runs out of memory while sharing its GPU is put back at the head of the
queue to run alone, and its shape's prediction is raised above what it was given. Nothing here
imports Ray or torch: the driver (sweeps._driver) asks `place`, and the pool says which GPU a
worker holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MARGIN = 1.15  # a prediction's headroom over what was measured
AFTER_OOM = 1.5  # a shape that ran out of memory sharing a GPU: at least this times what it was given
MIN_FIT = 4  # shapes measured before the line is trusted for a shape never seen
PROBE_STEPS = 2

# The built-in objective's knobs that change a trial's peak memory; the others (lr, init_std,
# warmup, ...) change what is learned, not how much is held.
MEMORY_KNOBS = ("batch_size", "resolution", "num_vectors", "freeze", "unfreeze_layers", "contrastive_weight",
                "lora_rank", "lora_targets", "embedding_dim", "precision", "gradient_checkpointing", "ema_decay",
                "optimizer")


def memory_shape(params: Mapping[str, Any], knobs: Sequence[str] | None) -> tuple:
    """The part of a config that decides its memory: `knobs` (None: every param but the seed)."""
    names = sorted(k for k in params if k != "seed") if knobs is None else [k for k in knobs if k in params]
    return tuple((k, params[k]) for k in names)


@dataclass
class MemoryPredictor:
    """A config's peak memory in MB from the study's measurements (see the module's text)."""

    knobs: Sequence[str] | None = None
    margin: float = MARGIN
    measured: dict[tuple, float] = field(default_factory=dict)  # shape -> largest peak seen
    floor: dict[tuple, float] = field(default_factory=dict)  # shape -> at least this (after an OOM)

    def observe(self, params: Mapping[str, Any], peak_mb: float) -> None:
        if math.isfinite(peak_mb) and peak_mb > 0:
            key = memory_shape(params, self.knobs)
            self.measured[key] = max(self.measured.get(key, 0.0), float(peak_mb))

    def observe_oom(self, params: Mapping[str, Any], given_mb: float) -> None:
        key = memory_shape(params, self.knobs)
        self.floor[key] = max(self.floor.get(key, 0.0), AFTER_OOM * given_mb)

    def predict(self, params: Mapping[str, Any]) -> float | None:
        key = memory_shape(params, self.knobs)
        if key in self.measured:
            guess = self.measured[key] * self.margin
        else:
            line = self._line(key)
            if line is None:
                return self.floor.get(key)
            guess = line * self.margin
        return max(guess, self.floor.get(key, 0.0))

    def _line(self, key: tuple) -> float | None:
        if len(self.measured) < MIN_FIT:
            return None
        import numpy as np

        shapes = list(self.measured)
        columns = self._columns([*shapes, key])
        x = np.array([[1.0] + [col(s) for col in columns] for s in shapes])
        y = np.array([self.measured[s] for s in shapes])
        ridge = 1e-6 * np.eye(x.shape[1])
        coef = np.linalg.solve(x.T @ x + ridge, x.T @ y)
        spread = float(np.sqrt(np.mean((x @ coef - y) ** 2)))
        at = float(np.array([1.0] + [col(key) for col in columns]) @ coef)
        # never below the smallest peak measured: a line can dip under any real trial
        return max(at + 2 * spread, float(y.min()))

    @staticmethod
    def _columns(shapes: Sequence[tuple]) -> list[Callable[[tuple], float]]:
        values: dict[str, set] = {}
        for s in shapes:
            for k, v in s:
                values.setdefault(k, set()).add(v)
        cols: list[Callable[[tuple], float]] = []
        for k, seen in sorted(values.items(), key=lambda kv: kv[0]):
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seen):
                cols.append(lambda s, k=k: float(dict(s).get(k, 0.0)))
            else:
                for level in sorted(seen, key=repr):
                    cols.append(lambda s, k=k, level=level: float(dict(s).get(k) == level))
        return cols


@dataclass
class Packing:
    """Which worker may start a task, by its GPU's room (`budget_mb` per GPU)."""

    budget_mb: float
    gpu_of: Callable[[int], Hashable]  # the GPU (key) a worker holds
    predictor: MemoryPredictor = field(default_factory=MemoryPredictor)
    can_probe: bool = False
    per_process_mb: float = 0.0  # what each process costs beyond its trial (a CUDA context)
    held: dict[Hashable, tuple[Hashable, float]] = field(default_factory=dict)  # task -> (GPU, MB)
    # worker -> (GPU, MB) it holds while it waits for its next task (its cached base model)
    resting: dict[int, tuple[Hashable, float]] = field(default_factory=dict)
    probing: set = field(default_factory=set)  # shapes whose probe is in flight
    unprobeable: set = field(default_factory=set)  # shapes whose probe failed: run alone
    most_in_flight: dict[Hashable, int] = field(default_factory=dict)  # GPU -> most tasks at once

    def committed(self, gpu: Hashable, *, besides: int | None = None) -> float:
        """MB held on a GPU: its running tasks' reservations and its waiting workers' residents
        (`besides`: leave that worker's out, its next task's reservation covers it)."""
        running = sum(mb for g, mb in self.held.values() if g == gpu)
        return running + sum(mb for w, (g, mb) in self.resting.items() if g == gpu and w != besides)

    def tasks_on(self, gpu: Hashable) -> int:
        return sum(1 for g, _ in self.held.values() if g == gpu)

    def need(self, params: Mapping[str, Any], *, alone: bool) -> float | None:
        """MB to reserve for a task; None: it runs alone (the whole GPU)."""
        if alone:
            return None
        guess = self.predictor.predict(params)
        return None if guess is None else guess + self.per_process_mb

    def place(self, free: Sequence[int], params: Mapping[str, Any], *, alone: bool = False
              ) -> tuple[str, int, float] | None:
        """("run" | "probe", worker, MB to hold) for the task at the head of the queue, or None
        to wait until a GPU has room (or its shape's probe is back)."""
        need = self.need(params, alone=alone)
        if need is None and not alone and self.can_probe:
            shape = memory_shape(params, self.predictor.knobs)
            if shape in self.probing:
                return None
            if shape not in self.unprobeable:
                empty = [w for w in free if self.tasks_on(self.gpu_of(w)) == 0]
                empty.sort(key=lambda w: self.committed(self.gpu_of(w), besides=w))
                if not empty:
                    return None
                self.probing.add(shape)
                return ("probe", empty[0], self.budget_mb)
        hold = self.budget_mb if need is None else need
        fits = [w for w in free if self._fits(w, hold)]
        if not fits:
            return None
        # best fit: the fullest GPU that still has room, so that empty GPUs stay free for big tasks
        return ("run", max(fits, key=lambda w: (self.committed(self.gpu_of(w), besides=w), -w)), hold)

    def _fits(self, widx: int, mb: float) -> bool:
        gpu = self.gpu_of(widx)
        if self.tasks_on(gpu) == 0:
            return True  # a task alone on a GPU always starts
        return self.committed(gpu, besides=widx) + mb <= self.budget_mb

    def hold(self, task: Hashable, widx: int, mb: float) -> None:
        gpu = self.gpu_of(widx)
        self.resting.pop(widx, None)
        self.held[task] = (gpu, mb)
        self.most_in_flight[gpu] = max(self.most_in_flight.get(gpu, 0), self.tasks_on(gpu))

    def release(self, task: Hashable) -> tuple[float, bool]:
        """Frees a task's room: (MB it held, whether it shared its GPU at the end)."""
        gpu, mb = self.held.pop(task, (None, 0.0))
        return mb, self.tasks_on(gpu) > 0

    def rest(self, widx: int, resident_mb: float) -> None:
        """A worker done with its task keeps `resident_mb` on its GPU until its next one."""
        if resident_mb > 0:
            self.resting[widx] = (self.gpu_of(widx), float(resident_mb))
        else:
            self.resting.pop(widx, None)

    def probed(self, params: Mapping[str, Any], peak_mb: float | None) -> None:
        shape = memory_shape(params, self.predictor.knobs)
        self.probing.discard(shape)
        if peak_mb is None or not math.isfinite(peak_mb):
            self.unprobeable.add(shape)
        else:
            self.predictor.observe(params, peak_mb)


def gpu_share(workers: int, gpus: float) -> float:
    """Each worker's GPU fraction, only to place it: an equal share that Ray can pack whole
    (1/k of a GPU, k workers to a GPU), never more than one GPU."""
    if gpus <= 0:
        return 0.0
    if workers <= gpus:
        return 1.0
    # Ray counts GPU fractions in steps of 1/10,000 and rounds a share up: 1/3 would take 0.3334,
    # and the third worker would never be placed
    return math.floor(10_000 / math.ceil(workers / gpus)) / 10_000


def describe_packing(packing: Packing, gpus: int) -> str:
    return (f"packing trials by predicted peak memory: {packing.budget_mb:,.0f} MB per GPU on {gpus} GPU(s), "
            f"{'a 2-step probe' if packing.can_probe else 'running alone'} for a config of unknown memory")
