import pytest

from tandem.errors import TandemError
from tandem.models.tiny import ByteTokenizer
from tandem.retrieval.chunking import ChunkParams, chunk_text
from tandem.retrieval.embedder import HashingEmbedder
from tandem.retrieval.search import (
    GAP,
    Piece,
    Retriever,
    joined_in_document_order,
    select_context,
    small_gaps,
)

LONG = " ".join(
    f"Section {i}. "
    + ("The reactor cooling loop uses water. " if i == 7 else f"Filler text number {i}. ") * 6
    for i in range(20)
)


def test_in_memory_retriever_over_one_long_context():
    chunks = chunk_text(LONG, ByteTokenizer(), ChunkParams(chunk_tokens=128))
    retriever = Retriever.from_chunks(chunks, HashingEmbedder(256))
    assert len(retriever) == len(chunks)
    hits = retriever.search("reactor cooling loop water", k=3)
    assert "reactor" in hits[0][0].text
    assert -1.0 - 1e-6 <= hits[-1][1] <= hits[0][1] <= 1.0 + 1e-6
    assert len(retriever.search("x", k=10_000)) == len(chunks)  # k capped at the corpus size
    vectors = retriever.vectors([0, 1])
    assert vectors.shape == (2, 256)
    with pytest.raises(TandemError, match="k must be at least 1"):
        retriever.search("x", k=0)


def test_empty_retriever_is_an_error():
    retriever = Retriever.from_chunks([], HashingEmbedder(16))
    with pytest.raises(TandemError, match="empty"):
        retriever.search("anything")


def test_select_context_threshold_budget_and_order():
    chunks = chunk_text(LONG, ByteTokenizer(), ChunkParams(chunk_tokens=100))
    hits = [(chunks[5], 0.9), (chunks[2], 0.8), (chunks[9], 0.5), (chunks[1], 0.2)]
    chosen = select_context(hits, max_tokens=250, min_score=0.3)
    assert [c.position for c in chosen] == [2, 5]  # budget: 2 chunks of ~100; order restored
    chosen = select_context(hits, max_tokens=10_000, min_score=0.3, in_document_order=False)
    assert [c.position for c in chosen] == [5, 2, 9]


def test_joined_context_keeps_each_document_in_order_and_marks_what_was_left_out():
    pieces = [  # retrieval order: best first; no leads (an index written before them)
        Piece("notes/backoff.py", 0, "async def retry(call, *, attempts=5,"),
        Piece("adr/0002.md", 3, "Retry with full jitter."),
        Piece("notes/backoff.py", 2, "PermanentError:\n    raise\n"),
        Piece("notes/backoff.py", 3, "except TimeoutError:"),
        Piece("adr/0002.md", 1, "Context."),
    ]
    text = joined_in_document_order(pieces)
    assert text.split("\n") == [
        "# notes/backoff.py",  # the best chunk's document first, its chunks by position
        "async def retry(call, *, attempts=5,",
        GAP,  # position 1 was not retrieved
        "PermanentError:",
        "    raise",  # a chunk's own newlines stay; only its ends are trimmed
        "except TimeoutError:",  # 3 follows 2 and its lead is unknown: a newline
        "# adr/0002.md",
        "Context.",
        GAP,
        "Retry with full jitter.",
    ]
    assert joined_in_document_order([Piece("a", 4, "alone")]) == "# a\nalone"
    assert joined_in_document_order([]) == ""


def test_joined_context_puts_adjacent_chunks_back_together_by_their_leads():
    source = "def f(x):\n    try:\n        return x\n    except KeyError:\n        raise\n"
    texts = ["def f(x):", "try:", "return x", "except", "KeyError:\n        raise"]
    pieces, end = [], 0
    for position, text in enumerate(texts):  # chunks cut at whitespace, as chunking does
        start = source.index(text, end)
        pieces.append(Piece("f.py", position, text, source[end:start]))
        end = start + len(text)
    assert pieces[3].lead == "\n    " and pieces[4].lead == " "
    assert joined_in_document_order(pieces) == "# f.py\n" + source.rstrip()  # as it stood
    assert joined_in_document_order(pieces[2:]) == (
        "# f.py\n        return x\n    except KeyError:\n        raise"  # indented as it stood
    )
    assert joined_in_document_order([pieces[0], pieces[2], pieces[4]]).split("\n") == [
        "# f.py",
        "def f(x):",
        GAP,
        "        return x",  # after a gap line: its first line's indentation, from its lead
        GAP,
        "KeyError:",  # cut mid-line (its lead holds no newline): nothing to indent by
        "        raise",
    ]


def test_small_gaps_are_the_short_runs_between_two_retrieved_chunks_of_one_document():
    places = [("a", 0), ("b", 5), ("a", 2), ("a", 3), ("b", 1), ("a", 7)]
    pieces = [Piece(document, position, "") for document, position in places]
    assert small_gaps(pieces, 1) == [("a", 0, 2)]  # a: 0 . 2 3 . . . 7; b: 1 . . . 5
    assert small_gaps(pieces, 2) == [("a", 0, 2)]
    assert small_gaps(pieces, 3) == [("a", 0, 2), ("a", 3, 7), ("b", 1, 5)]  # runs of three
    assert small_gaps(pieces, 0) == []
    assert small_gaps([Piece("a", 2, ""), Piece("a", 2, "")], 1) == []  # one chunk twice
    assert small_gaps([], 1) == []


def test_between_gives_a_documents_chunks_strictly_inside_the_positions():
    texts = {"one": LONG, "two": LONG.replace("reactor", "boiler")}
    chunks = [
        chunk
        for doc_id, text in texts.items()
        for chunk in chunk_text(text, ByteTokenizer(), ChunkParams(chunk_tokens=64), doc_id=doc_id)
    ]
    retriever = Retriever.from_chunks(chunks, HashingEmbedder(64))
    inside = retriever.between("two", 2, 6)
    assert [(c.doc_id, c.position) for c in inside] == [("two", 3), ("two", 4), ("two", 5)]
    assert inside[0].text == next(c.text for c in chunks if (c.doc_id, c.position) == ("two", 3))
    assert retriever.between("two", 2, 3) == [] and retriever.between("three", 0, 9) == []


def test_embedder_dimension_mismatch_is_refused():
    chunks = chunk_text("hello world", ByteTokenizer(), ChunkParams())
    retriever = Retriever.from_chunks(chunks, HashingEmbedder(32))
    with pytest.raises(TandemError, match="32-dim"):
        Retriever(index=retriever.index, lookup=retriever.lookup, embedder=HashingEmbedder(64))
