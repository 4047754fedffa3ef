"""One settings record per run: what `csweep run` was asked, written to the study, read back by
`resume`, `sync`, `report` and `rerun-front`. Every field is stored unless it says where it
comes from on each invocation, so a new option survives a resume without further edits."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search_spaces import SearchSpace, parse_space

from ._rungs import DEFAULT_RUNGS
from ._study import OBJECTIVES

# fields each invocation gives anew (`resume` has flags of its own for them); all others are stored
PER_INVOCATION = {"per_invocation": True}


@dataclass(frozen=True)
class RunConfig:
    space: SearchSpace
    study_name: str = field(metadata=PER_INVOCATION)
    trials: int = field(metadata=PER_INVOCATION)
    workers: int = field(metadata=PER_INVOCATION)
    workdir: Path = field(metadata=PER_INVOCATION)
    storage: str = field(metadata=PER_INVOCATION)
    tracking_uri: str = ""  # stored without its password
    objective: str = "textual_inversion"
    builtin: bool = True
    fixed: Mapping[str, Any] = field(default_factory=dict)
    model: str = "tiny"
    data: str | None = None
    sampler: str = "tpe"
    seed: int | None = None
    seeds: int = 1
    # "every": each config trains `seeds` seeds; "design" (--sampler coupling): `seeds` is a
    # budget of trials x seeds runs that the design spends (CouplingSampler.seeds_for)
    seed_plan: str = "every"
    until_decisive: bool = False  # stop once every hypothesis (or pair) has a decided verdict
    score: str = "final"  # the study's val_loss: the trial's last validation, or its best step's
    early_stop: str = ""  # "dominated": stop trials the others beat at a rung (sweeps._rungs)
    profile: str = ""  # the space's profile (model family) the run took its ranges from
    rungs: tuple[float, ...] = DEFAULT_RUNGS  # fractions of a trial's steps (sweeps._rungs)
    ray_address: str | None = field(default=None, metadata=PER_INVOCATION)
    cpus_per_trial: float | None = None  # None: the CPUs shared among the trials in flight
    gpus_per_trial: float | None = None
    # MB per GPU that trials in flight may hold together (sweeps._packing); None: the card's memory
    gpu_mem_mb: float | None = None
    max_mem_mb: float | None = None
    health: Mapping[str, Any] = field(default_factory=dict)
    # what every trial draws (objectives.SampleConfig as a mapping); None: no samples
    samples: Mapping[str, Any] | None = None
    max_retries: int = 1
    max_fail_share: float = 0.5
    objectives: tuple[str, ...] = OBJECTIVES  # the study's (sweeps._study)
    progress: bool = field(default=True, metadata=PER_INVOCATION)
    # write the reports at the end (benchmarks time the loop alone)
    reports: bool = field(default=True, metadata=PER_INVOCATION)
    artifact_root: Path | None = field(default=None, metadata=PER_INVOCATION)
    # parameters to run first (a resume's re-runs, rerun-front's configs)
    enqueue: Sequence[Mapping[str, Any]] = field(default=(), metadata=PER_INVOCATION)
    # user attrs of each enqueued trial, in the same order (rerun-front: the trial it re-trains)
    enqueue_attrs: Sequence[Mapping[str, Any]] = field(default=(), metadata=PER_INVOCATION)
    seed_offset: int = field(default=0, metadata=PER_INVOCATION)  # rerun-front: fresh seeds
    # a fresh `csweep run --seed-plan design`: `trials` x `seeds` is a budget of training runs
    # (sweeps._runner.planned_trials turns it into trials); a resume's `trials` are trials
    trials_are_runs: bool = field(default=False, metadata=PER_INVOCATION)

    def __post_init__(self) -> None:
        object.__setattr__(self, "objectives", tuple(self.objectives))  # JSON gives a list
        object.__setattr__(self, "rungs", tuple(self.rungs))

    @staticmethod
    def stored_fields() -> list[str]:
        return [f.name for f in dataclasses.fields(RunConfig) if not f.metadata.get("per_invocation")]

    @staticmethod
    def per_invocation_fields() -> list[str]:
        return [f.name for f in dataclasses.fields(RunConfig) if f.metadata.get("per_invocation")]

    def stored(self) -> dict[str, Any]:
        """The stored fields as JSON-able values (no credentials)."""
        from ._tracking import redact

        out: dict[str, Any] = {}
        for name in self.stored_fields():
            value = getattr(self, name)
            if isinstance(value, SearchSpace):
                value = value.to_dict()
            elif isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, Path):
                value = str(value)
            out[name] = value
        out["tracking_uri"] = redact(self.tracking_uri)
        return out

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any], *, source: str, **per_invocation: Any) -> RunConfig:
        """The run's config again: stored fields from the study (defaults for fields an older
        csweep did not store), per-invocation ones from the caller."""
        known = set(cls.stored_fields())
        values = {k: v for k, v in stored.items() if k in known}
        values["space"] = parse_space(stored["space"], source=source)
        missing = set(cls.per_invocation_fields()) - set(per_invocation)
        required = {f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        if missing & required:
            raise TypeError(f"from_stored needs {sorted(missing & required)}")
        return cls(**values, **per_invocation)
