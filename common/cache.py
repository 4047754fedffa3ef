"""Where csweep keeps what it makes once per machine: built models, converted checkpoints, an
empty MLflow store (CSWEEP_CACHE, else ~/.cache/csweep)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("CSWEEP_CACHE", Path.home() / ".cache" / "csweep"))
