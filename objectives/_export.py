"""Built-in models written as diffusers folders (lazy: torch loads only when called)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

BUILTIN_MODELS = ("tiny", "tiny-sdxl")


def export_model(name: str, directory: Path, *, single_file: bool = False) -> Path:
    """Write built-in model `name` to `directory`, loadable with from_pretrained: a tiny model, or
    `random:sd15` / `random:sdxl` (the published architectures with seeded random weights). With
    `single_file`, `directory` is a `.safetensors` file of the original (CompVis) layout."""
    if single_file:
        from ._model import load_base_model
        from ._single_file import write_single_file

        base = load_base_model(name)
        parts = dict(text_encoders=base.text_encoders, unet=base.unet, vae=base.vae)
        return write_single_file(parts, directory, exported_from=name)
    if name in ("random:sd15", "random:sdxl"):
        from ._model import export_random

        return export_random(name, directory)
    if name not in BUILTIN_MODELS:
        raise ValueError(f"model {name!r} is not built in (built-ins: {', '.join(BUILTIN_MODELS)})")
    from ._model import export_tiny

    return export_tiny(name, directory)


def prepare_model(spec: str, *, on_build: Callable[[str], None] | None = None) -> str | None:
    """Build a built-in model's on-disk cache now (in the driver, with all its threads) so
    that workers starting together only load it. Returns the cache folder, or None for a path."""
    if spec not in BUILTIN_MODELS:
        return None
    from ._model import build_tiny, tiny_dir

    target = tiny_dir(spec)
    if not (target / "model_index.json").is_file():
        if on_build is not None:
            on_build(str(target))
        build_tiny(spec, progress=build_progress(spec))
    return str(target)


def build_progress(spec: str) -> Callable[[str, int, int], None]:
    """A progress bar per pretraining stage on stderr (the build takes minutes on a small CPU)."""
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def progress(stage: str, i: int, n: int) -> None:
        if stage not in bars:
            bars[stage] = tqdm(total=n, desc=f"building {spec}: {stage}", mininterval=1)
        bars[stage].update(i - bars[stage].n)
        if i == n:
            bars[stage].close()

    return progress
