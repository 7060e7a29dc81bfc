import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from retrieval_fakes import BigramTokenizer, PairTokenizer, WordTokenizer

from tandem.errors import TandemError
from tandem.models.tiny import ByteTokenizer
from tandem.retrieval.chunking import ChunkParams, chunk_document, chunk_spans, chunk_text
from tandem.retrieval.document import Document

TOKENIZERS = [ByteTokenizer(), PairTokenizer(), WordTokenizer(), BigramTokenizer()]
TEXT = (
    (
        "The collector polls each buoy every 30 seconds. It never retries more than five times;\n\n"
        "after that the buoy is marked stale. " * 12
    )
    + "https://example.org/"
    + "x" * 300
    + " end."
)


def check_chunks(text: str, tokenizer, params: ChunkParams) -> list[tuple[int, int, int]]:
    spans = chunk_spans(text, tokenizer, params)
    for start, end, n_tokens in spans:
        piece = text[start:end]
        assert piece == piece.strip() and piece
        assert n_tokens == len(tokenizer.encode(piece)) <= params.chunk_tokens
    # in order, and every non-space character is covered by some chunk
    starts = [s for s, _, _ in spans]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    covered = set()
    for start, end, _ in spans:
        covered.update(range(start, end))
    assert all(i in covered for i, ch in enumerate(text) if not ch.isspace())
    return spans


@pytest.mark.parametrize("tokenizer", TOKENIZERS, ids=lambda t: type(t).__name__)
@pytest.mark.parametrize("chunk_tokens,overlap", [(64, 0), (64, 16), (8, 3), (512, 64), (1, 0)])
def test_chunks_respect_the_token_limit(tokenizer, chunk_tokens, overlap):
    params = ChunkParams(chunk_tokens=chunk_tokens, overlap=overlap)
    spans = check_chunks(TEXT, tokenizer, params)
    # chunks are filled: together they hold most of the text's tokens (only spaces are lost;
    # the bigram fake also loses the pair tokens at each cut, so it is left out here)
    if not isinstance(tokenizer, BigramTokenizer):
        assert sum(n for _, _, n in spans) >= 0.75 * len(tokenizer.encode(TEXT))


def test_undercounting_estimates_are_caught_by_the_verification_step():
    tokenizer = BigramTokenizer()
    words = re.findall(r"\s*\S+", TEXT)
    assert sum(len(tokenizer.encode(w)) for w in words[:40]) < len(
        tokenizer.encode("".join(words[:40]))
    )
    spans = check_chunks(TEXT, tokenizer, ChunkParams(chunk_tokens=31))
    assert max(n for _, _, n in spans) == 31  # 16 words + 15 bigrams: filled to the limit


def test_overlap_repeats_the_tail_of_the_previous_chunk():
    tokenizer = WordTokenizer()
    text = " ".join(f"w{i}" for i in range(100))
    spans = chunk_spans(text, tokenizer, ChunkParams(chunk_tokens=10, overlap=4))
    assert [text[s:e].split()[0] for s, e, _ in spans[:3]] == ["w0", "w6", "w12"]
    assert all(n == 10 for _, _, n in spans[:-1])
    plain = chunk_spans(text, tokenizer, ChunkParams(chunk_tokens=10, overlap=0))
    assert len(plain) == 10 and len(spans) > len(plain)


def test_long_word_is_cut_into_fitting_slices():
    text = "a" * 1000
    spans = check_chunks(text, ByteTokenizer(), ChunkParams(chunk_tokens=64))
    assert [e - s for s, e, _ in spans] == [64] * 15 + [40]


def test_multibyte_text_never_splits_a_character():
    text = "naïve café — 日本語のテキスト " * 30
    tokenizer = ByteTokenizer()
    for start, end, n_tokens in check_chunks(text, tokenizer, ChunkParams(chunk_tokens=16)):
        assert n_tokens == len(text[start:end].encode())


def test_chunk_document_keys_and_offsets():
    doc = Document(doc_id="d", text="  hello world  \n" * 40, source="s", meta={"k": 1})
    params = ChunkParams(chunk_tokens=32, overlap=8)
    chunks = chunk_document(doc, ByteTokenizer(), params)
    assert [c.position for c in chunks] == list(range(len(chunks)))
    assert all(doc.text[c.start : c.end] == c.text for c in chunks)
    assert chunks[0].meta == {"k": 1} and chunks[0].source == "s"
    # same text, same params -> same key; other params -> other key
    again = chunk_document(doc, ByteTokenizer(), params)
    assert [c.key for c in chunks] == [c.key for c in again]
    other = chunk_document(doc, ByteTokenizer(), ChunkParams(chunk_tokens=32, overlap=0))
    assert chunks[0].text == other[0].text and chunks[0].key != other[0].key


def test_leads_join_the_chunks_back_into_the_document():
    code = (
        '"""Retry."""\n\nimport asyncio\n\n\nasync def retry(call, *, attempts=5, base=0.5):\n'
        "    for attempt in range(attempts):\n        try:\n            return await call()\n"
        "        except PermanentError:\n            raise\n"
    ) * 3
    doc = Document(doc_id="d", text="\n  " + code, source="s")
    chunks = chunk_document(doc, ByteTokenizer(), ChunkParams(chunk_tokens=24))
    assert len(chunks) > 10 and chunks[0].lead == "\n  "
    assert all(c.lead is not None and not c.lead.strip() for c in chunks)  # whitespace only
    assert "".join(c.lead + c.text for c in chunks) == doc.text.rstrip()
    overlapping = chunk_document(doc, ByteTokenizer(), ChunkParams(chunk_tokens=24, overlap=8))
    pairs = list(zip(overlapping, overlapping[1:], strict=False))
    assert overlapping[0].lead == "\n  " and any(b.start < a.end for a, b in pairs)
    assert all((b.lead is None) == (b.start < a.end) for a, b in pairs)  # None: it overlaps


def test_short_and_empty_texts():
    tokenizer = ByteTokenizer()
    assert chunk_spans("   \n ", tokenizer, ChunkParams()) == []
    assert chunk_spans("  hi  ", tokenizer, ChunkParams()) == [(2, 4, 2)]
    assert len(chunk_text("x " * 600, tokenizer, ChunkParams(chunk_tokens=512))) == 3


def test_a_character_over_the_limit_is_an_error():
    with pytest.raises(TandemError, match="too small"):
        chunk_spans("aé", ByteTokenizer(), ChunkParams(chunk_tokens=1))


@pytest.mark.parametrize("chunk_tokens,overlap", [(0, 0), (8, 8), (8, -1)])
def test_bad_params_are_refused(chunk_tokens, overlap):
    with pytest.raises(TandemError):
        ChunkParams(chunk_tokens=chunk_tokens, overlap=overlap)


@settings(max_examples=60, deadline=None)
@given(
    text=st.lists(st.sampled_from([*"ab é漢\n\t.,_-", "xyz", "  "]), max_size=200).map("".join),
    chunk_tokens=st.integers(4, 40),  # 4: a UTF-8 character is up to 4 byte tokens
    overlap_fraction=st.floats(0, 0.9),
)
def test_limit_holds_for_random_text(text, chunk_tokens, overlap_fraction):
    overlap = min(chunk_tokens - 1, int(chunk_tokens * overlap_fraction))
    for tokenizer in TOKENIZERS:
        check_chunks(text, tokenizer, ChunkParams(chunk_tokens=chunk_tokens, overlap=overlap))


@pytest.mark.slow
@pytest.mark.parametrize("chunk_tokens,overlap", [(64, 0), (64, 16), (512, 32)])
def test_qwen_tokenizer_limit_on_stdlib_and_notes(chunk_tokens, overlap, notes):
    from tandem.models.registry import load_tokenizer
    from tandem.retrieval.corpus import read_folder
    from tandem.retrieval.stdlib import stdlib_documents

    tokenizer = load_tokenizer("qwen2.5-coder-0.5b")
    docs = stdlib_documents()[:300] + list(read_folder(notes))
    params = ChunkParams(chunk_tokens=chunk_tokens, overlap=overlap)
    for doc in docs:
        check_chunks(doc.text, tokenizer, params)
