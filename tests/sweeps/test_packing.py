"""Memory-aware packing (--gpu-mem-mb): trials start on a GPU as far as their predicted peaks fit,
against a fake pool on a simulated clock whose workers share logical GPUs. The fake knows each
config's true peak; a task that starts where the true peaks no longer fit runs out of memory,
as on a card."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import optuna
import pytest
from fakes import FakeLog, FakePool, ok
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from common import attrs as A
from sweeps._driver import Driver
from sweeps._packing import MIN_FIT, MemoryPredictor, Packing, gpu_share
from sweeps._result import Kind, TrialResult

BUDGET = 1000.0


@dataclass
class GpuPool(FakePool):
    """Workers on logical GPUs (`per_gpu` workers to a GPU); `true_mb(params)` is a config's real
    peak, `probe_mb(params)` what a 2-step probe of it measures."""

    per_gpu: int = 4
    true_mb: Any = None
    probe_mb: Any = None
    resident: float = 0.0  # MB a worker keeps on its GPU between tasks once it has run one (its model)
    spans: list = field(default_factory=list)  # (start, end, worker, params, kind)
    loaded: set = field(default_factory=set)

    def gpu(self, widx: int) -> int:
        return widx // self.per_gpu

    def on_gpu_now(self, gpu: int) -> list:
        return [t for t in self.tasks.values() if t.started is not None and t.done_at > self.clock
                and self.gpu(t.widx) == gpu and not t.lost]

    def resting_on(self, gpu: int, besides: int) -> float:
        busy = {t.widx for t in self.on_gpu_now(gpu)}
        return sum(self.resident for w in self.loaded if self.gpu(w) == gpu and w not in busy and w != besides)

    def result(self, handle: int) -> TrialResult:
        widx = self.tasks[handle].widx
        out = super().result(handle)
        self.loaded.add(widx)
        out.resident_mb = self.resident
        return out

    def _start_heads(self) -> None:
        for q in self.queues:
            if q and self.tasks[q[0]].started is None:
                task = self.tasks[q[0]]
                gpu = self.gpu(task.widx)
                others = sum(self.true_mb(t.params) for t in self.on_gpu_now(gpu)) + self.resting_on(gpu, task.widx)
                self.calls += 1
                task.started = self.clock
                probe = bool(task.params.get("probe"))
                fits = others + self.true_mb(task.params) <= BUDGET or not others
                if probe:
                    task.seconds, task.outcome = 1.0, ok(math.nan, self.probe_mb(task.params))
                elif fits:
                    task.seconds, task.outcome = 10.0, ok(0.5, self.true_mb(task.params))
                else:
                    task.seconds, task.outcome = 2.0, TrialResult(Kind.OUT_OF_MEMORY, reason="CUDA out of memory")
                task.done_at = self.clock + task.seconds
                self.spans.append((task.started, task.done_at, task.widx, dict(task.params), task.outcome.kind))

    def most_at_once(self, gpu: int) -> int:
        mine = [(s, e) for s, e, w, p, k in self.spans if self.gpu(w) == gpu]
        return max(sum(1 for s, e in mine if s <= t < e) for t, _ in mine)

    def true_load_peak(self, gpu: int) -> float:
        """The most true memory that the trials running together on a GPU held at once."""
        mine = [(s, e, self.true_mb(p)) for s, e, w, p, k in self.spans if self.gpu(w) == gpu and k is Kind.OK]
        return max(sum(m for s, e, m in mine if s <= t < e) for t, _, _ in mine)


def law(params: dict) -> float:
    return 50.0 + 30.0 * params["lora_rank"] + (75.0 if params.get("precision") == "fp32" else 0.0)


def study(dists: dict) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(directions=["minimize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=1))


RANKS = {"lora_rank": IntDistribution(1, 8), "precision": CategoricalDistribution(["fp16", "fp32"])}


def packed_run(pool: GpuPool, *, trials: int, can_probe: bool = True, knobs=("lora_rank", "precision"),
               dists=RANKS) -> tuple[optuna.Study, Packing, Any]:
    st = study(dists)
    packing = Packing(BUDGET, pool.gpu, MemoryPredictor(knobs), can_probe=can_probe)
    out = Driver(st, pool, FakeLog(), trials=trials, distributions=dists, packing=packing).run()
    return st, packing, out


def test_trials_fill_a_gpu_as_far_as_their_measured_memory_fits():
    pool = GpuPool(8, lambda p, n: None, per_gpu=8, true_mb=law, probe_mb=law)
    st, packing, out = packed_run(pool, trials=30)
    assert out.completed == 30 and [t.state for t in st.trials] == [TrialState.COMPLETE] * 30
    assert not any(k is Kind.OUT_OF_MEMORY for *_, k in pool.spans)
    assert pool.true_load_peak(0) <= BUDGET
    assert pool.most_at_once(0) >= 4  # peaks of 80-365 MB: four or more at once on a 1,000 MB card
    probes = [p for *_, p, k in pool.spans if p.get("probe")]
    shapes = [(p["lora_rank"], p["precision"]) for p in probes]
    assert len(shapes) == len(set(shapes)) and len(shapes) <= MIN_FIT + 1  # each shape once, then the line
    # the same configs one trial per GPU take about as many trial-lengths as there are trials
    serial = GpuPool(1, lambda p, n: None, per_gpu=1, true_mb=law, probe_mb=law)
    st1 = study(RANKS)
    Driver(st1, serial, FakeLog(), trials=30, distributions=RANKS).run()
    assert pool.clock < 0.5 * serial.clock


def test_gpus_are_filled_fullest_first_so_a_big_trial_finds_an_empty_one():
    pool = GpuPool(4, lambda p, n: None, per_gpu=2, true_mb=law, probe_mb=law)
    packing = Packing(BUDGET, pool.gpu, MemoryPredictor(("lora_rank", "precision")))
    packing.predictor.observe({"lora_rank": 1, "precision": "fp16"}, 80.0)
    packing.hold("a", 0, 92.0)  # one small trial on GPU 0
    placed = packing.place([1, 2, 3], {"lora_rank": 1, "precision": "fp16"})
    assert placed[:2] == ("run", 1)  # beside it, on GPU 0, not on the empty GPU 1


def test_a_trial_that_runs_out_of_memory_sharing_a_gpu_runs_again_alone_and_teaches_the_predictor():
    # the probe under-reads rank 8 (its validation holds more than its first steps)
    def probe(p):
        return 200.0 if p["lora_rank"] == 8 else law(p)

    def true(p):
        return 900.0 if p["lora_rank"] == 8 else law(p)

    dists = {"lora_rank": CategoricalDistribution([1, 8])}
    pool = GpuPool(4, lambda p, n: None, per_gpu=4, true_mb=true, probe_mb=probe)
    st, packing, out = packed_run(pool, trials=12, knobs=("lora_rank",), dists=dists)
    assert out.completed == 12 and out.out_of_memory == 0
    assert [t.state for t in st.trials] == [TrialState.COMPLETE] * 12
    ooms = [(s, w, p) for s, e, w, p, k in pool.spans if k is Kind.OUT_OF_MEMORY]
    assert ooms, "the case did not happen: no rank-8 trial started beside another"
    repacked = [t for t in st.trials if t.user_attrs.get(A.REPACKED)]
    assert repacked and all(t.params["lora_rank"] == 8 for t in repacked)
    assert packing.predictor.predict({"lora_rank": 8}) >= 900.0  # measured alone, then kept
    assert pool.true_load_peak(0) <= BUDGET


def test_workers_waiting_with_their_model_on_the_gpu_count_against_its_room():
    """On CUDA a worker keeps its cached base model on the GPU between trials (the allocator's
    count after its trial, reported with the result); a trial's peak includes its own copy."""
    dists = {"lora_rank": CategoricalDistribution([0, 2])}

    def true(p):
        return 200.0 + 100.0 * p["lora_rank"]  # 200 MB of it the worker's model

    pool = GpuPool(4, lambda p, n: None, per_gpu=4, true_mb=true, probe_mb=true, resident=200.0)
    packing = Packing(BUDGET, pool.gpu, MemoryPredictor(("lora_rank",)), can_probe=True)
    # four small trials first, side by side: every worker then holds its 200 MB model
    out = Driver(study(dists), pool, FakeLog(), trials=16, distributions=dists, packing=packing,
                 enqueue=[{"lora_rank": 0}] * 4).run()
    assert out.completed == 16 and out.out_of_memory == 0
    assert len({w for _, _, w, p, _ in pool.spans if not p.get("probe")}) == 4
    # two 400 MB trials fit the 1,000 MB card, but not beside two waiting workers' models:
    # counted, nothing ran out of memory
    assert not any(k is Kind.OUT_OF_MEMORY for *_, k in pool.spans)


def test_a_config_larger_than_the_budget_runs_alone_and_never_stalls_the_sweep():
    dists = {"lora_rank": CategoricalDistribution([1, 40])}
    pool = GpuPool(4, lambda p, n: None, per_gpu=4, true_mb=law, probe_mb=law)  # rank 40: 1,250 MB
    st, packing, out = packed_run(pool, trials=10, knobs=("lora_rank",), dists=dists)
    assert out.completed == 10
    for s, e, w, p, k in pool.spans:
        if p["lora_rank"] == 30 and not p.get("probe"):
            beside = [q for s2, e2, w2, q, _ in pool.spans if w2 != w and s2 < e and s < e2]
            assert beside == [], "a trial larger than the card shared it"


def test_a_plugins_config_of_unknown_memory_runs_alone_until_its_shape_is_measured():
    dists = {"lora_rank": CategoricalDistribution([1, 2])}
    pool = GpuPool(4, lambda p, n: None, per_gpu=4, true_mb=law, probe_mb=law)
    st, packing, out = packed_run(pool, trials=12, can_probe=False, knobs=None, dists=dists)
    assert out.completed == 12 and not any(p.get("probe") for *_, p, _ in pool.spans)
    first = pool.spans[0]
    assert all(s >= first[1] for s, *_ in pool.spans[1:])  # nothing beside the first: its memory was unknown
    assert pool.most_at_once(0) >= 3


def test_the_prediction_of_a_shape_never_measured_covers_its_peak_once_enough_are_measured():
    import random

    def peak(p):
        return 300 + 40 * p["lora_rank"] + 350 * p["batch_size"] + (250 if p["precision"] == "fp32" else 0)

    rng = random.Random(0)
    shapes = [{"lora_rank": r, "batch_size": b, "precision": pr} for r in (1, 4, 8, 16, 32) for b in (1, 2, 4)
              for pr in ("fp16", "fp32")]
    rng.shuffle(shapes)
    pred = MemoryPredictor(("lora_rank", "batch_size", "precision"))
    assert pred.predict(shapes[0]) is None  # nothing measured: a probe, or alone
    for p in shapes[:8]:
        pred.observe(p, peak(p) * rng.uniform(0.97, 1.03))
    ratios = [pred.predict(p) / peak(p) for p in shapes[8:]]
    assert min(ratios) >= 1.0 and max(ratios) <= 1.6, ratios


@pytest.mark.parametrize("workers,gpus,share", [(8, 1, 0.125), (3, 2, 0.5), (1, 2, 1.0), (2, 2, 1.0), (4, 0, 0.0),
                                                 (3, 1, 0.3333), (7, 2, 0.25)])
def test_each_worker_gets_a_share_ray_can_place_whole(workers, gpus, share):
    assert gpu_share(workers, gpus) == share
    if gpus:  # k shares of a GPU, in Ray's steps of 1/10,000, never add up to more than one
        per_gpu = math.ceil(workers / gpus)
        assert per_gpu * round(share * 10_000) <= 10_000 or share == 1.0


SLEEPY = '''
import json, os, time

def objective(params):
    import ray
    start = time.time()
    time.sleep(1.5)
    peak = 100.0 + 50.0 * params["x"]
    with open(os.path.join(os.environ["SPANS_DIR"], f"{os.getpid()}-{start}.json"), "w") as f:
        json.dump({"start": start, "end": time.time(), "peak": peak, "gpus": [str(g) for g in ray.get_gpu_ids()]}, f)
    return {"val_loss": (params["y"] - 0.3) ** 2, "peak_mem_mb": peak}
'''

DRIVE = '''
import sys

import ray

if __name__ == "__main__":  # the MLflow side runs in a child process that imports this module
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False, logging_level="error",
             _node_ip_address="127.0.0.1", object_store_memory=128 * 1024 * 1024,
             runtime_env={"env_vars": {"PYTHONPATH": "."}})
    from sweeps import main

    sys.exit(main(sys.argv[1:]))
'''


@pytest.mark.slow
def test_a_sweep_on_ray_packs_trials_onto_a_logical_gpu_by_their_memory(tmp_path):
    """Through `csweep run` on a Ray with one logical GPU (this machine has none): 4 workers
    share it, and the trials in flight on it never hold more than --gpu-mem-mb together."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "userobj.py").write_text(SLEEPY)
    (tmp_path / "drive.py").write_text(DRIVE)
    (tmp_path / "s.yaml").write_text("name: s\nparams:\n  x: {type: int, low: 1, high: 8}\n"
                                     "  y: {type: float, low: 0.0, high: 1.0}\n")
    (tmp_path / "spans").mkdir()
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{tmp_path}", "SPANS_DIR": str(tmp_path / "spans"),
           "RAY_USAGE_STATS_ENABLED": "0"}
    res = subprocess.run([sys.executable, "drive.py", "run", "s.yaml", "--objective", "userobj:objective",
                          "--trials", "14", "--workers", "4", "--gpu-mem-mb", "1000", "--no-progress",
                          "--workdir", "wd", "--seed", "0"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    spans = [json.loads(p.read_text()) for p in (tmp_path / "spans").iterdir()]
    assert len(spans) == 14 and all(s["gpus"] == ["0"] for s in spans)  # every worker on the one GPU
    at_once = [[o for o in spans if o["start"] <= s["start"] < o["end"]] for s in spans]
    assert max(len(group) for group in at_once) >= 2  # packed: the 4 workers did not run one at a time
    assert max(sum(o["peak"] for o in group) for group in at_once) <= 1000


@pytest.mark.parametrize("workers,cpus,share,have,runs", [
    (4, 1, 1.0, {"CPU": 8, "GPU": 1}, 1), (4, 1, 0.5, {"CPU": 8, "GPU": 1}, 2), (4, 1, 0.25, {"CPU": 8, "GPU": 1}, 4),
    (3, 1, 0.3333, {"CPU": 8, "GPU": 1}, 3), (8, 1, 1.0, {"CPU": 16, "GPU": 4}, 4), (2, 1, 0.0, {"CPU": 2}, 2),
    (3, 1, 0.3333, {"CPU": 2, "GPU": 1}, 2), (4, 2, 0.0, {"CPU": 6}, 3)])
def test_workers_the_cluster_cannot_hold_are_not_started_to_wait_forever(workers, cpus, share, have, runs, capsys):
    from sweeps._resources import workers_that_fit

    assert workers_that_fit(workers, cpus, share, have) == runs
    said = capsys.readouterr().err
    assert (f"--workers {workers}: the cluster's" in said and f"running {runs}" in said) == (runs < workers)


def test_a_probe_trains_the_config_two_steps_and_measures_its_peak():
    """The built-in objective's probe (sweeps._workers.TrialWorker.probe): the config as asked,
    two steps, no validation during training, no samples; its peak as a full trial's first steps
    measure it, and what its worker then keeps (nothing on a machine without CUDA)."""
    from sweeps._workers import TrialWorker

    worker = TrialWorker("textual_inversion", True, "tiny", None)
    small = worker.probe({"steps": 60, "lora_rank": 2, "seed": 0})
    large = worker.probe({"steps": 60, "lora_rank": 16, "batch_size": 4, "seed": 0})
    assert small.kind is Kind.OK and large.kind is Kind.OK
    assert small.metrics["steps_run"] == 2 and small.config["steps"] == 2
    assert 0 < small.metrics["peak_mem_mb"] < large.metrics["peak_mem_mb"]
    assert small.resident_mb == 0.0 and not any(k.startswith("sample") for k in small.metrics)
