"""csweep's own offline tokenizer: a byte-level CLIP vocabulary (vocab.json + merges.txt) that
CLIPTokenizer loads, written without a hub or torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._configs import VOCAB

# Words that get whole-word tokens in the offline tokenizer, so templates tokenize compactly
# and `init_from: word:WORD` has real rows to copy from.
_WORDS = (
    "a photo of the an in on with and style picture rendering painting close up cropped "
    "dark bright small large good clean nice dog cat toy object thing shape circle square "
    "ring cross stripes red green blue yellow art sketch"
).split()


def _bytes_to_unicode() -> dict[int, str]:
    # NOTE: the byte->char table of byte-level BPE (GPT-2/CLIP); transformers 5 no longer exports it.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_tiny_tokenizer(directory: Path) -> Path:
    """Write a byte-level CLIP vocab.json + merges.txt (offline) that CLIPTokenizer loads."""
    directory.mkdir(parents=True, exist_ok=True)
    chars = list(_bytes_to_unicode().values())
    vocab: list[str] = chars + [c + "</w>" for c in chars]
    merges: list[str] = []
    seen = set(vocab)
    for word in _WORDS:
        symbols = list(word[:-1]) + [word[-1] + "</w>"]
        cur = symbols[0]
        for nxt in symbols[1:]:
            merge, cur = f"{cur} {nxt}", cur + nxt
            if cur not in seen:
                merges.append(merge)
                vocab.append(cur)
                seen.add(cur)
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return directory


def padded_tokenizer(directory: Path) -> Any:
    """csweep's offline tokenizer padded with unused tokens to CLIP's 49,408."""
    from transformers import CLIPTokenizer

    tok = CLIPTokenizer.from_pretrained(str(write_tiny_tokenizer(directory)), model_max_length=77)
    tok.add_tokens([f"<unused-{i}>" for i in range(VOCAB - len(tok))])
    return tok
