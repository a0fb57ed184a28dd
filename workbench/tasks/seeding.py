"""Per-row random generators derived by hashing, never by adding offsets to a seed.

An additive scheme (seed + depth * 10000 + row) makes seeds 20260702 and 20260705 draw
shifted copies of the same rows. Hashing the full key gives every (task, split, alphabet,
depth, row index, base seed) its own independent stream.
"""

from __future__ import annotations

import hashlib
import json
import random

SPLITS = ("train", "test")


def row_seed(task: str, split: str, alphabet: int | str, depth: int, index: int, seed: int) -> int:
    """Returns the 256-bit integer SHA-256 of the canonical JSON of the row's key."""
    key = json.dumps([task, split, alphabet, depth, index, seed], separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(key.encode()).digest(), "big")


def row_rng(task: str, split: str, alphabet: int | str, depth: int, index: int, seed: int) -> random.Random:
    """Returns a `random.Random` seeded from `row_seed` of the same key."""
    return random.Random(row_seed(task, split, alphabet, depth, index, seed))
