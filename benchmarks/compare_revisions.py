"""Orchestration overhead of two revisions of csweep, side by side in one run.

Each revision is checked out into a temporary git worktree; their orchestration benchmarks
(section 1 only, the Ray Tune peer skipped) run alternately, ROUNDS times each, so that the
machine's load falls on both alike. Prints csweep's steady-state overhead per trial for each
round, the medians and their ratio, with the plain Optuna ask/tell loop on Ray as a control.

Run from the repository root: python benchmarks/compare_revisions.py [OLD [NEW]] [--rounds 3]
(defaults: HEAD~1 against the working tree).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def worktree(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev], check=True,
                   capture_output=True)
    # the same harness for both: only the library under it differs
    for name in ("orchestration.py", "sleep_objective.py"):
        (where / "benchmarks" / name).write_text((ROOT / "benchmarks" / name).read_text())
    return where


def measure(tree: Path, n: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "benchmarks/orchestration.py", "--n", str(n), "--repeats", "1",
                          "--skip-tune", "--skip-warm", "--skip-efficiency"], cwd=tree, capture_output=True,
                         text=True, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: {out.stderr[-2000:]}")
    figures = {}
    for line in out.stdout.splitlines():
        # a figure may be negative: a difference of two noisy timings
        m = re.match(r"^(csweep[^\d]*?|Optuna ask/tell[^\d]*?)\s+(-?[\d.]+)\s+(-?[\d.]+)", line)
        if m:
            figures[m.group(1).strip()] = float(m.group(2))
    return figures


def revision_args(rounds: int, description: str) -> argparse.ArgumentParser:
    """OLD [NEW] [--rounds R]: NEW "" is the working tree."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("old", nargs="?", default="HEAD~1")
    ap.add_argument("new", nargs="?", default="")
    ap.add_argument("--rounds", type=int, default=rounds)
    return ap


@contextmanager
def revision_trees(old: str, new: str, prefix: str) -> Iterator[dict[str, Path]]:
    """{name: source tree} of the two revisions (NEW "" is the working tree); the temporary
    worktrees are removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    made = [worktree(old, tmp / "old")]
    trees = {old: made[0]}
    if new:
        made.append(worktree(new, tmp / "new"))
    trees[new or "working tree"] = made[-1] if new else ROOT
    try:
        yield trees
    finally:
        for tree in made:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)])


def interleaved(trees: dict[str, Path], rounds: int, measure: Callable[[Path], T],
                show: Callable[[T], str] = str) -> dict[str, list[T]]:
    """`measure` of each tree, the trees alternating, `rounds` times each, so that the
    machine's load falls on both alike."""
    results: dict[str, list[T]] = {name: [] for name in trees}
    for r in range(rounds):
        for name, tree in trees.items():
            results[name].append(measure(tree))
            print(f"round {r + 1} {name}: {show(results[name][-1])}", flush=True)
    return results


def print_medians(results: dict[str, list[float]], what: str) -> None:
    """Each revision's median of `results` (one figure per round), then NEW / OLD."""
    med = {name: statistics.median(v) for name, v in results.items()}
    for name, m in med.items():
        print(f"{name:14s} median {m:.1f} {what}")
    old, new = list(med)
    print(f"{new} / {old} = {med[new] / med[old]:.2f}")


def main() -> None:
    ap = revision_args(3, __doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=60)
    args = ap.parse_args()
    with revision_trees(args.old, args.new, "csweep-revs-") as trees:
        results = interleaved(trees, args.rounds, lambda tree: measure(tree, args.n))
    med = {}
    for name, rounds in results.items():
        for tool in sorted({k for r in rounds for k in r}):
            med[(name, tool)] = statistics.median(r[tool] for r in rounds if tool in r)
            print(f"{name:14s} {tool:36s} median {med[(name, tool)]:.2f} ms/trial (steady state)")
    names = list(trees)
    for tool in sorted({t for _, t in med}):
        if (names[0], tool) in med and (names[1], tool) in med and med[(names[0], tool)] > 0:
            print(f"{tool}: {names[1]} / {names[0]} = {med[(names[1], tool)] / med[(names[0], tool)]:.2f}")


if __name__ == "__main__":
    main()
