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

        try:
            return cls(AutoTokenizer.from_pretrained(directory))
        except (OSError, ValueError) as exc:
            from tandem.errors import TandemError

            raise TandemError(
                f"cannot read the tokenizer in {directory}: {exc}".splitlines()[0]
            ) from exc

    @classmethod
    def from_gguf(cls, path: Path) -> HFTokenizer:
        """The tokenizer stored in a GGUF file's metadata."""
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        try:
            return cls(AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name))
        except (OSError, ValueError, KeyError) as exc:
            from tandem.errors import TandemError

            raise TandemError(
                f"cannot read a tokenizer from {path}: {exc}".splitlines()[0]
            ) from exc

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
