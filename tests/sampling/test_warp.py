from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tandem.errors import TandemError
from tandem.sampling.warp import greedy_probs, is_one_hot, normalize, sample, warp


def probs_logits(probs: list[float], dtype=torch.float64) -> torch.Tensor:
    return torch.tensor([math.log(p) for p in probs], dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_temperature_scales_logits_and_keeps_dtype(dtype):
    logits = torch.tensor([[1.0, 2.0, -0.5], [0.0, 0.0, 3.0]], dtype=dtype)
    assert torch.allclose(warp(logits), torch.softmax(logits, -1))
    hot = warp(logits, temperature=0.5)
    assert hot.dtype == dtype
    assert torch.allclose(hot, torch.softmax(2 * logits, -1))


def test_temperature_zero_is_one_hot_argmax_first_on_ties():
    logits = torch.tensor([[0.1, 3.0, 3.0, -1.0], [5.0, 0.0, 0.0, 0.0]])
    probs = warp(logits, temperature=0.0, top_k=1, top_p=0.5)
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert is_one_hot(probs).all()
    assert torch.equal(greedy_probs(logits), probs)


def test_top_k_keeps_the_k_largest_and_ties_with_the_kth():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0, 2.0])
    assert (warp(logits, top_k=2) > 0).tolist() == [False, True, False, True, True]
    assert (warp(logits, top_k=1) > 0).tolist() == [False, True, False, False, False]
    assert torch.allclose(warp(logits, top_k=10), warp(logits))


def test_top_p_keeps_smallest_head_reaching_p():
    logits = probs_logits([0.05, 0.5, 0.15, 0.3])
    assert (warp(logits, top_p=0.75) > 0).tolist() == [False, True, False, True]
    assert (warp(logits, top_p=0.85) > 0).tolist() == [False, True, True, True]
    assert (warp(logits, top_p=0.1) > 0).tolist() == [False, True, False, False]
    kept = warp(logits, top_p=0.75)
    assert torch.allclose(kept[[1, 3]], torch.tensor([0.5, 0.3], dtype=torch.float64) / 0.8)


def test_top_k_then_top_p_on_batched_rows():
    logits = torch.stack([probs_logits([0.4, 0.3, 0.2, 0.1]), probs_logits([0.1, 0.2, 0.3, 0.4])])
    probs = warp(logits.expand(2, 2, 4), top_k=3, top_p=0.6)
    assert probs.shape == (2, 2, 4)
    # top-k 3 renormalises to [4, 3, 2]/9; the head reaching 0.6 is the first two tokens.
    assert (probs[0] > 0).tolist() == [[True, True, False, False], [False, False, True, True]]


@pytest.mark.parametrize(
    "kwargs", [{"temperature": -1.0}, {"top_k": 0}, {"top_p": 0.0}, {"top_p": 1.5}]
)
def test_bad_settings_raise_tandem_error(kwargs):
    with pytest.raises(TandemError):
        warp(torch.zeros(3), **kwargs)


def test_sample_shapes_seeds_and_zero_mass():
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]]).expand(3, 2, 4)
    first = sample(probs, torch.Generator().manual_seed(1))
    assert first.shape == (3, 2) and first.dtype == torch.int64
    assert torch.equal(first, sample(probs, torch.Generator().manual_seed(1)))
    many = sample(
        torch.tensor([0.0, 0.25, 0.75]).expand(20_000, 3), torch.Generator().manual_seed(2)
    )
    assert not bool((many == 0).any())
    share = float((many == 2).double().mean())
    assert abs(share - 0.75) < 0.02


def test_normalize_uses_fallback_for_empty_rows():
    weights = torch.tensor([[0.0, 0.0, 0.0], [1.0, 3.0, 0.0]])
    fallback = torch.tensor([[0.2, 0.2, 0.6], [1.0, 0.0, 0.0]])
    out = normalize(weights, fallback)
    assert torch.allclose(out, torch.tensor([[0.2, 0.2, 0.6], [0.25, 0.75, 0.0]]))


def test_sample_one_returns_the_one_token_of_a_greedy_row_without_drawing():
    from tandem.sampling.warp import sample_one

    one_hot = torch.zeros(7)
    one_hot[3] = 0.25  # unnormalized, one nonzero entry
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    assert sample_one(one_hot, generator) == 3
    assert torch.equal(generator.get_state(), state)


def test_inverse_cdf_law_by_enumeration_of_the_uniform():
    """u on a fine grid of [0, 1) hits each token a share of its mass (the law, enumerated
    up to the grid), never a token of mass 0; unnormalized rows are fine."""
    from tandem.sampling.warp import inverse_cdf

    rows = torch.tensor([[0.0, 0.1, 0.0, 0.6, 0.3], [2.0, 0.0, 1.0, 1.0, 0.0]])
    grid = 100_000
    u = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    for row in rows:
        tokens = inverse_cdf(row.expand(grid, 5), u)
        share = torch.bincount(tokens, minlength=5).double() / grid
        assert float((share - row.double() / row.sum()).abs().max()) <= 1.0 / grid
    edges = inverse_cdf(rows, torch.tensor([0.0, 1.0 - 2**-53], dtype=torch.float64))
    assert edges.tolist() == [1, 3]  # the first and the last token of mass > 0


def test_sample_rows_fixed_seed_statistics_and_zero_mass():
    from tandem.sampling.warp import sample_rows
    from tests.exactness.support import assert_chi_square

    law = torch.tensor([0.0, 0.05, 0.25, 0.0, 0.7, 0.0])
    generator = torch.Generator().manual_seed(0)
    u = torch.rand(40_000, generator=generator, dtype=torch.float64)
    tokens = sample_rows(law.expand(40_000, 6), u, generator)
    assert_chi_square(torch.bincount(tokens, minlength=6), law)
    # a round-off onto a token of mass 0 (forced here with u = 1) falls back to a real draw
    last = sample_rows(torch.tensor([[0.3, 0.7, 0.0]]), torch.tensor([1.0]), generator)
    assert int(last[0]) in (0, 1)


def test_support_argmax_reads_only_the_support_and_breaks_ties_low():
    from tandem.sampling.warp import support_argmax

    probs = torch.zeros(50)
    probs[[40, 3, 17]] = torch.tensor([0.25, 0.25, 0.5])
    assert support_argmax(probs) == 17 == support_argmax(probs, torch.tensor([40, 17, 3]))
    probs[17] = 0.25  # three-way tie: the lowest id, whatever the order of the support
    assert support_argmax(probs, torch.tensor([40, 17, 3])) == 3 == support_argmax(probs)
    # ids outside the support are not read: a support that leaves out a larger entry misses it
    assert support_argmax(probs, torch.tensor([40])) == 40


def test_unique_ids_is_np_unique_on_both_sides_of_its_threshold():
    from tandem.sampling.warp import SET_SORTED_IDS, support_argmax, unique_ids

    generator = torch.Generator().manual_seed(1)
    for size in (1, 2, 5, SET_SORTED_IDS, SET_SORTED_IDS + 1, 3 * SET_SORTED_IDS):
        for high in (3, 1000):  # many repeats, then few
            support = torch.randint(0, high, (size,), generator=generator)
            ids = unique_ids(support)
            assert ids.dtype == np.int64
            assert np.array_equal(ids, np.unique(support.numpy()))
    probs = torch.zeros(2000)
    probs[[1500, 7]] = 0.5  # a tie across a large support: the lowest id
    support = torch.cat([torch.tensor([1500, 7]), torch.arange(100, 100 + SET_SORTED_IDS)])
    assert support_argmax(probs, support) == 7 == support_argmax(probs)


def test_kept_argmax_is_support_argmax_of_the_dense_law():
    from tandem.sampling.warp import kept_argmax, support_argmax

    generator = torch.Generator().manual_seed(2)
    for _ in range(300):
        count = int(torch.randint(1, 7, (1,), generator=generator))
        ids = torch.randperm(60, generator=generator)[:count]
        values = torch.randint(1, 4, (count,), generator=generator).float()  # ties, often
        dense = torch.zeros(60)
        dense[ids] = values
        assert kept_argmax(ids.numpy(), values.numpy()) == support_argmax(dense)
