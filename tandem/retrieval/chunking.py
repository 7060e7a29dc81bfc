"""Cutting documents into token-bounded chunks with the generating model's tokenizer.

Words used here:
- *chunk*: a contiguous span `text[start:end]` of one document (character offsets), cut at
  whitespace, whose token count under the model's tokenizer is at most `chunk_tokens`. Chunks
  are what the index embeds and what retrieval returns (DRAGON's "documents" are 64-token
  chunks, RAPID's are 512-token chunks).
- *word*: a run of non-space characters with the whitespace before it. A word longer than the
  limit on its own (a URL, a base64 blob) is cut into character slices.
- *overlap*: about how many tokens of a chunk's tail the next chunk repeats (whole words only;
  never more than `overlap` by the per-word estimate).
- *key*: sha256 of the chunk parameters, the tokenizer fingerprint and the chunk text: equal
  keys mean equal embeddings, which is how incremental builds avoid re-embedding.

Theory: word token counts are estimated one word at a time (memoised), which BPE makes
approximate at word joins, so every packed chunk is re-encoded whole and shrunk by a word
until it fits; the limit is therefore exact, whatever the tokenizer.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tandem.errors import TandemError
from tandem.models.base import Tokenizer
from tandem.retrieval.document import Document

WORD = re.compile(r"\s*(\S+)")


@dataclass(frozen=True, kw_only=True)
class ChunkParams:
    chunk_tokens: int = 64
    overlap: int = 0

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1:
            raise TandemError(f"chunk size must be at least 1 token (got {self.chunk_tokens})")
        if not 0 <= self.overlap < self.chunk_tokens:
            raise TandemError(
                f"overlap must be in 0..{self.chunk_tokens - 1} tokens (got {self.overlap})"
            )


@dataclass(frozen=True, kw_only=True)
class Chunk:
    key: str
    doc_id: str
    position: int  # index of the chunk within its document
    start: int  # character offsets into the document text
    end: int
    n_tokens: int
    text: str
    source: str
    meta: Mapping[str, Any] = field(default_factory=dict)
    # The whitespace the cut left out between the previous chunk and this one (before the first:
    # the document's own leading whitespace), so adjacent chunks join back into the document
    # text; None where the two overlap, or for an index written before chunks carried it.
    lead: str | None = None


def chunk_key(text: str, params: ChunkParams, tokenizer_fingerprint: str) -> str:
    tag = f"{tokenizer_fingerprint}:{params.chunk_tokens}:{params.overlap}\n"
    return hashlib.sha256((tag + text).encode("utf-8")).hexdigest()


class TokenCounter:
    """Memoised token counts of short strings (words repeat a lot)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.memo: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        count = self.memo.get(text)
        if count is None:
            count = len(self.tokenizer.encode(text))
            if len(text) < 64:
                self.memo[text] = count
        return count


def _longest_fitting_prefix(text: str, count: TokenCounter, limit: int) -> int:
    """Largest n >= 1 with count(text[:n]) <= limit (binary search; n = 1 if none fits)."""
    low, high = 1, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if count(text[:mid]) <= limit:
            low = mid
        else:
            high = mid - 1
    return low


def _words(text: str, count: TokenCounter, limit: int) -> list[tuple[int, int, int]]:
    """(estimate, start, end) per word; start/end exclude the leading whitespace."""
    words = []
    for match in WORD.finditer(text):
        start, end = match.span(1)
        estimate = count(match.group(0))
        if estimate <= limit:
            words.append((estimate, start, end))
            continue
        while start < end:  # a word over the limit: cut it into fitting slices
            cut = start + _longest_fitting_prefix(text[start:end], count, limit)
            words.append((count(text[start:cut]), start, cut))
            start = cut
    return words


def chunk_spans(
    text: str, tokenizer: Tokenizer, params: ChunkParams, *, count: TokenCounter | None = None
) -> list[tuple[int, int, int]]:
    """(start, end, n_tokens) of each chunk of `text`, in order; n_tokens <= chunk_tokens."""
    limit = params.chunk_tokens
    count = count or TokenCounter(tokenizer)
    stripped = text.strip()
    if not stripped:
        return []
    if len(stripped) <= 4 * limit:  # short text: one encode decides
        n_tokens = len(tokenizer.encode(stripped))
        if n_tokens <= limit:
            start = text.index(stripped[0])
            return [(start, start + len(stripped), n_tokens)]
    words = _words(text, count, limit)
    spans = []
    first = 0
    while first < len(words):
        last, total = first, 0
        while last < len(words) and total + words[last][0] <= limit:
            total += words[last][0]
            last += 1
        last = max(last, first + 1)
        while True:  # verify the packed chunk whole; shrink by a word until it fits
            start, end = words[first][1], words[last - 1][2]
            n_tokens = len(tokenizer.encode(text[start:end]))
            if n_tokens <= limit or last == first + 1:
                break
            last -= 1
        if n_tokens > limit:  # only a single character can be left over the limit
            raise TandemError(
                f"chunk size {limit} is too small: {text[start:end]!r} alone is {n_tokens} tokens"
            )
        spans.append((start, end, n_tokens))
        if last >= len(words):
            break
        following, repeated = last, 0
        while following - 1 > first and repeated + words[following - 1][0] <= params.overlap:
            following -= 1
            repeated += words[following][0]
        first = following
    return spans


def chunk_document(
    doc: Document, tokenizer: Tokenizer, params: ChunkParams, *, count: TokenCounter | None = None
) -> list[Chunk]:
    fingerprint = tokenizer.fingerprint
    spans = chunk_spans(doc.text, tokenizer, params, count=count)
    chunks = []
    previous_end = 0
    for position, (start, end, n_tokens) in enumerate(spans):
        text = doc.text[start:end]
        lead = doc.text[previous_end:start] if previous_end <= start else None
        previous_end = end
        chunks.append(
            Chunk(
                key=chunk_key(text, params, fingerprint),
                doc_id=doc.doc_id,
                position=position,
                start=start,
                end=end,
                n_tokens=n_tokens,
                text=text,
                source=doc.source,
                meta=doc.meta,
                lead=lead,
            )
        )
    return chunks


def chunk_documents(
    docs: Iterable[Document], tokenizer: Tokenizer, params: ChunkParams
) -> list[Chunk]:
    count = TokenCounter(tokenizer)  # shared memo: words repeat across documents
    return [c for doc in docs for c in chunk_document(doc, tokenizer, params, count=count)]


def chunk_text(
    text: str, tokenizer: Tokenizer, params: ChunkParams, *, doc_id: str = "context"
) -> list[Chunk]:
    """Chunks of one long text (RAPID: the long context cut into 512-token chunks)."""
    return chunk_document(Document(doc_id=doc_id, text=text, source=doc_id), tokenizer, params)
