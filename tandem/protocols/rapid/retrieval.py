"""The RAG drafter's context C^S: chunk the long context, embed, keep the most similar chunks.

Words used here:
- *chunk*: a span of C of at most `chunk_tokens` tokens of the generating model's tokenizer
  (`tandem.retrieval.chunking`), the unit that is kept or dropped.
- *piece*: a sub-span of a chunk of at most `piece_tokens` tokens. all-MiniLM-L6-v2 reads only
  256 word pieces, about half of a 512-token chunk, so a chunk's *score* is the largest cosine
  similarity between the query and any of its pieces (the paper's BGE-M3 reads 8K tokens and
  embeds the chunk whole).
- *budget*: the most tokens C^S may hold (see `RetrievalConfig`).
- *selection*: chunks with score >= threshold, best first, each taken if it still fits in the
  budget (`tandem.retrieval.search.select_context`); if fewer than `min_chunks` pass the
  threshold, the best remaining chunks that fit are added. C^S is the selection in document
  order, joined by blank lines.

Bounds (tested): retrieved tokens <= budget; and when the chunks passing the threshold hold
more than the budget, retrieved tokens > budget - chunk_tokens.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from tandem.models.base import Tokenizer
from tandem.protocols.rapid.config import RetrievalConfig
from tandem.retrieval.chunking import Chunk, ChunkParams, chunk_text
from tandem.retrieval.embedder import Embedder
from tandem.retrieval.search import select_context


@dataclass(frozen=True, kw_only=True)
class RetrievedContext:
    text: str  # C^S
    chunks: tuple[Chunk, ...]  # the selection, in document order
    scores: tuple[float, ...]  # score of each selected chunk
    all_scores: tuple[float, ...]  # score of every chunk of C, in document order
    context_tokens: int  # |C|
    budget: int
    retrieve_s: float  # chunking + embedding + selection time

    @property
    def tokens(self) -> int:
        return sum(c.n_tokens for c in self.chunks)


def retrieval_budget(context_tokens: int, config: RetrievalConfig) -> int:
    """min(|C|, max(min_tokens, ceil(|C| / compression)))."""
    return min(
        context_tokens, max(config.min_tokens, math.ceil(context_tokens / config.compression))
    )


def select_chunks(
    chunks: list[Chunk], scores: np.ndarray, *, budget: int, config: RetrievalConfig
) -> list[Chunk]:
    """The selection (see module doc); scores [len(chunks)] float. Document order."""
    order = np.argsort(-scores, kind="stable")
    hits = [(chunks[i], float(scores[i])) for i in order]
    chosen = select_context(hits, max_tokens=budget, min_score=config.threshold)
    used = sum(c.n_tokens for c in chosen)
    for chunk, _ in hits:  # the min_chunks fallback, below the threshold
        if len(chosen) >= config.min_chunks:
            break
        if chunk not in chosen and used + chunk.n_tokens <= budget:
            chosen.append(chunk)
            used += chunk.n_tokens
    return sorted(chosen, key=lambda c: c.position)


def chunk_scores(
    chunks: list[Chunk], query: str, tokenizer: Tokenizer, embedder: Embedder, piece_tokens: int
) -> np.ndarray:  # [len(chunks)] cosine of the best piece of each chunk
    params = ChunkParams(chunk_tokens=piece_tokens)
    owner, texts = [], []
    for index, chunk in enumerate(chunks):
        pieces = chunk_text(chunk.text, tokenizer, params) or [chunk]
        owner.extend([index] * len(pieces))
        texts.extend(p.text for p in pieces)
    vectors = embedder.embed([query, *texts])  # [1 + pieces, dim] unit rows
    cosines = vectors[1:] @ vectors[0]  # [pieces]
    scores = np.full(len(chunks), -1.0)
    np.maximum.at(scores, np.asarray(owner, dtype=np.int64), cosines.astype(np.float64))
    return scores


def retrieve(
    context: str,
    query: str,
    tokenizer: Tokenizer,
    embedder: Embedder,
    config: RetrievalConfig | None = None,
) -> RetrievedContext:
    """C^S for `query` out of `context` (see module doc)."""
    config = config or RetrievalConfig()
    start = time.perf_counter()
    chunks = chunk_text(context, tokenizer, ChunkParams(chunk_tokens=config.chunk_tokens))
    context_tokens = len(tokenizer.encode(context))
    budget = retrieval_budget(context_tokens, config)
    scores = (
        chunk_scores(chunks, query, tokenizer, embedder, config.piece_tokens)
        if chunks
        else np.zeros(0)
    )
    chosen = select_chunks(chunks, scores, budget=budget, config=config)
    by_position = {c.position: float(scores[c.position]) for c in chunks}
    return RetrievedContext(
        text="\n\n".join(c.text for c in chosen),
        chunks=tuple(chosen),
        scores=tuple(by_position[c.position] for c in chosen),
        all_scores=tuple(float(s) for s in scores),
        context_tokens=context_tokens,
        budget=budget,
        retrieve_s=time.perf_counter() - start,
    )
