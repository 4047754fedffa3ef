"""`csweep export-model`: a built-in model as a diffusers folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._options import UsageError


def add_parser(sub: Any) -> None:
    exp = sub.add_parser("export-model", help="write a built-in model as a diffusers folder")
    exp.add_argument("model", choices=("tiny", "tiny-sdxl", "random:sd15", "random:sdxl"),
                     help="a tiny model, or the published SD 1.5 / SDXL architecture with seeded random weights "
                          "(about 4 GB / 14 GB in fp32), for dry runs on the real shapes")
    exp.add_argument("directory")
    exp.set_defaults(handler=cmd_export_model)


def cmd_export_model(a: argparse.Namespace) -> int:
    target = Path(a.directory)
    if target.exists() and any(target.iterdir()):
        raise UsageError(f"export-model: {str(target)!r} exists and is not empty")
    from objectives import export_model

    export_model(a.model, target)
    print(f"wrote {a.model} model to {target}")
    return 0
