"""Tokenizer adapter: a transformers tokenizer seen through the `Tokenizer` protocol.

`fingerprint` is the sha256 of the vocabulary (token -> id, sorted) plus the added tokens, so
two sides can check they speak the same ids before collaborating.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any


class HFTokenizer:
    """Wraps a `transformers` tokenizer; encode never adds special tokens."""

    def __init__(self, hf_tokenizer: Any):
        self.hf = hf_tokenizer
        self.vocab_size: int = len(hf_tokenizer)
        self.eos_token_id: int | None = hf_tokenizer.eos_token_id

    @classmethod
    def from_dir(cls, directory: Path) -> HFTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(directory))

    @cached_property
    def fingerprint(self) -> str:
        vocab = sorted(self.hf.get_vocab().items(), key=lambda kv: kv[1])
        blob = json.dumps(vocab, ensure_ascii=False, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=False)

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        """Token ids of a one-turn chat prompt rendered with the model's chat template."""
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": user_message})
        text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.encode(text)
