"""K-SQS and C-SQS: bit counts are the paper's formulas, the support rules, the conformal
threshold with checkpoint/backtrack, and drafts sampled from what is sent."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tandem.codecs import (
    CodecError,
    ConformalThreshold,
    CSQSCodec,
    KSQSCodec,
    draft,
    tv_distance,
)

QWEN_VOCAB = 151_936


def ceil_log2_by_counting(count: int) -> int:
    bits = 0
    while 2**bits < count:
        bits += 1
    return bits


def formula_bits(vocab: int, support: int, ell: int, *, adaptive: bool) -> int:
    """SQS-SD eqs. (1), (2), (5) and section 3, each term rounded up to whole bits."""
    return (
        (ceil_log2_by_counting(vocab) if adaptive else 0)
        + ceil_log2_by_counting(math.comb(vocab, support))
        + ceil_log2_by_counting(math.comb(ell + support - 1, support - 1))
    )


def probs_with_support(vocab: int, support: int, seed: int) -> torch.Tensor:
    """`support` tokens with probability >= 1/(2 support), the rest far below 1e-6."""
    rng = np.random.default_rng(seed)
    probs = np.full(vocab, 1e-9)
    ids = rng.choice(vocab, support, replace=False)
    probs[ids] = rng.uniform(1.0, 2.0, support)
    probs /= probs.sum()
    return torch.from_numpy(probs)


CASES = [(2, 1, 1), (50, 5, 10), (1000, 16, 100), (50_257, 8, 100), (QWEN_VOCAB, 1, 100),
         (QWEN_VOCAB, 8, 100), (QWEN_VOCAB, 32, 100), (QWEN_VOCAB, 100, 50), (QWEN_VOCAB, 64, 1000)]  # fmt: skip


@pytest.mark.parametrize(("vocab", "support", "ell"), CASES)
def test_k_sqs_bits_are_the_formula_and_bytes_are_exact(vocab, support, ell):
    codec = KSQSCodec(k=support, ell=ell)
    probs = probs_with_support(vocab, support, seed=vocab + support)
    bits = formula_bits(vocab, support, ell, adaptive=False)
    assert codec.bits(probs) == bits
    data = codec.encode(probs)
    assert len(data) == math.ceil(bits / 8)
    assert torch.equal(codec.decode(data, vocab), codec.transmitted_probs(probs))


@pytest.mark.parametrize(("vocab", "support", "ell"), CASES)
def test_c_sqs_bits_are_the_formula_and_bytes_are_exact(vocab, support, ell):
    codec = CSQSCodec(ell=ell, beta=1e-6)
    probs = probs_with_support(vocab, support, seed=vocab * 3 + support)
    assert int((probs >= 1e-6).sum()) == support
    bits = formula_bits(vocab, support, ell, adaptive=True)
    assert codec.bits(probs) == bits
    data = codec.encode(probs)
    assert len(data) == math.ceil(bits / 8)
    assert torch.equal(codec.decode(data, vocab), codec.transmitted_probs(probs))


def test_known_sizes_for_qwen():
    probs = probs_with_support(QWEN_VOCAB, 8, seed=0)
    # log2 C(151936, 8) = 122.2 -> 123 bits; log2 C(107, 7) = 33.4 -> 34 bits; 157 bits = 20 B
    assert len(KSQSCodec(k=8, ell=100).encode(probs)) == 20
    # plus 18 bits of K: 175 bits = 22 B
    assert len(CSQSCodec(ell=100, beta=1e-6).encode(probs)) == 22


def test_k_sqs_with_k_above_the_support_fills_with_zero_tokens():
    probs = torch.tensor([0.0, 0.7, 0.0, 0.3, 0.0, 0.0])
    codec = KSQSCodec(k=4, ell=10)
    sent = codec.transmitted_probs(probs)
    assert sent.tolist() == pytest.approx([0, 0.7, 0, 0.3, 0, 0])
    assert codec.bits(probs) == formula_bits(6, 4, 10, adaptive=False)
    assert KSQSCodec(k=100, ell=10).bits(probs) == formula_bits(6, 6, 10, adaptive=False)
    assert torch.equal(
        KSQSCodec(k=100, ell=10).decode(KSQSCodec(k=100, ell=10).encode(probs), 6), sent
    )


def test_c_sqs_support_is_the_threshold_set_plus_the_top_token():
    probs = torch.tensor([0.05, 0.4, 0.3, 0.15, 0.1], dtype=torch.float64)
    values = probs.numpy()
    assert CSQSCodec(beta=0.1).support(values).tolist() == [1, 2, 3, 4]  # >= is inclusive
    assert CSQSCodec(beta=0.9).support(values).tolist() == [1]  # nothing above: keep the top
    assert CSQSCodec(beta=-0.1).support(values).tolist() == [0, 1, 2, 3, 4]
    assert CSQSCodec(beta=0.01, max_support=2).support(values).tolist() == [1, 2]
    assert CSQSCodec(beta=0.1).dropped_mass(probs) == pytest.approx(0.05)


def test_c_sqs_decoder_refuses_supports_above_its_cap():
    probs = probs_with_support(1000, 40, seed=3)
    data = CSQSCodec(beta=1e-6, max_support=64).encode(probs)
    assert CSQSCodec(max_support=64).decode(data, 1000).count_nonzero() <= 40
    with pytest.raises(CodecError):
        CSQSCodec(max_support=16).decode(data, 1000)


def test_conformal_update_is_eq_8():
    state = ConformalThreshold(beta=0.01, alpha=0.05, eta=0.1)
    assert state.updated(0.25).beta == pytest.approx(0.01 - 0.1 * (0.25 - 0.05))
    assert state.updated(0.0).beta == pytest.approx(0.01 + 0.1 * 0.05)
    assert state.updated(0.05).beta == pytest.approx(0.01)
    assert state.updated(1.0).beta == pytest.approx(0.01 - 0.1 * 0.95)
    low = ConformalThreshold(beta=-0.05, alpha=0.05, eta=0.1)
    assert low.updated(1.0).beta == pytest.approx(-0.1 * 0.95)  # clamped at Lemma 4's bound
    assert low.updated(1.0).updated(1.0).beta == pytest.approx(-0.1 * 0.95)


def test_average_dropped_mass_meets_theorem_2():
    rng = np.random.default_rng(4)
    alpha, eta, beta, num_tokens = 0.1, 0.05, 0.3, 600
    codec = CSQSCodec(alpha=alpha, eta=eta, beta=beta, ell=50, max_support=64)
    dropped = []
    for _ in range(num_tokens):
        probs = torch.from_numpy(rng.dirichlet(np.full(40, 0.3)))
        dropped.append(codec.dropped_mass(probs))
        codec.observe(probs)
    bound = alpha + (abs(beta) + 1 + eta * alpha) / (eta * num_tokens)
    assert np.mean(dropped) <= bound
    assert np.mean(dropped) > alpha / 2  # the threshold really adapts (not all-kept)


def test_backtrack_returns_to_the_last_accepted_draft():
    rng = np.random.default_rng(5)
    batch = [torch.from_numpy(rng.dirichlet(np.full(30, 0.5))) for _ in range(4)]
    codec = CSQSCodec(alpha=0.05, eta=0.2, beta=0.05)
    codec.checkpoint()
    start = codec.state
    for probs in batch:
        codec.observe(probs)
    codec.backtrack(2)  # drafts 1-2 accepted, 3-4 discarded
    expected = start.updated(CSQSCodec(alpha=0.05, eta=0.2, beta=0.05).dropped_mass(batch[0]))
    expected = expected.updated(
        CSQSCodec(alpha=0.05, eta=0.2, beta=expected.beta).dropped_mass(batch[1])
    )
    assert codec.state == expected
    codec.observe(batch[2])
    codec.backtrack(0)  # everything since the backtrack (a new checkpoint) rejected
    assert codec.state == expected
    with pytest.raises(CodecError):
        codec.backtrack(1)
    for probs in batch:
        codec.observe(probs)
    after_all = codec.state
    codec.backtrack(4)  # all accepted: nothing changes
    assert codec.state == after_all


def test_stateless_codecs_ignore_the_state_hooks():
    codec = KSQSCodec(k=4, ell=10)
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
    before = codec.transmitted_probs(probs)
    codec.observe(probs)
    codec.checkpoint()
    codec.backtrack(3)
    assert torch.equal(codec.transmitted_probs(probs), before)


def test_drafts_are_sampled_from_the_sent_distribution():
    probs = torch.tensor([0.02, 0.5, 0.03, 0.25, 0.2])
    codec = KSQSCodec(k=3, ell=8)
    sent = codec.transmitted_probs(probs)  # [0, 4/8, 0, 2/8, 2/8]
    assert sent.tolist() == pytest.approx([0, 0.5, 0, 0.25, 0.25])
    generator = torch.Generator().manual_seed(0)
    num_draws = 8000
    counts = np.zeros(5)
    for _ in range(num_draws):
        result = draft(codec, probs, generator)
        counts[result.token] += 1
    assert counts[0] == counts[2] == 0  # never a token the receiver does not hold
    expected = sent.double().numpy() * num_draws
    chi2 = float((((counts - expected) ** 2)[expected > 0] / expected[expected > 0]).sum())
    assert chi2 < 13.8  # chi-square, 2 degrees of freedom, p = 0.001
    assert result.payload == codec.encode(probs)
    assert torch.equal(result.sent_probs, sent)


def test_draft_advances_the_c_sqs_threshold():
    codec = CSQSCodec(alpha=0.01, eta=0.5, beta=0.3)
    probs = torch.tensor([0.6, 0.2, 0.1, 0.1])
    result = draft(codec, probs, torch.Generator().manual_seed(1))
    assert result.token == 0 and result.sent_probs.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert codec.state.beta == pytest.approx(0.3 - 0.5 * (0.4 - 0.01))


def test_sqs_error_stays_within_dropped_plus_k_over_4_ell():
    rng = np.random.default_rng(7)
    for _ in range(30):
        probs = torch.from_numpy(rng.dirichlet(np.full(500, 0.05)))
        for codec in [KSQSCodec(k=int(rng.integers(1, 64)), ell=int(rng.integers(1, 200))),
                      CSQSCodec(beta=float(rng.uniform(0, 0.05)), ell=int(rng.integers(1, 200)))]:  # fmt: skip
            bound = codec.dropped_mass(probs) + codec.support(probs.numpy()).shape[0] / (
                4 * codec.ell
            )
            assert tv_distance(probs, codec.transmitted_probs(probs)) <= bound + 1e-6
