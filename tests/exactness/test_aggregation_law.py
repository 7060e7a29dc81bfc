"""Speculative Aggregation (DRAGON Algorithm 1) emits exactly eta_l * local + eta_r * remote.

The enumeration renders Algorithm 1 from its statement: Sample(x, own, other, eta_other)
replaces x, when own(x) > other(x), with probability eta_other (1 - other(x)/own(x)) by a draw
from norm(max(0, other - own)); a fair coin picks one side's result; a draft is accepted iff it
equals the picked token. Drafts are independent, local ~ local_probs, remote ~ remote_probs.
"""

from __future__ import annotations

import math

import pytest
import torch

from tandem.sampling import aggregation
from tandem.sampling.warp import sample, warp

from .support import (
    KINDS,
    LAW_TOLERANCE,
    NUM_SAMPLES,
    assert_chi_square,
    counts,
    law_pair,
    max_abs,
)


def sample_kernel(own: torch.Tensor, other: torch.Tensor, other_weight: float) -> torch.Tensor:
    """[x, y] = P(Sample(x, own, other, other_weight) = y), from Algorithm 1's text."""
    vocab = own.shape[0]
    kernel = torch.zeros(vocab, vocab, dtype=torch.float64)
    excess = (other - own).clamp_min(0.0)
    for x in range(vocab):
        replace = 0.0
        if own[x] > other[x]:
            replace = other_weight * (1.0 - float(other[x] / own[x]))
        kernel[x, x] += 1.0 - replace
        if replace > 0:
            kernel[x] += replace * excess / excess.sum()
    return kernel


def joint_law(local, remote, eta_l, eta_r) -> torch.Tensor:
    """[token, local_accepted, remote_accepted] law of one aggregation step."""
    vocab = local.shape[0]
    local_kernel = sample_kernel(local, remote, eta_r)
    remote_kernel = sample_kernel(remote, local, eta_l)
    law = torch.zeros(vocab, 2, 2, dtype=torch.float64)
    for x_l in range(vocab):
        for x_r in range(vocab):
            weight = float(local[x_l] * remote[x_r])
            if weight == 0:
                continue
            token_law = 0.5 * local_kernel[x_l] + 0.5 * remote_kernel[x_r]
            for y in range(vocab):
                law[y, int(x_l == y), int(x_r == y)] += weight * token_law[y]
    return law


def case(kind: str, vocab: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    local, remote = law_pair(kind, vocab, generator)
    local_logweight, remote_logweight = torch.randn(2, generator=generator, dtype=torch.float64)
    return local, remote, float(local_logweight), float(remote_logweight)


CASES = [(kind, 3 + i % 4, 10 + i) for i, kind in enumerate(KINDS)] + [
    ("random", 5, 30),
    ("disjoint", 6, 31),
    ("peaked", 4, 32),
]


def test_enumerated_law_is_the_mixture_on_many_random_cases():
    for seed in range(400):
        kind = KINDS[seed % len(KINDS)]
        local, remote, h_l, h_r = case(kind, 3 + seed % 4, seed)
        eta_l, eta_r = (float(w) for w in aggregation.side_weights(h_l, h_r))
        law = joint_law(local, remote, eta_l, eta_r)
        target = aggregation.mixture(local, remote, h_l, h_r)
        assert max_abs(law.sum(dim=(1, 2)), target) <= LAW_TOLERANCE, (kind, seed)
        # Each side's Sample result alone already follows the mixture (paper Sec. 4.2).
        assert max_abs(local @ sample_kernel(local, remote, eta_r), target) <= LAW_TOLERANCE
        assert max_abs(remote @ sample_kernel(remote, local, eta_l), target) <= LAW_TOLERANCE
        # The module's kernel and Eq. (5) acceptance rates agree with the enumeration.
        kernel = aggregation.resample_transition(local, remote, eta_r)
        assert max_abs(kernel, sample_kernel(local, remote, eta_r)) <= LAW_TOLERANCE
        alpha_l, alpha_r = aggregation.acceptance_rates(local, remote, h_l, h_r)
        assert abs(alpha_l - float(law[:, 1, :].sum())) <= LAW_TOLERANCE
        assert abs(alpha_r - float(law[:, :, 1].sum())) <= LAW_TOLERANCE


def test_one_sided_weight_reduces_to_that_side():
    local, remote, _, _ = case("random", 5, 3)
    law = joint_law(local, remote, 1.0, 0.0)
    assert max_abs(law.sum(dim=(1, 2)), local) <= LAW_TOLERANCE
    assert max_abs(aggregation.mixture(local, remote, 0.0, -math.inf), local) <= LAW_TOLERANCE


@pytest.mark.parametrize("kind,vocab,seed", CASES)
def test_speculative_aggregate_draws_the_enumerated_joint_law(kind, vocab, seed):
    """Chi-square on the (token, local accepted, remote accepted) cells of the real kernel."""
    local, remote, h_l, h_r = case(kind, vocab, seed)
    eta_l, eta_r = (float(w) for w in aggregation.side_weights(h_l, h_r))
    generator = torch.Generator().manual_seed(1000 + seed)
    local_tokens = sample(local.expand(NUM_SAMPLES, vocab), generator)
    remote_tokens = sample(remote.expand(NUM_SAMPLES, vocab), generator)
    out = aggregation.speculative_aggregate_batch(
        local_tokens,
        local.expand(NUM_SAMPLES, vocab),
        remote_tokens,
        remote.expand(NUM_SAMPLES, vocab),
        h_l,
        h_r,
        generator,
    )
    cells = out.token * 4 + out.local_accepted.to(torch.int64) * 2 + out.remote_accepted
    assert_chi_square(counts(cells, vocab * 4), joint_law(local, remote, eta_l, eta_r))


def test_per_step_function_is_the_batch_kernel():
    local, remote, h_l, h_r = case("random", 5, 7)
    for seed in range(30):
        local_token, remote_token = int(seed % 5), int((seed * 3) % 5)
        one = aggregation.speculative_aggregate(
            local_token, local, remote_token, remote, h_l, h_r, torch.Generator().manual_seed(seed)
        )
        batch = aggregation.speculative_aggregate_batch(
            torch.tensor([local_token]),
            local.unsqueeze(0),
            torch.tensor([remote_token]),
            remote.unsqueeze(0),
            h_l,
            h_r,
            torch.Generator().manual_seed(seed),
        )
        assert one == (
            int(batch.token[0]),
            bool(batch.local_accepted[0]),
            bool(batch.remote_accepted[0]),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_greedy_aggregation_is_argmax_of_the_mixture(dtype):
    """Sides forced one-hot with +-100 logits, and untempered laws with the greedy flag."""
    vocab = 5
    local_logits = torch.full((vocab,), -100.0, dtype=dtype)
    local_logits[1] = 100.0
    remote_logits = torch.full((vocab,), -100.0, dtype=dtype)
    remote_logits[3] = 100.0
    local, remote = warp(local_logits), warp(remote_logits)
    for seed in range(5):
        generator = torch.Generator().manual_seed(seed)
        # Remote weighs more: the aggregate argmax is the remote token, every time.
        assert aggregation.speculative_aggregate(
            1, local, 3, remote, 0.0, 1.0, generator, greedy=True
        ) == (
            3,
            False,
            True,
        )
        # Without the flag the kernel samples the mixture; with equal one-hot drafts it agrees.
        assert aggregation.speculative_aggregate(1, local, 1, local, 0.0, 1.0, generator) == (
            1,
            True,
            True,
        )
    generator = torch.Generator().manual_seed(0)
    local = torch.softmax(torch.randn(vocab, generator=generator, dtype=dtype), 0)
    remote = torch.softmax(torch.randn(vocab, generator=generator, dtype=dtype), 0)
    expected = int(aggregation.mixture(local, remote, 0.2, -0.1).argmax())
    token, _, _ = aggregation.speculative_aggregate(
        int(local.argmax()), local, int(remote.argmax()), remote, 0.2, -0.1, generator, greedy=True
    )
    assert token == expected
