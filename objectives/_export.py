"""Built-in models written as diffusers folders (lazy: torch loads only when called)."""

from __future__ import annotations

from pathlib import Path

BUILTIN_MODELS = ("tiny",)


def export_model(name: str, directory: Path) -> Path:
    """Write built-in model `name` to `directory`, loadable with from_pretrained."""
    from ._model import export_tiny

    if name != "tiny":
        raise ValueError(f"model {name!r} is not built in (built-ins: {', '.join(BUILTIN_MODELS)})")
    return export_tiny(directory)
