"""The driver: ask Optuna, keep W trials in flight on Ray, tell, log to MLflow, report."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search_spaces import SearchSpace

from ._study import make_sampler, make_storage, open_study
from ._tracking import Tracker, redact
from ._workers import local_runtime_env, make_worker, start_ray

MAX_MEM_ATTR = "max_mem_mb"


@dataclass(frozen=True)
class RunConfig:
    space: SearchSpace
    study_name: str
    trials: int
    workers: int
    workdir: Path
    storage: str
    tracking_uri: str
    objective: str
    builtin: bool
    fixed: Mapping[str, Any]
    model: str = "tiny"
    data: str | None = None
    sampler: str = "tpe"
    seed: int | None = None
    ray_address: str | None = None
    cpus_per_trial: float = 1.0
    gpus_per_trial: float | None = None
    max_mem_mb: float | None = None
    health: Mapping[str, Any] = field(default_factory=dict)
    progress: bool = True
    artifact_root: Path | None = None


@dataclass
class Outcome:
    study_name: str
    completed: int = 0
    failed: int = 0
    pruned: int = 0
    report_dir: Path | None = None
    parent_run_id: str = ""
    interrupted: bool = False
    trial_numbers: list[int] = field(default_factory=list)


def _gpus_for(cfg: RunConfig) -> float:
    if cfg.gpus_per_trial is not None:
        return cfg.gpus_per_trial
    import ray

    return 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0


def _quiet() -> None:
    import logging
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    for name in ("mlflow", "alembic", "ray"):
        logging.getLogger(name).setLevel(logging.WARNING)


def run_sweep(cfg: RunConfig) -> Outcome:
    import ray
    from optuna.trial import TrialState

    _quiet()
    storage = make_storage(cfg.storage)
    study = open_study(
        cfg.study_name, storage,
        sampler_factory=lambda n: make_sampler(
            cfg.sampler, seed=None if cfg.seed is None else cfg.seed + n, workers=cfg.workers
        ),
    )
    if cfg.max_mem_mb is not None:
        study.set_user_attr(MAX_MEM_ATTR, cfg.max_mem_mb)
    study.set_user_attr("space", cfg.space.to_dict())
    study.set_user_attr("objective", cfg.objective)
    tracker = Tracker(cfg.tracking_uri, cfg.study_name, artifact_root=cfg.artifact_root)
    study.set_user_attr("mlflow_experiment_id", tracker.experiment_id)
    parent = tracker.attach_parent(
        study,
        params={
            "space": cfg.space.name, "objective": cfg.objective, "sampler": cfg.sampler,
            "model": cfg.model, "data": cfg.data or "synthetic", "storage": redact(cfg.storage),
            "seed": cfg.seed, **{f"fixed.{k}": v for k, v in cfg.fixed.items()},
        },
    )
    outcome = Outcome(cfg.study_name, parent_run_id=parent)
    if cfg.builtin and cfg.ray_address is None:
        from objectives import prepare_model

        prepare_model(cfg.model, on_build=lambda where: print(
            f"building the tiny model once for this machine (about a minute), cached in {where}",
            file=sys.stderr, flush=True))

    start_ray(cfg.ray_address, num_cpus=max(2, math.ceil(cfg.workers * cfg.cpus_per_trial)),
              runtime_env=local_runtime_env())
    options = {"num_cpus": cfg.cpus_per_trial, "num_gpus": _gpus_for(cfg), "max_restarts": 0}
    target = _objective_target(cfg)
    workers = [make_worker(options, target, cfg.builtin, cfg.model, cfg.data, cfg.health) for _ in range(cfg.workers)]
    distributions = cfg.space.distributions()
    in_flight: dict[Any, tuple[Any, str, int]] = {}  # future -> (trial, run id, worker index)
    free = list(range(len(workers)))
    asked = 0
    bar = _progress(cfg)

    def submit(widx: int) -> None:
        nonlocal asked
        trial = study.ask(fixed_distributions=distributions)
        params = {**cfg.fixed, **trial.params}
        run_id = tracker.start_trial(parent, cfg.study_name, trial.number, params)
        trial.set_user_attr("mlflow_run_id", run_id)
        trial.set_user_attr("fixed_params", dict(cfg.fixed))
        in_flight[workers[widx].run.remote(params)] = (trial, run_id, widx)
        outcome.trial_numbers.append(trial.number)
        asked += 1

    def finish(trial: Any, run_id: str, result: Mapping[str, Any]) -> None:
        trial.set_user_attr("node_id", result.get("node_id", ""))
        tags = {**result.get("tags", {}), "ray.node_id": result.get("node_id", "")}
        if "health" in tags:
            trial.set_user_attr("health", tags["health"])
        if result.get("pruned"):
            reason = result.get("error", "pruned")
            trial.set_user_attr("prune_reason", reason)
            study.tell(trial, state=TrialState.PRUNED)
            outcome.pruned += 1
            tracker.finish_trial(
                run_id, status="KILLED", metrics=result.get("metrics", {}), history=result.get("history", {}),
                tags={**tags, "optuna.state": "PRUNED", "prune_reason": reason[:5000]},
                artifacts=result.get("artifacts", {}), config={**cfg.fixed, **trial.params},
            )
        elif result.get("ok"):
            metrics = result["metrics"]
            values = [metrics["val_loss"], metrics["peak_mem_mb"]]
            if cfg.max_mem_mb is not None:
                trial.set_constraint("peak_mem_mb", values[1] - cfg.max_mem_mb)
            study.tell(trial, values)
            outcome.completed += 1
            tracker.finish_trial(
                run_id, status="FINISHED", metrics=metrics, history=result.get("history", {}),
                tags={**tags, "optuna.state": "COMPLETE"},
                artifacts=result.get("artifacts", {}), config={**cfg.fixed, **trial.params},
            )
        else:
            reason = result.get("error", "unknown error")
            trial.set_user_attr("fail_reason", reason)
            study.tell(trial, state=TrialState.FAIL)
            outcome.failed += 1
            tracker.finish_trial(
                run_id, status="FAILED", tags={"fail_reason": reason[:5000]},
                artifacts={"traceback.txt": result.get("traceback", reason).encode()},
            )

    try:
        while asked < cfg.trials or in_flight:
            while free and asked < cfg.trials:
                submit(free.pop(0))
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for fut in done:
                trial, run_id, widx = in_flight.pop(fut)
                try:
                    result = ray.get(fut)
                except ray.exceptions.RayError as exc:
                    # the worker process died (killed, OOM-killed): fail the trial, replace it
                    result = {"ok": False, "error": f"worker lost: {exc.__class__.__name__}: {exc}"[:2000]}
                    workers[widx] = make_worker(options, target, cfg.builtin, cfg.model, cfg.data, cfg.health)
                finish(trial, run_id, result)
                free.append(widx)
                _update(bar, study, outcome, len(in_flight))
    except KeyboardInterrupt:
        outcome.interrupted = True
        for fut, (trial, run_id, _) in in_flight.items():
            ray.cancel(fut, force=True)
            trial.set_user_attr("fail_reason", "interrupted (SIGINT on the driver)")
            study.tell(trial, state=TrialState.FAIL)
            outcome.failed += 1
            tracker.finish_trial(run_id, status="KILLED", tags={"fail_reason": "interrupted"})
        in_flight.clear()
    finally:
        if bar is not None:
            bar.close()
        for w in workers:
            ray.kill(w)
    outcome.report_dir = write_study_reports(study, cfg.workdir, tracker, parent)
    tracker.end_parent(parent, "KILLED" if outcome.interrupted else "FINISHED")
    return outcome


def _objective_target(cfg: RunConfig) -> str:
    from objectives import get_objective

    return get_objective(cfg.objective).target


def write_study_reports(study: Any, workdir: Path, tracker: Tracker | None, parent: str | None) -> Path:
    from reports import write_study_report

    out = workdir / "reports" / study.study_name
    write_study_report(study, out, tracking_uri=redact(tracker.uri) if tracker else None)
    if tracker is not None and parent:
        tracker.log_files(parent, out, "reports")
    return out


def _progress(cfg: RunConfig) -> Any:
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.trials, desc=cfg.study_name, unit="trial", file=sys.stderr, dynamic_ncols=True)


def _update(bar: Any, study: Any, outcome: Outcome, running: int) -> None:
    if bar is None:
        return
    bar.update(1)
    front = len(study.best_trials)
    bar.set_postfix(done=outcome.completed, failed=outcome.failed, pruned=outcome.pruned, running=running,
                    front=front)
