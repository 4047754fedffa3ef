"""A run, set up and torn down: the study, MLflow's parent run and logging process, Ray and
its workers around one `Driver` (sweeps._driver), then the reports.

Optuna's storage is the source of truth. MLflow is logged to on the side: when it is unreachable
the sweep goes on and `csweep sync` back-fills it later.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import attrs as A
from ._driver import Driver, Outcome
from ._packing import gpu_share
from ._resources import _gpus_for, cpus_per_trial, gpu_plan, packing_for, workers_that_fit
from ._resume import counted_trials
from ._lane import PENDING_DIR, MlflowLane, PendingLog
from ._settings import RunConfig
from ._samplers import make_sampler, sampler_spec
from ._study import describe_objectives, make_storage, open_study, study_qmc_seed
from ._result import TrialResult
from ._tracking import SAMPLES_DIR, SafeTracker, redact
from ._workers import RayPool, import_paths, in_ray_job, runtime_env, start_ray

__all__ = ["Outcome", "RunConfig", "run_sweep", "write_study_reports"]


def quiet() -> None:
    import logging
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    for name in ("mlflow", "alembic", "ray", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR)


def seeds_phrase(cfg: RunConfig) -> str:
    if cfg.seed_plan == "design" and cfg.seeds > 1:
        return f"seeds spent by the design ({cfg.seeds} per config of its space-filling start, 1 per config after it)"
    return f"{cfg.seeds} seed(s) per config"


def describe(cfg: RunConfig) -> str:
    """The parent run's description in the MLflow UI."""
    cmd = " ".join(shlex.quote(a) for a in ["csweep", *sys.argv[1:]]) if sys.argv[1:] else "(from Python)"
    return (f"csweep study **{cfg.study_name}**: search space `{cfg.space.name}` "
            f"({cfg.space.description or 'no description'}), objective `{cfg.objective}`, sampler {cfg.sampler}, "
            f"{seeds_phrase(cfg)}.\n\nCommand: `{redact(cmd)}`\n\n"
            f"Objectives: {describe_objectives(cfg.objectives)}.\n\n"
            "How to read it: each nested run is one trial (one sampled config); sort by "
            f"{' and '.join(f'`{o}`' for o in cfg.objectives)} to see the trade-off, and open this run's "
            "`reports/index.html` artifact for the Pareto front, couplings and fitted laws. Metrics of this "
            "run: best val_loss, front size, hypervolume.")


def _open_mlflow(cfg: RunConfig, study: Any, lane: MlflowLane) -> tuple[SafeTracker, str, Any]:
    """(tracker, parent run id or "", where per-trial records go): the parent run attached to the
    study, each concept's training images on it, and the logging process started; without a
    parent run (MLflow unreachable) the records go straight to pending_mlflow/."""
    mlflow = SafeTracker(cfg.tracking_uri, cfg.study_name, artifact_root=cfg.artifact_root)
    parent = ""
    if mlflow.experiment_id is not None:
        study.set_user_attr(A.EXPERIMENT_ID, mlflow.experiment_id)
        parent = mlflow.attach_parent(study, description=describe(cfg), params={
            "space": cfg.space.name, "objective": cfg.objective, "sampler": cfg.sampler,
            "model": cfg.model, "data": cfg.data or "synthetic", "storage": redact(cfg.storage),
            "seed": cfg.seed, "seeds": cfg.seeds, **{f"fixed.{k}": v for k, v in cfg.fixed.items()},
        })
    if parent and cfg.builtin and cfg.samples:  # each concept's training images, for reference
        from objectives import training_grids

        mlflow.log_images(parent, {f"training_images/{k}.png": v for k, v in training_grids(cfg.model, cfg.data).items()})
    pending_dir = cfg.workdir / PENDING_DIR / cfg.study_name
    if not parent:
        lane.discard()
        return mlflow, parent, PendingLog(pending_dir)
    return mlflow, parent, lane.open(cfg.tracking_uri, cfg.study_name, artifact_root=cfg.artifact_root,
                                     pending=pending_dir, parent=parent)


def _open_study(cfg: RunConfig) -> Any:
    """The study, created or loaded, with the run's settings written to it."""
    storage = make_storage(cfg.storage)
    spec = sampler_spec(cfg.sampler)
    sobol = spec.sobol
    qmc_seed = study_qmc_seed(storage, cfg.study_name, cfg.seed) if sobol else None
    study = open_study(
        cfg.study_name, storage,
        sampler_factory=lambda n: make_sampler(
            cfg.sampler, seed=None if cfg.seed is None else cfg.seed + n, workers=cfg.workers,
            pairs=[(h.x, h.y) for h in cfg.space.hypotheses] if spec.hypotheses else (),
            qmc_seed=qmc_seed,
        ),
        objectives=cfg.objectives,
    )
    if sobol and A.QMC_SEED not in study.user_attrs:
        study.set_user_attr(A.QMC_SEED, qmc_seed)
    if cfg.max_mem_mb is not None:
        study.set_user_attr(A.MAX_MEM, cfg.max_mem_mb)
    if not cfg.enqueue:  # a fresh run adds its trials to the target; a resume only completes it
        study.set_user_attr(A.TARGET_TRIALS, counted_trials(study) + planned_trials(cfg, study))
    study.set_user_attr(A.SPACE, cfg.space.to_dict())
    study.set_user_attr(A.OBJECTIVE, cfg.objective)
    study.set_user_attr(A.SETTINGS, cfg.stored())
    if cfg.builtin:
        from objectives import data_digest

        study.set_user_attr(A.DATA_DIGEST, data_digest(cfg.model, cfg.data, dict(cfg.fixed)))
    return study


def _open_study_and_mlflow(cfg: RunConfig, lane: MlflowLane) -> tuple[Any, SafeTracker, str, Any]:
    try:
        study = _open_study(cfg)
        return (study, *_open_mlflow(cfg, study, lane))
    except BaseException:
        lane.discard()
        raise


def run_sweep(cfg: RunConfig) -> Outcome:
    quiet()
    study, mlflow, parent, log = _start(cfg)
    pool, packing = _workers(cfg, study)
    planned = planned_trials(cfg, study)
    bar = _progress(cfg, planned)
    stop = threading.Event()
    driver = Driver(
        study, pool, log, trials=planned, fixed=cfg.fixed, distributions=cfg.space.distributions(),
        seeds=cfg.seeds, seed_offset=cfg.seed_offset, max_mem_mb=cfg.max_mem_mb, max_retries=cfg.max_retries,
        max_fail_share=cfg.max_fail_share, enqueue=cfg.enqueue, enqueue_attrs=cfg.enqueue_attrs, stop=stop,
        objectives=cfg.objectives,
        on_progress=(lambda o, flight: _update(bar, study, o, flight, cfg.seeds)) if bar is not None else None,
        on_result=lambda number, result: keep_samples(samples_dir(cfg.workdir, cfg.study_name), number, result),
        should_stop=(lambda: decided_line(study, cfg)) if cfg.until_decisive else None,
        seed_plan=study.sampler.seeds_for if cfg.seed_plan == "design" else None, packing=packing,
    )
    previous = _catch_signals(driver, stop)
    pool.wait_ready()
    try:
        try:
            outcome = driver.run()
        finally:
            if bar is not None:
                bar.close()
            pool.close()
            lane_error = log.close()
            if lane_error:
                mlflow.error = mlflow.error or lane_error
        _end_run(cfg, study, mlflow, parent, outcome)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return outcome


def _start(cfg: RunConfig) -> tuple[Any, SafeTracker, str, Any]:
    """The study, MLflow's side (its import, the store's schema, the parent run, the logging
    process) and Ray: the study and MLflow are set up in a thread while this one starts Ray (and
    loads the built-in model), so that the start-ups overlap instead of adding up (a study of
    another kind is refused by the command line before this)."""
    cluster = cfg.ray_address is not None or in_ray_job()
    lane = MlflowLane()  # the logging process starts first: its imports overlap all the rest
    with ThreadPoolExecutor(1, thread_name_prefix="csweep-setup") as ex:
        ready = ex.submit(_open_study_and_mlflow, cfg, lane)
        try:
            if cfg.builtin and not cluster:
                from objectives import prepare_model

                prepare_model(cfg.model, on_build=lambda where: print(
                    f"no shipped weights for {cfg.model}: building it once for this machine (minutes; "
                    f"the shipped ones load in seconds), cached in {where}",
                    file=sys.stderr, flush=True))
            local_cpus = max(os.cpu_count() or 1, math.ceil(cfg.workers * (cfg.cpus_per_trial or 1)))
            start_ray(cfg.ray_address, num_cpus=local_cpus, runtime_env=runtime_env(cluster=cfg.ray_address is not None))
        except BaseException:
            try:  # the logging process stops with the run
                ready.result()[3].close()
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise
        return ready.result()


def _workers(cfg: RunConfig, study: Any) -> tuple[RayPool, Any]:
    """The run's Ray actors (as many as the cluster holds of --workers), and the packing of
    trials onto GPUs by memory where there are GPUs to pack (else None)."""
    import ray

    from objectives import get_objective

    cluster = cfg.ray_address is not None or in_ray_job()
    cpus = cpus_per_trial(cfg)
    packed, gpus, card = gpu_plan(cfg)
    options = {"num_cpus": cpus, "num_gpus": gpu_share(cfg.workers, gpus) if packed else _gpus_for(cfg),
               "max_restarts": 0}
    # on a cluster the data folder travels through the object store (other nodes lack the path)
    data: Any = cfg.data
    if cluster and cfg.data is not None:
        from ._workers import pack_folder

        data = ray.put(pack_folder(cfg.data))
    target = get_objective(cfg.objective).target
    workers = workers_that_fit(cfg.workers, cpus, options["num_gpus"], ray.cluster_resources())
    pool = RayPool(workers, options, target, cfg.builtin, cfg.model, data, cfg.health, cfg.samples, int(cpus),
                   () if cluster else tuple(import_paths()), cfg.score, rung_board(cfg, study))
    return pool, packing_for(cfg, pool, int(gpus), study, card) if packed else None


def _catch_signals(driver: Driver, stop: threading.Event) -> dict[Any, Any]:
    """Ctrl-C and SIGTERM (what Slurm's scancel, Kubernetes, `timeout` and supervisors send) set a
    flag that the loop reads between steps, so that it never lands between an ask and the
    submit, or between a result and its tell; installed after Ray's start, whose own SIGTERM
    handler prints a C-level stack and kills the driver with trials left RUNNING. Returns the
    handlers they replaced."""
    def on_signal(signum: int, _frame: Any) -> None:
        driver.outcome.signal = driver.outcome.signal or signal.Signals(signum).name
        stop.set()

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread: Ctrl-C arrives as KeyboardInterrupt
            break
    return previous


def rung_board(cfg: RunConfig, study: Any) -> Any:
    """--early-stop dominated: the board every worker reports its validations to (a Ray actor),
    holding the curves of the study's finished trials already (a resume's)."""
    if cfg.early_stop != "dominated":
        return None
    import ray

    from ._rungs import RungBoard

    board = ray.remote(RungBoard).options(num_cpus=0).remote(tuple(cfg.rungs))
    ray.get(board.seed_with.remote(finished_curves(study)))
    return board


def finished_curves(study: Any) -> list[tuple[int, float, list]]:
    """(trial, peak memory, curve) of every finished trial that kept its curve."""
    from optuna.trial import TrialState

    out = []
    names = list(study.metric_names or ())
    for t in study.trials:
        if t.state not in (TrialState.COMPLETE, TrialState.PRUNED) or not t.user_attrs.get(A.VAL_CURVE):
            continue
        mem = t.values[names.index("peak_mem_mb")] if t.values and "peak_mem_mb" in names else \
            t.user_attrs.get(A.PEAK_MEM_SEEN)
        out.append((t.number, mem, t.user_attrs[A.VAL_CURVE]))
    return out


def _end_run(cfg: RunConfig, study: Any, mlflow: SafeTracker, parent: str, outcome: Outcome) -> None:
    """The run's reports and its parent run's end (with the signals still caught: a second
    SIGTERM while the reports are written does not lose them)."""
    outcome.parent_run_id = parent
    outcome.study_trials = len(study.trials)
    summary: dict[str, Any] = {}
    if cfg.reports:
        outcome.report_dir = write_study_reports(study, cfg.workdir, mlflow, parent)
        summary = json.loads((outcome.report_dir / "summary.json").read_text())
    mlflow.end_parent(parent, "KILLED" if outcome.interrupted else "FINISHED", metrics=parent_metrics(summary))
    line = mlflow.unreachable_line(cfg.study_name)
    if line:
        print(line, file=sys.stderr)


def decided_line(study: Any, cfg: RunConfig) -> str:
    """--until-decisive: a line once every declared hypothesis (with none, every pair) has a
    decided verdict, else "". Looks are taken after each finished trial, at the 99% level (the
    report's verdicts use 95%): repeated looks at 95% would call a pair more often than 1 in 20."""
    from reports import decision_looks

    return decision_looks(study, [(h.x, h.y) for h in cfg.space.hypotheses])


def parent_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """What the parent run shows at a glance in the MLflow UI."""
    out = {}
    if summary.get("best_val_loss") is not None:
        out["best_val_loss"] = summary["best_val_loss"]
    if summary:
        out["front_size"] = summary.get("pareto_size", 0)
        out["hypervolume"] = summary.get("hypervolume") or 0.0
        out["n_trials"] = summary.get("n_trials", 0)
    return out


def samples_dir(workdir: Path, study_name: str) -> Path:
    return workdir / "samples" / study_name


def keep_samples(root: Path, number: int, result: TrialResult) -> None:
    """A trial's sample grids, also kept beside the study (WORKDIR/samples/STUDY/N/CONCEPT.png),
    where the reports find them without MLflow."""
    grids = {k[len(SAMPLES_DIR):]: v for k, v in result.artifacts.items()
             if k.startswith(SAMPLES_DIR) and k.endswith(".png") and "/" not in k[len(SAMPLES_DIR):]}
    if not grids:
        return
    folder = root / str(number)
    folder.mkdir(parents=True, exist_ok=True)
    for name, blob in grids.items():
        (folder / name).write_bytes(blob)


def write_study_reports(study: Any, workdir: Path, mlflow: SafeTracker | None, parent: str | None) -> Path:
    """The study's reports under WORKDIR/reports/STUDY/, and on its parent run when MLflow is there."""
    from reports import write_study_report

    out = workdir / "reports" / study.study_name
    write_study_report(study, out, tracking_uri=redact(mlflow.uri) if mlflow is not None else None,
                       samples=samples_dir(workdir, study.study_name))
    if mlflow is not None and parent:
        mlflow.log_files(parent, out, "reports")
    return out


def planned_trials(cfg: RunConfig, study: Any) -> int:
    """The trials this run will ask: --trials, or on a fresh run with --seed-plan design as many
    as its --trials x K runs make (K seeds on the design's start trials still to run, one after)."""
    if not cfg.trials_are_runs or cfg.seed_plan != "design" or cfg.seeds < 2:
        return cfg.trials
    start = max(0, study.sampler.startup_trials(len(cfg.space.params)) - len(study.get_trials(deepcopy=False)))
    start = min(start, cfg.trials)
    return start + (cfg.trials - start) * cfg.seeds


def _progress(cfg: RunConfig, total: int) -> Any:
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=cfg.study_name, unit="trial", file=sys.stderr, dynamic_ncols=True)


def in_flight_text(flight: dict[str, int], seeds: int) -> dict[str, Any]:
    """The bar's words for what runs now: `running=N` trials, or with --seeds K > 1 `running="4 runs
    of 2 configs"` (a config's seed replicates run side by side, each on a worker: 2 workers and
    --seeds 2 train one config at a time)."""
    if seeds <= 1:
        return {"running": flight["running"]}
    configs = flight["configs"]
    return {"running": f"{flight['running']} run{'s' * (flight['running'] != 1)} of {configs} "
                       f"config{'s' * (configs != 1)}"}


def _update(bar: Any, study: Any, outcome: Outcome, flight: dict[str, int], seeds: int) -> None:
    """The bar counts trials (configs) done; `running` says what runs now (in_flight_text)."""
    # the front's size reads every trial from the storage: at most once a second, not per trial
    now = time.monotonic()
    if now - getattr(bar, "_front_at", -1e9) >= 1.0:
        bar._front_at, bar._front = now, len(study.best_trials)
    bar.set_postfix(done=outcome.completed, failed=outcome.failed, oom=outcome.out_of_memory,
                    pruned=outcome.pruned, **in_flight_text(flight, seeds), queued=flight["queued"],
                    front=bar._front, refresh=False)
    bar.update(outcome.done - bar.n)  # several trials may be told between two updates
