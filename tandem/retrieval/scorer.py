"""Relevance scores of a retrieved set that follow the growing context (DRAGON's dynamic weights).

Words used here:
- *retrieved set*: the documents (chunks) retrieved once for the query; their KV caches are
  fixed, only their weights change during decoding.
- *context*: the query plus the text generated so far. Scorers look at its tail
  (`window_chars` characters) so the cost per call stays flat as the output grows.
- *relevance logits*: one score per document, `R(d, context)` in the paper; per-document
  weights are `softmax(R)` and a side's weight is `logsumexp(R)` (`tandem.sampling.aggregation`),
  so the scale matters: scores are divided by a `temperature`.
- *dynamic relevance*: re-scoring every `interval` generated tokens, keeping the last scores
  in between.

The paper re-ranks with a cross-encoder (ms-marco-MiniLM-L6-v2). No cross-encoder ships in an
installable offline package (checked: PyPI packages that bundle rerankers pickle them, or
download weights at run time), so two bi-encoder-era scorers are offered instead:
- `EmbeddingScorer`: cosine of each document's embedding with the embedding of the context
  tail (the same embedder as retrieval), divided by the temperature;
- `BM25Scorer`: Okapi BM25 of the context tail's terms against each document, IDF taken over
  the retrieved set, divided by the temperature. Cheap (no model call).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Protocol

import numpy as np

from tandem.retrieval.embedder import Embedder

TERM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")


class RelevanceScorer(Protocol):
    name: str

    def score(self, context: str) -> np.ndarray:  # [num_docs] relevance logits
        ...


def tail(text: str, window_chars: int) -> str:
    return text if len(text) <= window_chars else text[-window_chars:]


class EmbeddingScorer:
    """cosine(doc embedding, embedding of the context tail) / temperature."""

    name = "embedding"

    def __init__(
        self,
        embedder: Embedder,
        docs: list[str],
        *,
        doc_vectors: np.ndarray | None = None,  # [num_docs, dim] unit rows, if already known
        temperature: float = 0.1,
        window_chars: int = 1000,
    ):
        self.embedder = embedder
        self.doc_vectors = doc_vectors if doc_vectors is not None else embedder.embed(docs)
        assert self.doc_vectors.shape == (len(docs), embedder.dim), self.doc_vectors.shape
        self.temperature = temperature
        self.window_chars = window_chars

    def score(self, context: str) -> np.ndarray:  # [num_docs]
        context_vector = self.embedder.embed([tail(context, self.window_chars)])[0]  # [dim]
        return (self.doc_vectors @ context_vector / self.temperature).astype(np.float32)


def terms(text: str) -> list[str]:
    """Lower-cased identifier-like terms; a snake_case name also counts as its parts."""
    found = []
    for term in TERM.findall(text):
        lower = term.lower()
        found.append(lower)
        parts = [p for p in lower.split("_") if p]
        if len(parts) > 1:
            found.extend(parts)
    return found


class BM25Scorer:
    """Okapi BM25 of the context tail against each document, IDF over the retrieved set."""

    name = "bm25"

    def __init__(
        self,
        docs: list[str],
        *,
        k1: float = 1.2,
        b: float = 0.75,
        temperature: float = 1.0,
        window_chars: int = 1000,
    ):
        self.doc_terms = [Counter(terms(d)) for d in docs]
        self.doc_lengths = np.array([sum(c.values()) for c in self.doc_terms], dtype=np.float64)
        self.average_length = max(float(self.doc_lengths.mean()) if docs else 0.0, 1.0)
        frequency = Counter(t for c in self.doc_terms for t in c)
        n = len(docs)
        self.idf = {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t, f in frequency.items()}
        self.k1, self.b = k1, b
        self.temperature = temperature
        self.window_chars = window_chars

    def score(self, context: str) -> np.ndarray:  # [num_docs]
        query = Counter(t for t in terms(tail(context, self.window_chars)) if t in self.idf)
        norm = self.k1 * (
            1.0 - self.b + self.b * self.doc_lengths / self.average_length
        )  # [num_docs]
        scores = np.zeros(len(self.doc_terms), dtype=np.float64)
        for term, query_count in query.items():
            tf = np.array([c.get(term, 0) for c in self.doc_terms], dtype=np.float64)  # [num_docs]
            scores += query_count * self.idf[term] * tf * (self.k1 + 1.0) / (tf + norm)
        return (scores / self.temperature).astype(np.float32)


class DynamicRelevance:
    """The retrieved set's relevance logits, refreshed every `interval` generated tokens."""

    def __init__(self, scorer: RelevanceScorer, query: str, *, interval: int = 4):
        if interval < 1:
            raise ValueError(f"interval must be >= 1 (got {interval})")
        self.scorer = scorer
        self.query = query
        self.interval = interval
        self.scores = scorer.score(query)  # [num_docs]
        self.scored_at = 0  # generated tokens when last scored
        self.calls = 1

    def update(self, generated_text: str, num_generated: int) -> tuple[np.ndarray, bool]:
        """(scores, whether they were recomputed) after `num_generated` output tokens."""
        if num_generated - self.scored_at < self.interval:
            return self.scores, False
        self.scores = self.scorer.score(f"{self.query}\n{generated_text}")
        self.scored_at = num_generated
        self.calls += 1
        return self.scores, True
