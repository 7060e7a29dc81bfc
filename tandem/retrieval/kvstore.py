"""Document KV store: each document's prefilled KV cache on disk, loaded to skip prefill.

Words used here:
- *document ids*: the token ids a model prefills for one retrieved document (the chunk text,
  possibly wrapped in a prompt template by the caller). The store is content-addressed: the
  key is the sha256 of the ids, so a changed document simply gets a new entry.
- *model folder*: entries live under `<root>/<model fingerprint[:24]>/`, so caches of different
  models (or tokenizers) never mix; `load_state` also refuses a file made by another model.
- *entry*: one safetensors file written by `lm.save_state` (ids, logits, per-layer keys and
  values), written atomically. Its size in bytes is what DRCG/KV would send over the network.
  An entry that cannot be read (truncated, corrupt) is a cache miss: prefilled again, with a
  warning naming the file; other entries are left alone.

DRAGON's TTFT premise: loading an entry should be much cheaper than prefilling the document
again; `benchmarks.retrieval` measures both on the real model.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from tandem.errors import TandemError
from tandem.models.base import CausalLM, State

log = logging.getLogger("tandem.retrieval")


def ids_key(ids: list[int]) -> str:
    return hashlib.sha256(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()


class DocKVStore:
    """Prefilled single-row states of documents for one model."""

    def __init__(self, root: Path, lm: CausalLM):
        self.lm = lm
        self.folder = Path(root) / lm.fingerprint[:24]
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, ids: list[int]) -> Path:
        return self.folder / f"{ids_key(ids)}.safetensors"

    def __contains__(self, ids: list[int]) -> bool:
        return self.path(ids).is_file()

    def put(self, ids: list[int], state: State | None = None) -> Path:
        """Store the state of `ids` (prefilled now unless given); returns its file."""
        ids = [int(i) for i in ids]
        if not ids:
            raise TandemError("cannot store the KV cache of an empty document")
        path = self.path(ids)
        if not path.is_file():
            state = state if state is not None else self.lm.prefill(ids)
            if state.batch != 1 or state.row_ids(0) != ids:
                raise TandemError("KV store: the state given does not hold exactly these ids")
            self.lm.save_state(state, path)
        return path

    def load(self, ids: list[int]) -> State:
        """The stored state of `ids` (its logits predict the token after the document)."""
        ids = [int(i) for i in ids]
        path = self.path(ids)
        if not path.is_file():
            raise TandemError(f"KV store has no entry for this document ({path.name[:12]})")
        state = self.lm.load_state(path)
        if state.batch != 1 or state.row_ids(0) != ids:
            raise TandemError(f"KV store entry {path.name[:12]} is corrupt (ids differ)")
        return state

    def get_or_prefill(self, ids: list[int]) -> tuple[State, bool]:
        """(state, hit): loaded when stored, else prefilled and stored; an unreadable entry
        (truncated, corrupt) is prefilled and stored again, with a warning naming it."""
        if ids in self:
            try:
                return self.load(ids), True
            except TandemError as exc:
                log.warning("%s; prefilled it again", exc)
                self.path(ids).unlink(missing_ok=True)
        state = self.lm.prefill([int(i) for i in ids])
        self.put(ids, state)
        return state, False

    def precompute(self, documents: Iterable[list[int]]) -> int:
        """Store every document not yet stored; returns how many were prefilled now."""
        made = 0
        for ids in documents:
            if ids not in self:
                self.put(ids)
                made += 1
        return made

    def nbytes(self, ids: list[int]) -> int:
        """Size of a stored entry on disk."""
        return self.path(ids).stat().st_size
