"""Ray workers: long-lived actors that keep the base model warm across trials."""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
from pathlib import Path
from collections.abc import Mapping
from typing import Any

REQUIRED = ("val_loss", "peak_mem_mb")


def _node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside Ray (tests calling run_trial directly)
        return "local"


def normalize_result(raw: Any) -> dict[str, Any]:
    """Split an objective's return value into metrics / history / tags / artifacts.

    Raises ValueError when it is not a mapping with finite val_loss and peak_mem_mb.
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"objective returned {type(raw).__name__}, expected a mapping")
    metrics: dict[str, float] = {}
    for key, value in raw.items():
        if key in ("history", "tags", "embeddings", "artifacts", "health"):
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
    artifacts = {str(k): bytes(v) for k, v in dict(raw.get("artifacts", {})).items()}
    return {
        "metrics": metrics,
        "history": {k: [float(x) for x in v] for k, v in dict(raw.get("history", {})).items()},
        "tags": {k: str(v) for k, v in dict(raw.get("tags", {})).items()},
        "artifacts": artifacts,
    }


def run_trial(
    objective: str, builtin: bool, params: Mapping[str, Any], *, model: str, data: str | None,
    health: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one trial in this process; never raises (a failure or a stop is a result)."""
    import importlib

    import optuna

    from objectives import TrialStopped

    started = time.perf_counter()
    try:
        module, _, func = objective.partition(":")
        fn = getattr(importlib.import_module(module), func)
        if builtin:
            raw = fn(dict(params), model=model, data=data, health=dict(health or {}))
        else:
            raw = fn(dict(params))
        out = {"ok": True, **normalize_result(raw)}
    except (optuna.TrialPruned, TrialStopped) as exc:
        partial = getattr(exc, "partial", {}) or {}
        out = {
            "ok": False, "pruned": True, "error": str(exc) or "pruned by the objective",
            "metrics": {k: float(v) for k, v in partial.get("metrics", {}).items()},
            "history": partial.get("history", {}), "tags": partial.get("tags", {}),
            "artifacts": partial.get("artifacts", {}),
        }
    except Exception as exc:  # noqa: BLE001 - any failure of a trial is recorded, not raised
        if exc.__class__.__name__ == "OutOfMemoryError":
            _release_memory()
            out = {"ok": False, "oom": True, "error": f"{exc.__class__.__name__}: {str(exc)[:500]}"}
        else:
            out = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"[:2000],
                   "traceback": traceback.format_exc()[-4000:]}
    out["node_id"] = _node_id()
    out["seconds"] = time.perf_counter() - started
    return out


def _release_memory() -> None:
    """After an out-of-memory error: drop the failed trial's tensors so the next trial fits."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


class TrialWorker:
    """One per in-flight trial; the base model is built on first use and then reused."""

    def __init__(self, objective: str, builtin: bool, model: str, data: Any,
                 health: Mapping[str, Any] | None = None) -> None:
        self.objective, self.builtin, self.model = objective, builtin, model
        self.data = data if data is None or isinstance(data, str) else unpack_folder(data)
        self.health = dict(health or {})
        self.trials_run = 0

    def ping(self) -> dict[str, Any]:
        return {"node_id": _node_id(), "pid": os.getpid(), "trials_run": self.trials_run}

    def run(self, params: Mapping[str, Any]) -> dict[str, Any]:
        self.trials_run += 1
        out = run_trial(self.objective, self.builtin, params, model=self.model, data=self.data,
                        health=self.health)
        out["worker_pid"] = os.getpid()
        out["worker_trial_index"] = self.trials_run
        return out


def start_ray(address: str | None, *, num_cpus: int, runtime_env: dict[str, Any]) -> None:
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level="error")
    else:
        ray.init(
            num_cpus=num_cpus, include_dashboard=False, runtime_env=runtime_env,
            log_to_driver=False, logging_level="error", _node_ip_address="127.0.0.1",
            object_store_memory=128 * 1024 * 1024,
        )


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
    prefixes = (sys.prefix, sys.base_prefix)
    paths = [os.getcwd()] + [
        p for p in sys.path if p and os.path.isdir(p) and not p.startswith(prefixes)
    ]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}}


def make_worker(options: Mapping[str, Any], *args: Any) -> Any:
    import ray

    return ray.remote(TrialWorker).options(**options).remote(*args)
