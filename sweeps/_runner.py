"""The driver: ask Optuna, keep W trials in flight on Ray, tell, log to MLflow, report.

Optuna's storage is the source of truth. MLflow is logged to on the side: when it is unreachable
the sweep goes on and `csweep sync` back-fills it later.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reports import MAX_MEM_ATTR
from search_spaces import SearchSpace

from ._study import make_sampler, make_storage, open_study
from ._lane import PENDING_DIR, MlflowLane, done_future, write_pending
from ._tracking import PARENT_RUN_ATTR, SafeTracker, Tracker, redact
from ._workers import make_worker, runtime_env, start_ray

RUN_ATTR = "csweep_run"  # what `csweep resume` needs to run the same sweep again
TARGET_ATTR = "target_trials"
INFEASIBLE_CONSTRAINT = 1e6  # constraint value of a trial that ran out of memory
PREFETCH_BELOW_S = 0.5  # trials shorter than this (median of the last five) get a second one queued


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
class _Flight:
    """A trial submitted to a worker: its run id to come, where it runs, which attempt."""

    trial: Any
    started: Future
    widx: int
    generation: int
    params: dict[str, Any]
    attempt: int
    seq: int
    run_id: str | None = None  # None until the MLflow process has answered


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
    safe = SafeTracker(cfg.tracking_uri, cfg.study_name, artifact_root=cfg.artifact_root)
    parent = ""
    if safe.tracker is not None:
        study.set_user_attr("mlflow_experiment_id", safe.tracker.experiment_id)
        parent = safe.call("attach_parent", study, params={
            "space": cfg.space.name, "objective": cfg.objective, "sampler": cfg.sampler,
            "model": cfg.model, "data": cfg.data or "synthetic", "storage": redact(cfg.storage),
            "seed": cfg.seed, **{f"fixed.{k}": v for k, v in cfg.fixed.items()},
        }) or ""
    outcome = Outcome(cfg.study_name, parent_run_id=parent)
    # per-trial MLflow calls go to a child process, in order (started now, while Ray starts);
    # without a parent run (MLflow unreachable) the records go straight to pending_mlflow/
    pending_dir = cfg.workdir / PENDING_DIR / cfg.study_name
    lane = (MlflowLane(cfg.tracking_uri, cfg.study_name, artifact_root=cfg.artifact_root, pending=pending_dir,
                       parent=parent) if parent else None)
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
    in_flight: dict[Any, _Flight] = {}
    load = [0] * len(workers)  # tasks submitted to each worker and not yet returned
    generation = [0] * len(workers)  # bumped when a worker is replaced
    running_seq: dict[tuple[int, int], int] = {}  # (worker, generation) that died -> the task it ran
    durations: list[float] = []
    seq = 0
    asked = 0
    bar = _progress(cfg)

    def depth() -> int:
        """Tasks per worker: a second one queued behind a short trial, so that the worker goes
        straight on while the driver tells the first and asks the next; one for long trials,
        where the wait is negligible and the sampler should see every finished result first,
        and one for the last trials, which go to whichever worker is free first."""
        recent = sorted(durations[-5:])
        short = bool(recent) and recent[len(recent) // 2] < PREFETCH_BELOW_S
        return 2 if short and cfg.trials - asked > len(workers) else 1

    def send(widx: int, trial: Any, started: Future, params: dict[str, Any], attempt: int,
             run_id: str | None = None) -> None:
        nonlocal seq
        seq += 1
        ref = workers[widx].run.remote(params)
        in_flight[ref] = _Flight(trial, started, widx, generation[widx], params, attempt, seq, run_id)
        load[widx] += 1

    def dispatch() -> None:
        nonlocal asked
        while asked < cfg.trials and not outcome.aborted and not stop.is_set():
            widx = min(range(len(workers)), key=load.__getitem__)
            if load[widx] >= depth():
                return
            trial = study.ask(fixed_distributions=distributions)
            params = {**cfg.fixed, **trial.params}
            started = lane.start_trial(trial.number, params) if lane else done_future("")
            send(widx, trial, started, params, 1)
            outcome.trial_numbers.append(trial.number)
            asked += 1

    def log_trial(trial: Any, run_id: str, status: str, **record: Any) -> None:
        """To MLflow, or to WORKDIR/pending_mlflow/ for `csweep sync` when it cannot be reached."""
        if lane is not None:
            lane.finish_trial(trial.number, run_id, status, **record)
        else:
            write_pending(pending_dir, trial.number, status, run_id, record)

    def run_id_of(flight: _Flight) -> str:
        """The trial's MLflow run id, put on the trial as soon as it is known (a resume after a
        driver crash ends the runs of the trials it finds RUNNING by that attr)."""
        if flight.run_id is None:
            flight.run_id = MlflowLane.run_id(flight.started)
            if flight.run_id:
                flight.trial.set_user_attr("mlflow_run_id", flight.run_id)
        return flight.run_id

    def ids_due() -> bool:
        """Record the run ids that have arrived; True while some are still to come."""
        due = False
        for flight in in_flight.values():
            if flight.run_id is None:
                if flight.started.done():
                    run_id_of(flight)
                else:
                    due = True
        return due

    def finish(flight: _Flight, result: Mapping[str, Any]) -> None:
        trial = flight.trial
        run_id = run_id_of(flight)
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
            log_trial(trial, run_id, "KILLED", metrics=result.get("metrics", {}),
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
            log_trial(trial, run_id, "FAILED", config=config,
                      tags={**tags, "optuna.state": "COMPLETE", "infeasible": "out of memory",
                            "fail_reason": reason[:5000]})
        elif result.get("ok"):
            metrics = result["metrics"]
            values = [metrics["val_loss"], metrics["peak_mem_mb"]]
            if cfg.max_mem_mb is not None:
                trial.set_constraint("peak_mem_mb", values[1] - cfg.max_mem_mb)
            study.tell(trial, values)
            outcome.completed += 1
            log_trial(trial, run_id, "FINISHED", metrics=metrics, history=result.get("history", {}),
                      tags={**tags, "optuna.state": "COMPLETE"}, artifacts=result.get("artifacts", {}),
                      config=config)
        else:
            reason = result.get("error", "unknown error")
            trial.set_user_attr("fail_reason", reason)
            study.tell(trial, state=TrialState.FAIL)
            outcome.failed += 1
            log_trial(trial, run_id, "FAILED", tags={**tags, "fail_reason": reason[:5000], "optuna.state": "FAIL"},
                      artifacts={"traceback.txt": result.get("traceback", reason).encode()})

    def worker_lost(flight: _Flight, exc: Exception) -> dict[str, Any] | None:
        """The worker process died (killed, OOM-killed): replace it once and run its trials again.
        Only the trial it was running counts an attempt; one queued behind it never started."""
        widx = flight.widx
        key = (widx, flight.generation)
        if flight.generation == generation[widx]:
            mates = [f.seq for f in in_flight.values() if (f.widx, f.generation) == key]
            running_seq[key] = min([flight.seq, *mates])
            workers[widx] = new_worker()
            generation[widx] += 1
        attempt = flight.attempt
        if flight.seq == running_seq[key]:
            if attempt > cfg.max_retries:
                return {"ok": False, "error": f"worker lost {attempt} time(s): {exc.__class__.__name__}: "
                                              f"{str(exc)[:500]}"}
            attempt += 1
            flight.trial.set_user_attr("attempts", attempt)
        send(widx, flight.trial, flight.started, flight.params, attempt, flight.run_id)
        return None

    def too_many_failures() -> str:
        done = outcome.completed + outcome.failed + outcome.pruned
        if done >= 4 and outcome.failed / done > cfg.max_fail_share:
            return (f"stopped: {outcome.failed} of {done} trials failed (more than "
                    f"{cfg.max_fail_share:.0%}); fix the objective, or raise --max-fail-share")
        return ""

    def interrupted() -> None:
        outcome.interrupted = True
        # the workers are killed below (ray.kill), which ends their tasks
        for flight in in_flight.values():
            run_id = run_id_of(flight)
            flight.trial.set_user_attr("fail_reason", "interrupted (SIGINT on the driver)")
            flight.trial.set_user_attr("replaced", True)  # resume re-runs its parameters
            study.tell(flight.trial, state=TrialState.FAIL)
            if run_id and lane is not None:
                lane.finish_trial(flight.trial.number, run_id, "KILLED", tags={"fail_reason": "interrupted"})
        in_flight.clear()

    # Ctrl-C sets a flag that the loop reads between steps, so that it never lands between an
    # ask and the submit, or between a result and its tell
    stop = threading.Event()
    try:
        previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    except ValueError:  # not the main thread: Ctrl-C arrives as KeyboardInterrupt
        previous = None
    try:
        while not stop.is_set():
            dispatch()
            if not in_flight:
                break
            done, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.25 if ids_due() else 0.5)
            for fut in done:
                flight = in_flight.pop(fut)
                load[flight.widx] -= 1
                try:
                    result = ray.get(fut)
                except ray.exceptions.RayError as exc:
                    result = worker_lost(flight, exc)
                    if result is None:
                        continue
                if "seconds" in result:
                    durations.append(float(result["seconds"]))
                finish(flight, result)
                outcome.aborted = outcome.aborted or too_many_failures()
                _update(bar, study, outcome, len(in_flight))
        if stop.is_set():
            interrupted()
    except KeyboardInterrupt:
        interrupted()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if bar is not None:
            bar.close()
        for w in workers:
            ray.kill(w)
        if lane is not None:
            safe.error = lane.close() or safe.error
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


def _orphan_run(tracker: Tracker, study: Any, number: int) -> str:
    """The MLflow run of a trial whose driver died before it recorded the run's id on the trial
    (the run is created in the logging process, the id recorded a moment later); recorded now
    for `csweep sync`, so that the trial keeps exactly one run."""
    from ._sync import SYNCED_ATTR

    parent = study.user_attrs.get(PARENT_RUN_ATTR)
    if not parent:
        return ""
    try:
        runs = tracker.client.search_runs(
            [tracker.experiment_id], max_results=1,
            filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and tags.`optuna.trial_number` = '{number}'")
    except Exception:  # noqa: BLE001 - MLflow unreachable: nothing to end
        return ""
    if not runs:
        return ""
    run_id = runs[0].info.run_id
    study.set_user_attr(SYNCED_ATTR, {**study.user_attrs.get(SYNCED_ATTR, {}), str(number): run_id})
    return run_id


def prepare_resume(study: Any, tracker: Tracker | None) -> tuple[list[dict[str, Any]], int]:
    """Fail the stale RUNNING trials of a driver that died (their MLflow runs too) and return the
    parameters to run again (theirs and those of interrupted trials) and how many trials remain."""
    from optuna.trial import TrialState

    for t in stale_trials(study):
        study._storage.set_trial_user_attr(t._trial_id, "fail_reason", "stale: its driver stopped")
        study._storage.set_trial_user_attr(t._trial_id, "replaced", True)
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        run_id = t.user_attrs.get("mlflow_run_id") or (_orphan_run(tracker, study, t.number) if tracker else "")
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

