"""Shared pieces of the exactness tests: seeded random laws, enumeration, chi-square.

A *case* is a named family of small laws (vocab 3..6) chosen to hit the edges of the
kernels: random, sparse (zeros), disjoint supports, one-hot, equal rows, peaked.
Every law here is float64 and comes from an explicit `torch.Generator`, so every test is
deterministic.
"""

from __future__ import annotations

import itertools

import scipy.stats
import torch

from tandem.sampling import acceptance, speculative
from tandem.sampling.warp import warp

NUM_SAMPLES = 100_000
P_VALUE_FLOOR = 1e-3
LAW_TOLERANCE = 1e-6


def dirichlet(vocab: int, generator: torch.Generator) -> torch.Tensor:
    """A Dirichlet(1, ..., 1) law: normalised unit exponentials. [vocab] float64"""
    uniforms = torch.rand(vocab, generator=generator, dtype=torch.float64)
    weights = -torch.log1p(-uniforms)
    return weights / weights.sum()


def sparse(vocab: int, generator: torch.Generator, keep: int) -> torch.Tensor:
    """A random law on `keep` random tokens (the rest exactly 0). [vocab]"""
    support = torch.randperm(vocab, generator=generator)[:keep]
    law = torch.zeros(vocab, dtype=torch.float64)
    law[support] = dirichlet(keep, generator)
    return law


def one_hot(vocab: int, token: int) -> torch.Tensor:
    law = torch.zeros(vocab, dtype=torch.float64)
    law[token] = 1.0
    return law


def law_pair(
    kind: str, vocab: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two laws over one vocabulary with the relationship `kind` names."""
    if kind == "random":
        return dirichlet(vocab, generator), dirichlet(vocab, generator)
    if kind == "sparse":
        return sparse(vocab, generator, vocab - 1), sparse(vocab, generator, vocab - 2)
    if kind == "disjoint":
        order = torch.randperm(vocab, generator=generator)
        first = torch.zeros(vocab, dtype=torch.float64)
        second = torch.zeros(vocab, dtype=torch.float64)
        half = vocab // 2
        first[order[:half]] = dirichlet(half, generator)
        second[order[half:]] = dirichlet(vocab - half, generator)
        return first, second
    if kind == "one-hot-first":
        return one_hot(vocab, int(torch.randint(vocab, (1,), generator=generator))), dirichlet(
            vocab, generator
        )
    if kind == "one-hot-second":
        return dirichlet(vocab, generator), one_hot(
            vocab, int(torch.randint(vocab, (1,), generator=generator))
        )
    if kind == "equal":
        law = dirichlet(vocab, generator)
        return law, law.clone()
    if kind == "peaked":
        first = torch.softmax(3.0 * torch.randn(vocab, generator=generator, dtype=torch.float64), 0)
        second = torch.softmax(
            3.0 * torch.randn(vocab, generator=generator, dtype=torch.float64), 0
        )
        return first, second
    raise ValueError(kind)


KINDS = ("random", "sparse", "disjoint", "one-hot-first", "one-hot-second", "equal", "peaked")


def all_sequences(vocab: int, length: int):
    """Every token sequence of `length` over `vocab`, as tuples."""
    return itertools.product(range(vocab), repeat=length)


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def assert_chi_square(observed: torch.Tensor, expected_law: torch.Tensor) -> float:
    """Fixed-seed goodness of fit: observed counts vs a law over the same cells.

    Cells of probability 0 must never be observed; cells expected fewer than 5 times are
    pooled into one bin. Fails when the p-value is below P_VALUE_FLOOR. Returns the p-value.
    """
    observed = observed.reshape(-1).to(torch.float64)
    expected_law = expected_law.reshape(-1).to(torch.float64)
    assert observed.shape == expected_law.shape
    total = float(observed.sum())
    impossible = expected_law <= 1e-12
    assert float(observed[impossible].sum()) == 0.0, "a zero-probability outcome was drawn"
    law = expected_law[~impossible]
    counts = observed[~impossible]
    expected = law / law.sum() * total
    small = expected < 5
    if bool(small.any()):
        counts = torch.cat([counts[~small], counts[small].sum().reshape(1)])
        expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    if counts.numel() < 2:  # a single possible outcome: nothing left to test
        return 1.0
    pvalue = float(scipy.stats.chisquare(counts.numpy(), expected.numpy()).pvalue)
    assert pvalue > P_VALUE_FLOOR, f"chi-square p-value {pvalue:.2e}"
    return pvalue


def counts(values: torch.Tensor, cells: int) -> torch.Tensor:
    """Histogram of int64 cell indices in [0, cells)."""
    return torch.bincount(values.reshape(-1), minlength=cells)


def rapid_verify_batch(tokens, draft, logits, draws, *, eta, temperature, mode="exact"):
    """RAPID's rule on the one sampler, from the target's logits (what `Target` does)."""
    laws = acceptance.Augmented(eta=eta, mode=mode).laws(
        warp(logits.to(draft.dtype), temperature=temperature), draft
    )
    n = tokens.shape[-1]
    return speculative.verify_batch(
        tokens, draft[:, :n], laws.verify, draws, residual_probs=laws.residual
    )
