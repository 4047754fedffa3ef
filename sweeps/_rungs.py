"""`--early-stop dominated`: stop a trial at a rung once the trials that reached that step beat
it on both objectives.

Optuna cannot prune multi-objective studies, and Ray Tune's schedulers rank one metric. In a
csweep study one objective, peak memory, is known after the first steps (exactly, on the CPU) and
only val_loss moves. So at a rung (a fraction of the trial's steps: 1/9, 2/9, ..., 2/3 by
default) a trial is stopped when another trial that reached the same step used no more memory
and had a val_loss lower by more than the margin there, and lower than where the trial itself
would end if its gains went on shrinking as they last did (`optimistic`); or when a trial that
ran to its end at no more memory finished below that optimistic end (the front has already
beaten it: on the benchmark's curves this second test cut the steps from 0.54 to 0.45 of a full
study's at the same hypervolume). The extrapolation
keeps a slow starter: loss curves cross (a high lr leads early and overfits late), and stopping
on the first condition alone, as ranking at a rung does (MO-ASHA), lost 8% of the front's
hypervolume on the benchmark's curves, beyond the seed noise (benchmarks/early_stop.py). A rung needs a few trials
that reached it before it stops anything (`min_reached`), as ASHA's rungs do.

The board is one object that every worker reports to (a Ray actor in a sweep; in-process in
tests). It keeps each trial's curve per seed replicate; with `--seeds K` a trial's value at a
step is its replicates' mean there. Other trials' values at a step between two of their
validations are read off their curves by linear interpolation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_RUNGS = tuple(k / 9 for k in range(1, 7))  # 1/9, 2/9, ..., 2/3 of the trial's steps
DEFAULT_RUNGS_TEXT = "1/9,2/9,1/3,4/9,5/9,2/3"
MARGIN = 0.01  # relative: a dominating trial's val_loss is below this trial's by more than 1%
MIN_REACHED = 3  # trials (besides this one) that reached the step before a rung stops anything
RATIO_CAP, RATIO_MAX = 0.8, 0.9  # the extrapolation's ratio of gains: before two gains are seen, at most


def rung_steps(fractions: Sequence[float], steps: int) -> list[int]:
    """The step of each rung in a trial of `steps` steps: ceil(fraction x steps), at least 1."""
    return [max(1, math.ceil(f * steps - 1e-9)) for f in fractions]


def check_rungs(fractions: Sequence[float], steps: int) -> str | None:
    """Why these rungs do not fit a trial of `steps` steps, or None."""
    bad = [s for s in rung_steps(fractions, steps) if s >= steps]
    if bad:
        return (f"--rungs {','.join(f'{f:g}' for f in fractions)} place a rung at step {bad[0]} of a trial of "
                f"{steps} steps; a rung must come before the trial's last step")
    return None


def parse_rungs(text: str) -> tuple[float, ...]:
    """'1/9,1/3' or '0.111,0.333' -> fractions in (0, 1), increasing; raises ValueError naming the rule."""
    from fractions import Fraction

    try:
        values = tuple(float(Fraction(x.strip())) for x in text.split(","))
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"--rungs must be fractions of the trial's steps, e.g. 1/9,1/3, got {text!r}") from None
    if not values or any(not 0 < v < 1 for v in values) or list(values) != sorted(set(values)):
        raise ValueError(f"--rungs must be increasing fractions in (0, 1) of the trial's steps, got {text!r}")
    return values


def _at(curve: Mapping[int, float], step: int) -> float | None:
    """A curve's value at `step`: measured there, or interpolated between the validations on
    either side; None outside what it measured."""
    if step in curve:
        return curve[step]
    below = [s for s in curve if s < step]
    above = [s for s in curve if s > step]
    if not below or not above:
        return None
    a, b = max(below), min(above)
    return curve[a] + (curve[b] - curve[a]) * (step - a) / (b - a)


@dataclass
class Decision:
    trial: int
    rung: int  # 1, 2, ...
    step: int
    stopped: bool
    reason: str = ""


@dataclass
class RungBoard:
    fractions: tuple[float, ...] = DEFAULT_RUNGS
    margin: float = MARGIN
    min_reached: int = MIN_REACHED
    extrapolate: bool = True  # stop only when even the trial's optimistic extrapolation cannot catch up
    ratio_cap: float = RATIO_CAP  # r before a trial has two gains
    ratio_max: float = RATIO_MAX
    curves: dict[int, dict[int, dict[int, float]]] = field(default_factory=dict)  # trial -> seed -> step -> val
    memory: dict[int, float] = field(default_factory=dict)  # trial -> its peak memory so far
    passed: dict[tuple[int, int], int] = field(default_factory=dict)  # (trial, seed) -> rungs judged
    stopped: dict[int, Decision] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    planned: dict[int, int] = field(default_factory=dict)  # trial -> its planned steps
    use_finals: bool = True  # also against the final val_loss of the trials that ran to their end

    def seed_with(self, trials: Sequence[tuple[int, float, Sequence[Sequence[float]]]]) -> None:
        """Curves of finished trials (a resumed study's): (trial, peak memory, [[step, val], ...])."""
        for number, mem, curve in trials:
            self.curves.setdefault(number, {})[0] = {int(s): float(v) for s, v in curve}
            if mem is not None and math.isfinite(mem):
                self.memory[number] = float(mem)

    def report(self, trial: int, seed: int, steps: int, step: int, values: Mapping[str, Any]) -> tuple[str, int]:
        """A validation of one replicate of `trial` (planned `steps` steps) at `step`. Returns
        (reason to stop, rung) or ("", 0) to go on."""
        self.curves.setdefault(trial, {}).setdefault(seed, {})[int(step)] = float(values["val_loss"])
        self.planned[trial] = int(steps)
        mem = values.get("peak_mem_mb")
        if mem is not None and math.isfinite(float(mem)):
            self.memory[trial] = max(self.memory.get(trial, 0.0), float(mem))
        if trial in self.stopped:
            d = self.stopped[trial]
            return d.reason, d.rung
        rungs = rung_steps(self.fractions, steps)
        k = self.passed.get((trial, seed), 0)
        while k < len(rungs) and rungs[k] <= step < steps:
            k += 1
            decision = self._judge(trial, k, step, steps)
            self.decisions.append(decision)
            if decision.stopped:
                self.passed[(trial, seed)] = k
                self.stopped[trial] = decision
                return decision.reason, decision.rung
        self.passed[(trial, seed)] = k
        return "", 0

    def rung_steps(self, steps: int) -> list[int]:
        """The steps at which a trial of `steps` steps meets its rungs (where the built-in
        objective, with `val_every` left to its default, also validates)."""
        return [s for s in rung_steps(self.fractions, steps) if s < steps]

    def value(self, trial: int, step: int) -> float | None:
        """A trial's value at `step`: its replicates' mean over those that measured it."""
        values = [v for c in self.curves.get(trial, {}).values() if (v := _at(c, step)) is not None]
        return sum(values) / len(values) if values else None

    def optimistic(self, trial: int, step: int, steps: int) -> float | None:
        """Where the trial would end if its gains went on shrinking as they last did: the gain g
        of its last validation interval, then g r, g r^2, ... to its last step, r the ratio of its
        last two gains (at most 0.9, so that the sum stays finite; 0.8 before it has two gains).
        Exact for an exponential approach to a floor, which is what a converging loss curve looks
        like. Its value at `step` when it is not improving; None before its second validation.
        With --seeds K each replicate is extrapolated from its own curve and the trial's end is
        their mean: replicates validate at their own pace, and a gain read from the mean of two at
        one step and from one alone at the next is the two seeds' difference, not a gain."""
        ends = [e for c in self.curves.get(trial, {}).values() if (e := self._extrapolate(c, step, steps)) is not None]
        return sum(ends) / len(ends) if ends else None

    def _extrapolate(self, curve: Mapping[int, float], step: int, steps: int) -> float | None:
        """One replicate's optimistic end from its validations up to `step` (optimistic)."""
        seen = sorted(s for s in curve if s <= step)
        if len(seen) < 2:
            return None
        a, b = seen[-2], seen[-1]
        va, vb = curve[a], curve[b]
        g = max(0.0, va - vb)
        # the drop from step 0 (the untrained start) is no gain of the curve's tail: a ratio to it
        # would read every curve as flat at its second validation
        g_prev = max(0.0, curve[seen[-3]] - va) if len(seen) >= 3 and seen[-3] > 0 else 0.0
        r = min(self.ratio_max, g / g_prev) if g_prev > 0 else self.ratio_cap
        intervals = (steps - b) / (b - a)
        remaining = g * r * (1 - r ** intervals) / (1 - r) if r < 1 else g * intervals
        return vb - remaining

    def _judge(self, trial: int, rung: int, step: int, steps: int) -> Decision:
        mine, mem = self.value(trial, step), self.memory.get(trial)
        if mine is None or mem is None:  # a trial whose memory is not known yet cannot be dominated
            return Decision(trial, rung, step, False)
        others = [(u, v, self.memory[u]) for u in self.curves if u != trial and u in self.memory
                  and (v := self.value(u, step)) is not None]
        if len(others) < self.min_reached:
            return Decision(trial, rung, step, False)
        bar = mine
        if self.extrapolate:
            bar = self.optimistic(trial, step, steps)
            if bar is None:
                return Decision(trial, rung, step, False)
        better = [(u, v, m, f"{v:.4g} there") for u, v, m in others
                  if m <= mem and v < min(mine, bar) - self.margin * abs(mine)]
        if self.use_finals and self.extrapolate:
            better += [(u, v, m, f"final {v:.4g}, below the {bar:.4g} this trial would reach at best")
                       for u, v, m in self._finals(trial) if m <= mem and v < bar - self.margin * abs(mine)]
        if not better:
            return Decision(trial, rung, step, False)
        u, v, m, what = min(better, key=lambda x: (x[1], x[2]))
        reason = (f"dominated at rung {rung} (step {step}): val_loss {mine:.4g} against trial {u}'s {what} "
                  f"at no more memory ({m:.4g} MB against {mem:.4g} MB)")
        return Decision(trial, rung, step, True, reason)

    def _finals(self, trial: int) -> list[tuple[int, float, float]]:
        """(trial, final val_loss, memory) of the other trials that ran to their end."""
        out = []
        for u, seeds in self.curves.items():
            end = self.planned.get(u)
            if u == trial or u not in self.memory or u in self.stopped:
                continue
            if end is None:  # a finished trial the board was seeded with: its curve's last point
                end = max((max(c) for c in seeds.values() if c), default=None)
            if end is not None and all(end in c for c in seeds.values()) and (v := self.value(u, end)) is not None:
                out.append((u, v, self.memory[u]))
        return out


class BoardReporter:
    """What a trial's objective calls after each validation: the board's answer for this
    trial and seed (a Ray actor handle, or the board itself in-process)."""

    def __init__(self, board: Any, trial: int, seed: int, steps: int) -> None:
        self.board, self.trial, self.seed, self.steps = board, trial, seed, steps
        self.last_rung = 0

    def _remote(self) -> bool:
        return hasattr(self.board, "report") and hasattr(self.board.report, "remote")

    def rung_steps(self) -> list[int]:
        """The steps of this trial's rungs: a trial that validates there is judged at each rung
        where it is placed, not at its next validation after it."""
        if self._remote():
            import ray

            return list(ray.get(self.board.rung_steps.remote(self.steps)))
        return self.board.rung_steps(self.steps)

    def __call__(self, step: int, values: Mapping[str, Any]) -> str:
        clean = {k: float(v) for k, v in values.items() if k in ("val_loss", "peak_mem_mb")}
        if self._remote():
            import ray

            reason, rung = ray.get(self.board.report.remote(self.trial, self.seed, self.steps, step, clean))
        else:
            reason, rung = self.board.report(self.trial, self.seed, self.steps, step, clean)
        self.last_rung = rung
        return reason
