"""A fixed-cost objective for orchestration benchmarks: sleeps, returns analytic values."""

from __future__ import annotations

import time


def objective(params: dict) -> dict:
    time.sleep(params.get("sleep", 0.05))
    x, y = params["x"], params["y"]
    return {"val_loss": (x - 0.3) ** 2 + (y - 0.5) ** 2, "peak_mem_mb": 100 * x + 10 * y}
