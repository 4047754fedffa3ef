"""A trial as a worker runs it (sweeps._workers.run_trial), called outside Ray: its result, and
no Ray started for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CALL = """
import json
import ray
from sweeps._workers import run_trial
r = run_trial("userobj:objective", False, {"x": 0.3, "y": 0.5}, model="tiny", data=None)
print(json.dumps({"kind": r.kind.value, "node": r.node, "val_loss": r.metrics["val_loss"],
                  "ray_started": ray.is_initialized()}))
"""


def test_a_trial_run_outside_ray_says_local_and_starts_no_ray(analytic_project):
    # a process of its own: the test process may hold a Ray of an earlier in-process sweep
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(analytic_project)])
    out = subprocess.run([sys.executable, "-c", CALL], cwd=analytic_project, capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"kind": "ok", "node": "local", "val_loss": 0.0, "ray_started": False}
