"""Orchestration overhead, parallel efficiency and warm workers, side by side in one run.

1. Marginal wall time per trial beyond the objective's own time, for a 50 ms sleep objective on
   2 workers: run N and 2N trials and take the difference (start-up cancels), for csweep (MLflow
   logging on, SQLite storage and tracking), a plain Optuna ask/tell loop on Ray tasks with the same
   storage, Optuna's optimize(n_jobs=2), and Ray Tune with OptunaSearch.
2. Parallel efficiency of csweep: 1 s trials on 1 and 2 workers.
4. Warm workers: start-up of a worker's 2nd trial against its 1st (cold), on the tiny model.

Run from the repository root: python benchmarks/orchestration.py [--n 40]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
sys.path.insert(0, str(Path(__file__).resolve().parent))

SLEEP = 0.05


def _space(sleep: float):
    from search_spaces import parse_space

    return parse_space({"name": "bench", "params": {"x": {"type": "float", "low": 0, "high": 1},
                                                    "y": {"type": "float", "low": 0, "high": 1}},
                        "fixed": {"sleep": sleep}}, source="<bench>")


def csweep_run(n: int, workers: int, sleep: float, workdir: Path, study: str) -> float:
    from sweeps._cli import default_storage, default_tracking
    from sweeps._runner import RunConfig, run_sweep

    workdir.mkdir(parents=True, exist_ok=True)
    cfg = RunConfig(space=_space(sleep), study_name=study, trials=n, workers=workers, workdir=workdir,
                    storage=default_storage(workdir), tracking_uri=default_tracking(workdir),
                    objective="sleep_objective:objective", builtin=False, fixed={"sleep": sleep},
                    sampler="random", seed=0, progress=False, artifact_root=workdir / "mlartifacts",
                    reports=False)  # the end-of-run reports are timed on their own below
    t0 = time.perf_counter()
    run_sweep(cfg)
    return time.perf_counter() - t0


def ray_ask_tell(n: int, workers: int, sleep: float, storage: str, study_name: str) -> float:
    import optuna
    import ray

    from sleep_objective import objective

    remote = ray.remote(num_cpus=1)(objective)
    study = optuna.create_study(study_name=study_name, storage=storage, directions=["minimize", "minimize"],
                                sampler=optuna.samplers.RandomSampler(seed=0))
    t0 = time.perf_counter()
    pending, asked = {}, 0
    while asked < n or pending:
        while len(pending) < workers and asked < n:
            trial = study.ask()
            p = {"x": trial.suggest_float("x", 0, 1), "y": trial.suggest_float("y", 0, 1), "sleep": sleep}
            pending[remote.remote(p)] = trial
            asked += 1
        done, _ = ray.wait(list(pending), num_returns=1)
        for f in done:
            out = ray.get(f)
            study.tell(pending.pop(f), [out["val_loss"], out["peak_mem_mb"]])
    return time.perf_counter() - t0


def optuna_n_jobs(n: int, sleep: float, storage: str, study_name: str) -> float:
    import optuna

    from sleep_objective import objective

    study = optuna.create_study(study_name=study_name, storage=storage, directions=["minimize", "minimize"],
                                sampler=optuna.samplers.RandomSampler(seed=0))

    def obj(trial):
        out = objective({"x": trial.suggest_float("x", 0, 1), "y": trial.suggest_float("y", 0, 1), "sleep": sleep})
        return out["val_loss"], out["peak_mem_mb"]

    t0 = time.perf_counter()
    study.optimize(obj, n_trials=n, n_jobs=2)
    return time.perf_counter() - t0


def ray_tune(n: int, sleep: float, storage_dir: Path) -> float:
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from sleep_objective import objective

    def trainable(config):
        out = objective({**config, "sleep": sleep})
        return {"val_loss": out["val_loss"], "peak_mem_mb": out["peak_mem_mb"]}

    search = OptunaSearch(metric=["val_loss", "peak_mem_mb"], mode=["min", "min"], seed=0)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space={"x": tune.uniform(0, 1), "y": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(search_alg=search, num_samples=n, max_concurrent_trials=2),
        run_config=tune.RunConfig(storage_path=str(storage_dir), verbose=0),
    )
    t0 = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - t0


def marginal(t_n: float, t_2n: float, n: int, workers: int, sleep: float) -> float:
    """Per-trial wall time beyond the objective's own (sleep / workers), in ms."""
    return 1000 * ((t_2n - t_n) / n - sleep / workers)


def overhead(n: int, tmp: Path, *, tune: bool) -> None:
    print(f"## 1. marginal overhead per trial, {int(SLEEP * 1000)} ms objective, 2 workers, N={n} vs 2N")
    rows = {}
    rows["csweep (MLflow on)"] = marginal(csweep_run(n, 2, SLEEP, tmp / "c1", "a"),
                                          csweep_run(2 * n, 2, SLEEP, tmp / "c2", "b"), n, 2, SLEEP)
    st = f"sqlite:///{tmp / 'peer.db'}"
    ray_ask_tell(4, 2, SLEEP, st, "warm")
    rows["Optuna ask/tell on Ray tasks"] = marginal(ray_ask_tell(n, 2, SLEEP, st, "r1"),
                                                    ray_ask_tell(2 * n, 2, SLEEP, st, "r2"), n, 2, SLEEP)
    rows["Optuna optimize(n_jobs=2)"] = marginal(optuna_n_jobs(n, SLEEP, st, "o1"),
                                                 optuna_n_jobs(2 * n, SLEEP, st, "o2"), n, 2, SLEEP)
    if tune:
        rows["Ray Tune + OptunaSearch"] = marginal(ray_tune(n, SLEEP, tmp / "t1"), ray_tune(2 * n, SLEEP, tmp / "t2"),
                                                   n, 2, SLEEP)
    base = rows["csweep (MLflow on)"]
    for name, ms in rows.items():
        ratio = "" if name.startswith("csweep") or ms <= 0 else f"  (csweep / this = {base / ms:.2f})"
        print(f"{name:32s} {ms:8.1f} ms/trial{ratio}")
    import optuna

    from reports import write_study_report

    t0 = time.perf_counter()
    write_study_report(optuna.load_study(study_name="b", storage=f"sqlite:///{tmp / 'c2' / 'optuna.db'}"),
                       tmp / "report")
    print(f"(end-of-run reports of the {2 * n}-trial study, once per run: {time.perf_counter() - t0:.2f} s)")


def efficiency(tmp: Path) -> None:
    print("## 2. parallel efficiency of csweep, 1 s trials")
    k = 4
    # differences of two run lengths, so worker start-up and study set-up cancel
    t1 = csweep_run(2 * k, 1, 1.0, tmp / "p1", "p1") - csweep_run(k, 1, 1.0, tmp / "p0", "p0")
    t2 = csweep_run(4 * k, 2, 1.0, tmp / "p3", "p3") - csweep_run(2 * k, 2, 1.0, tmp / "p2", "p2")
    print(f"{k} more trials on 1 worker: {t1:.2f} s; {2 * k} more trials on 2 workers: {t2:.2f} s; "
          f"efficiency = {t1 / t2:.3f}")


def warm_workers() -> None:
    print("## 4. warm workers: tiny model, textual_inversion, 1 step")
    from sweeps._workers import TrialWorker

    os.chdir(Path(__file__).resolve().parents[1])
    times = []
    worker = TrialWorker("objectives._textual_inversion:textual_inversion", True, "tiny", None)
    for _ in range(3):
        t0 = time.perf_counter()
        out = worker.run({"steps": 1})
        times.append(time.perf_counter() - t0 - out["metrics"]["train_seconds"])
    print(f"start-up (trial time minus training): cold {times[0]:.3f} s, warm {times[1]:.3f} s, "
          f"{times[2]:.3f} s; cold / warm = {times[0] / times[1]:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--skip-tune", action="store_true")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-warm", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from sweeps._workers import runtime_env

    tmp = Path(tempfile.mkdtemp(prefix="csweep-bench-"))
    os.chdir(Path(__file__).resolve().parent)  # the sleep objective travels from here
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error",
             runtime_env=runtime_env(cluster=False), _node_ip_address="127.0.0.1")
    print(f"# orchestration benchmark  {time.strftime('%Y-%m-%d')}  {platform.platform()}  "
          f"{os.cpu_count()} CPUs  python {platform.python_version()}")
    csweep_run(4, 2, SLEEP, tmp / "warm", "warm")  # the first Ray use pays worker start-up
    if not args.skip_overhead:
        overhead(args.n, tmp, tune=not args.skip_tune)
    efficiency(tmp)
    ray.shutdown()
    if not args.skip_warm:
        warm_workers()


if __name__ == "__main__":
    main()
