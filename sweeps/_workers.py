"""Ray workers: long-lived actors that keep the base model warm across trials."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import time
import traceback
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any

from common import attrs as A
from ._result import Kind, TrialResult, best_point, curve_metrics, normalize, parse_curve

def _node_id() -> str:
    """The Ray node this trial ran on; "local" outside Ray (run_trial called directly), where
    asking Ray would start a local instance of it."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
    except Exception:  # noqa: BLE001
        return "local"


def resolved_config(objective: str, builtin: bool, params: Mapping[str, Any]) -> dict[str, Any]:
    """The trial's full config: for a built-in objective every parameter with its default."""
    if builtin:
        from objectives import resolve_params

        return resolve_params(params)
    return dict(params)


Reporter = Callable[[int, Mapping[str, float]], str]


def run_trial(
    objective: str, builtin: bool, params: Mapping[str, Any], *, model: str, data: str | None,
    health: Mapping[str, Any] | None = None, samples: Mapping[str, Any] | None = None,
    score: str = "final", report: Reporter | None = None,
) -> TrialResult:
    """Run one trial (one seed replicate) in this process; never raises: a failure, an
    out-of-memory error or a stop is a result. `report(step, values)` is called after each
    validation during training; a non-empty answer stops the trial there (PRUNED, that reason)."""
    import optuna

    from objectives import TrialStopped, get_objective

    started = time.perf_counter()
    config: dict[str, Any] = dict(params)
    try:
        config = resolved_config(objective, builtin, params)
        fn = get_objective(objective).load()
        if builtin:
            raw = fn(dict(params), model=model, data=data, health=dict(health or {}), samples=samples,
                     score=score, report=report)
        else:
            raw = fn(dict(params))
            if inspect.isgenerator(raw):
                raw = drive_curve(raw, score=score, report=report)
        out = TrialResult(Kind.OK, **normalize(raw))
        out.metrics |= {k: v for k, v in curve_metrics(out.curve).items() if k not in out.metrics}
    except (optuna.TrialPruned, TrialStopped) as exc:
        partial = getattr(exc, "partial", {}) or {}
        curve = parse_curve(partial.get("curve", []))
        out = TrialResult(
            Kind.PRUNED, reason=str(exc) or "pruned by the objective",
            metrics={**curve_metrics(curve), **{k: float(v) for k, v in partial.get("metrics", {}).items()}},
            history=dict(partial.get("history", {})), tags=dict(partial.get("tags", {})),
            artifacts=dict(partial.get("artifacts", {})), curve=curve,
        )
        if isinstance(exc, TrialStopped) and exc.rung:
            out.metrics[A.RUNG] = float(exc.rung)
    except Exception as exc:  # noqa: BLE001 - any failure of a trial is recorded, not raised
        if exc.__class__.__name__ == "OutOfMemoryError":
            _release_memory()
            out = TrialResult(Kind.OUT_OF_MEMORY, reason=f"{exc.__class__.__name__}: {str(exc)[:500]}")
        else:
            out = TrialResult.failed(f"{exc.__class__.__name__}: {exc}"[:2000],
                                     traceback=traceback.format_exc()[-4000:])
    out.config = config
    if isinstance(config.get("steps"), int):
        out.metrics[A.STEPS_PLANNED] = float(config["steps"])
        if out.curve and A.STEPS_RUN not in out.metrics:
            out.metrics[A.STEPS_RUN] = float(out.curve[-1]["step"])
    out.node = _node_id()
    out.seconds = time.perf_counter() - started
    return out


def drive_curve(gen: Generator[Mapping[str, Any], None, Any], *, score: str,
                report: Reporter | None) -> dict[str, Any]:
    """A plug-in that reports its curve: a generator that yields `{"step": s, "val_loss": v}` (and
    `peak_mem_mb` once known) after each validation and returns its final mapping. Each point goes
    to `report`; a stop closes the generator (its `finally` runs) and raises TrialStopped with the
    curve so far. With `score="best"` the final val_loss is the curve's lowest (the final one is
    kept as val_loss_final)."""
    from objectives import TrialStopped

    curve: list[dict[str, Any]] = []
    while True:
        try:
            point = next(gen)
        except StopIteration as end:
            final = end.value
            break
        curve = parse_curve([*curve, point])
        reason = report(int(point["step"]), dict(point)) if report is not None else ""
        if reason:
            gen.close()
            raise TrialStopped(reason, int(point["step"]) - 1, {"curve": curve, "metrics": {
                A.STEPS_RUN: float(point["step"]), **({"peak_mem_mb": float(point["peak_mem_mb"])}
                                                      if "peak_mem_mb" in point else {})}},
                rung=getattr(report, "last_rung", 0))
    if not isinstance(final, Mapping):
        raise ValueError(f"the objective's generator returned {type(final).__name__}, expected its final mapping "
                         "(return {'val_loss': ..., 'peak_mem_mb': ...} after the last yield)")
    out = {**final, "curve": curve}
    if score == "best" and curve:
        step, value = best_point(curve)
        out |= {"val_loss_final": final.get("val_loss"), "val_loss": value}
    return out


def _resident_mb() -> float:
    """What this process holds on its GPU between trials (the cached base model; the allocator's
    count), 0 without CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0.0
    return torch.cuda.memory_allocated() / 2**20


def _release_memory() -> None:
    """After an out-of-memory error: drop the failed trial's tensors so the next trial fits."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


class TrialWorker:
    """One per in-flight trial; the base model is built on first use and then reused. Its torch
    threads match the CPUs Ray gave it."""

    def __init__(self, objective: str, builtin: bool, model: str, data: Any,
                 health: Mapping[str, Any] | None = None, samples: Mapping[str, Any] | None = None,
                 threads: int = 1, import_from: Sequence[str] = (), score: str = "final",
                 board: Any = None) -> None:
        # a plug-in module is imported from where the driver imports it now (its working directory
        # first, then its extra sys.path entries): Ray hands a worker the paths its driver had
        # when Ray started, which in a process that runs several sweeps (a notebook) may be an
        # earlier sweep's directory, without a folder added to sys.path since
        sys.path[:0] = list(import_from)
        self.objective, self.builtin, self.model = objective, builtin, model
        self.data = data if data is None or isinstance(data, str) else unpack_folder(data)
        self.health = dict(health or {})
        self.samples = dict(samples) if samples is not None else None
        self.threads = max(1, int(threads))
        self._threads_set = False
        self.score, self.board = score, board  # board: --early-stop dominated's (sweeps._rungs)

    def ready(self) -> bool:
        """Imports what a trial needs (optuna, csweep's objectives, the objective itself), so
        that the first trial's time is its own; a plug-in that fails to import fails its trials
        later, with the reason, not here."""
        import optuna  # noqa: F401

        from objectives import get_objective

        try:
            get_objective(self.objective).load()
        except Exception:  # noqa: BLE001 - the trial reports it
            pass
        return True

    def gpus(self) -> tuple:
        """The GPUs Ray gave this worker (ids; logical ones on a machine without GPUs)."""
        import ray

        return tuple(sorted(str(g) for g in ray.get_gpu_ids())) if ray.is_initialized() else ()

    def probe(self, params: Mapping[str, Any]) -> TrialResult:
        """The config trained for a few steps, with no validation, samples or early stop: its peak
        memory, for packing (sweeps._packing); never raises."""
        from ._packing import PROBE_STEPS

        short = {**params, "steps": PROBE_STEPS, "val_every": PROBE_STEPS}
        if self.builtin and not self._threads_set:
            import torch

            torch.set_num_threads(self.threads)
            self._threads_set = True
        out = run_trial(self.objective, self.builtin, short, model=self.model, data=self.data,
                        health={**self.health, "early_stop": False}, samples=None, score="final")
        out.resident_mb = _resident_mb()
        return out

    def run(self, params: Mapping[str, Any], trial: int | None = None) -> TrialResult:
        if self.builtin and not self._threads_set:
            import torch

            torch.set_num_threads(self.threads)
            self._threads_set = True
        out = run_trial(self.objective, self.builtin, params, model=self.model, data=self.data,
                        health=self.health, samples=self.samples, score=self.score,
                        report=self.reporter(params, trial))
        out.resident_mb = _resident_mb()
        return out

    def reporter(self, params: Mapping[str, Any], trial: int | None) -> Reporter | None:
        if self.board is None or trial is None:
            return None
        from ._rungs import BoardReporter

        steps = resolved_config(self.objective, self.builtin, params).get("steps")
        return BoardReporter(self.board, trial, int(params.get("seed", 0) or 0), int(steps))


class RayPool:
    """`size` TrialWorker actors (sweeps._driver.WorkerPool)."""

    def __init__(self, size: int, options: Mapping[str, Any], *args: Any) -> None:
        self.size, self._options, self._args = size, dict(options), args
        self.workers = [self._new() for _ in range(size)]
        self._gpus: dict[int, tuple[Any, tuple]] = {}

    def _new(self) -> Any:
        import ray

        return ray.remote(TrialWorker).options(**self._options).remote(*self._args)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every worker process has started (or `timeout`): the first trials are asked once
        a worker can take them, so that their time in the storage is their own, not Ray's actor
        start-up (about 1-3 s here, which spread over a 200-trial sweep read as 15 ms a trial)."""
        import ray

        ray.wait([w.ready.remote() for w in self.workers], num_returns=len(self.workers), timeout=timeout)

    def submit(self, widx: int, params: Mapping[str, Any], trial: int | None = None) -> Any:
        return self.workers[widx].run.remote(dict(params), trial)

    def probe(self, widx: int, params: Mapping[str, Any]) -> Any:
        return self.workers[widx].probe.remote(dict(params))

    def gpu_of(self, widx: int) -> tuple:
        """The GPU(s) worker `widx` holds, asked once per worker process."""
        import ray

        worker = self.workers[widx]
        if self._gpus.get(widx, (None,))[0] is not worker:
            self._gpus[widx] = (worker, ray.get(worker.gpus.remote()))
        return self._gpus[widx][1]

    def wait(self, handles: Sequence[Any], timeout: float) -> list[Any]:
        import ray

        done, _ = ray.wait(list(handles), num_returns=1, timeout=timeout)
        return done

    def result(self, handle: Any) -> TrialResult:
        import ray

        from ._driver import WorkerLost

        try:
            return ray.get(handle)
        except ray.exceptions.RayError as exc:
            raise WorkerLost(f"{exc.__class__.__name__}: {str(exc)[:500]}") from exc

    def replace(self, widx: int) -> None:
        self.workers[widx] = self._new()

    def close(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)


def in_ray_job() -> bool:
    """Inside `ray job submit` (or with RAY_ADDRESS set): Ray is there already, with the job's
    runtime env (its working_dir included)."""
    return bool(os.environ.get("RAY_ADDRESS") or os.environ.get("RAY_JOB_ID"))


def start_ray(address: str | None, *, num_cpus: int, runtime_env: dict[str, Any]) -> None:
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return
    if in_ray_job() and address in (None, "auto", os.environ.get("RAY_ADDRESS")):
        # join the job's cluster as it is: no CPU count, no second working_dir
        ray.init(address=os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False, logging_level="error")
    elif address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level="error")
    else:
        # the local Ray's processes inherit the environment its raylet starts with: the env_vars
        # set in this process's environment while it starts, not passed as a runtime_env, whose
        # agent made every worker process (each trial actor, each replacement) start about 0.45 s
        # later (benchmarks/RESULTS.md)
        with _environment(runtime_env.get("env_vars") or {}):
            ray.init(
                num_cpus=num_cpus, include_dashboard=False,
                log_to_driver=False, logging_level="error", _node_ip_address="127.0.0.1",
                object_store_memory=128 * 1024 * 1024,
            )


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Generator[None, None, None]:
    """os.environ with `values` set, as it was again afterwards."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def pack_folder(root: str) -> dict[str, bytes]:
    """A data folder as {relative path: bytes}, to travel to remote nodes through the object store."""
    base = Path(root)
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def unpack_folder(files: Mapping[str, bytes]) -> str:
    """Materialise a packed folder on this node (once per worker); returns its path."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="csweep-data-"))
    for rel, blob in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
    return str(root)


def runtime_env(*, cluster: bool) -> dict[str, Any]:
    """What workers need to import what the driver imports. On the local Ray: the driver's
    working directory and extra sys.path entries on PYTHONPATH. On a cluster: the working
    directory itself travels (Ray's runtime_env working_dir), minus csweep's own outputs."""
    if cluster:
        return {"working_dir": os.getcwd(),
                "excludes": ["csweep_runs/", ".git/", "*.db", "mlartifacts/", "__pycache__/", "*.safetensors"]}
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(import_paths())}}


def import_paths() -> list[str]:
    """Where this process imports from beyond the Python installation: its working directory and
    the extra entries of sys.path (a checkout on PYTHONPATH, a folder a notebook added)."""
    prefixes = (sys.prefix, sys.base_prefix)
    paths = [os.getcwd()] + [p for p in sys.path if p and os.path.isdir(p) and not p.startswith(prefixes)]
    return list(dict.fromkeys(paths))
