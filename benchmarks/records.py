"""Synthetic text records whose loading is pure Python: the ``purepy`` workload's dataset.

Each item is one record, a ``str`` held in a Python list (as a dataset that
read a JSON-lines or CSV file would hold it), turned into a training example
in Python alone: the record is split into fields, its text tokenised
character by character, and every token and every character trigram hashed
(FNV-1a, in Python) into a bag of :data:`BINS` counts. No I/O, no call that
releases the GIL: about 2 ms of CPU per record on CPython 3.11 (more on
3.13t, whose single thread is slower). The records are made from a seeded
generator, the same in every process.
"""

from __future__ import annotations

import random

import torch
from torch.utils.data import Dataset

__all__ = ["BINS", "WORDS", "Records", "features", "make_record", "tokenize"]

WORDS = 450
"""Words in a record's text: sets the work per record (about 2 ms on 3.11)."""
BINS = 256
"""Length of the feature vector an item holds."""
SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "vo", "shi", "zen", "por", "qua", "dex")
FNV_OFFSET, FNV_PRIME, MASK = 2166136261, 16777619, 0xFFFFFFFF


def make_record(index: int, words: int = WORDS) -> str:
    """Return record ``index``: ``id=..;label=..;score=..;tags=[..];text="..."``.

    Example:
        >>> make_record(7, words=3)
        'id=7;label=5;score=0.9479;tags=[vo,qua,ka,lo,zen];text="ta kalo. lonelozen."'
    """
    rng = random.Random(index)
    label, score = rng.randrange(10), rng.random()
    tags = ",".join(rng.choice(SYLLABLES) for _ in range(5))
    text = " ".join(
        "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))
        + rng.choice(("", "", ",", "."))
        for _ in range(words)
    )
    return f'id={index};label={label};score={score:.4f};tags=[{tags}];text="{text}"'


def _hash(text: str) -> int:
    value = FNV_OFFSET
    for char in text:
        value = ((value ^ ord(char)) * FNV_PRIME) & MASK
    return value


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lower-case words and punctuation marks, one character at a time.

    Example:
        >>> tokenize("Ka lo, MI.")
        ['ka', 'lo', ',', 'mi', '.']
    """
    tokens: list[str] = []
    current: list[str] = []
    for char in text:
        if char.isalnum():
            current.append(char.lower())
            continue
        if current:
            tokens.append("".join(current))
            current = []
        if not char.isspace():
            tokens.append(char)
    if current:
        tokens.append("".join(current))
    return tokens


def features(record: str) -> tuple[list[int], int]:
    """Return the bag of token and trigram counts of ``record``'s text, and its label."""
    fields = dict(part.partition("=")[::2] for part in record.split(";"))
    counts = [0] * BINS
    for token in tokenize(fields["text"].strip('"')):
        counts[_hash(token) % BINS] += 1
        padded = f"<{token}>"
        for start in range(len(padded) - 2):
            counts[_hash(padded[start : start + 3]) % BINS] += 1
    return counts, int(fields["label"])


class Records(Dataset[tuple[torch.Tensor, int]]):
    """``count`` records in a Python list; an item is ``(counts, label)``.

    Reading is thread-safe: the list is never written after ``__init__`` and
    the parsing uses only locals.

    Example:
        >>> records = Records(2, words=3)
        >>> counts, label = records[1]
        >>> counts.shape, counts.dtype, label
        (torch.Size([256]), torch.int32, 2)
    """

    def __init__(self, count: int, words: int = WORDS) -> None:
        self.records = [make_record(index, words) for index in range(count)]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        counts, label = features(self.records[index])
        return torch.tensor(counts, dtype=torch.int32), label
