"""Fakes of the driver's two interfaces (sweeps._driver.WorkerPool, TrialLog): the scheduling,
queueing, retry and interrupt logic runs against them in milliseconds, on a simulated clock."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sweeps._result import Kind, TrialResult

DIE = "die"  # a behaviour's answer: the worker process dies while running this task


@dataclass
class _Task:
    handle: int
    widx: int
    generation: int
    params: dict[str, Any]
    seconds: float = 0.0
    outcome: Any = None  # a TrialResult, or DIE
    started: float | None = None
    done_at: float | None = None
    lost: bool = False


@dataclass
class FakePool:
    """`size` workers, each running its tasks in order on a simulated clock.

    `behave(params, call)` says what a task does: (seconds, TrialResult) or (seconds, DIE), where
    `call` counts the tasks started so far (1, 2, ...). A worker that dies loses every task it
    holds (the one running and those queued behind it), as a Ray actor does."""

    size: int
    behave: Callable[[Mapping[str, Any], int], tuple[float, Any]]
    on_submit: Callable[[FakePool, dict[str, Any]], None] | None = None
    clock: float = 0.0
    calls: int = 0
    tasks: dict[int, _Task] = field(default_factory=dict)
    queues: list[list[int]] = field(default_factory=list)
    generation: list[int] = field(default_factory=list)
    replaced: list[int] = field(default_factory=list)
    max_depth: int = 0  # most tasks one worker held at once
    depth_log: list[tuple[int, int]] = field(default_factory=list)  # (tasks started so far, depth) per submit
    started_params: list[dict[str, Any]] = field(default_factory=list)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.queues = [[] for _ in range(self.size)]
        self.generation = [0] * self.size

    def submit(self, widx: int, params: Mapping[str, Any], trial: int | None = None) -> int:
        handle = next(self._ids)
        self.tasks[handle] = _Task(handle, widx, self.generation[widx], dict(params))
        self.queues[widx].append(handle)
        self.max_depth = max(self.max_depth, len(self.queues[widx]))
        self.depth_log.append((self.calls, len(self.queues[widx])))
        self._start_heads()
        if self.on_submit is not None:
            self.on_submit(self, dict(params))
        return handle

    def _start_heads(self) -> None:
        for q in self.queues:
            if q:
                task = self.tasks[q[0]]
                if task.started is None:
                    self.calls += 1
                    task.started = self.clock
                    task.seconds, task.outcome = self.behave(task.params, self.calls)
                    task.done_at = self.clock + task.seconds
                    self.started_params.append(task.params)

    def wait(self, handles: Any, timeout: float) -> list[int]:
        heads = [self.tasks[q[0]] for q in self.queues if q]
        heads = [t for t in heads if t.handle in set(handles)]
        lost = [t.handle for t in self.tasks.values() if t.lost and t.handle in set(handles)]
        if lost:
            return lost[:1]
        if not heads:
            return []
        first = min(heads, key=lambda t: (t.done_at, t.handle))
        self.clock = max(self.clock, first.done_at)
        if first.outcome == DIE:  # the worker dies: all it holds is lost
            for h in self.queues[first.widx]:
                self.tasks[h].lost = True
            self.queues[first.widx] = []
            return [first.handle]
        self.queues[first.widx].pop(0)
        self._start_heads()
        return [first.handle]

    def probe(self, widx: int, params: Mapping[str, Any]) -> int:
        """A 2-step memory probe (sweeps._packing): behaves as `behave(params | {"probe": True}, call)`."""
        return self.submit(widx, {**params, "probe": True})

    def result(self, handle: int) -> TrialResult:
        from sweeps._driver import WorkerLost

        task = self.tasks.pop(handle)
        if task.lost or task.outcome == DIE:
            raise WorkerLost("ActorDiedError: the worker process died")
        out = task.outcome
        return TrialResult(out.kind, dict(out.metrics), reason=out.reason, node=f"node-{task.widx}",
                           seconds=task.seconds, config=dict(task.params))

    def replace(self, widx: int) -> None:
        self.replaced.append(widx)
        self.generation[widx] += 1
        self.queues[widx] = []


def ok(val_loss: float, mem: float = 10.0) -> TrialResult:
    return TrialResult(Kind.OK, {"val_loss": val_loss, "peak_mem_mb": mem})


@dataclass
class FakeLog:
    """The MLflow side: run ids at once, every finished record kept."""

    finished: dict[int, tuple[str, str, dict[str, Any]]] = field(default_factory=dict)
    started: list[int] = field(default_factory=list)

    def start_trial(self, number: int, params: Mapping[str, Any]) -> Future:
        self.started.append(number)
        fut: Future = Future()
        fut.set_result(f"run-{number}")
        return fut

    def finish_trial(self, number: int, run_id: str, status: str, **record: Any) -> None:
        self.finished[number] = (run_id, status, record)
