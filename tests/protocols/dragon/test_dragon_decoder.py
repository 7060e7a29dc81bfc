"""Per-document decoder: rollback by sync, cancellation, doc-KV reuse, prefix-pure relevance."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from tandem.models.base import Cancelled
from tandem.protocols.dragon import DragonConfig
from tandem.protocols.dragon.decoder import RelevanceSchedule, joined_side_law, side_law
from tandem.protocols.dragon.knowledge import build_decoder

from .conftest import QUESTION

ATOL = 1e-5


def fresh(lm, knowledge, **overrides):
    decoder, docs = build_decoder(lm, knowledge, QUESTION, DragonConfig(**overrides))
    decoder.prefill()
    return decoder, docs


def test_rows_are_one_per_retrieved_document(tiny_lm, corpora):
    decoder, docs = fresh(tiny_lm, corpora[0], docs_per_side=2)
    assert len(docs) == 2 and decoder.num_rows == 2 and decoder.state.batch == 2
    bare, none = fresh(tiny_lm, corpora[0], docs_per_side=0)
    assert none == [] and bare.num_rows == 1


def test_sync_rolls_back_to_the_same_law_as_a_fresh_decode(tiny_lm, corpora):
    decoder, _ = fresh(tiny_lm, corpora[0])
    decoder.sync([65, 66, 67])
    wanted = decoder.law()
    decoder.sync([65, 90])  # a rejection at position 1: crop and decode the target token
    assert decoder.tokens == [65, 90]
    decoder.sync([65, 66, 67])
    assert torch.allclose(decoder.law().probs, wanted.probs, atol=ATOL)
    decoder.sync([])
    other, _ = fresh(tiny_lm, corpora[0])
    assert torch.allclose(decoder.law().probs, other.law().probs, atol=ATOL)
    other.sync([65, 66, 67])
    assert torch.allclose(other.law().probs, wanted.probs, atol=ATOL)
    decoder.sync([65, 66])  # a strict prefix of what is held (logits recomputed)
    other.sync([65, 66])
    assert torch.allclose(decoder.law().probs, other.law().probs, atol=ATOL)


def test_a_rejection_decodes_only_the_target_token(tiny_lm, corpora, monkeypatch):
    """Drafted one token a time (the live worker's way), a rejection crops the rejected
    drafts and decodes the target token alone: not the cut's last token again beside it (a
    two-token block costs llama.cpp's CPU kernels ~3.5 single steps)."""
    decoder, _ = fresh(tiny_lm, corpora[0])
    for n in range(1, 4):
        decoder.sync([65, 66, 67][:n])
    fed = []
    decode = decoder.lm.decode

    def counting(state, ids, cancel=None):
        fed.append(len(ids[0]))
        return decode(state, ids, cancel=cancel)

    monkeypatch.setattr(decoder.lm, "decode", counting)
    assert decoder.sync([65, 90]) == 1
    assert fed == [1] and decoder.tokens == [65, 90]
    monkeypatch.undo()
    other, _ = fresh(tiny_lm, corpora[0])
    other.sync([65])
    other.sync([65, 90])
    assert torch.allclose(decoder.law().probs, other.law().probs, atol=ATOL)


def test_cancelled_sync_leaves_the_decoder_unchanged(tiny_lm, corpora):
    decoder, _ = fresh(tiny_lm, corpora[0])
    decoder.sync([70, 71])
    before = decoder.law().probs.clone()
    event = threading.Event()
    event.set()
    with pytest.raises(Cancelled):
        decoder.sync([70, 71, 72, 73], cancel=event)
    assert decoder.tokens == [70, 71]
    assert torch.equal(decoder.law().probs, before)


def test_document_kv_from_the_store_gives_the_same_law(tiny_lm, corpora, tmp_path):
    from tandem.protocols.dragon import Knowledge
    from tandem.retrieval.kvstore import DocKVStore

    plain, _ = fresh(tiny_lm, corpora[0])
    stored = Knowledge(retriever=corpora[0].retriever, kv_store=DocKVStore(tmp_path, tiny_lm))
    first, _ = fresh(tiny_lm, stored)
    second, _ = fresh(tiny_lm, stored)
    assert first.kv_hits == 0 and second.kv_hits == second.num_rows
    for decoder in (first, second):
        assert torch.allclose(decoder.law().probs, plain.law().probs, atol=ATOL)
        decoder.sync([80, 81])
    plain.sync([80, 81])
    assert torch.allclose(second.law().probs, plain.law().probs, atol=ATOL)


class CountingScorer:
    name = "counting"

    def __init__(self):
        self.texts = []

    def score(self, context: str) -> np.ndarray:
        self.texts.append(context)
        return np.array([len(context) % 7, len(context) % 5], dtype=np.float32)


def test_relevance_is_a_pure_function_of_the_prefix():
    scorer = CountingScorer()
    schedule = RelevanceSchedule(
        num_docs=2, query="q", detokenize=lambda ids: "x" * sum(ids), scorer=scorer, interval=2
    )
    first = schedule.scores([1, 1, 1])  # boundary 2 scored on tokens [1, 1]
    assert scorer.texts[-1] == "q\nxx"
    assert np.array_equal(schedule.scores([1, 1]), first) and len(scorer.texts) == 1
    rolled = schedule.scores([3, 3])  # same boundary, another prefix: re-scored, not reused
    assert scorer.texts[-1] == "q\nxxxxxx" and not np.array_equal(rolled, first)
    assert np.array_equal(schedule.scores([1]), np.array([1, 1]))  # boundary 0: the query alone
    assert scorer.texts[-1] == "q"


def test_prefetched_relevance_is_the_same_scores_computed_on_the_scorer_thread():
    import threading

    class ThreadScorer(CountingScorer):
        def score(self, context: str) -> np.ndarray:
            self.threads = [*getattr(self, "threads", []), threading.current_thread().name]
            return super().score(context)

    def schedule(scorer, background):
        return RelevanceSchedule(
            num_docs=2, query="q", detokenize=lambda ids: "x" * sum(ids), scorer=scorer,
            interval=2, background=background,
        )  # fmt: skip

    inline, ahead = schedule(CountingScorer(), False), schedule(ThreadScorer(), True)
    for tokens in ([], [1], [1, 2], [1, 2, 3], [3, 3], [3, 3, 1, 1]):
        ahead.prefetch(tokens)
        assert np.array_equal(ahead.scores(tokens), inline.scores(tokens))
    assert ahead.scorer.texts == inline.scorer.texts  # each prefix scored once, in order
    assert set(ahead.scorer.threads) == {"dragon-relevance_0"}
    inline.prefetch([5, 5])  # without background scoring, prefetch does nothing
    assert inline.scorer.texts[-1] == "q\nxxxxxxxx"


def test_side_law_is_the_relevance_weighted_mixture():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    scores = np.array([1.0, 0.0], dtype=np.float32)
    law = side_law(logits, scores, temperature=0.0)
    weights = torch.softmax(torch.tensor([1.0, 0.0]), 0)
    expected = weights @ torch.softmax(logits, -1)
    assert torch.allclose(law.probs, expected)
    assert law.logweight == pytest.approx(float(torch.logsumexp(torch.tensor([1.0, 0.0]), 0)))
    hot = side_law(logits, scores, temperature=0.5)
    assert torch.allclose(hot.probs, weights @ torch.softmax(logits / 0.5, -1))


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_one_row_side_law_is_the_mixture_bit_for_bit(temperature):
    """One row skips the mixture (its weight is exactly 1) and x / 1 skips the division:
    the same bits as the general form, so aggregation and replays see the same law."""
    from tandem.sampling.aggregation import document_mixture

    logits = torch.randn(1, 5000, generator=torch.Generator().manual_seed(3)) * 4
    scores = np.array([0.37], dtype=np.float32)
    law = side_law(logits, scores, temperature=temperature)
    scale = temperature if temperature > 0 else 1.0
    general = document_mixture(torch.softmax(logits / scale, -1), torch.tensor([0.37]))
    assert torch.equal(law.probs, general)


def test_one_row_laws_say_they_are_a_float32_softmax():
    """A one-row law (one row per side, or one document) is marked a softmax row, which lets a
    sparse codec skip summing it; a mixture of documents is not marked."""
    logits = torch.randn(2, 3000, generator=torch.Generator().manual_seed(4)) * 3
    for temperature in (0.0, 0.7):
        one = side_law(logits[:1], np.array([0.2], dtype=np.float32), temperature)
        joined = joined_side_law(logits[:1], np.array([0.2, -1.0], dtype=np.float32), temperature)
        assert one.softmax and joined.softmax
    mixed = side_law(logits, np.array([0.2, -1.0], dtype=np.float32), temperature=0.0)
    assert not mixed.softmax
