"""`csweep ui` from the command to the study's link, for two revisions of csweep side by side.

A workdir with one study's MLflow store (an experiment and a run, no sweep needed); `csweep ui`
is started on a free port and timed until it prints the study's link (the server accepts
connections and the links are read from it); then its process group is stopped. Prints each
round's time and how many processes the UI ran, the medians and their ratio. The revisions run
alternately, ROUNDS times each, so that the machine's load falls on both alike.

Run from the repository root: python benchmarks/ui.py [OLD [NEW]] [--rounds 3]
(defaults: HEAD~1 against the working tree).
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from compare_revisions import interleaved, revision_args, revision_trees


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(tree: Path, workdir: Path) -> tuple[float, int]:
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sweeps", "ui", "--workdir", str(workdir), "--port",
                             str(_free_port())], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, start_new_session=True)
    try:
        while "bench:" not in (line := proc.stdout.readline()):
            if not line and proc.poll() is not None:
                raise SystemExit(f"{tree}: csweep ui ended with {proc.returncode}")
        seconds = time.perf_counter() - started
        processes = 1 + len(psutil.Process(proc.pid).children(recursive=True))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    return seconds, processes


def main() -> None:
    args = revision_args(3, __doc__.splitlines()[0]).parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="csweep-ui-")) / "csweep_runs"
    workdir.mkdir()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    client.create_run(client.create_experiment("bench"))
    with revision_trees(args.old, args.new, "csweep-ui-trees-") as trees:
        results = interleaved(trees, args.rounds, lambda tree: measure(tree, workdir),
                              lambda r: f"{r[0]:.1f} s to the study's link, {r[1]} processes")
    med = {name: statistics.median(s for s, _ in v) for name, v in results.items()}
    for name, m in med.items():
        print(f"{name:14s} median {m:.1f} s from `csweep ui` to the study's link")
    old, new = list(med)
    print(f"{new} / {old} = {med[new] / med[old]:.2f}")


if __name__ == "__main__":
    main()
