"""Nearest-chunk search: a faiss index over unit vectors plus a way to fetch chunks by row.

Words used here:
- *flat*: exact inner-product search (`IndexFlatIP`); vectors are unit, so scores are cosine
  similarities. The default.
- *hnsw*: approximate search (`IndexHNSWFlat`, inner-product metric) for large corpora; its
  recall@10 against flat is measured in `benchmarks.retrieval`.
- *hit*: `(chunk, score)`, best first.
- *context selection* (RAPID §3.1): keep hits above a similarity threshold, within a token
  budget, and put them back in document order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from tandem.errors import TandemError
from tandem.retrieval.chunking import Chunk
from tandem.retrieval.embedder import Embedder

INDEX_KINDS = ("flat", "hnsw")
HNSW_NEIGHBORS = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 64

Hit = tuple[Chunk, float]


class ChunkLookup(Protocol):
    def get(self, rows: list[int]) -> list[Chunk]: ...


class ListLookup:
    """Chunks held in memory (an index built on the fly, e.g. over one long context)."""

    def __init__(self, chunks: Sequence[Chunk]):
        self.chunks = list(chunks)

    def get(self, rows: list[int]) -> list[Chunk]:
        return [self.chunks[r] for r in rows]


def make_faiss_index(kind: str, vectors: np.ndarray) -> Any:  # vectors: [n, dim] unit rows
    import faiss

    if kind not in INDEX_KINDS:
        raise TandemError(f"unknown index kind '{kind}'; use one of {', '.join(INDEX_KINDS)}")
    dim = int(vectors.shape[1])
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    else:
        index = faiss.IndexHNSWFlat(dim, HNSW_NEIGHBORS, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = HNSW_EF_SEARCH
    if len(vectors):
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


def index_vectors(index: Any) -> np.ndarray:  # [ntotal, dim]
    """All stored vectors, by row (flat and HNSW-flat keep them exactly)."""
    if index.ntotal == 0:
        return np.zeros((0, index.d), dtype=np.float32)
    return index.reconstruct_n(0, index.ntotal)


class Retriever:
    """`search(query, k) -> [(chunk, score)]` over an embedded set of chunks."""

    def __init__(
        self, *, index: Any, lookup: ChunkLookup, embedder: Embedder, manifest: Any = None
    ):
        if index.d != embedder.dim:
            raise TandemError(
                f"index holds {index.d}-dim vectors but embedder '{embedder.name}' makes {embedder.dim}"
            )
        self.index = index
        self.lookup = lookup
        self.embedder = embedder
        self.manifest = manifest  # an on-disk index's `Manifest`; None in memory

    @classmethod
    def from_chunks(
        cls, chunks: Sequence[Chunk], embedder: Embedder, *, kind: str = "flat"
    ) -> Retriever:
        """An in-memory retriever (nothing written to disk)."""
        vectors = (
            embedder.embed([c.text for c in chunks]) if chunks else np.zeros((0, embedder.dim))
        )
        return cls(
            index=make_faiss_index(kind, vectors), lookup=ListLookup(chunks), embedder=embedder
        )

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def search_vectors(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores [m, k'], rows [m, k']) for query vectors [m, dim]; k' = min(k, len(self))."""
        if not len(self):
            raise TandemError("the index is empty")
        if k < 1:
            raise TandemError(f"k must be at least 1 (got {k})")
        k = min(int(k), len(self))
        scores, rows = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        return scores, rows

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """The k chunks most similar to `query`, best first, with cosine scores."""
        return self.search_many([query], k)[0]

    def search_many(self, queries: list[str], k: int = 5) -> list[list[Hit]]:
        scores, rows = self.search_vectors(self.embedder.embed(queries), k)
        results = []
        for score_row, id_row in zip(scores, rows, strict=True):
            keep = [(int(r), float(s)) for r, s in zip(id_row, score_row, strict=True) if r >= 0]
            chunks = self.lookup.get([r for r, _ in keep])
            results.append([(chunk, score) for chunk, (_, score) in zip(chunks, keep, strict=True)])
        return results

    def vectors(self, rows: list[int]) -> np.ndarray:  # [len(rows), dim]
        return (
            np.stack([self.index.reconstruct(int(r)) for r in rows])
            if rows
            else np.zeros((0, self.index.d))
        )


def select_context(
    hits: list[Hit], *, max_tokens: int, min_score: float = 0.3, in_document_order: bool = True
) -> list[Chunk]:
    """RAPID's RAG context: hits with score >= min_score, best first, until max_tokens.

    The chosen chunks are returned in document order (doc_id, position) when asked, so the
    drafter reads them as they stood in the long context.
    """
    chosen, used = [], 0
    for chunk, score in hits:
        if score < min_score or used + chunk.n_tokens > max_tokens:
            continue
        chosen.append(chunk)
        used += chunk.n_tokens
    if in_document_order:
        chosen.sort(key=lambda c: (c.doc_id, c.position))
    return chosen
