from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # test processes share the cores: torch's default of one thread per core in each makes its
    # threads spin against the others' (several times slower, not faster)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(
        1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))))
    # and a test that does take both cores (the real-shape trials) waits for its threads without
    # spinning: OpenMP's spin-wait beside the other test process (a sweep's driver, its Ray
    # workers and MLflow's logging process) took half of that process's time; the tiny sweep beside
    # the SDXL trial ran 123 s spinning, 96 s passive (the SDXL trial 85 s and 84 s)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_collection_modifyitems(config, items):
    """With several test processes (-n): the modules with long tests first, so that none of them
    starts last while the other processes have run out of work, the real sweeps first among
    them; a module's tests stay together (its module-wide fixtures are built once)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slow = {item.path for item in items if item.get_closest_marker("slow")}
        items.sort(key=lambda item: (item.path not in slow, "sweeps" not in item.path.parts))


@pytest.fixture(autouse=True)
def _torch_threads_as_they_were():
    """A test that sets torch's threads (the real-shape trials use both cores; `--dry-run` in
    process sets as many as there are cores) leaves them as it found them: a test process left
    at two threads beside another test process spins against it, and the tiny-model tests after
    it ran up to ten times slower (72 s against 7.7 s for the checkpointing test)."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(before or int(os.environ.get("OMP_NUM_THREADS") or 0) or torch.get_num_threads())


ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m sweeps ARGS` the way a user runs `csweep ARGS`."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "sweeps", *args], cwd=cwd, capture_output=True, text=True,
        timeout=timeout, env=full_env, stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="session")
def cli():
    return run_cli


@pytest.fixture
def csweep(analytic_project: Path, monkeypatch, capsys):
    """`csweep ARGS` run by `sweeps.main` in this test process, in the analytic project
    (helpers.in_process): returncode, stdout, stderr, as `cli` gives them."""
    from helpers import in_process

    return in_process(analytic_project, monkeypatch, capsys)


ANALYTIC_OBJECTIVE = '''
import os
import time


def objective(params):
    x, y = params["x"], params["y"]
    if params.get("pid_dir"):
        open(os.path.join(params["pid_dir"], str(os.getpid())), "w").close()
    if params.get("calls_dir"):  # the worker process dies (SIGKILL) in the die_on_call-th call overall
        calls = params["calls_dir"]
        open(os.path.join(calls, f"call-{time.time_ns()}-{os.getpid()}"), "w").close()
        if len(os.listdir(calls)) == params["die_on_call"] and not os.path.exists(calls + ".died"):
            open(calls + ".died", "w").close()
            time.sleep(params.get("sleep") or 0)
            os.kill(os.getpid(), 9)
    time.sleep(params.get("sleep") or 0)
    if params.get("fail_above") is not None and x > params["fail_above"]:
        raise RuntimeError(f"planted failure at x={x:.3f}")
    if params.get("oom_above") is not None and x > params["oom_above"]:
        import torch

        raise torch.OutOfMemoryError("planted: CUDA out of memory. Tried to allocate 2.00 GiB")
    if params.get("seeds_dir"):  # the seed each replicate was given
        open(os.path.join(params["seeds_dir"], f"{x:.6f}-{params['seed']}"), "w").close()
    wobble = (params.get("noise") or 0) * ((params.get("seed", 0) * 7919) % 101) / 100
    return {"val_loss": (x - 0.3) ** 2 + (y - 0.5) ** 2 + wobble, "peak_mem_mb": 100 * x + 10 * y, "extra": x * y}
'''

ANALYTIC_SPACE = """
name: analytic
description: a fast analytic objective
objective: userobj:objective
trials: 6
params:
  x: {type: float, low: 0.0, high: 1.0}
  y: {type: float, low: 0.0, high: 1.0}
fixed:
  fail_above: null
  oom_above: null
  sleep: 0
  pid_dir: null
  calls_dir: null
  die_on_call: null
  seeds_dir: null
  noise: 0
"""


@pytest.fixture
def analytic_project(tmp_path: Path) -> Path:
    """A user's working directory with a plug-in objective module and a space file."""
    (tmp_path / "userobj.py").write_text(ANALYTIC_OBJECTIVE)
    (tmp_path / "analytic.yaml").write_text(ANALYTIC_SPACE)
    return tmp_path

