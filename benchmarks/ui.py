"""`csweep ui` from the command to the study's link, for two revisions of csweep side by side.

A workdir with one study's MLflow store (an experiment and a run, no sweep needed); `csweep ui`
is started on a free port and timed until its server answers a request for the study; then,
40 s after the start, the CPU time its processes have used and how many there are (MLflow goes
on starting worker and job processes after it first answers); then its process group is
stopped. Prints each round's figures, the medians and their ratios. The revisions run
alternately, ROUNDS times each, so that the machine's load falls on both alike.

Run from the repository root: python benchmarks/ui.py [OLD [NEW]] [--rounds 3]
(defaults: HEAD~1 against the working tree).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
from compare_revisions import interleaved, print_medians, revision_args, revision_trees

SETTLE = 40.0  # seconds after the start at which the UI's processes and CPU time are read


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def measure(tree: Path, workdir: Path) -> tuple[float, float, int]:
    # the user's environment as it is (MLflow looks for its job runner's tools on PATH)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", None)
    port = _free_port()
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sweeps", "ui", "--workdir", str(workdir), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
                            cwd=workdir.parent)  # not the repository root: `-m` would import its sweeps/
    tree_proc = psutil.Process(proc.pid)
    try:
        while True:  # the UI answers a real request: the study's runs
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name"
                                            "?experiment_name=bench", timeout=5) as r:
                    r.read()
                break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"{tree}: csweep ui ended with {proc.returncode}")
                time.sleep(0.2)
        seconds = time.perf_counter() - started
        time.sleep(max(0.0, SETTLE - (time.perf_counter() - started)))  # what it goes on starting
        cpu = _cpu_seconds(tree_proc)
        processes = 1 + len(tree_proc.children(recursive=True))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    return seconds, cpu, processes


def main() -> None:
    args = revision_args(3, __doc__.splitlines()[0]).parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="csweep-ui-")) / "csweep_runs"
    workdir.mkdir()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    client.create_run(client.create_experiment("bench"))
    with revision_trees(args.old, args.new, "csweep-ui-trees-") as trees:
        results = interleaved(trees, args.rounds, lambda tree: measure(tree, workdir),
                              lambda r: f"{r[0]:.1f} s to the first answer; after {SETTLE:.0f} s: {r[2]} processes, "
                                        f"{r[1]:.1f} CPU-s")
    for i, what in ((0, "s from `csweep ui` to the first answer"), (1, f"CPU-s in the first {SETTLE:.0f} s")):
        print_medians({name: [r[i] for r in v] for name, v in results.items()}, what)


if __name__ == "__main__":
    main()
