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
import statistics
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
    from sweeps import default_storage, default_tracking
    from sweeps import RunConfig, run_sweep

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


def steady_slope(storage: str, study: str, workers: int, sleep: float) -> float:
    """Per-trial wall time beyond the objective's in the steady state, in ms: the time between
    the completions of the 10%-th and the 90%-th trial (start-up and drain left out)."""
    import optuna

    done = sorted(t.datetime_complete for t in optuna.load_study(study_name=study, storage=storage).trials
                  if t.datetime_complete is not None)
    # both ends at the same place in a round of `workers` completions, which come close together
    a = len(done) // 10
    b = a + (len(done) * 9 // 10 - a) // workers * workers
    return 1000 * ((done[b] - done[a]).total_seconds() / (b - a) - sleep / workers)  # sleep 0: the raw slope


def whole_sweep(storage: str, study: str, workers: int, sleep: float) -> float:
    """Per-trial wall time beyond the objective's over the whole sweep as a user sees it, in ms:
    the first trial's start to the last trial's end (from the storage, so start-up is outside
    it, the first asks and the drain at the end inside), over the trials."""
    import optuna

    trials = [t for t in optuna.load_study(study_name=study, storage=storage).trials
              if t.datetime_start is not None and t.datetime_complete is not None]
    span = (max(t.datetime_complete for t in trials) - min(t.datetime_start for t in trials)).total_seconds()
    return 1000 * (span / len(trials) - sleep / workers)


def overhead(n: int, tmp: Path, *, tune: bool, repeats: int) -> None:
    print(f"## 1. overhead per trial beyond the objective, {int(SLEEP * 1000)} ms objective, 2 workers; "
          f"median of {repeats} rounds, the tools interleaved")
    st = f"sqlite:///{tmp / 'peer.db'}"
    ray_ask_tell(4, 2, SLEEP, st, "warm")
    diffs: dict[str, list[float]] = {}
    slopes: dict[str, list[float]] = {}
    wholes: dict[str, list[float]] = {}
    for k in range(repeats):
        tools = {
            "csweep (MLflow on)": (lambda m, tag: csweep_run(m, 2, SLEEP, tmp / f"c{k}{tag}", f"c{k}{tag}"),
                                   lambda tag: (f"sqlite:///{tmp / f'c{k}{tag}' / 'optuna.db'}", f"c{k}{tag}")),
            "Optuna ask/tell on Ray tasks": (lambda m, tag: ray_ask_tell(m, 2, SLEEP, st, f"r{k}{tag}"),
                                             lambda tag: (st, f"r{k}{tag}")),
            "Optuna optimize(n_jobs=2)": (lambda m, tag: optuna_n_jobs(m, SLEEP, st, f"o{k}{tag}"),
                                          lambda tag: (st, f"o{k}{tag}")),
        }
        if tune and k == 0:  # a second per trial: once is enough to see it
            tools["Ray Tune + OptunaSearch"] = (lambda m, tag: ray_tune(m, SLEEP, tmp / f"t{k}{tag}"), None)
        for name, (run, where) in tools.items():
            run(4, "w")  # a warm-up, so that both timed runs find Ray's worker processes started
            diffs.setdefault(name, []).append(marginal(run(n, "a"), run(2 * n, "b"), n, 2, SLEEP))
            if where is not None:
                slopes.setdefault(name, []).append(steady_slope(*where("b"), 2, SLEEP))
                wholes.setdefault(name, []).append(whole_sweep(*where("b"), 2, SLEEP))
    per_trial = 1000 * SLEEP / 2
    print(f"(a) steady state: trials 10%..90% of a {2 * n}-trial run, from the completion times in storage")
    print(f"(b) whole runs: (T({2 * n}) - T({n})) / {n}, start-up cancelled")
    print(f"(c) the whole {2 * n}-trial sweep as users see it: first trial's start to last trial's end, from "
          "the storage, over the trials: " + "; ".join(
              f"{name} {statistics.median(w):.1f} ms ({', '.join(f'{x:.1f}' for x in w)})" for name, w in wholes.items()))
    print(f"{'':32s} {'(a) ms':>8s} {'(b) ms':>8s}   per-round (a) | (b); the objective alone takes {per_trial:.0f} ms "
          f"per trial")
    base = statistics.median(slopes["csweep (MLflow on)"]) + per_trial
    for name, d in diffs.items():
        sl = slopes.get(name)
        a = f"{statistics.median(sl):8.1f}" if sl else f"{'':>8s}"
        ratio = f"  wall per trial {(statistics.median(sl) + per_trial) / base:.2f}x csweep's" if sl and \
            not name.startswith("csweep") else ""
        rounds = (", ".join(f"{x:.1f}" for x in sl) + " | " if sl else "") + ", ".join(f"{x:.1f}" for x in d)
        print(f"{name:32s} {a} {statistics.median(d):8.1f}   {rounds}{ratio}")
    _check_mlflow(tmp / f"c{repeats - 1}b", f"c{repeats - 1}b", 2 * n)
    import optuna

    from reports import write_study_report

    t0 = time.perf_counter()
    last = f"c{repeats - 1}b"
    write_study_report(optuna.load_study(study_name=last, storage=f"sqlite:///{tmp / last / 'optuna.db'}"),
                       tmp / "report")
    print(f"(end-of-run reports of the {2 * n}-trial study, once per run: {time.perf_counter() - t0:.2f} s)")


def _check_mlflow(workdir: Path, study: str, n: int) -> None:
    """The timed csweep run includes its MLflow logging: every trial's run is there, ended."""
    from mlflow.tracking import MlflowClient

    from sweeps import default_tracking

    client = MlflowClient(default_tracking(workdir))
    exp = client.get_experiment_by_name(study)
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`mlflow.parentRunId` != ''", max_results=1000)
    done = [r for r in runs if r.info.status == "FINISHED" and "val_loss" in r.data.metrics]
    print(f"(csweep's {n}-trial run: {len(done)} of {n} MLflow trial runs FINISHED with their metrics)")
    assert len(done) == n


def efficiency(tmp: Path) -> None:
    print("## 2. parallel efficiency of csweep, 1 s trials")
    k = 6
    # (a) differences of two run lengths, so worker start-up and study set-up cancel
    t1 = csweep_run(2 * k, 1, 1.0, tmp / "p1", "p1") - csweep_run(k, 1, 1.0, tmp / "p0", "p0")
    t2 = csweep_run(4 * k, 2, 1.0, tmp / "p3", "p3") - csweep_run(2 * k, 2, 1.0, tmp / "p2", "p2")
    # (b) the steady state of the longer runs: seconds per trial between their 10%-th and 90%-th completion
    s1 = steady_slope(f"sqlite:///{tmp / 'p1' / 'optuna.db'}", "p1", 1, 0) / 1000
    s2 = steady_slope(f"sqlite:///{tmp / 'p3' / 'optuna.db'}", "p3", 2, 0) / 1000
    print(f"(a) {k} more trials on 1 worker: {t1:.2f} s; {2 * k} more trials on 2 workers: {t2:.2f} s; "
          f"efficiency = {t1 / t2:.3f}")
    print(f"(b) steady state: {s1:.3f} s per trial on 1 worker, {s2:.3f} s on 2 workers; "
          f"efficiency = {s1 / (2 * s2):.3f}")


def warm_workers() -> None:
    print("## 4. warm workers: tiny model, textual_inversion, 1 step")
    from sweeps._workers import TrialWorker

    os.chdir(Path(__file__).resolve().parents[1])
    times = []
    worker = TrialWorker("objectives._textual_inversion:textual_inversion", True, "tiny", None)
    for _ in range(3):
        t0 = time.perf_counter()
        out = worker.run({"steps": 1})
        times.append(time.perf_counter() - t0 - out.metrics["train_seconds"])
    print(f"start-up (trial time minus training): cold {times[0]:.3f} s, warm {times[1]:.3f} s, "
          f"{times[2]:.3f} s; cold / warm = {times[0] / times[1]:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-tune", action="store_true")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-warm", action="store_true")
    ap.add_argument("--skip-efficiency", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from sweeps._workers import runtime_env, start_ray

    tmp = Path(tempfile.mkdtemp(prefix="csweep-bench-"))
    os.chdir(Path(__file__).resolve().parent)  # the sleep objective travels from here
    start_ray(None, num_cpus=2, runtime_env=runtime_env(cluster=False))  # the local Ray csweep starts
    print(f"# orchestration benchmark  {time.strftime('%Y-%m-%d')}  {platform.platform()}  "
          f"{os.cpu_count()} CPUs  python {platform.python_version()}")
    csweep_run(4, 2, SLEEP, tmp / "warm", "warm")  # the first Ray use pays worker start-up
    if not args.skip_overhead:
        overhead(args.n, tmp, tune=not args.skip_tune, repeats=args.repeats)
    if not args.skip_efficiency:
        efficiency(tmp)
    ray.shutdown()
    if not args.skip_warm:
        warm_workers()


if __name__ == "__main__":
    main()
