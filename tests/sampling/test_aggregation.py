from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tandem.sampling import aggregation


def law(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_side_logweight_is_logsumexp_of_scores():
    scores = law(0.5, -1.0, 2.0)
    expected = math.log(sum(math.exp(s) for s in scores.tolist()))
    assert abs(float(aggregation.side_logweight(scores)) - expected) < 1e-12
    assert float(aggregation.side_logweight(torch.zeros(0))) == -math.inf


def test_side_weights_are_softmax_of_the_pair():
    eta_l, eta_r = aggregation.side_weights(math.log(3.0), math.log(1.0))
    assert abs(float(eta_l) - 0.75) < 1e-12 and abs(float(eta_r) - 0.25) < 1e-12
    eta_l, eta_r = aggregation.side_weights(torch.tensor([0.0, 5.0]), -math.inf)
    assert eta_l.tolist() == [1.0, 1.0] and eta_r.tolist() == [0.0, 0.0]
    with pytest.raises(AssertionError):
        aggregation.side_weights(-math.inf, -math.inf)


def test_side_weights_match_paper_ratio_of_summed_exp_scores():
    local_scores, remote_scores = law(1.0, 0.2), law(-0.3, 0.4, 0.9)
    h_l = aggregation.side_logweight(local_scores)
    h_r = aggregation.side_logweight(remote_scores)
    eta_l, _ = aggregation.side_weights(h_l, h_r)
    sum_l, sum_r = local_scores.exp().sum(), remote_scores.exp().sum()
    assert abs(float(eta_l) - float(sum_l / (sum_l + sum_r))) < 1e-12


def test_document_mixture_weights_documents_by_softmax_of_scores():
    docs = torch.stack([law(1.0, 0.0, 0.0), law(0.0, 0.5, 0.5)])
    assert torch.allclose(aggregation.document_mixture(docs, law(0.0, 0.0)), law(0.5, 0.25, 0.25))
    mixed = aggregation.document_mixture(docs, law(math.log(3.0), 0.0))
    assert torch.allclose(mixed, law(0.75, 0.125, 0.125))


def test_mixture_of_whole_corpus_equals_per_document_mixture_of_both_sides():
    """Law of total probability: per-side mixtures weighted by eta = one mixture of all docs."""
    generator = torch.Generator().manual_seed(0)
    local_docs = torch.softmax(torch.randn(3, 6, generator=generator, dtype=torch.float64), -1)
    remote_docs = torch.softmax(torch.randn(2, 6, generator=generator, dtype=torch.float64), -1)
    local_scores = torch.randn(3, generator=generator, dtype=torch.float64)
    remote_scores = torch.randn(2, generator=generator, dtype=torch.float64)
    combined = aggregation.mixture(
        aggregation.document_mixture(local_docs, local_scores),
        aggregation.document_mixture(remote_docs, remote_scores),
        aggregation.side_logweight(local_scores),
        aggregation.side_logweight(remote_scores),
    )
    everything = aggregation.document_mixture(
        torch.cat([local_docs, remote_docs]), torch.cat([local_scores, remote_scores])
    )
    assert torch.allclose(combined, everything, atol=1e-12)


def test_resample_transition_rows_are_laws_and_identity_for_equal_sides():
    own, other = law(0.6, 0.3, 0.1, 0.0), law(0.1, 0.3, 0.2, 0.4)
    kernel = aggregation.resample_transition(own, other, 0.7)
    assert torch.allclose(kernel.sum(-1), torch.ones(4, dtype=torch.float64))
    assert float(kernel[0, 0]) == pytest.approx(1 - 0.7 * (1 - 0.1 / 0.6))
    assert torch.allclose(
        aggregation.resample_transition(own, own, 0.7), torch.eye(4, dtype=torch.float64)
    )


def test_acceptance_rates_edges():
    one_hot = law(0.0, 1.0, 0.0)
    assert aggregation.acceptance_rates(one_hot, one_hot, 0.0, 0.0) == pytest.approx((1.0, 1.0))
    side = law(0.2, 0.3, 0.5)
    square = float((side * side).sum())
    assert aggregation.acceptance_rates(side, side, 1.0, 0.0) == pytest.approx(
        (0.5 + 0.5 * square, 0.5 + 0.5 * square)
    )


def test_equal_drafts_from_equal_one_hot_laws_are_both_accepted():
    one_hot = law(0.0, 0.0, 1.0)
    for seed in range(10):
        out = aggregation.speculative_aggregate(
            2, one_hot, 2, one_hot, 0.3, 0.1, torch.Generator().manual_seed(seed)
        )
        assert out == (2, True, True)


def test_float32_batch_and_shape_checks():
    generator = torch.Generator().manual_seed(1)
    local = torch.softmax(torch.randn(16, 7, generator=generator), -1)
    remote = torch.softmax(torch.randn(16, 7, generator=generator), -1)
    tokens = torch.randint(7, (16,), generator=generator)
    out = aggregation.speculative_aggregate_batch(
        tokens, local, tokens.flip(0), remote, torch.zeros(16), torch.ones(16), generator
    )
    assert out.token.shape == (16,) and out.local_accepted.dtype == torch.bool
    assert torch.equal(out.local_accepted, out.token == tokens)
    with pytest.raises(AssertionError):
        aggregation.speculative_aggregate_batch(
            tokens, local, tokens, remote[:, :6], 0.0, 0.0, generator
        )


def sparse_law(vocab: int, ids: list[int], values: list[float]) -> torch.Tensor:
    probs = torch.zeros(vocab, dtype=torch.float32)
    probs[torch.tensor(ids)] = torch.tensor(values, dtype=torch.float32)
    return probs / probs.sum()


def test_greedy_aggregate_on_the_supports_equals_the_dense_argmax():
    """Random sparse laws (as a sparse codec sends them) and random side weights: the token on
    the union of the supports is the dense mixture's argmax, ties included."""
    generator = torch.Generator().manual_seed(0)
    vocab = 1000
    for trial in range(300):
        sides = []
        for _ in range(2):
            kept = int(torch.randint(1, 6, (1,), generator=generator))
            ids = torch.randperm(vocab, generator=generator)[:kept].tolist()
            # coarse values: many exact ties within and across the sides
            values = torch.randint(1, 4, (kept,), generator=generator).float().tolist()
            sides.append((sparse_law(vocab, ids, values), torch.tensor(ids)))
        (local, local_ids), (remote, remote_ids) = sides
        lw = [0.0, float(torch.randn(1, generator=generator))] if trial % 3 else [0.0, 0.0]
        dense = int(aggregation.mixture(local, remote, *lw).argmax())
        support = torch.cat([local_ids, remote_ids])
        assert aggregation.greedy_aggregate(local, remote, *lw) == dense
        assert aggregation.greedy_aggregate(local, remote, *lw, support=support) == dense
        token, _, _ = aggregation.speculative_aggregate(
            0, local, 0, remote, *lw, torch.Generator(), greedy=True
        )
        assert token == dense


def test_greedy_aggregate_breaks_a_tie_to_the_lowest_id_in_any_support_order():
    local = sparse_law(10, [7, 2], [1.0, 1.0])
    remote = sparse_law(10, [7, 2], [1.0, 1.0])
    for support in ([7, 2, 7, 2], [2, 7], [7, 2]):
        assert aggregation.greedy_aggregate(local, remote, 0.0, 0.0, torch.tensor(support)) == 2


def test_greedy_aggregate_kept_equals_the_dense_argmax():
    """Two laws in the kept form (ids and values, as a sparse codec's receiver holds them):
    the same token as the dense mixture's argmax, ties across and within sides included."""
    generator = torch.Generator().manual_seed(1)
    vocab = 1000
    for trial in range(300):
        kept, dense = [], []
        for _ in range(2):
            count = int(torch.randint(1, 6, (1,), generator=generator))
            ids = torch.randperm(vocab, generator=generator)[:count]
            if trial % 4 == 0:  # overlapping supports
                ids[0] = 5
            values = torch.randint(1, 4, (count,), generator=generator).float()
            values = values / values.sum()
            dense.append(sparse_law(vocab, ids.tolist(), values.tolist()))
            kept.append((ids.numpy(), dense[-1][ids].numpy()))
        lw = [0.0, float(torch.randn(1, generator=generator))] if trial % 3 else [0.0, 0.0]
        want = int(aggregation.mixture(dense[0], dense[1], *lw).argmax())
        assert aggregation.greedy_aggregate_kept(kept[0], kept[1], *lw) == want


def test_greedy_aggregate_kept_breaks_a_tie_to_the_lowest_id():
    one = (np.array([7, 2]), np.array([0.5, 0.5], dtype=np.float32))
    assert aggregation.greedy_aggregate_kept(one, one, 0.0, 0.0) == 2
    device, cloud = (np.array([9]), np.ones(1, np.float32)), (np.array([4]), np.ones(1, np.float32))
    assert aggregation.greedy_aggregate_kept(device, cloud, 0.0, 0.0) == 4  # equal weights
    assert aggregation.greedy_aggregate_kept(device, cloud, 1.0, 0.0) == 9  # the heavier side
