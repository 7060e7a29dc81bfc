"""Fixtures for retrieval tests: a byte tokenizer, a hashing embedder, the example notes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.models.tiny import ByteTokenizer
from tandem.retrieval.embedder import HashingEmbedder

NOTES = Path(__file__).resolve().parents[2] / "examples" / "private-notes"


@pytest.fixture
def byte_tokenizer() -> ByteTokenizer:
    return ByteTokenizer()


@pytest.fixture
def embedder() -> HashingEmbedder:
    return HashingEmbedder(128)


@pytest.fixture
def notes() -> Path:
    return NOTES
