"""Fake tokenizers for chunking tests (importable from test modules)."""

from __future__ import annotations

import hashlib
import re


class PairTokenizer:
    """A fake whose counts are NOT additive over words: it merges any two adjacent characters
    into one token, across spaces too, so per-word estimates are wrong at word joins."""

    vocab_size = 1 << 16
    eos_token_id = None
    fingerprint = hashlib.sha256(b"pair-tokenizer").hexdigest()

    def encode(self, text: str) -> list[int]:
        return [hash(text[i : i + 2]) % self.vocab_size for i in range(0, len(text), 2)]

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError


class WordTokenizer:
    """One token per word or punctuation mark (spaces free)."""

    vocab_size = 1 << 16
    eos_token_id = None
    fingerprint = hashlib.sha256(b"word-tokenizer").hexdigest()

    def encode(self, text: str) -> list[int]:
        return [hash(w) % self.vocab_size for w in re.findall(r"\w+|[^\w\s]", text)]

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError


class BigramTokenizer:
    """One token per word plus one per pair of adjacent words: the count of a text exceeds the
    sum of its words' counts, so per-word estimates undercount and chunks must be re-checked."""

    vocab_size = 1 << 16
    eos_token_id = None
    fingerprint = hashlib.sha256(b"bigram-tokenizer").hexdigest()

    def encode(self, text: str) -> list[int]:
        words = text.split()
        grams = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
        return [hash(g) % self.vocab_size for g in grams]

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError
