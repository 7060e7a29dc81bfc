import numpy as np
import pytest

from tandem.retrieval.embedder import HashingEmbedder
from tandem.retrieval.scorer import BM25Scorer, DynamicRelevance, EmbeddingScorer, terms

DOCS = [
    "SQLite in WAL mode with synchronous NORMAL; nightly backup with the sqlite3 backup command.",
    "Retry failed buoy requests with exponential backoff and full jitter, at most five attempts.",
    "The flatline check flags a buoy as suspect when the same value repeats for two hours.",
    "Deploy the wheel to the harbour Raspberry Pi and restart the systemd units.",
]
QUERY = "How does tidepool store its readings?"


def scorers():
    return [BM25Scorer(DOCS), EmbeddingScorer(HashingEmbedder(512), DOCS)]


def margins(scores: np.ndarray, doc: int) -> np.ndarray:
    """Score of `doc` minus each other document's score."""
    return scores[doc] - np.delete(scores, doc)


@pytest.mark.parametrize("scorer", scorers(), ids=lambda s: s.name)
@pytest.mark.parametrize("doc", range(len(DOCS)))
def test_repeating_a_documents_words_raises_it_relative_to_the_others(scorer, doc):
    base = scorer.score(QUERY)
    assert base.shape == (len(DOCS),) and base.dtype == np.float32
    context = f"{QUERY}\n{DOCS[doc]}"
    raised = scorer.score(context)
    assert np.all(margins(raised, doc) > margins(base, doc))
    assert int(np.argmax(raised)) == doc
    # more repetition, higher still (monotone in the evidence)
    more = scorer.score(f"{context} {DOCS[doc]}")
    assert margins(more, doc).min() >= margins(raised, doc).min() - 1e-5


@pytest.mark.parametrize("scorer", scorers(), ids=lambda s: s.name)
def test_scores_follow_the_tail_of_a_long_context(scorer):
    long_context = DOCS[1] + " filler" * 400 + " " + DOCS[3]
    assert int(np.argmax(scorer.score(long_context))) == 3  # DOCS[1] fell out of the window


def test_bm25_gives_zero_without_shared_terms_and_splits_snake_case():
    scorer = BM25Scorer(DOCS)
    assert np.all(scorer.score("zebra quartz") == 0.0)
    assert "retry_async" in terms("retry_async") and "async" in terms("retry_async")


def test_embedding_scorer_temperature_scales_logits():
    embedder = HashingEmbedder(256)
    hot = EmbeddingScorer(embedder, DOCS, temperature=1.0).score(QUERY)
    cold = EmbeddingScorer(embedder, DOCS, temperature=0.1).score(QUERY)
    np.testing.assert_allclose(cold, 10 * hot, rtol=1e-5)
    assert np.all(np.abs(hot) <= 1.0 + 1e-6)  # cosines


def test_dynamic_relevance_rescoring_interval():
    scorer = BM25Scorer(DOCS)
    dynamic = DynamicRelevance(scorer, QUERY, interval=4)
    first = dynamic.scores.copy()
    scores, fresh = dynamic.update("exponential backoff", 3)
    assert not fresh and np.array_equal(scores, first)
    scores, fresh = dynamic.update("exponential backoff jitter retry", 4)
    assert fresh and int(np.argmax(scores)) == 1
    _, fresh = dynamic.update("exponential backoff jitter retry more", 7)
    assert not fresh and dynamic.calls == 2
    with pytest.raises(ValueError):
        DynamicRelevance(scorer, QUERY, interval=0)


@pytest.mark.slow
@pytest.mark.parametrize("doc", range(len(DOCS)))
def test_minilm_scorer_is_monotone(doc):
    from tandem.retrieval.embedder import load_embedder

    scorer = EmbeddingScorer(load_embedder("all-minilm-l6-v2"), DOCS)
    base = scorer.score(QUERY)
    raised = scorer.score(f"{QUERY}\n{DOCS[doc]}")
    assert np.all(margins(raised, doc) > margins(base, doc))
    assert int(np.argmax(raised)) == doc
