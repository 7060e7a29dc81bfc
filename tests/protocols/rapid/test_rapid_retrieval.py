"""RAPID's retrieval context: chunk sizes, the budget formula and the retrieval-length bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.errors import TandemError
from tandem.models.tiny import ByteTokenizer
from tandem.protocols.rapid.config import RetrievalConfig
from tandem.protocols.rapid.retrieval import (
    retrieval_budget,
    retrieve,
    select_chunks,
)
from tandem.retrieval.chunking import Chunk
from tandem.retrieval.embedder import HashingEmbedder


def fake_chunks(lengths: list[int]) -> list[Chunk]:
    return [
        Chunk(
            key=str(i), doc_id="c", position=i, start=0, end=0, n_tokens=n, text=f"c{i}", source="c"
        )
        for i, n in enumerate(lengths)
    ]


def test_budget_is_the_paper_formula():
    config = RetrievalConfig(chunk_tokens=512, min_tokens=4096, compression=24)
    assert retrieval_budget(120_000, config) == 5000  # |C| / 24 above the floor
    assert retrieval_budget(32_000, config) == 4096  # the floor
    assert retrieval_budget(3_000, config) == 3_000  # never more than the context


@pytest.mark.parametrize(
    "kwargs",
    [
        {"chunk_tokens": 512, "min_tokens": 256},  # a budget that cannot hold a chunk
        {"compression": 0.5},
        {"threshold": 1.5},
        {"min_chunks": -1},
    ],
)
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(TandemError):
        RetrievalConfig(**kwargs)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=40),
    data=st.data(),
    min_chunks=st.integers(0, 3),
)
def test_selection_bounds(lengths, data, min_chunks):
    chunks = fake_chunks(lengths)
    scores = np.array(
        data.draw(st.lists(st.floats(-1, 1), min_size=len(lengths), max_size=len(lengths)))
    )
    config = RetrievalConfig(
        chunk_tokens=64, min_tokens=64 * 2, threshold=0.3, min_chunks=min_chunks
    )
    budget = data.draw(st.integers(64, 64 * 8))
    chosen = select_chunks(chunks, scores, budget=budget, config=config)
    used = sum(c.n_tokens for c in chosen)
    assert used <= budget  # upper bound
    assert [c.position for c in chosen] == sorted(c.position for c in chosen)  # document order
    passing = [c for c in chunks if scores[c.position] >= 0.3]
    if sum(c.n_tokens for c in passing) > budget:  # lower bound when relevant text is plentiful
        assert used > budget - config.chunk_tokens
    else:
        assert all(c in chosen for c in passing)  # everything relevant fits, so it is kept
    below = [c for c in chosen if scores[c.position] < 0.3]
    assert len(below) <= max(0, min_chunks - (len(chosen) - len(below)))  # fallback if needed


def test_selection_prefers_higher_scores():
    chunks = fake_chunks([10] * 5)
    scores = np.array([0.31, 0.9, 0.2, 0.8, 0.5])
    config = RetrievalConfig(chunk_tokens=10, min_tokens=20, min_chunks=0)
    chosen = select_chunks(chunks, scores, budget=20, config=config)
    assert [c.position for c in chosen] == [1, 3]


def test_retrieve_finds_the_relevant_chunk_within_bounds():
    tokenizer = ByteTokenizer()
    filler = " ".join(f"lorem{i} ipsum dolor sit amet" for i in range(300))
    needle = "The zebra parameter of frobnicate defaults to forty two."
    context = filler[:4000] + " " + needle + " " + filler[4000:]
    config = RetrievalConfig(chunk_tokens=256, min_tokens=512, compression=24, piece_tokens=64)
    retrieved = retrieve(
        context,
        "what does the zebra parameter of frobnicate default to",
        tokenizer,
        HashingEmbedder(256),
        config,
    )
    assert retrieved.context_tokens == len(context.encode())
    assert retrieved.budget == 512
    assert 0 < retrieved.tokens <= retrieved.budget
    assert all(c.n_tokens <= 256 for c in retrieved.chunks)
    assert "zebra" in retrieved.text and "frobnicate" in retrieved.text
    assert max(retrieved.all_scores) == max(retrieved.scores)


def test_chunks_respect_the_chunk_size_on_a_real_tokenizer(real_tokenizer):
    context = " ".join(f"def function_{i}(x): return x * {i}  # doc {i}" for i in range(400))
    config = RetrievalConfig(chunk_tokens=512, min_tokens=1024, piece_tokens=128)
    retrieved = retrieve(context, "function_17", real_tokenizer, HashingEmbedder(128), config)
    assert all(c.n_tokens <= 512 for c in retrieved.chunks)
    assert all(len(real_tokenizer.encode(c.text)) == c.n_tokens for c in retrieved.chunks)
    assert retrieved.tokens <= retrieved.budget
