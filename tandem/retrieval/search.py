"""Nearest-chunk search: a faiss index over unit vectors plus a way to fetch chunks by row.

Words used here:
- *flat*: exact inner-product search (`IndexFlatIP`); vectors are unit, so scores are cosine
  similarities. The default.
- *hnsw*: approximate search (`IndexHNSWFlat`, inner-product metric) for large corpora; its
  recall@10 against flat is measured in `benchmarks.retrieval`.
- *hit*: `(chunk, score)`, best first.
- *context selection* (RAPID §3.1): keep hits above a similarity threshold, within a token
  budget, and put them back in document order.
- *joined context* (`joined_in_document_order`): several retrieved chunks as one text for one
  prompt, each document's chunks in the order they stand in it, under a line naming the
  document, with `GAP` where chunks between two retrieved ones were left out.
- *small gap*: at most `FILL_GAP` chunks of one document left out between two of its retrieved
  chunks; a joined context puts them back (`small_gaps`, `Retriever.between`), so a function
  or a paragraph split across three chunks, of which retrieval found the outer two, reads
  whole (the private-spec README question "Which base delay ...?" got `backoff.py#0` and
  `#2`, and the answer invented the delay that stands in `#1`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from tandem.errors import TandemError
from tandem.retrieval.chunking import Chunk
from tandem.retrieval.embedder import Embedder

INDEX_KINDS = ("flat", "hnsw")
HNSW_NEIGHBORS = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 64

Hit = tuple[Chunk, float]
GAP = "..."  # the line that stands for the chunks left out between two retrieved ones
FILL_GAP = 1  # a joined context puts back runs of at most this many left-out chunks


class ChunkLookup(Protocol):
    def get(self, rows: list[int]) -> list[Chunk]: ...

    def between(self, doc_id: str, after: int, before: int) -> list[Chunk]: ...


class ListLookup:
    """Chunks held in memory (an index built on the fly, e.g. over one long context)."""

    def __init__(self, chunks: Sequence[Chunk]):
        self.chunks = list(chunks)

    def get(self, rows: list[int]) -> list[Chunk]:
        return [self.chunks[r] for r in rows]

    def between(self, doc_id: str, after: int, before: int) -> list[Chunk]:
        """The chunks of `doc_id` at positions after < p < before, by position."""
        inside = (c for c in self.chunks if c.doc_id == doc_id and after < c.position < before)
        return sorted(inside, key=lambda c: c.position)


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

    def between(self, doc_id: str, after: int, before: int) -> list[Chunk]:
        """The chunks of document `doc_id` at positions after < p < before, by position."""
        return self.lookup.between(doc_id, after, before)

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


class Piece(NamedTuple):
    """A chunk as a joined context needs it."""

    document: str  # its document's id
    position: int  # its index within the document
    text: str
    lead: str | None = None  # `Chunk.lead`: None joins it to the chunk before it by a newline


def small_gaps(pieces: Sequence[Piece], most: int) -> list[tuple[str, int, int]]:
    """(document, after, before) for each run of 1..`most` positions of one document that lies
    between two of `pieces` and holds none of them."""
    held: dict[str, set[int]] = {}
    for piece in pieces:
        held.setdefault(piece.document, set()).add(piece.position)
    gaps = []
    for document, positions in held.items():
        ordered = sorted(positions)
        gaps += [
            (document, after, before)
            for after, before in itertools.pairwise(ordered)
            if 1 <= before - after - 1 <= most
        ]
    return gaps


def in_document_order(items: Sequence) -> list:
    """Items with `.document` and `.position` (pieces, retrieved chunks) as a joined context
    lays them out: documents in the order each first appears, a document's by position."""
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.document, len(first_seen))
    return sorted(items, key=lambda item: (first_seen[item.document], item.position))


def joined_in_document_order(pieces: Sequence[Piece]) -> str:
    """One text of retrieved chunks: grouped by document in the order each first appears, a
    document's chunks by position, a `# <document id>` line before each document and a `GAP`
    line between two of its chunks that were not next to each other. Chunks next to each
    other are joined by the whitespace the cut left out (`Piece.lead`), so they read as the
    document did, indentation and all; a chunk after a header or a gap line keeps its first
    line's indentation. Chunks are cut at any whitespace, mid-line too, so two far-apart chunks
    joined as they are read as one text (the DRAGON demo's answer copied
    `retry_async(call, *, attempts=5,` straight into the `PermanentError:` of a chunk two
    further on); adjacent chunks joined by a newline broke a line in two (`except` /
    `PermanentError:`)."""
    parts: list[str] = []
    previous: Piece | None = None
    for piece in in_document_order(pieces):
        text = piece.text.strip("\n")
        same_document = previous is not None and previous.document == piece.document
        if same_document and piece.position == previous.position + 1:
            parts.append(("\n" if piece.lead is None else piece.lead) + text)
        else:
            opening = GAP if same_document else f"# {piece.document}"
            lead = piece.lead or ""
            indent = lead.rpartition("\n")[2] if "\n" in lead else ""
            parts.append(("\n" if parts else "") + f"{opening}\n{indent}{text}")
        previous = piece
    return "".join(parts)
