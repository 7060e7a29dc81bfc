"""The unit of text every corpus holds: `corpus.py` reads documents from folders and JSONL
files, `stdlib.py` makes them from the standard library's docstrings; chunking cuts them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Document:
    """One document: a stable `doc_id`, its `text`, the `source` it came from, free-form
    `meta`."""

    doc_id: str
    text: str
    source: str
    meta: Mapping[str, Any] = field(default_factory=dict)
