"""Build the built-in tiny models from scratch and write them where the package ships them.

    python scripts/build_tiny_models.py [tiny tiny-sdxl] [--out objectives/tiny_models]

Seeded and single-threaded (torch.set_num_threads(1)), so that a rerun on the same torch build
writes the same bytes. Run time on a 2-core CI-class machine: see README ("The built-in models").
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*.safetensors")):
        h.update(f.relative_to(folder).as_posix().encode() + f.read_bytes())
    return h.hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=["tiny", "tiny-sdxl"])
    ap.add_argument("--out", type=Path, default=ROOT / "objectives" / "tiny_models")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from objectives._export import build_progress
    from objectives._model import _save_pipeline, build_tiny_parts

    for name in args.names:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            parts = build_tiny_parts(name, Path(tmp), build_progress(name))
        target = args.out / name
        _save_pipeline(parts, target)
        print(f"{name}: {time.perf_counter() - started:.0f} s, weights sha256 {digest(target)} -> {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
