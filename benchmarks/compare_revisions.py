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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old", nargs="?", default="HEAD~1")
    ap.add_argument("new", nargs="?", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=60)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="csweep-revs-"))
    trees = {args.old: worktree(args.old, tmp / "old")}
    trees[args.new or "working tree"] = worktree(args.new, tmp / "new") if args.new else ROOT
    results: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    try:
        for r in range(args.rounds):
            for name, tree in trees.items():
                results[name].append(measure(tree, args.n))
                print(f"round {r + 1} {name}: {results[name][-1]}", flush=True)
    finally:
        if args.old in trees:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees[args.old])])
        if args.new:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees[args.new])])
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
