"""The project's one scheme of per-position seeds, and the randomness a verification draws.

A draw at output position `position` for `purpose` ("draft", "verify", "resample", a DRAGON
side, "aggregate", "context", "schedule", ...) gets its own generator, seeded from
(seed, purpose, position) alone. So a token depends on where it sits, never on how many
draws happened before it: two processes, or an exact mode and the plain decoding it must
reproduce, draw the same token at the same position. Every mode draws this way.

`Draws` is where a block verification (`tandem.sampling.speculative.verify_batch`) takes its
randomness from: the uniform that tests each draft, then the one draw of the block's next
token (recovered or bonus). `PositionDraws` gives position i of a block starting at output
position `first` the generator of (seed, purpose, first + i): its uniform, then, if the
block stops there, the next token from the same generator; a bonus at first + gamma gets
that position's fresh generator, so a decoding step with no drafts draws exactly what
`sample_at` draws; tokens are drawn by `tandem.sampling.warp.sample_one`. `StreamDraws` (a
bare `torch.Generator` consumed in order, `torch.multinomial` per row) serves batched math
and its tests only.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import torch

from tandem.sampling.warp import sample_one


def position_seed(seed: int, purpose: str, position: int) -> int:
    """A 63-bit seed for one draw."""
    digest = hashlib.blake2b(f"{seed}:{purpose}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def position_generator(seed: int, purpose: str, position: int) -> torch.Generator:
    """A fresh generator for one draw at `position`."""
    return torch.Generator().manual_seed(position_seed(seed, purpose, position))


def sample_at(probs: torch.Tensor, seed: int, purpose: str, position: int) -> int:
    """One token from `probs` ([vocab], need not be normalized) with the position's generator."""
    return sample_one(probs, position_generator(seed, purpose, position))


class Draws(Protocol):
    def uniforms(self, batch: int, gamma: int, dtype: torch.dtype) -> torch.Tensor:
        """[batch, gamma] uniforms in [0, 1), one per draft token."""
        ...

    def next_tokens(self, probs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """One token per row of `probs` [batch, vocab]; `index` [batch]: the position in the
        block each row's token takes (the number of drafts accepted before it)."""
        ...


class StreamDraws:
    """One generator, consumed in order (batched math and its tests)."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def uniforms(self, batch: int, gamma: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.rand((batch, gamma), generator=self.generator, dtype=dtype)

    def next_tokens(self, probs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)


class PositionDraws:
    """The position scheme for one block (batch 1) whose first draft sits at `first`."""

    def __init__(self, seed: int, purpose: str, first: int):
        self.seed, self.purpose, self.first = seed, purpose, first
        self.generators: list[torch.Generator] = []

    def _generator(self, offset: int) -> torch.Generator:
        if offset < len(self.generators):
            return self.generators[offset]
        return position_generator(self.seed, self.purpose, self.first + offset)

    def uniforms(self, batch: int, gamma: int, dtype: torch.dtype) -> torch.Tensor:
        assert batch == 1, "position draws verify one block at a time"
        self.generators = [self._generator(i) for i in range(gamma)]
        rows = [torch.rand((1, 1), generator=g, dtype=dtype) for g in self.generators]
        return torch.cat(rows, dim=1) if rows else torch.zeros((1, 0), dtype=dtype)

    def next_tokens(self, probs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        assert probs.shape[0] == 1, probs.shape
        token = sample_one(probs[0], self._generator(int(index[0])))
        return torch.tensor([token], dtype=torch.int64)


def as_draws(randomness: torch.Generator | Draws) -> Draws:
    return StreamDraws(randomness) if isinstance(randomness, torch.Generator) else randomness
