"""The driver as a small machine: ask Optuna, keep the workers busy, collect, tell, log.

It runs against two interfaces, so that its scheduling, queueing, retry and interrupt logic is
tested in milliseconds with fakes (tests/fakes.py) and runs on Ray in production:
- a `WorkerPool` (sweeps._workers.RayPool): `size` workers that each run tasks in order;
- a `TrialLog` (sweeps._lane.MlflowLane, or PendingLog when MLflow is unreachable).
It imports neither Ray nor MLflow.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from common import attrs as A
from ._result import Kind, TrialResult, combine, mlflow_record, replicate_seeds, require, tell
from ._study import OBJECTIVES

PREFETCH_BELOW_S = 0.5  # trials shorter than this (median of the last five) get a second one queued
INTERRUPTED = "interrupted ({signal} on the driver)"


class WorkerLost(Exception):
    """The worker process that held this task died (killed, OOM-killed)."""


class WorkerPool(Protocol):
    size: int

    def submit(self, widx: int, params: Mapping[str, Any], trial: int | None = None) -> Hashable: ...

    def wait(self, handles: Sequence[Hashable], timeout: float) -> list[Hashable]: ...

    def result(self, handle: Hashable) -> TrialResult: ...  # raises WorkerLost

    def replace(self, widx: int) -> None: ...


class TrialLog(Protocol):
    def start_trial(self, number: int, params: Mapping[str, Any]) -> Future: ...  # of the run id

    def finish_trial(self, number: int, run_id: str, status: str, **record: Any) -> None: ...


@dataclass
class Outcome:
    study_name: str
    completed: int = 0
    failed: int = 0
    pruned: int = 0
    out_of_memory: int = 0
    study_trials: int = 0  # trials in the study when this run ended
    report_dir: Any = None
    parent_run_id: str = ""
    interrupted: bool = False
    signal: str = ""  # the signal that interrupted it (SIGINT, SIGTERM)
    decided: str = ""  # --until-decisive: the line that stopped the study early
    aborted: str = ""

    @property
    def done(self) -> int:
        return self.completed + self.failed + self.pruned + self.out_of_memory


@dataclass
class _Trial:
    """An asked Optuna trial and its seed replicates."""

    trial: Any
    params: dict[str, Any]
    started: Future  # of its MLflow run id
    seeds: list[int]
    results: dict[int, TrialResult] = field(default_factory=dict)
    run_id: str | None = None  # None until the logging side has answered
    attempts: dict[int, int] = field(default_factory=dict)  # replicate -> attempt of its next start

    def replicate_params(self, replicate: int) -> dict[str, Any]:
        return {**self.params, "seed": self.seeds[replicate]}


@dataclass
class _Task:
    """One replicate of a trial, submitted to a worker."""

    owner: _Trial
    replicate: int
    widx: int
    generation: int
    attempt: int
    seq: int
    probe: bool = False  # a 2-step memory probe of the owner's config (sweeps._packing), not a replicate


class Driver:
    def __init__(
        self, study: Any, pool: WorkerPool, log: TrialLog, *, trials: int,
        fixed: Mapping[str, Any] = {}, distributions: Mapping[str, Any] | None = None,
        seeds: int = 1, seed_offset: int = 0, max_mem_mb: float | None = None, max_retries: int = 1,
        max_fail_share: float = 0.5, enqueue: Sequence[Mapping[str, Any]] = (),
        enqueue_attrs: Sequence[Mapping[str, Any]] = (),
        stop: threading.Event | None = None, on_progress: Callable[[Outcome, dict[str, int]], None] | None = None,
        on_result: Callable[[int, TrialResult], None] | None = None,
        objectives: Sequence[str] = OBJECTIVES, should_stop: Callable[[], str] | None = None,
        seed_plan: Callable[[Any, int], int] | None = None, packing: Any = None,
    ) -> None:
        self.study, self.pool, self.log = study, pool, log
        self.objectives = tuple(objectives)
        self.target, self.fixed, self.distributions = trials, dict(fixed), distributions
        self.seeds, self.seed_offset = seeds, seed_offset
        # --seed-plan design: how many of the `seeds` each asked trial trains (seed_plan(trial, seeds))
        self.seed_plan = seed_plan
        self.max_mem_mb, self.max_retries, self.max_fail_share = max_mem_mb, max_retries, max_fail_share
        self.stop = stop or threading.Event()
        self.on_progress, self.on_result = on_progress, on_result
        self.should_stop = should_stop  # after a tell: a line when the study may stop asking
        self.outcome = Outcome(study.study_name)
        for i, params in enumerate(enqueue):
            attrs = dict(enqueue_attrs[i]) if i < len(enqueue_attrs) else None
            study.enqueue_trial(dict(params), user_attrs=attrs, skip_if_exists=False)
        self.asked = 0
        self.seq = 0
        self.queue: deque[tuple[_Trial, int]] = deque()  # replicates not yet submitted
        self.in_flight: dict[Hashable, _Task] = {}
        self.open: list[_Trial] = []  # asked and not yet told
        self.load = [0] * pool.size  # tasks submitted to each worker and not yet returned
        self.generation = [0] * pool.size  # bumped when a worker is replaced
        self.running_seq: dict[tuple[int, int], int] = {}  # a dead (worker, generation) -> its running task
        self.durations: list[float] = []
        self.progressed = False  # a trial was told since the progress was last shown
        # --gpu-mem-mb: which worker may start a task, by its GPU's room (sweeps._packing.Packing)
        self.packing = packing
        self.alone: set[tuple[int, int]] = set()  # (trial, replicate) put back to run alone after an OOM

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> Outcome:
        try:
            while not self.stop.is_set():
                self.dispatch()
                if self.progressed and self.on_progress is not None:  # told, and the workers refilled
                    self.on_progress(self.outcome, self.in_progress())
                if self.progressed and self.should_stop is not None and not self.outcome.decided:
                    self.outcome.decided = self.should_stop()
                    if self.outcome.decided:  # no more asks; the trials in flight finish and are told
                        self.target = self.asked
                self.progressed = False
                if not self.in_flight:
                    break
                timeout = 0.25 if self._record_run_ids() else 0.5
                for handle in self.pool.wait(list(self.in_flight), timeout):
                    self.collect(handle)
        except KeyboardInterrupt:
            self.stop.set()
        if self.stop.is_set():
            self.interrupted()
        return self.outcome

    def remaining_tasks(self) -> int:
        return (self.target - self.asked) * (self.seeds if self.seed_plan is None else 1) + len(self.queue)

    def depth(self) -> int:
        """Tasks per worker: a second one queued behind a short trial, so that the worker goes
        straight on while the driver tells the first and asks the next; one for long trials,
        where the wait is negligible and the sampler should see every finished result first,
        and one for the last tasks, which go to whichever worker is free first."""
        if self.packing is not None:
            return 1  # a task queued behind another holds no room on its GPU
        recent = sorted(self.durations[-5:])
        short = bool(recent) and recent[len(recent) // 2] < PREFETCH_BELOW_S
        return 2 if short and self.remaining_tasks() > self.pool.size else 1

    def dispatch(self) -> None:
        while not self.outcome.aborted and not self.stop.is_set():
            if not self.queue and self.asked >= self.target:
                return
            widx = min(range(self.pool.size), key=self.load.__getitem__)
            if self.load[widx] >= self.depth():
                return
            if not self.queue:
                self._ask()
            if self.packing is not None:
                if not self._place():
                    return
                continue
            owner, replicate = self.queue.popleft()
            self._send(widx, owner, replicate, attempt=1)

    def _place(self) -> bool:
        """--gpu-mem-mb: start the queue's head where its predicted memory fits (or its probe on an
        empty GPU); False when it must wait for room."""
        owner, replicate = self.queue[0]
        params = owner.replicate_params(replicate)
        free = [w for w in range(self.pool.size) if self.load[w] == 0]
        placed = self.packing.place(free, params, alone=(owner.trial.number, replicate) in self.alone)
        if placed is None:
            return False
        what, widx, mb = placed
        if what == "probe":
            self.seq += 1
            handle = self.pool.probe(widx, params)
            self.in_flight[handle] = _Task(owner, replicate, widx, self.generation[widx], 0, self.seq, probe=True)
            self.load[widx] += 1
        else:
            self.queue.popleft()
            attempt = owner.attempts.get(replicate, 1)
            handle = self._send(widx, owner, replicate, attempt=attempt)
            owner.trial.set_user_attr(A.PREDICTED_MEM, round(mb, 1))
            owner.trial.set_user_attr(A.PACKED_START, time.time())
        self.packing.hold(handle, widx, mb)
        return True

    def _ask(self) -> None:
        trial = self.study.ask(fixed_distributions=self.distributions)
        params = {**self.fixed, **trial.params}
        base = int(params.get("seed", 0) or 0)
        k = self.seeds if self.seed_plan is None else max(1, min(self.seed_plan(trial, self.seeds), self.seeds))
        owner = _Trial(trial, params, self.log.start_trial(trial.number, params),
                       replicate_seeds(base, k, offset=self.seed_offset))
        self.open.append(owner)
        self.queue.extend((owner, r) for r in range(k))
        self.asked += 1

    def _send(self, widx: int, owner: _Trial, replicate: int, *, attempt: int) -> Hashable:
        self.seq += 1
        handle = self.pool.submit(widx, owner.replicate_params(replicate), owner.trial.number)
        self.in_flight[handle] = _Task(owner, replicate, widx, self.generation[widx], attempt, self.seq)
        self.load[widx] += 1
        return handle

    def collect(self, handle: Hashable) -> None:
        task = self.in_flight.pop(handle)
        self.load[task.widx] -= 1
        held, shared = self.packing.release(handle) if self.packing is not None else (0.0, False)
        try:
            result = self.pool.result(handle)
        except WorkerLost as exc:
            if self.packing is not None:
                self.packing.rest(task.widx, 0.0)  # its replacement holds nothing yet
            if task.probe:
                self.packing.probed(task.owner.replicate_params(task.replicate), None)
                return
            lost = self._worker_lost(task, exc)
            if lost is None:
                return
            result = lost
        if self.packing is not None:
            self.packing.rest(task.widx, result.resident_mb)
        if task.probe:
            self.packing.probed(task.owner.replicate_params(task.replicate),
                                result.metrics.get("peak_mem_mb") if result.kind is Kind.OK else None)
            return
        owner = task.owner
        if self.packing is not None and self._packed_oom(task, result, held, shared):
            return
        self.durations.append(float(result.seconds))
        result.seed = owner.seeds[task.replicate]
        owner.results[task.replicate] = result
        if len(owner.results) == len(owner.seeds):
            self._finish(owner)

    def _packed_oom(self, task: _Task, result: TrialResult, held: float, shared: bool) -> bool:
        """Teach the predictor what a trial measured; an out-of-memory error of a task that shared
        its GPU (or held less than all of it) puts it back at the head of the queue, to run alone."""
        params = task.owner.replicate_params(task.replicate)
        peak = result.metrics.get("peak_mem_mb", result.metrics.get(A.PEAK_MEM_SEEN, math.nan))
        if result.kind is not Kind.OUT_OF_MEMORY:
            self.packing.predictor.observe(params, float(peak))
            return False
        key = (task.owner.trial.number, task.replicate)
        if key in self.alone or not (shared or held < self.packing.budget_mb):
            return False  # it ran alone on a whole GPU: the config does not fit, a fact about it
        self.packing.predictor.observe_oom(params, held)
        self.alone.add(key)
        task.owner.attempts[task.replicate] = task.attempt
        task.owner.trial.set_user_attr(A.REPACKED, True)
        self.queue.appendleft((task.owner, task.replicate))
        return True

    def _worker_lost(self, task: _Task, exc: Exception) -> TrialResult | None:
        """The worker process died: replace it once and run its tasks again. Only the task it
        was running counts an attempt; those queued behind it never started."""
        widx, key = task.widx, (task.widx, task.generation)
        if task.generation == self.generation[widx]:
            mates = [t.seq for t in self.in_flight.values() if (t.widx, t.generation) == key]
            self.running_seq[key] = min([task.seq, *mates])
            self.pool.replace(widx)
            self.generation[widx] += 1
        attempt = task.attempt
        if task.seq == self.running_seq[key]:
            if attempt > self.max_retries:
                return TrialResult.failed(f"worker lost {attempt} time(s): {exc.__class__.__name__}: "
                                          f"{str(exc)[:500]}")
            attempt += 1
            task.owner.trial.set_user_attr(A.ATTEMPTS, attempt)
        if self.packing is not None:  # it starts again where its memory fits
            task.owner.attempts[task.replicate] = attempt
            self.queue.appendleft((task.owner, task.replicate))
            return None
        self._send(widx, task.owner, task.replicate, attempt=attempt)
        return None

    def _finish(self, owner: _Trial) -> None:
        self.open.remove(owner)
        result = require(combine([owner.results[i] for i in range(len(owner.seeds))]), self.objectives)
        run_id = self._run_id(owner)
        tell(self.study, owner.trial, result, max_mem_mb=self.max_mem_mb, objectives=self.objectives)
        status, record = mlflow_record(result)
        self.log.finish_trial(owner.trial.number, run_id, status, **record)
        if self.on_result is not None:
            self.on_result(owner.trial.number, result)
        o = self.outcome
        if result.kind is Kind.OK:
            o.completed += 1
        elif result.kind is Kind.PRUNED:
            o.pruned += 1
        elif result.kind is Kind.OUT_OF_MEMORY:
            o.out_of_memory += 1
        else:
            o.failed += 1
        o.aborted = o.aborted or self._too_many_failures()
        self.progressed = True

    def in_progress(self) -> dict[str, int]:
        """What is in flight, for the progress bar: `running`, the tasks (seed replicates) that
        workers are executing now; `queued`, those waiting behind them on a worker; `configs`,
        the trials (configs) asked and not yet told."""
        running = sum(1 for n in self.load if n > 0)
        return {"running": running, "queued": len(self.in_flight) - running, "configs": len(self.open)}

    def _too_many_failures(self) -> str:
        o = self.outcome
        if o.done >= 4 and o.failed / o.done > self.max_fail_share:
            return (f"stopped: {o.failed} of {o.done} trials failed (more than "
                    f"{self.max_fail_share:.0%}); fix the objective, or raise --max-fail-share")
        return ""

    def interrupted(self) -> None:
        """Ctrl-C or SIGTERM: every trial asked and not told ends FAIL, marked for a resume to run again
        (the pool's workers are killed by its owner, which ends their tasks)."""
        from optuna.trial import TrialState

        self.outcome.interrupted = True
        for owner in list(self.open):
            run_id = self._run_id(owner)
            owner.trial.set_user_attr(A.FAIL_REASON, INTERRUPTED.format(signal=self.outcome.signal or "SIGINT"))
            owner.trial.set_user_attr(A.REPLACED, True)
            self.study.tell(owner.trial, state=TrialState.FAIL)
            if run_id:
                self.log.finish_trial(owner.trial.number, run_id, "KILLED", tags={A.FAIL_REASON: "interrupted"})
        self.open.clear()
        self.in_flight.clear()
        self.queue.clear()

    # --- MLflow run ids ----------------------------------------------------------------
    def _run_id(self, owner: _Trial) -> str:
        """The trial's MLflow run id, put on the trial as soon as it is known (a resume after a
        driver crash ends the runs of the trials it finds RUNNING by that attr)."""
        if owner.run_id is None:
            try:
                owner.run_id = owner.started.result()
            except Exception:  # noqa: BLE001 - the logging side died before it answered
                owner.run_id = ""
            if owner.run_id:
                owner.trial.set_user_attr(A.MLFLOW_RUN_ID, owner.run_id)
        return owner.run_id

    def _record_run_ids(self) -> bool:
        """Record the run ids that have arrived; True while some are still to come."""
        due = False
        for owner in self.open:
            if owner.run_id is None:
                if owner.started.done():
                    self._run_id(owner)
                else:
                    due = True
        return due
