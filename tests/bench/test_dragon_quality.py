"""Fig. 5 perplexity scoring (benchmarks.dragon_quality) on a tiny model and tiny corpus."""

from __future__ import annotations

import math

import pytest
import torch
from protocols.dragon.conftest import CLOUD_TEXTS, DEVICE_TEXTS

from benchmarks.dragon_quality import (
    METHODS,
    Doc,
    Passage,
    QualityConfig,
    score_passage,
    side_docs,
    summarize,
    union_order,
)

PROMPT = "def retry(call, attempts=5):\n    for attempt in range(attempts):\n        try:\n"
CONFIG = QualityConfig(ks=(0, 1, 2), doc_tokens=48, relevance_temperature=0.1)


def docs(texts, side, scores):
    return [Doc(f"{side}{i}", t, s) for i, (t, s) in enumerate(zip(texts, scores, strict=True))]


@pytest.fixture(scope="module")
def passage(tiny_lm):
    ids = tiny_lm.tokenizer.encode(PROMPT)
    return Passage("retry", tuple(ids[:40]), tuple(ids[40:64]))


def continuation_logprobs(lm, context, passage):
    """Log-probs of the scored tokens from one plain `lm.score` call, computed by hand."""
    ids = list(context) + list(passage.prefix_ids) + list(passage.scored_ids)
    logp = torch.log_softmax(lm.score(ids).double(), dim=-1)
    start = len(context) + len(passage.prefix_ids)
    return torch.stack([logp[i - 1, ids[i]] for i in range(start, len(ids))])


def doc_context(lm, doc, doc_tokens):
    return lm.tokenizer.encode(doc.text)[:doc_tokens] + lm.tokenizer.encode("\n\n")


def test_dragon_with_one_doc_per_side_and_equal_weights_is_the_half_half_mixture(tiny_lm, passage):
    device, cloud = docs(DEVICE_TEXTS[:1], "d", [0.4]), docs(CLOUD_TEXTS[:1], "c", [0.4])
    result = score_passage(tiny_lm, passage, {0: ([], []), 1: (device, cloud)}, CONFIG)
    p1 = continuation_logprobs(tiny_lm, doc_context(tiny_lm, device[0], 48), passage).exp()
    p2 = continuation_logprobs(tiny_lm, doc_context(tiny_lm, cloud[0], 48), passage).exp()
    wanted = float(-(0.5 * p1 + 0.5 * p2).log().sum())
    assert result.nll["dragon"][1] == pytest.approx(wanted, rel=1e-6)
    # unequal scores move the weights: no longer the half-half mixture
    heavier = docs(DEVICE_TEXTS[:1], "d", [0.9])
    other = score_passage(tiny_lm, passage, {1: (heavier, cloud)}, CONFIG)
    eta = 1 / (1 + math.exp((0.4 - 0.9) / 0.1))
    wanted = float(-(eta * p1 + (1 - eta) * p2).log().sum())
    assert other.nll["dragon"][1] == pytest.approx(wanted, rel=1e-6)


def test_k_zero_is_plain_perplexity_for_every_method(tiny_lm, passage):
    result = score_passage(tiny_lm, passage, {0: ([], [])}, CONFIG)
    plain = float(-continuation_logprobs(tiny_lm, [], passage).sum())
    for method in METHODS:
        assert result.nll[method][0] == pytest.approx(plain, rel=1e-6)


def test_concatenated_contexts_reuse_kv_but_equal_a_fresh_score(tiny_lm, passage):
    device = docs(DEVICE_TEXTS, "d", [0.9, 0.5, 0.3])
    cloud = docs(CLOUD_TEXTS, "c", [0.8, 0.6, 0.2])
    sides = {0: ([], []), 1: (device[:1], cloud[:1]), 2: (device[:2], cloud[:2])}
    result = score_passage(tiny_lm, passage, sides, CONFIG)
    for k in (1, 2):
        for method, chosen in (
            ("crcg-device", device[:k]),
            ("crcg-cloud", cloud[:k]),
            ("drcg", union_order(union_order([], device[:1] + cloud[:1]), device[:k] + cloud[:k])),
        ):
            context = [t for d in chosen for t in doc_context(tiny_lm, d, 48)]
            wanted = float(-continuation_logprobs(tiny_lm, context, passage).sum())
            assert result.nll[method][k] == pytest.approx(wanted, rel=1e-4), (method, k)


def test_all_methods_give_finite_positive_perplexities(tiny_lm, passage):
    device = docs(DEVICE_TEXTS, "d", [0.9, 0.5, 0.3])
    cloud = docs(CLOUD_TEXTS, "c", [0.8, 0.6, 0.2])
    ranked = sorted(device + cloud, key=lambda d: -d.score)
    sides = {k: side_docs(ranked, k, "rank", None) for k in CONFIG.ks}
    assert sides[1] == ([ranked[1]], [ranked[0]])  # the paper's split: cloud holds the top half
    summary = summarize([score_passage(tiny_lm, passage, sides, CONFIG)], CONFIG.ks)
    for method in METHODS:
        for k in CONFIG.ks:
            value = summary["perplexity"][method][k]
            assert math.isfinite(value) and value > 0, (method, k, value)
    assert summary["perplexity"]["drcg"][1] == pytest.approx(summary["perplexity"]["crcg-cloud"][2])


def test_union_order_keeps_earlier_documents_first():
    a, b, c = Doc("a", "", 0.1), Doc("b", "", 0.9), Doc("c", "", 0.5)
    assert [d.doc_id for d in union_order([a], [c, b, a])] == ["a", "b", "c"]
    assert [d.doc_id for d in union_order([a, b], [b, c])] == ["b", "c"]


def test_one_row_per_side_mixes_the_sides_concatenated_rows(tiny_lm, passage):
    device = docs(DEVICE_TEXTS[:2], "d", [0.9, 0.5])
    cloud = docs(CLOUD_TEXTS[:2], "c", [0.8, 0.6])
    sides = {0: ([], []), 1: (device[:1], cloud[:1]), 2: (device, cloud)}
    result = score_passage(tiny_lm, passage, sides, CONFIG)
    # one document per side: the joined row is that document's row, so it is DRAGON's law
    assert result.nll["dragon-side"][1] == pytest.approx(result.nll["dragon"][1], rel=1e-4)

    def row(chosen):
        context = [t for d in chosen for t in doc_context(tiny_lm, d, 48)]
        return continuation_logprobs(tiny_lm, context, passage).exp()

    def h(chosen):  # the side's weight: logsumexp of its relevance logits
        return math.log(sum(math.exp(d.score / 0.1) for d in chosen))

    eta = 1 / (1 + math.exp(h(cloud) - h(device)))
    wanted = float(-(eta * row(device) + (1 - eta) * row(cloud)).log().sum())
    assert result.nll["dragon-side"][2] == pytest.approx(wanted, rel=1e-4)
    assert result.nll["dragon-side"][2] != pytest.approx(result.nll["dragon"][2], rel=1e-4)
    assert result.nll["dragon-side"][0] == pytest.approx(result.nll["none"][0])
