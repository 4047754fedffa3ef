"""The driver: ask Optuna, keep W trials in flight on Ray, tell, log to MLflow, report.

Optuna's storage is the source of truth. MLflow is logged to on the side: when it is unreachable
the sweep goes on and `csweep sync` back-fills it later.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reports import MAX_MEM_ATTR
from search_spaces import SearchSpace

from ._study import make_sampler, make_storage, open_study
from ._tracking import PARENT_RUN_ATTR, Tracker, redact
from ._workers import make_worker, runtime_env, start_ray

RUN_ATTR = "csweep_run"  # what `csweep resume` needs to run the same sweep again
TARGET_ATTR = "target_trials"
INFEASIBLE_CONSTRAINT = 1e6  # constraint value of a trial that ran out of memory
PENDING_DIR = "pending_mlflow"


class SweepAborted(RuntimeError):
    """Too many trials failed: the sweep stopped instead of burning the cluster."""


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
    max_retries: int = 1
    max_fail_share: float = 0.5
    progress: bool = True
    reports: bool = True  # write the reports at the end (benchmarks time the loop alone)
    artifact_root: Path | None = None
    enqueue: Sequence[Mapping[str, Any]] = ()

    def stored(self) -> dict[str, Any]:
        """The settings a resume needs, as JSON-able values (no credentials)."""
        keep = ("objective", "builtin", "model", "data", "sampler", "seed", "cpus_per_trial", "gpus_per_trial",
                "max_mem_mb", "max_retries", "max_fail_share")
        out = {k: getattr(self, k) for k in keep}
        return {**out, "fixed": dict(self.fixed), "health": dict(self.health)}


@dataclass
class Outcome:
    study_name: str
    completed: int = 0
    failed: int = 0
    pruned: int = 0
    report_dir: Path | None = None
    parent_run_id: str = ""
    interrupted: bool = False
    aborted: str = ""
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
    for name in ("mlflow", "alembic", "ray", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR)


def counted_trials(study: Any) -> int:
    """Trials that count toward the requested total: all but those replaced by a re-run
    (stale RUNNING trials of a dead driver, trials interrupted by Ctrl-C)."""
    return sum(1 for t in study.trials if not t.user_attrs.get("replaced"))


class SafeTracker:
    """Tracker calls that never take the sweep down: a failure marks MLflow as unreachable and
    the trial's record is kept on disk for `csweep sync`."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.tracker: Tracker | None = None
        self.error = ""
        try:
            from ._study import retry_on_race

            self.tracker = retry_on_race(
                lambda: Tracker(cfg.tracking_uri, cfg.study_name, artifact_root=cfg.artifact_root))
        except Exception as exc:  # noqa: BLE001 - MLflow down must not stop the sweep
            self.error = f"{exc.__class__.__name__}: {exc}"

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.tracker is None:
            return None
        try:
            return getattr(self.tracker, method)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            self.error = f"{exc.__class__.__name__}: {str(exc)[:300]}"
            return None


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
    if not cfg.enqueue:  # a fresh run adds its trials to the target; a resume only completes it
        study.set_user_attr(TARGET_ATTR, counted_trials(study) + cfg.trials)
    study.set_user_attr("space", cfg.space.to_dict())
    study.set_user_attr("objective", cfg.objective)
    study.set_user_attr(RUN_ATTR, cfg.stored())
    safe = SafeTracker(cfg)
    parent = ""
    if safe.tracker is not None:
        study.set_user_attr("mlflow_experiment_id", safe.tracker.experiment_id)
        parent = safe.call("attach_parent", study, params={
            "space": cfg.space.name, "objective": cfg.objective, "sampler": cfg.sampler,
            "model": cfg.model, "data": cfg.data or "synthetic", "storage": redact(cfg.storage),
            "seed": cfg.seed, **{f"fixed.{k}": v for k, v in cfg.fixed.items()},
        }) or ""
    outcome = Outcome(cfg.study_name, parent_run_id=parent)
    if cfg.builtin and cfg.ray_address is None:
        from objectives import prepare_model

        prepare_model(cfg.model, on_build=lambda where: print(
            f"building the tiny model once for this machine (about a minute), cached in {where}",
            file=sys.stderr, flush=True))

    start_ray(cfg.ray_address, num_cpus=max(2, math.ceil(cfg.workers * cfg.cpus_per_trial)),
              runtime_env=runtime_env(cluster=cfg.ray_address is not None))
    options = {"num_cpus": cfg.cpus_per_trial, "num_gpus": _gpus_for(cfg), "max_restarts": 0}
    target = _objective_target(cfg)
    # on a cluster the data folder travels through the object store (other nodes lack the path)
    data: Any = cfg.data
    if cfg.ray_address is not None and cfg.data is not None:
        from ._workers import pack_folder

        data = ray.put(pack_folder(cfg.data))

    def new_worker() -> Any:
        return make_worker(options, target, cfg.builtin, cfg.model, data, cfg.health)

    workers = [new_worker() for _ in range(cfg.workers)]
    distributions = cfg.space.distributions()
    for params in cfg.enqueue:
        study.enqueue_trial(dict(params), skip_if_exists=False)
    # future -> (trial, its run id to come, worker index, params, attempt)
    in_flight: dict[Any, tuple[Any, Future, int, dict[str, Any], int]] = {}
    free = list(range(len(workers)))
    asked = 0
    bar = _progress(cfg)

    # MLflow calls run on one background thread, in order, off the driver's critical path; the
    # only wait is for a trial's run id, which must be on the trial before it is told
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="csweep-mlflow")

    def start_run(trial: Any, params: dict[str, Any]) -> str:
        run_id = safe.call("start_trial", parent, cfg.study_name, trial.number, params) if parent else None
        if run_id:
            trial.set_user_attr("mlflow_run_id", run_id)
        return run_id or ""

    def submit(widx: int) -> None:
        nonlocal asked
        trial = study.ask(fixed_distributions=distributions)
        params = {**cfg.fixed, **trial.params}
        started = pool.submit(start_run, trial, params)
        in_flight[workers[widx].run.remote(params)] = (trial, started, widx, params, 1)
        outcome.trial_numbers.append(trial.number)
        asked += 1

    def log_trial(trial: Any, run_id: str, status: str, **record: Any) -> None:
        """To MLflow, or to WORKDIR/pending_mlflow/ for `csweep sync` when it cannot be reached."""
        ok = bool(run_id) and safe.call("finish_trial", run_id, status=status, **record) is not None
        if not ok:
            pending = cfg.workdir / PENDING_DIR / cfg.study_name
            pending.mkdir(parents=True, exist_ok=True)
            blob = {"number": trial.number, "status": status, "run_id": run_id,
                    **{k: v for k, v in record.items() if k != "artifacts"}}
            (pending / f"trial-{trial.number}.json").write_text(json.dumps(blob, default=str))
            for name, data in record.get("artifacts", {}).items():
                path = pending / f"trial-{trial.number}" / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)

    def finish(trial: Any, started: Future, result: Mapping[str, Any]) -> None:
        run_id = started.result()
        trial.set_user_attr("node_id", result.get("node_id", ""))
        tags = {**result.get("tags", {}), "ray.node_id": result.get("node_id", "")}
        if "health" in tags:
            trial.set_user_attr("health", tags["health"])
        config = {**cfg.fixed, **trial.params}
        if result.get("pruned"):
            reason = result.get("error", "pruned")
            trial.set_user_attr("prune_reason", reason)
            study.tell(trial, state=TrialState.PRUNED)
            outcome.pruned += 1
            pool.submit(log_trial, trial, run_id, "KILLED", metrics=result.get("metrics", {}),
                      history=result.get("history", {}), config=config,
                      tags={**tags, "optuna.state": "PRUNED", "prune_reason": reason[:5000]},
                      artifacts=result.get("artifacts", {}))
        elif result.get("oom"):
            # infeasible through Optuna's constraints, so the sampler steers away
            reason = result.get("error", "out of memory")
            trial.set_user_attr("fail_reason", f"out of memory: {reason}")
            trial.set_user_attr("oom", True)
            trial.set_constraint("peak_mem_mb", INFEASIBLE_CONSTRAINT)
            mem = cfg.max_mem_mb * 2 if cfg.max_mem_mb else INFEASIBLE_CONSTRAINT
            study.tell(trial, [INFEASIBLE_CONSTRAINT, mem])
            outcome.completed += 1
            pool.submit(log_trial, trial, run_id, "FAILED", config=config,
                      tags={**tags, "optuna.state": "COMPLETE", "infeasible": "out of memory",
                            "fail_reason": reason[:5000]})
        elif result.get("ok"):
            metrics = result["metrics"]
            values = [metrics["val_loss"], metrics["peak_mem_mb"]]
            if cfg.max_mem_mb is not None:
                trial.set_constraint("peak_mem_mb", values[1] - cfg.max_mem_mb)
            study.tell(trial, values)
            outcome.completed += 1
            pool.submit(log_trial, trial, run_id, "FINISHED", metrics=metrics, history=result.get("history", {}),
                      tags={**tags, "optuna.state": "COMPLETE"}, artifacts=result.get("artifacts", {}),
                      config=config)
        else:
            reason = result.get("error", "unknown error")
            trial.set_user_attr("fail_reason", reason)
            study.tell(trial, state=TrialState.FAIL)
            outcome.failed += 1
            pool.submit(log_trial, trial, run_id, "FAILED", tags={**tags, "fail_reason": reason[:5000], "optuna.state": "FAIL"},
                      artifacts={"traceback.txt": result.get("traceback", reason).encode()})

    def too_many_failures() -> str:
        done = outcome.completed + outcome.failed + outcome.pruned
        if done >= 4 and outcome.failed / done > cfg.max_fail_share:
            return (f"stopped: {outcome.failed} of {done} trials failed (more than "
                    f"{cfg.max_fail_share:.0%}); fix the objective, or raise --max-fail-share")
        return ""

    try:
        while (asked < cfg.trials and not outcome.aborted) or in_flight:
            while free and asked < cfg.trials and not outcome.aborted:
                submit(free.pop(0))
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for fut in done:
                trial, started, widx, params, attempt = in_flight.pop(fut)
                try:
                    result = ray.get(fut)
                except ray.exceptions.RayError as exc:
                    # the worker process died (killed, OOM-killed): replace it, retry the trial
                    workers[widx] = new_worker()
                    if attempt <= cfg.max_retries:
                        trial.set_user_attr("attempts", attempt + 1)
                        in_flight[workers[widx].run.remote(params)] = (trial, started, widx, params, attempt + 1)
                        continue
                    result = {"ok": False, "error": f"worker lost {attempt} time(s): {exc.__class__.__name__}: "
                                                    f"{str(exc)[:500]}"}
                finish(trial, started, result)
                free.append(widx)
                outcome.aborted = outcome.aborted or too_many_failures()
                _update(bar, study, outcome, len(in_flight))
    except KeyboardInterrupt:
        outcome.interrupted = True
        # the workers are killed below (ray.kill), which ends their tasks
        for trial, started, _, _, _ in in_flight.values():
            run_id = started.result()
            trial.set_user_attr("fail_reason", "interrupted (SIGINT on the driver)")
            trial.set_user_attr("replaced", True)  # resume re-runs its parameters
            study.tell(trial, state=TrialState.FAIL)
            if run_id:
                pool.submit(safe.call, "finish_trial", run_id, status="KILLED", tags={"fail_reason": "interrupted"})
        in_flight.clear()
    finally:
        if bar is not None:
            bar.close()
        for w in workers:
            ray.kill(w)
        pool.shutdown(wait=True)
    if cfg.reports:
        outcome.report_dir = write_study_reports(study, cfg.workdir, safe.tracker, parent, safe=safe)
    if parent:
        safe.call("end_parent", parent, "KILLED" if outcome.interrupted else "FINISHED")
    if safe.error:
        print(f"csweep: MLflow was unreachable ({safe.error}); results are in the Optuna storage, "
              f"run `csweep sync {cfg.study_name}` to back-fill MLflow", file=sys.stderr)
    return outcome


def _objective_target(cfg: RunConfig) -> str:
    from objectives import get_objective

    return get_objective(cfg.objective).target


def stale_trials(study: Any) -> list[Any]:
    from optuna.trial import TrialState

    return [t for t in study.trials if t.state == TrialState.RUNNING]


def prepare_resume(study: Any, tracker: Tracker | None) -> tuple[list[dict[str, Any]], int]:
    """Fail the stale RUNNING trials of a driver that died (their MLflow runs too) and return the
    parameters to run again (theirs and those of interrupted trials) and how many trials remain."""
    from optuna.trial import TrialState

    for t in stale_trials(study):
        study._storage.set_trial_user_attr(t._trial_id, "fail_reason", "stale: its driver stopped")
        study._storage.set_trial_user_attr(t._trial_id, "replaced", True)
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        run_id = t.user_attrs.get("mlflow_run_id")
        if tracker is not None and run_id:
            try:
                tracker.client.set_terminated(run_id, status="FAILED")
                tracker.client.set_tag(run_id, "fail_reason", "stale: its driver stopped")
            except Exception:  # noqa: BLE001 - a run MLflow never saw is fine
                pass
    redo, seen = [], set()
    requeued = set(study.user_attrs.get("requeued_trials", []))
    for t in study.trials:
        if t.user_attrs.get("replaced") and t.number not in requeued:
            requeued.add(t.number)
            key = json.dumps(t.params, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                redo.append(dict(t.params))
    study.set_user_attr("requeued_trials", sorted(requeued))
    target = int(study.user_attrs.get(TARGET_ATTR, counted_trials(study)))
    remaining = max(0, target - counted_trials(study))
    return redo, remaining


def write_study_reports(study: Any, workdir: Path, tracker: Tracker | None, parent: str | None,
                        *, safe: SafeTracker | None = None) -> Path:
    from reports import write_study_report

    out = workdir / "reports" / study.study_name
    write_study_report(study, out, tracking_uri=redact(tracker.uri) if tracker else None)
    if tracker is not None and parent:
        if safe is not None:
            safe.call("log_files", parent, out, "reports")
        else:
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

