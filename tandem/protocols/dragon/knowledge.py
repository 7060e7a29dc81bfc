"""What one side knows: its own corpus, and how a question becomes its decoder.

Words used here:
- *knowledge*: a side's retriever (its corpus only: documents never cross the network), an
  optional document KV store, and how relevance is scored while generating.
- *retrieved document*: a chunk chosen once for the question (top-k by cosine similarity);
  its KV cache is reused and only its weight changes during decoding (paper Sec. 4.1).
- *filled*: retrieved chunks plus the few chunks of a document that lie between two of them
  (`Knowledge.filled`); a context that joins chunks into one text (the side row, the
  private-spec prompt) holds these, so a function cut into three chunks reads whole.

`build_decoder(...)` is what a side runs at session start: retrieve, lay out one row per
document (`prompt.RagPrompt`), set up dynamic relevance, return an un-prefilled `DocDecoder`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tandem.models.base import CausalLM
from tandem.protocols.dragon.config import DragonConfig
from tandem.protocols.dragon.decoder import DocDecoder, RelevanceSchedule
from tandem.protocols.dragon.prompt import RagPrompt
from tandem.retrieval.chunking import Chunk
from tandem.retrieval.search import (
    FILL_GAP,
    Piece,
    in_document_order,
    joined_in_document_order,
    small_gaps,
)


@dataclass(frozen=True)
class RetrievedDoc:
    doc_id: str  # "<document>#<position>"
    text: str
    score: float  # retrieval cosine similarity (nan: put back by `Knowledge.filled`)
    document: str  # the chunk's document id
    position: int  # the chunk's index within its document
    lead: str | None = None  # `Chunk.lead`: the whitespace before it in its document, if known

    @classmethod
    def of(cls, chunk: Chunk, score: float) -> RetrievedDoc:
        """A chunk of this side's corpus with its score."""
        doc_id = f"{chunk.doc_id}#{chunk.position}"
        return cls(doc_id, chunk.text, score, chunk.doc_id, chunk.position, chunk.lead)

    @property
    def put_back(self) -> bool:
        """Put back between two retrieved chunks (`Knowledge.filled`), not retrieved."""
        return math.isnan(self.score)


def retrieved(docs: list[RetrievedDoc]) -> list[RetrievedDoc]:
    """The retrieved chunks of a filled list, best first (as retrieval returned them)."""
    return sorted((d for d in docs if not d.put_back), key=lambda d: -d.score)


def named(docs: list[RetrievedDoc]) -> tuple[list[str], list[str]]:
    """(ids of the retrieved chunks, best first; ids of those put back between them, in layout
    order), as reports keep them."""
    return [d.doc_id for d in retrieved(docs)], [d.doc_id for d in docs if d.put_back]


def listed(docs: list[str], put_back: list[str]) -> str:
    """'a#0, a#2 (and a#1 put back between them)': chunk ids as the demos print them."""
    text = ", ".join(docs)
    return text + (f" (and {', '.join(put_back)} put back between them)" if put_back else "")


@dataclass
class Knowledge:
    """One side's corpus access. `retriever` None = no retrieval (a bare row)."""

    retriever: object | None = None  # tandem.retrieval.search.Retriever
    kv_store: object | None = None  # tandem.retrieval.kvstore.DocKVStore

    @classmethod
    def from_texts(cls, texts: list[str], embedder, *, tokenizer=None, chunk_tokens: int = 64):
        """An in-memory corpus (tests, benchmarks): chunk `texts` and index them."""
        from tandem.retrieval.chunking import ChunkParams, chunk_text
        from tandem.retrieval.search import Retriever

        if tokenizer is None:
            from tandem.models.tiny import ByteTokenizer

            tokenizer = ByteTokenizer()
        params = ChunkParams(chunk_tokens=chunk_tokens)
        chunks = [
            chunk
            for number, text in enumerate(texts)
            for chunk in chunk_text(text, tokenizer, params, doc_id=f"doc{number}")
        ]
        return cls(retriever=Retriever.from_chunks(chunks, embedder))

    @classmethod
    def from_index(cls, path: Path, *, kv_root: Path | None = None, lm: CausalLM | None = None):
        """An index folder built by `tandem index build` (and a KV store, if asked)."""
        from tandem.retrieval.index import open_index

        kv_store = None
        if kv_root is not None and lm is not None:
            from tandem.retrieval.kvstore import DocKVStore

            kv_store = DocKVStore(kv_root, lm)
        return cls(retriever=open_index(path), kv_store=kv_store)

    def retrieve(self, question: str, k: int) -> list[RetrievedDoc]:
        if self.retriever is None or k == 0 or not len(self.retriever):
            return []
        return [
            RetrievedDoc.of(chunk, score) for chunk, score in self.retriever.search(question, k)
        ]

    def filled(self, docs: list[RetrievedDoc], *, fill: int = FILL_GAP) -> list[RetrievedDoc]:
        """`docs` with each run of at most `fill` chunks left out between two retrieved chunks of
        a document put back from this corpus (score nan: not retrieved), in the order a joined
        context lays them out (documents by first retrieved chunk, then by position)."""
        gaps = small_gaps(pieces(docs), fill) if self.retriever is not None else []
        extra = [
            RetrievedDoc.of(chunk, math.nan)
            for document, after, before in gaps
            for chunk in self.retriever.between(document, after, before)
        ]
        return in_document_order(docs + extra)

    def context(self, question: str, k: int) -> tuple[list[RetrievedDoc], str]:
        """(the chunks, the text) of one prompt's context: the k chunks retrieved for
        `question`, filled (`filled`) and joined (`joined_context`)."""
        used = self.filled(self.retrieve(question, k))
        return used, joined_context(used)


def pieces(docs: list[RetrievedDoc]) -> list[Piece]:
    return [Piece(d.document, d.position, d.text, d.lead) for d in docs]


def joined_context(docs: list[RetrievedDoc]) -> str:
    """Chunks as one context for one prompt (`retrieval.search.joined_in_document_order`)."""
    return joined_in_document_order(pieces(docs))


def make_scorer(kind: str, knowledge: Knowledge, docs: list[RetrievedDoc], temperature: float):
    """A `RelevanceScorer` over the retrieved documents, or None for static weights."""
    if kind == "static" or not docs:
        return None
    texts = [d.text for d in docs]
    if kind == "bm25":
        from tandem.retrieval.scorer import BM25Scorer

        return BM25Scorer(texts, temperature=temperature)
    from tandem.retrieval.scorer import EmbeddingScorer

    return EmbeddingScorer(knowledge.retriever.embedder, texts, temperature=temperature)


def build_decoder(
    lm: CausalLM, knowledge: Knowledge, question: str, config: DragonConfig
) -> tuple[DocDecoder, list[RetrievedDoc]]:
    """Retrieve from this side's corpus and lay out its rows (not yet prefilled). Returns the
    decoder and the chunks its rows hold: the retrieved ones, and for one row per side also
    those put back between them (`Knowledge.filled`, score nan: they weigh nothing)."""
    docs = used = knowledge.retrieve(question, config.docs_per_side)
    prompt = RagPrompt.for_tokenizer(lm.tokenizer)
    prefixes = [prompt.doc_prefix(lm.tokenizer, d.text) for d in docs] or [
        prompt.doc_prefix(lm.tokenizer, None)
    ]
    if config.rows == "side" and len(docs) > 1:  # one row holding every document
        used = knowledge.filled(docs)
        prefixes = [prompt.doc_prefix(lm.tokenizer, joined_context(used))]
    scorer = make_scorer(config.scorer, knowledge, docs, config.relevance_temperature)
    static = np.array([d.score / config.relevance_temperature for d in docs] or [0.0], np.float32)
    relevance = RelevanceSchedule(
        num_docs=max(len(docs), 1),
        query=question,
        detokenize=lm.tokenizer.decode,
        scorer=scorer,
        static_scores=static,
        interval=config.relevance_interval,
        background=config.relevance_prefetch,
    )
    decoder = DocDecoder(
        lm,
        prefixes=prefixes,
        suffix=prompt.question_suffix(lm.tokenizer, question),
        relevance=relevance,
        temperature=config.temperature,
        kv_store=knowledge.kv_store,
    )
    return decoder, used
