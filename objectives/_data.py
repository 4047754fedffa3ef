"""Concept images: a deterministic synthetic set, or a user's folder of png/jpg files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
TEMPLATES = (
    "a photo of {}",
    "a rendering of {}",
    "a cropped photo of the {}",
    "a close up photo of a {}",
    "a bright photo of the {}",
    "a good picture of {}",
)
VAL_TEMPLATE = "a photo of {}"


@dataclass(frozen=True)
class ConceptSet:
    """Images as float arrays in [-1, 1], shape (3, R, R), split into train and held-out."""

    names: tuple[str, ...]
    train: tuple[tuple[np.ndarray, tuple[int, ...]], ...]  # (image, concepts in it, in prompt order)
    val: tuple[tuple[np.ndarray, tuple[int, ...]], ...]

    @property
    def placeholders(self) -> tuple[str, ...]:
        return tuple(f"<{name}>" for name in self.names)


COLORS = {"red": (0.9, 0.1, 0.1), "green": (0.1, 0.85, 0.2), "blue": (0.15, 0.2, 0.95),
          "yellow": (0.95, 0.9, 0.1)}
SHAPES = ("circle", "square", "stripes", "ring")


def draw(color: str, shape: str, rng: np.random.Generator, res: int) -> np.ndarray:
    """One image of a coloured shape on a dark background, jittered by `rng`."""
    yy, xx = np.mgrid[0:res, 0:res] / res
    cx, cy = rng.uniform(0.35, 0.65, size=2)
    size = rng.uniform(0.18, 0.3)
    bg = rng.uniform(0.0, 0.25, size=3)
    img = np.ones((3, res, res)) * bg[:, None, None]
    r2 = (xx - cx) ** 2 + (yy - cy) ** 2
    if shape == "circle":
        mask = r2 < size**2
    elif shape == "square":
        mask = (abs(xx - cx) < size) & (abs(yy - cy) < size)
    elif shape == "stripes":
        mask = ((xx + yy * 0.3) / rng.uniform(0.15, 0.25) % 1.0) < 0.5
    else:  # ring
        mask = (r2 < size**2) & (r2 > (0.6 * size) ** 2)
    for c, value in enumerate(COLORS[color]):
        img[c][mask] = value
    img += rng.normal(0, 0.03, size=img.shape)
    return (np.clip(img, 0, 1) * 2 - 1).astype(np.float32)


SYNTHETIC_CONCEPTS = ("red-circle", "green-square", "blue-stripes")
SYNTHETIC_PAIRS = ((0, 1), (1, 2), (2, 0))


def synthetic_concepts(
    resolution: int, *, per_concept: int = 6, held_out: int = 2, per_pair: int = 2
) -> ConceptSet:
    """A few visually distinct concepts, plus two-concept images (left half one concept, right
    half another) whose prompts name both; the same images on every call (fixed seed)."""
    rng = np.random.default_rng(20240601)
    train, val = [], []

    def one(ci: int) -> np.ndarray:
        color, shape = SYNTHETIC_CONCEPTS[ci].split("-")
        return draw(color, shape, rng, resolution)

    for ci in range(len(SYNTHETIC_CONCEPTS)):
        images = [one(ci) for _ in range(per_concept + held_out)]
        train += [(im, (ci,)) for im in images[:per_concept]]
        val += [(im, (ci,)) for im in images[per_concept:]]
    half = resolution // 2
    for pair in SYNTHETIC_PAIRS:
        for k in range(per_pair + 1):
            left, right = one(pair[0]), one(pair[1])
            im = np.concatenate([left[:, :, :half], right[:, :, half:]], axis=2)
            (train if k < per_pair else val).append((im, pair))
    return ConceptSet(SYNTHETIC_CONCEPTS, tuple(train), tuple(val))


def list_concept_images(root: Path) -> dict[str, list[Path]]:
    """Concept name -> sorted image files. Subfolders are concepts; loose files one concept."""
    groups: dict[str, list[Path]] = {}
    loose = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if loose:
        groups[_token_name(root.name)] = loose
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(p for p in sub.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if files:
            groups[_token_name(sub.name)] = files
    return groups


def _token_name(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-") or "concept"


def folder_concepts(root: Path, resolution: int) -> ConceptSet:
    """Every 4th image of a concept (at least one, when it has two) is held out."""
    from PIL import Image

    train, val = [], []
    groups = list_concept_images(root)
    for ci, files in enumerate(groups.values()):
        for i, path in enumerate(files):
            with Image.open(path) as im:
                im = im.convert("RGB").resize((resolution, resolution), Image.BICUBIC)
                arr = np.asarray(im, dtype=np.float32).transpose(2, 0, 1) / 127.5 - 1.0
            held = len(files) >= 2 and (i % 4 == 3 or (len(files) < 4 and i == len(files) - 1))
            (val if held else train).append((arr, (ci,)))
    return ConceptSet(tuple(groups), tuple(train), tuple(val))


def check_data_dir(value: str) -> str | None:
    """Why `--data DIR` is unusable, or None. Cheap: no torch, opens each image header."""
    root = Path(value)
    if not root.is_dir():
        return f"--data {value!r}: not a directory"
    groups = list_concept_images(root)
    if not groups:
        return f"--data {value!r}: no .png/.jpg images in it or its subfolders"
    from PIL import Image, UnidentifiedImageError

    for files in groups.values():
        for path in files:
            try:
                with Image.open(path) as im:
                    im.verify()
            except (OSError, UnidentifiedImageError) as exc:
                return f"--data {value!r}: unreadable image {path.name!r} ({exc.__class__.__name__})"
    if sum(len(f) for f in groups.values()) < 2:
        return f"--data {value!r}: needs at least 2 images (one is held out for validation)"
    return None


def dataset_inputs(resolution: int, data: str | None) -> list[dict[str, object]]:
    """The training and validation sets a trial sees, as MLflow dataset inputs: a name, a
    content digest of the images (pixels at the training resolution) and captions themselves,
    and where they come from. Two runs with the same digest saw the same data."""
    import hashlib
    import json

    concepts = synthetic_concepts(resolution) if data is None else folder_concepts(Path(data), resolution)
    if data is None:
        source_type = "code"
        source = {"generator": "objectives._data.synthetic_concepts", "seed": 20240601,
                  "concepts": list(concepts.names), "resolution": resolution}
    else:
        source_type = "local"
        source = {"uri": Path(data).resolve().as_uri(), "resolution": resolution}
    out = []
    for context, items, templates in (("training", concepts.train, TEMPLATES), ("validation", concepts.val, (VAL_TEMPLATE,))):
        h = hashlib.sha256(json.dumps([list(templates), list(concepts.placeholders)]).encode())
        for image, combo in items:
            h.update(np.ascontiguousarray(np.round((image + 1) * 127.5).astype(np.uint8)).tobytes())
            h.update(json.dumps(list(combo)).encode())
        out.append({"name": f"{'synthetic' if data is None else Path(data).name}-{context}",
                    "digest": h.hexdigest()[:16], "source_type": source_type, "source": json.dumps(source),
                    "context": context, "images": len(items)})
    return out
