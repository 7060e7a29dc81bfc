"""The project's one scheme of per-position seeds.

A draw at output position `position` for `purpose` ("draft", "verify", "resample", a DRAGON
side, "aggregate", "context", "schedule", ...) gets its own generator, seeded from
(seed, purpose, position) alone. So a token depends on where it sits, never on how many
draws happened before it: two processes, or an exact mode and the plain decoding it must
reproduce, draw the same token at the same position. (The other scheme in use, one
`torch.Generator` consumed in order, is `tandem.protocols.decoding.stream_draw`.)
"""

from __future__ import annotations

import hashlib

import torch


def position_seed(seed: int, purpose: str, position: int) -> int:
    """A 63-bit seed for one draw."""
    digest = hashlib.blake2b(f"{seed}:{purpose}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def position_generator(seed: int, purpose: str, position: int) -> torch.Generator:
    """A fresh generator for one draw at `position`."""
    return torch.Generator().manual_seed(position_seed(seed, purpose, position))
