"""Lattice quantizer (SQS-SD Algorithm 2) and the enumerative codings are exact bijections."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tandem.codecs.base import BitReader, BitWriter, CodecError, ceil_log2
from tandem.codecs.lattice import (
    composition_bits,
    composition_count,
    quantize,
    rank_composition,
    rank_subset,
    subset_bits,
    unrank_composition,
    unrank_subset,
)

QWEN_VOCAB = 151_936


def independent_ceil_log2(count: int) -> int:
    """Smallest b with 2**b >= count, by counting (no bit tricks)."""
    bits = 0
    while 2**bits < count:
        bits += 1
    return bits


def test_ceil_log2_matches_counting():
    for count in [*range(1, 70), 2**40 - 1, 2**40, 2**40 + 1, math.comb(QWEN_VOCAB, 64)]:
        assert ceil_log2(count) == independent_ceil_log2(count)


@pytest.mark.parametrize("universe", range(0, 9))
def test_subset_rank_is_colex_bijection(universe):
    for size in range(universe + 1):
        colex = sorted(itertools.combinations(range(universe), size), key=lambda s: s[::-1])
        assert len(colex) == math.comb(universe, size)
        for rank, subset in enumerate(colex):
            assert rank_subset(subset) == rank
            assert unrank_subset(rank, size, universe) == list(subset)


@pytest.mark.parametrize("parts", range(1, 6))
def test_composition_rank_is_lexicographic_bijection(parts):
    for total in range(0, 7):
        lex = [c for c in itertools.product(range(total + 1), repeat=parts) if sum(c) == total]
        assert len(lex) == composition_count(total, parts)
        for rank, counts in enumerate(lex):
            assert rank_composition(counts) == rank
            assert tuple(unrank_composition(rank, parts, total).tolist()) == counts


def test_large_subsets_round_trip_near_the_top_of_qwen_vocab():
    rng = np.random.default_rng(0)
    for size in [1, 2, 8, 64, 300]:
        subset = sorted(rng.choice(QWEN_VOCAB, size, replace=False).tolist())
        subset[-1] = QWEN_VOCAB - 1  # the very last id
        subset = sorted(set(subset))
        rank = rank_subset(subset)
        assert 0 <= rank < math.comb(QWEN_VOCAB, len(subset))
        assert unrank_subset(rank, len(subset), QWEN_VOCAB) == subset
    top = list(range(QWEN_VOCAB - 40, QWEN_VOCAB))  # the largest subset of size 40
    assert rank_subset(top) == math.comb(QWEN_VOCAB, 40) - 1
    assert unrank_subset(math.comb(QWEN_VOCAB, 40) - 1, 40, QWEN_VOCAB) == top


def test_large_compositions_round_trip():
    rng = np.random.default_rng(1)
    for parts, total in [(1, 100), (500, 100), (3, 10_000), (2000, 7)]:
        counts = rng.multinomial(total, rng.dirichlet(np.ones(parts)))
        rank = rank_composition(counts)
        assert 0 <= rank < composition_count(total, parts)
        assert np.array_equal(unrank_composition(rank, parts, total), counts)
    assert rank_composition([0] * 9 + [5]) == 0  # lexicographically first
    assert rank_composition([5] + [0] * 9) == composition_count(5, 10) - 1  # last


def test_out_of_range_ranks_are_refused():
    with pytest.raises(CodecError):
        unrank_subset(math.comb(20, 3), 3, 20)
    with pytest.raises(CodecError):
        unrank_subset(-1, 3, 20)
    with pytest.raises(CodecError):
        unrank_subset(0, 21, 20)
    with pytest.raises(CodecError):
        unrank_composition(composition_count(7, 4), 4, 7)


@pytest.mark.parametrize(
    ("vocab", "size", "ell"),
    [(2, 1, 1), (50, 7, 10), (50_257, 16, 100), (QWEN_VOCAB, 1, 100), (QWEN_VOCAB, 32, 100),
     (QWEN_VOCAB, 1000, 100), (QWEN_VOCAB, QWEN_VOCAB, 100), (QWEN_VOCAB, 8, 1_000_000)],
)  # fmt: skip
def test_bit_widths_are_the_paper_formulas(vocab, size, ell):
    assert subset_bits(vocab, size) == independent_ceil_log2(math.comb(vocab, size))
    assert composition_bits(ell, size) == independent_ceil_log2(math.comb(ell + size - 1, size - 1))
    # within one bit of the real-valued log2 in eqs. (2) and (5)
    assert 0 <= subset_bits(vocab, size) - math.log2(math.comb(vocab, size)) < 1
    assert 0 <= composition_bits(ell, size) - math.log2(composition_count(ell, size)) < 1


def quantization_tv(values: np.ndarray, ell: int) -> float:
    counts = quantize(values, ell)
    assert counts.sum() == ell and (counts >= 0).all()
    assert (counts[values == 0] == 0).all()
    return 0.5 * float(np.abs(counts / ell - values).sum())


def test_quantize_stays_within_k_over_4_ell():
    rng = np.random.default_rng(2)
    for _ in range(3000):
        size = int(rng.integers(1, 40))
        ell = int(rng.integers(1, 120))
        values = rng.dirichlet(np.full(size, rng.choice([0.05, 0.5, 1.0, 20.0])))
        values[rng.random(size) < 0.2] = 0.0
        if values.sum() == 0:
            values[0] = 1.0
        values /= values.sum()
        assert quantization_tv(values, ell) <= size / (4 * ell) + 1e-12


def test_quantize_worst_cases_reach_but_never_exceed_the_bound():
    # two halves on a resolution of 1: one must round to 0, the other to 1 -> TV = 1/2 = 2/(4*1)
    assert quantization_tv(np.array([0.5, 0.5]), 1) == pytest.approx(0.5)
    for size in range(1, 12):
        for ell in range(1, 12):
            uniform = np.full(size, 1.0 / size)
            assert quantization_tv(uniform, ell) <= size / (4 * ell) + 1e-12


def test_quantize_follows_algorithm_2_exactly():
    # ell * values = [0.8, 0.7, 0.5] -> floor(x + 1/2) = [1, 1, 1] sums to 3 > ell = 2;
    # zeta = [0.2, 0.3, 0.5]: the largest excess moves down
    assert quantize(np.array([0.4, 0.35, 0.25]), 2).tolist() == [1, 1, 0]
    # ell * values = [2.3, 2.3, 0.4, 0] -> [2, 2, 0, 0] sums to 4 < 5;
    # zeta = [-0.3, -0.3, -0.4, 0]: the largest deficit moves up
    assert quantize(np.array([0.46, 0.46, 0.08, 0.0]), 5).tolist() == [2, 2, 1, 0]
    assert quantize(np.array([1.0]), 100).tolist() == [100]


def test_bit_writer_reader_round_trip_and_refusals():
    writer = BitWriter()
    fields = [(5, 3), (0, 0), (1, 1), (12345, 17), (0, 2)]
    for value, width in fields:
        writer.write(value, width)
    data = writer.to_bytes()
    assert len(data) == math.ceil(23 / 8)
    reader = BitReader(data)
    assert [reader.read(width) for _, width in fields] == [value for value, _ in fields]
    reader.finish()
    with pytest.raises(CodecError):
        BitReader(data + b"\x00").finish()  # a trailing byte
    bad_pad = BitReader(data[:-1] + bytes([data[-1] | 1]))
    for _, width in fields:
        bad_pad.read(width)
    with pytest.raises(CodecError):
        bad_pad.finish()
    with pytest.raises(CodecError):
        BitReader(b"\x00").read(9)
