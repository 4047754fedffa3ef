"""Where the test suite's time goes: each test run alone (one test process, `-n 0`), its wall
time and the machine's CPU time over it, every process counted (the test, its CLI subprocesses,
Ray's daemons and workers, MLflow's servers and logging process), from /proc/stat. A test that
keeps less than a core busy waits (sleeping trials, a server's start); one near two cores uses
the machine alone. The sum of the CPU time over the cores is the least wall time any number of
test processes could reach on this machine: the figure to hold against a time budget.

Each test gets the threads it would have as one of N test processes (`--as N`, default 2, as
`.ci/run`'s `-n 2`: tests/conftest.py gives each of N processes cores / N threads, waiting
passively), so that its CPU time is what it costs there, not what two spinning threads cost.

Run from the repository root, on an otherwise idle Linux machine:
    python benchmarks/suite_cpu.py [-m slow | -m "not slow" | PYTEST ARGS...] [--as 2] [--top 25]
(default: -m slow). Prints the totals, the tests that take most CPU, and those that wait most.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = "CSWEEP_SUITE_CPU_RECORD"


def _busy_ticks() -> int:
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return sum(values) - values[3] - values[4]  # all but idle and iowait


# --- as a pytest plug-in (-p suite_cpu): one line per test into the file RECORD names ---------
_started: dict[str, tuple[float, int]] = {}


def pytest_runtest_logstart(nodeid, location):
    _started[nodeid] = (time.perf_counter(), _busy_ticks())


def pytest_runtest_logfinish(nodeid, location):
    wall0, busy0 = _started.pop(nodeid)
    with open(os.environ[RECORD], "a") as f:
        f.write(json.dumps({"test": nodeid, "wall": time.perf_counter() - wall0,
                            "cpu": (_busy_ticks() - busy0) / os.sysconf("SC_CLK_TCK")}) + "\n")


def main(argv: list[str]) -> int:
    opts = {"--top": 25, "--as": 2}
    for flag in opts:
        if flag in argv:
            i = argv.index(flag)
            opts[flag], argv = int(argv[i + 1]), argv[:i] + argv[i + 2:]
    top, processes = opts["--top"], opts["--as"]
    args = argv or ["-m", "slow"]
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "tests.jsonl"
        env = {**os.environ, RECORD: str(record), "OMP_NUM_THREADS": str(max(1, cores // processes)),
               "OMP_WAIT_POLICY": "PASSIVE",
               "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
        started = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "suite_cpu",
                              "-p", "no:cacheprovider", *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        rows = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    cpu = sum(r["cpu"] for r in rows)
    print(f"{len(rows)} tests, pytest exit {rc}: {wall:.0f} s wall one at a time (threads as one of {processes} "
          f"test processes), {cpu:.0f} s of CPU over {cores} cores: at least {cpu / cores:.0f} s with any number "
          f"of test processes")

    def show(title: str, key) -> None:
        print(f"\n{title}\n{'wall s':>8} {'cpu s':>8} {'cores':>6}  test")
        for r in sorted(rows, key=key)[:top]:
            print(f"{r['wall']:8.1f} {r['cpu']:8.1f} {r['cpu'] / max(r['wall'], 1e-9):6.2f}  {r['test']}")

    show("most CPU", lambda r: -r["cpu"])
    show("most waiting (less than a core busy: wall - CPU)", lambda r: -(r["wall"] - r["cpu"]))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
