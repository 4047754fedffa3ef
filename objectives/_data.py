"""Concept images: a deterministic synthetic set, or a user's folder of images as trainers lay
them out (kohya's sd-scripts, OneTrainer): a subfolder per concept, `N_name/` repeating its images
N times, a `.txt` caption beside an image."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
CROP_WINDOWS = 4  # crop: random picks one of this many windows along an image's long side each step
CROPS = ("center", "random")
LEARNABLE = ("object", "style")
TEMPLATES = (
    "a photo of {}",
    "a rendering of {}",
    "a cropped photo of the {}",
    "a close up photo of a {}",
    "a bright photo of the {}",
    "a good picture of {}",
)
VAL_TEMPLATE = "a photo of {}"
# learnable_property: style (diffusers' textual_inversion example, imagenet_style_templates_small)
STYLE_TEMPLATES = (
    "a painting in the style of {}",
    "a rendering in the style of {}",
    "a cropped painting in the style of {}",
    "the painting in the style of {}",
    "a clean painting in the style of {}",
    "a good painting in the style of {}",
)
STYLE_VAL_TEMPLATE = "a painting in the style of {}"


def templates(learnable_property: str) -> tuple[tuple[str, ...], str]:
    """(training templates, validation template) of an object or a style concept."""
    return (STYLE_TEMPLATES, STYLE_VAL_TEMPLATE) if learnable_property == "style" else (TEMPLATES, VAL_TEMPLATE)


@dataclass(frozen=True)
class ConceptSet:
    """Images as float arrays in [-1, 1], shape (3, R, R), split into train and held-out."""

    names: tuple[str, ...]
    train: tuple[tuple[np.ndarray, tuple[int, ...]], ...]  # (image, concepts in it, in prompt order)
    val: tuple[tuple[np.ndarray, tuple[int, ...]], ...]
    # per train item: its caption (None: the templates), its repeat count, and its crop windows
    # (V, 3, R, R), the centre one first (empty: the image itself is the only view)
    captions: tuple[str | None, ...] = ()
    val_captions: tuple[str | None, ...] = ()
    repeats: tuple[int, ...] = ()
    views: tuple[np.ndarray, ...] = field(default=(), repr=False)

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


@dataclass(frozen=True)
class ConceptFolder:
    name: str
    files: tuple[Path, ...]
    repeats: int = 1


REPEAT_FOLDER = re.compile(r"^(\d+)_(.+)$")


def concept_folders(root: Path) -> list[ConceptFolder]:
    """The concepts of a data folder: loose images are one concept (the folder's name), each
    subfolder another; a subfolder named `N_name` (kohya's layout) is concept `name` with its
    images repeated N times in the draw of training batches."""
    out = []
    loose = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if loose:
        out.append(ConceptFolder(_token_name(root.name), tuple(loose)))
    subs = []
    for sub in (p for p in root.iterdir() if p.is_dir()):
        files = tuple(sorted(p for p in sub.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES))
        if files:
            m = REPEAT_FOLDER.match(sub.name)
            subs.append(ConceptFolder(_token_name(m.group(2)), files, int(m.group(1))) if m
                        else ConceptFolder(_token_name(sub.name), files))
    # in the order of the concepts' names: a repeat count put on a folder does not reorder them
    return out + sorted(subs, key=lambda c: c.name)


def list_concept_images(root: Path) -> dict[str, list[Path]]:
    """Concept name -> sorted image files (concept_folders without the repeat counts)."""
    return {c.name: list(c.files) for c in concept_folders(root)}


def _token_name(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-") or "concept"


def caption_of(image: Path) -> str | None:
    """The caption kept beside an image (`photo1.png` -> `photo1.txt`), stripped; None without one."""
    txt = image.with_suffix(".txt")
    if not txt.is_file():
        return None
    text = " ".join(txt.read_text(encoding="utf-8", errors="replace").split())
    return text or None


def crop_windows(im: object, resolution: int, crop: str) -> np.ndarray:
    """An image resized so that its short side is `resolution` (aspect kept, bicubic) and cut
    into resolution x resolution windows along its long side: the centre one only (crop=center),
    or CROP_WINDOWS evenly spaced ones from one end to the other, the centre first (crop=random,
    of which each training step takes one at random). (V, 3, R, R) in [-1, 1]."""
    from PIL import Image

    w, h = im.size
    scale = resolution / min(w, h)
    size = (max(resolution, round(w * scale)), max(resolution, round(h * scale)))
    im = im.convert("RGB").resize(size, Image.BICUBIC)
    slack_x, slack_y = size[0] - resolution, size[1] - resolution
    offsets = [0.5] if crop == "center" or max(slack_x, slack_y) == 0 else \
        [0.5] + [k / (CROP_WINDOWS - 1) for k in range(CROP_WINDOWS)]
    out = []
    for f in offsets:
        x, y = round(slack_x * f), round(slack_y * f)
        box = im.crop((x, y, x + resolution, y + resolution))
        out.append(np.asarray(box, dtype=np.float32).transpose(2, 0, 1) / 127.5 - 1.0)
    return np.stack(out)


def folder_concepts(root: Path, resolution: int, crop: str = "center") -> ConceptSet:
    """Every 4th image of a concept (at least one, when it has two) is held out. Images keep their
    aspect (resized by the short side, then cropped: crop_windows); captions from `.txt` sidecars;
    repeat counts from `N_name/` folders."""
    from PIL import Image

    train, val, captions, val_captions, repeats, views = [], [], [], [], [], []
    folders = concept_folders(root)
    for ci, folder in enumerate(folders):
        files = folder.files
        for i, path in enumerate(files):
            with Image.open(path) as im:
                windows = crop_windows(im, resolution, crop)
            held = len(files) >= 2 and (i % 4 == 3 or (len(files) < 4 and i == len(files) - 1))
            if held:
                val.append((windows[0], (ci,)))
                val_captions.append(caption_of(path))
            else:
                train.append((windows[0], (ci,)))
                captions.append(caption_of(path))
                repeats.append(folder.repeats)
                views.append(windows)
    return ConceptSet(tuple(f.name for f in folders), tuple(train), tuple(val), tuple(captions),
                      tuple(val_captions), tuple(repeats), tuple(views))


def check_data_dir(value: str) -> str | None:
    """Why `--data DIR` is unusable, or None. Cheap: no torch, opens each image header."""
    root = Path(value)
    if not root.is_dir():
        return f"--data {value!r}: not a directory"
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        m = REPEAT_FOLDER.match(sub.name)
        if m and int(m.group(1)) < 1:
            return f"--data {value!r}: folder {sub.name!r} repeats its images {m.group(1)} times; the count must be >= 1"
    folders = concept_folders(root)
    if not folders:
        return f"--data {value!r}: no .png/.jpg/.webp images in it or its subfolders"
    from PIL import Image, UnidentifiedImageError

    images = set()
    for folder in folders:
        for path in folder.files:
            images.add(path.with_suffix(""))
            try:
                with Image.open(path) as im:
                    im.verify()
            except (OSError, UnidentifiedImageError) as exc:
                return f"--data {value!r}: unreadable image {path.name!r} ({exc.__class__.__name__})"
    for txt in sorted(p for d in [root, *(q for q in root.iterdir() if q.is_dir())] for p in d.glob("*.txt")):
        if txt.with_suffix("") not in images:
            return f"--data {value!r}: caption {str(txt.relative_to(root))!r} has no image beside it (same name, .png/.jpg/.webp)"
    if sum(len(f.files) for f in folders) < 2:
        return f"--data {value!r}: needs at least 2 images (one is held out for validation)"
    return None


DATA_SETTINGS = {"crop": "center", "flip": 0.0, "learnable_property": "object"}  # their defaults


def dataset_inputs(resolution: int, data: str | None, settings: tuple[tuple[str, object], ...] = ()) -> list[dict[str, object]]:
    """The training and validation sets a trial sees, as MLflow dataset inputs: a name, a
    content digest of the images (pixels at the training resolution), their captions, repeat
    counts and the data settings (crop, flip, learnable_property; defaults leave the digest as it
    was), and where they come from. Two runs with the same digest saw the same data."""
    import hashlib
    import json

    opts = {k: v for k, v in dict(settings).items() if k in DATA_SETTINGS and v != DATA_SETTINGS[k]}
    concepts = (synthetic_concepts(resolution) if data is None else
                folder_concepts(Path(data), resolution, str(dict(settings).get("crop", "center"))))
    if data is None:
        source_type = "code"
        source = {"generator": "objectives._data.synthetic_concepts", "seed": 20240601,
                  "concepts": list(concepts.names), "resolution": resolution}
    else:
        source_type = "local"
        source = {"uri": Path(data).resolve().as_uri(), "resolution": resolution}
    out = []
    train_t, val_t = templates(str(dict(settings).get("learnable_property", "object")))
    for context, items, tmpl, caps, reps in (
            ("training", concepts.train, train_t, concepts.captions, concepts.repeats),
            ("validation", concepts.val, (val_t,), concepts.val_captions, ())):
        h = hashlib.sha256(json.dumps([list(tmpl), list(concepts.placeholders)]).encode())
        if opts:
            h.update(json.dumps(opts, sort_keys=True).encode())
        for k, (image, combo) in enumerate(items):
            h.update(np.ascontiguousarray(np.round((image + 1) * 127.5).astype(np.uint8)).tobytes())
            h.update(json.dumps(list(combo)).encode())
            if k < len(caps) and caps[k] is not None:
                h.update(caps[k].encode())
            if k < len(reps) and reps[k] != 1:
                h.update(f"x{reps[k]}".encode())
        out.append({"name": f"{'synthetic' if data is None else Path(data).name}-{context}",
                    "digest": h.hexdigest()[:16], "source_type": source_type, "source": json.dumps(source),
                    "context": context, "images": len(items)})
    return out
