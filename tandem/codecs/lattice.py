"""Sparse lattice quantization (SQS-SD Algorithm 2) and exact enumerative coding.

Words used here:
- *support*: the sorted token ids kept, a K-subset of the vocabulary {0, ..., V-1}.
- *counts*: the lattice point, K non-negative ints summing to the resolution `ell`; the
  quantized probability of support[i] is counts[i] / ell.
- *rank*: the index of a subset or of a composition among all of them, an exact Python int.

Subsets are ranked with the combinatorial number system (colex order):
rank({c_1 < ... < c_K}) = sum_i C(c_i, i), a bijection onto [0, C(V, K)).
Counts are ranked lexicographically (counts[0] most significant, smaller first), a bijection
onto [0, C(ell+K-1, K-1)). By stars and bars a composition is a string of `ell` stars and
K-1 bars; with bar < star its lexicographic rank is sum_j C(N-1-s_j, ell-j) over the star
positions s_0 < ... < s_{ell-1} (N = ell+K-1), which is the colex rank of the reflected
positions {N-1-s_j}. So both codings share one primitive and cost O(K) and O(ell) binomials.
Unranking finds each element with a float (lgamma) estimate corrected by exact comparisons.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tandem.codecs.base import CodecError, ceil_log2


def quantize(values: np.ndarray, ell: int) -> np.ndarray:
    """Algorithm 2, lines 6-16: the lattice point nearest to `values` ([K], summing to 1).

    Round ell * values to the nearest integers, then fix the total by moving the entries with
    the largest rounding excess down (or the largest deficit up) by one. Returns int64 counts
    [K] summing to ell, never negative, zero wherever `values` is zero.
    TV(values, counts / ell) <= K / (4 ell)  (SQS-SD eq. 20, from Teku et al.).
    """
    assert values.ndim == 1 and ell >= 1, (values.shape, ell)
    scaled = ell * values.astype(np.float64)  # [K]
    counts = np.floor(scaled + 0.5).astype(np.int64)
    excess = int(counts.sum()) - ell
    if excess != 0:
        zeta = counts - scaled  # rounding excess per entry
        order = np.argsort(zeta, kind="stable")  # increasing zeta
        if excess > 0:
            counts[order[::-1][:excess]] -= 1
        else:
            counts[order[:-excess]] += 1
    assert counts.sum() == ell and (counts >= 0).all()
    return counts


def subset_count(universe: int, size: int) -> int:
    return math.comb(universe, size)


def composition_count(total: int, parts: int) -> int:
    """Weak compositions of `total` into `parts` ordered non-negative parts."""
    return math.comb(total + parts - 1, parts - 1)


def subset_bits(universe: int, size: int) -> int:
    """ceil(log2 C(V, K)): the width of a subset rank."""
    return ceil_log2(subset_count(universe, size))


def composition_bits(total: int, parts: int) -> int:
    """ceil(log2 C(ell+K-1, K-1)): the width of a composition rank."""
    return ceil_log2(composition_count(total, parts))


def rank_subset(elements: Sequence[int]) -> int:
    """Colex rank of a strictly increasing sequence of non-negative ints."""
    rank = 0
    for i, element in enumerate(elements, start=1):
        if element >= i:  # C(c, i) = 0 for c < i
            rank += math.comb(element, i)
    return rank


def unrank_subset(rank: int, size: int, universe: int) -> list[int]:
    """Inverse of `rank_subset` over `size`-subsets of {0..universe-1}; sorted increasing."""
    if not 0 <= size <= universe:
        raise CodecError(f"subset of {size} out of {universe}")
    if not 0 <= rank < subset_count(universe, size):
        raise CodecError("subset rank out of range")
    elements = []
    upper = universe - 1
    for k in range(size, 0, -1):
        element, binom = _largest_with_binomial_at_most(rank, k, upper)
        elements.append(element)
        rank -= binom
        upper = element - 1
    assert rank == 0
    return elements[::-1]


def rank_composition(counts: Sequence[int] | np.ndarray) -> int:
    """Lexicographic rank of a weak composition (counts[0] most significant)."""
    counts = np.asarray(counts, dtype=np.int64)
    ell, parts = int(counts.sum()), len(counts)
    num_positions = ell + parts - 1
    part_of_star = np.repeat(np.arange(parts), counts)  # [ell] part index of star j
    star_positions = np.arange(ell) + part_of_star  # s_j = j + bars before star j
    reflected = (num_positions - 1 - star_positions)[::-1]  # increasing
    return rank_subset(reflected.tolist())


def unrank_composition(rank: int, parts: int, total: int) -> np.ndarray:
    """Inverse of `rank_composition`: int64 counts [parts] summing to `total`."""
    if parts < 1 or total < 0:
        raise CodecError(f"no compositions of {total} into {parts} parts")
    num_positions = total + parts - 1
    reflected = np.asarray(unrank_subset(rank, total, num_positions), dtype=np.int64)
    star_positions = (num_positions - 1 - reflected)[::-1]  # increasing
    part_of_star = star_positions - np.arange(total)
    return np.bincount(part_of_star, minlength=parts).astype(np.int64)


def _log_binomial(n: float, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _largest_with_binomial_at_most(rank: int, k: int, upper: int) -> tuple[int, int]:
    """The largest c in [k-1, upper] with C(c, k) <= rank, and that C(c, k).

    Assumes C(upper + 1, k) > rank or nothing larger is allowed. A float binary search on
    log C(c, k) lands within one step (adjacent log-binomials differ by >= k/c, far above
    float error), and exact big-int comparisons settle it.
    """
    if rank == 0 or upper < k:
        return k - 1, 0
    log_rank = math.log(rank)
    low, high = k, upper  # C(k, k) = 1 <= rank
    while low < high:
        mid = (low + high + 1) // 2
        if _log_binomial(mid, k) <= log_rank:
            low = mid
        else:
            high = mid - 1
    element = low
    binom = math.comb(element, k)
    while binom > rank:
        binom = binom * (element - k) // element  # C(c-1, k)
        element -= 1
    while element < upper:
        bigger = binom * (element + 1) // (element + 1 - k)  # C(c+1, k)
        if bigger > rank:
            break
        element, binom = element + 1, bigger
    return element, binom
