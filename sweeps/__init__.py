"""How to run it: the commands, the Optuna study, Ray workers and MLflow tracking.

The public face, what the commands, benchmarks and tests use::

    from sweeps import RunConfig, run_sweep
    out = run_sweep(RunConfig(space=..., study_name=..., trials=20, workers=2, workdir=..., storage=...))

`main(argv)` is `csweep` itself; `make_sampler` / `SAMPLER_SPECS` the samplers as records."""

from __future__ import annotations

from .commands import UsageError, build_parser, main
from .commands._options import default_storage, default_tracking

# loaded on first use: they import Optuna, Ray and MLflow
_LAZY = {"RunConfig": "_settings", "run_sweep": "_runner", "Outcome": "_driver", "make_sampler": "_samplers",
         "SAMPLER_SPECS": "_samplers", "CouplingSampler": "_coupling_sampler"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CouplingSampler", "Outcome", "RunConfig", "SAMPLER_SPECS", "UsageError", "build_parser", "default_storage",
           "default_tracking", "main", "make_sampler", "run_sweep"]
