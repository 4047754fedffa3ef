"""How to run it: the CLI, the Optuna study, Ray workers and MLflow tracking."""

from __future__ import annotations

from .commands import UsageError, build_parser, main

__all__ = ["UsageError", "build_parser", "main"]
