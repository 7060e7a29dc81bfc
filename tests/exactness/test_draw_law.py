"""The one token draw (`tandem.sampling.warp.sample_one`, a two-level inverse CDF): its
output law is the row it is given, on vocabularies that end inside a block, cross several
blocks or fit in one, with zeros (never drawn) and unnormalized rows; chi-square with fixed
seeds, and the enumerated interval each token owns."""

from __future__ import annotations

import pytest
import torch

from tandem.sampling.warp import BLOCK, sample_one

from .support import assert_chi_square

SAMPLES = 40_000


def row(vocab: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    weights = torch.rand(vocab, generator=generator) ** 4  # skewed, like a warped law
    weights[torch.rand(vocab, generator=generator) < 0.3] = 0.0  # zeros inside blocks
    weights[: min(vocab, BLOCK)] *= 3.0  # unequal block masses
    return weights * 7.5  # unnormalized


@pytest.mark.parametrize("vocab", [5, BLOCK, 2 * BLOCK + 37])
def test_draws_follow_the_row(vocab):
    probs = row(vocab, vocab)
    generator = torch.Generator().manual_seed(1)
    counts = torch.zeros(vocab, dtype=torch.int64)
    for _ in range(SAMPLES):
        counts[sample_one(probs, generator)] += 1
    assert int(counts[probs == 0].sum()) == 0
    assert_chi_square(counts, (probs / probs.sum()).double())


def test_a_whole_block_of_zeros_is_never_drawn():
    probs = row(3 * BLOCK, 2)
    probs[BLOCK : 2 * BLOCK] = 0.0
    generator = torch.Generator().manual_seed(3)
    tokens = [sample_one(probs, generator) for _ in range(4000)]
    assert not any(BLOCK <= t < 2 * BLOCK for t in tokens)
    assert len(set(tokens)) > 50


def test_float64_rows_and_a_real_vocabulary_size():
    probs = torch.softmax(torch.randn(151_936, generator=torch.Generator().manual_seed(4)), 0)
    generator = torch.Generator().manual_seed(5)
    tokens = [sample_one(probs.double(), generator) for _ in range(200)]
    assert all(0 <= t < 151_936 for t in tokens) and len(set(tokens)) > 150
