"""The causal-LM protocol every backend implements, and its state object.

Words used here:
- *row*: one sequence in a batch. Rows may have different prefixes (one row per retrieved
  document in DRAGON's per-document decoding); they are left-padded internally so that tokens
  appended later line up at the right end.
- *seq_len*: the padded length of every row (prefix padding + tokens). `crop(state, n)` keeps
  the first `n` padded positions; because new tokens are appended to all rows at once, this
  removes the same newest tokens from every row. `rollback(state, k)` drops the newest `k`.
- *cancel*: a `threading.Event`; backends check it during the forward pass (between layers for
  transformers, between graph nodes for llama.cpp) and raise `Cancelled`, leaving the state
  exactly as it was before the call (preemptible decoding). A `CancelEvent` also tells listeners
  the moment it is set, which lets native backends abort without taking the GIL.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from tandem.errors import TandemError


class Cancelled(TandemError):
    """A forward pass was aborted because its cancel event was set; the state is unchanged."""


class CancelEvent(threading.Event):
    """A `threading.Event` that calls its listeners when set (any plain Event works too)."""

    def __init__(self) -> None:
        super().__init__()
        self._listeners: list[Any] = []

    def listen(self, callback: Any) -> None:
        """Call `callback()` when the event is set (now, if it already is)."""
        self._listeners.append(callback)
        if self.is_set():
            callback()

    def unlisten(self, callback: Any) -> None:
        self._listeners.remove(callback)

    def set(self) -> None:
        super().set()
        for callback in list(self._listeners):
            callback()


@dataclass
class State:
    """KV state of a batch of rows. Treat as opaque outside a backend except the fields below.

    ids:     [batch, seq_len] token ids, left-padded with `pad_id` (padding is masked out)
    pads:    per-row number of left padding positions
    logits:  [batch, vocab] float32 logits at each row's last position (next-token logits);
             None right after a crop past the last decode block (decode the next token to refresh)
    cache:   backend-specific KV storage
    recent_logits: [batch, n, vocab] logits of the last decode block (kept so a crop inside it
             can restore `logits` without a forward pass), or None
    """

    ids: torch.Tensor
    pads: list[int]
    logits: torch.Tensor | None
    cache: Any = field(repr=False)
    recent_logits: torch.Tensor | None = field(default=None, repr=False)

    @property
    def seq_len(self) -> int:
        return int(self.ids.shape[1])

    @property
    def batch(self) -> int:
        return int(self.ids.shape[0])

    @property
    def lengths(self) -> list[int]:
        """Real (unpadded) tokens per row."""
        return [self.seq_len - p for p in self.pads]

    def row_ids(self, row: int) -> list[int]:
        """The real token ids of one row."""
        return self.ids[row, self.pads[row] :].tolist()

    def crop_bookkeeping(self, seq_len: int) -> None:
        """The backend-independent half of `CausalLM.crop`: check `seq_len`, cut `ids` and keep
        the next-token logits when the cut falls inside the last decode block."""
        if not 0 < seq_len <= self.seq_len:
            raise ValueError(f"crop to {seq_len} outside 1..{self.seq_len}")
        if min(self.pads) >= seq_len:
            raise ValueError(f"crop to {seq_len} would empty a row (pads {self.pads})")
        recent = self.recent_logits
        recent_start = self.seq_len - (recent.shape[1] if recent is not None else 1)
        if seq_len - 1 >= recent_start and recent is not None:
            self.logits = recent[:, seq_len - 1 - recent_start]
            self.recent_logits = recent[:, : seq_len - recent_start]
        elif seq_len < self.seq_len:
            self.logits = None  # not kept: the caller decodes the next token anyway
            self.recent_logits = None
        self.ids = self.ids[:, :seq_len]

    def evict_bookkeeping(self, start: int, end: int) -> None:
        """The backend-independent half of `evict`: check the span, cut it out of `ids`."""
        if self.batch != 1 or self.pads[0] != 0:
            raise TandemError("evict works on one unpadded row")
        if not 0 <= start < end <= self.seq_len:
            raise ValueError(f"evict [{start}, {end}) outside 0..{self.seq_len}")
        self.ids = torch.cat([self.ids[:, :start], self.ids[:, end:]], dim=1)
        self.recent_logits = None


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> ids. `fingerprint` identifies the vocabulary (sha256 hex of its contents)."""

    vocab_size: int
    eos_token_id: int | None
    fingerprint: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@runtime_checkable
class CausalLM(Protocol):
    """A causal language model with an explicit, rollback-able KV state."""

    name: str
    vocab_size: int  # width of the logits (may exceed tokenizer.vocab_size: padded embeddings)
    tokenizer: Tokenizer
    fingerprint: str  # identifies weights + tokenizer (for caches keyed by model)

    def prefill(
        self, ids: list[int] | list[list[int]], cancel: threading.Event | None = None
    ) -> State:
        """Run the prompt(s); one row per list. Returns a state whose `logits` predict the next token."""
        ...

    def decode(
        self,
        state: State,
        ids: torch.Tensor | list[list[int]] | list[int],
        cancel: threading.Event | None = None,
    ) -> torch.Tensor:
        """Append ids ([batch, n], or [n] when batch == 1) to every row.

        Returns logits [batch, n, vocab] (float32); updates `state` in place (ids, cache, logits).
        On cancellation raises `Cancelled` and leaves `state` unchanged.
        """
        ...

    def crop(self, state: State, seq_len: int) -> None:
        """Keep the first `seq_len` padded positions of every row (rollback); in place."""
        ...

    def rollback(self, state: State, num_tokens: int) -> None:
        """Drop the newest `num_tokens` of every row; in place."""
        ...

    def score(self, ids: list[int]) -> torch.Tensor:
        """Logits [len(ids), vocab] for every position of one sequence (no state kept)."""
        ...

    def stack(self, states: list[State]) -> State:
        """Batch single-row states with different lengths into one left-padded state."""
        ...

    def split_rows(self, state: State) -> list[State]:
        """The inverse of `stack`: one single-row state per row, left padding removed."""
        ...

    def save_state(self, state: State, path: Path) -> None:
        """Write a state (KV cache, ids, logits) to a safetensors file, atomically."""
        ...

    def load_state(self, path: Path) -> State:
        """Read a state written by `save_state` of a model with the same fingerprint."""
        ...

    def evict(self, state: State, start: int, end: int) -> None:
        """Drop positions [start, end) of a one-row unpadded state; later positions shift down
        by end - start (StreamingLLM's cache)."""
        ...


def release(lm: CausalLM, state: State) -> None:
    """Give `state`'s cache back to `lm` now if the backend can (`free`: llama.cpp, where
    a row's cells lie changes its logits a little); otherwise it goes when collected."""
    free = getattr(lm, "free", None)
    if free is not None:
        free(state)


# -- input normalisation shared by the backends ----------------------------------------------


def as_rows(ids: list[int] | list[list[int]]) -> list[list[int]]:
    """Prefill input as a list of non-empty rows (one list of ids = one row)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    if not ids:
        raise ValueError("prefill needs at least one token")
    rows = [list(map(int, ids))] if isinstance(ids[0], int) else [list(map(int, r)) for r in ids]
    if any(not r for r in rows):
        raise ValueError("prefill rows must not be empty")
    return rows


def as_new_ids(ids: torch.Tensor | list, batch: int) -> torch.Tensor:  # [batch, n]
    """Decode input as a [batch, n] long tensor ([n] is broadcast to every row)."""
    new = ids if isinstance(ids, torch.Tensor) else torch.tensor(ids, dtype=torch.long)
    if new.dim() == 1:
        new = new.unsqueeze(0).expand(batch, -1) if batch > 1 else new.unsqueeze(0)
    if new.shape[0] != batch or new.shape[1] == 0:
        raise ValueError(f"decode ids of shape {tuple(new.shape)} for a batch of {batch}")
    return new.long()


# -- KV files (save_state / load_state of every backend) ----------------------------------------


def state_tensors(state: State) -> dict[str, torch.Tensor]:
    """The backend-neutral part of a KV file: ids, pads and next-token logits."""
    return {
        "ids": state.ids.contiguous(),
        "pads": torch.tensor(state.pads, dtype=torch.long),
        "logits": state.logits.contiguous(),
    }


def write_kv_file(path: Path, tensors: dict[str, torch.Tensor], *, kind: str, lm) -> None:
    """Atomically write a safetensors KV file stamped with its format and the model fingerprint."""
    import os

    from safetensors.torch import save_file

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp), metadata={"format": kind, "fingerprint": lm.fingerprint})
    os.replace(tmp, path)


def read_kv_file(path: Path, *, kind: str, lm) -> dict[str, torch.Tensor]:
    """The tensors of a KV file written by `write_kv_file` for this very model; a one-line
    TandemError for another format, another model or an unreadable file."""
    from safetensors import SafetensorError, safe_open

    from tandem.models.integrity import safetensors_problem

    try:
        problem = safetensors_problem(path)
        if problem is not None:
            raise TandemError(f"{path}: unreadable KV file ({problem})")
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != kind:
                raise TandemError(f"{path}: not a tandem KV file of this engine ({kind})")
            if meta.get("fingerprint") != lm.fingerprint:
                raise TandemError(f"{path}: KV cache was made by another model ({lm.name} differs)")
            return {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        raise TandemError(f"{path}: unreadable KV file ({exc})".splitlines()[0]) from exc
