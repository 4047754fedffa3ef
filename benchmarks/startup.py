"""A short sweep end to end, as a user runs it, for two revisions of csweep side by side.

`csweep run` of a 2-trial plug-in study (the sleep objective, 50 ms a trial) on a fresh workdir:
what it costs before the first trial and after the last one (Python and Ray start-up, the
Optuna and MLflow stores, the reports, the exit) — the fixed cost that every sweep, and every
subprocess sweep of the test suite, pays. The revisions run alternately, ROUNDS times each, so
that the machine's load falls on both alike; prints each round's wall time, the medians and
their ratio.

Run from the repository root: python benchmarks/startup.py [OLD [NEW]] [--rounds 5]
(defaults: HEAD~1 against the working tree).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compare_revisions import ROOT, interleaved, print_medians, revision_args, revision_trees

SPACE = """name: startup
objective: sleep_objective:objective
params:
  x: {type: float, low: 0.0, high: 1.0}
  y: {type: float, low: 0.0, high: 1.0}
fixed:
  sleep: 0.05
"""


def measure(tree: Path, project: Path) -> float:
    shutil.rmtree(project / "csweep_runs", ignore_errors=True)
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "sweeps", "run", "startup.yaml", "--trials", "2", "--no-progress"],
                         cwd=project, capture_output=True, text=True, timeout=600,
                         env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
    seconds = time.perf_counter() - started
    if out.returncode != 0 or "2 completed" not in out.stdout:
        raise SystemExit(f"{tree}: {out.stderr[-2000:]}")
    return seconds


def main() -> None:
    args = revision_args(5, __doc__.splitlines()[0]).parse_args()
    project = Path(tempfile.mkdtemp(prefix="csweep-startup-"))
    (project / "startup.yaml").write_text(SPACE)
    shutil.copy(ROOT / "benchmarks" / "sleep_objective.py", project / "sleep_objective.py")
    with revision_trees(args.old, args.new, "csweep-startup-trees-") as trees:
        results = interleaved(trees, args.rounds, lambda tree: measure(tree, project), lambda s: f"{s:.1f} s")
    print_medians(results, "s for a 2-trial sweep, start to exit")


if __name__ == "__main__":
    main()
