"""`csweep export-model`: a built-in model as a diffusers folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._options import UsageError


def add_parser(sub: Any) -> None:
    exp = sub.add_parser("export-model", help="write a built-in model as a diffusers folder or a single file")
    exp.add_argument("model", choices=("tiny", "tiny-sdxl", "random:sd15", "random:sdxl"),
                     help="a tiny model, or the published SD 1.5 / SDXL architecture with seeded random weights "
                          "(about 4 GB / 14 GB in fp32), for dry runs on the real shapes")
    exp.add_argument("directory", help="the folder to write, or with --format single-file the .safetensors file")
    exp.add_argument("--format", choices=("diffusers", "single-file"), default="diffusers",
                     help="a diffusers folder, or one .safetensors in the original (CompVis / AUTOMATIC1111) "
                          "layout that --model and other tools read [diffusers]")
    exp.set_defaults(handler=cmd_export_model)


def cmd_export_model(a: argparse.Namespace) -> int:
    target = Path(a.directory)
    single = a.format == "single-file"
    if single and target.suffix.lower() != ".safetensors":
        raise UsageError(f"export-model --format single-file: {str(target)!r} must end in .safetensors")
    if single and target.exists():
        raise UsageError(f"export-model: {str(target)!r} exists")
    if not single and target.exists() and any(target.iterdir()):
        raise UsageError(f"export-model: {str(target)!r} exists and is not empty")
    from objectives import export_model

    export_model(a.model, target, single_file=single)
    print(f"wrote {a.model} model to {target}")
    return 0
