"""Emulated compute: a `CausalLM` that spends the time of a calibrated machine without using a
core (the papers' GPU regimes, which this CPU cannot be; every result that uses it says
"emulated").

- `SleepLM`: logits are a deterministic function of the context (a generator seeded by a hash
  of the ids, optionally mixed with another SleepLM's, `mix`, which sets how often the two
  agree); each forward pass takes `base_s + per_token_s * n` (`prefill_s` for a prefill) in
  all: it computes its logits, then *sleeps* for the rest of that time on the cancel event,
  which ends the pass the moment it is set (the real backend stops between layers). (Until
  2026-11-27 it slept the whole time, then computed the logits, polling the event every
  millisecond: a pass ran over its calibration by the logits' time and the last poll's
  overshoot, ~0.25 ms measured for a 24 ms pass.)
- `ToyTokenizer`: bytes modulo the vocabulary.

Calibrations (which machine it stands for) live with the benchmarks that use them
(`benchmarks.spec_emulated.paper_pair`, `benchmarks.spec_paper`).
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field

import torch

from tandem.models.base import Cancelled


class ToyTokenizer:
    eos_token_id = None

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.fingerprint = hashlib.sha256(f"toy-{vocab_size}".encode()).hexdigest()

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab_size for b in text.encode()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


@dataclass
class SleepState:
    ids: list[int]
    logits: torch.Tensor | None
    pads: list[int] = field(default_factory=lambda: [0])

    @property
    def seq_len(self) -> int:
        return len(self.ids)

    @property
    def batch(self) -> int:
        return 1


class SleepLM:
    """Deterministic logits per context; each forward pass sleeps (preemptibly)."""

    def __init__(
        self,
        name: str,
        *,
        vocab_size: int = 64,
        base_s: float,
        per_token_s: float,
        prefill_s: float,
        other: SleepLM | None = None,
        mix: float = 0.0,
        scale: float = 2.0,
        key: str | None = None,
    ) -> None:
        """`key` seeds the logits (default: `name`)."""
        self.name = name
        self.key = name if key is None else key
        self.vocab_size = vocab_size
        self.tokenizer = ToyTokenizer(vocab_size)
        self.fingerprint = name
        self.base_s, self.per_token_s, self.prefill_s = base_s, per_token_s, prefill_s
        self.other, self.mix, self.scale = other, mix, scale

    def row(self, context: tuple[int, ...]) -> torch.Tensor:  # [vocab]
        digest = hashlib.blake2b(f"{self.key}:{context}".encode(), digest_size=8).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
        own = self.scale * torch.randn(self.vocab_size, generator=generator)
        if self.other is None:
            return own
        return self.mix * self.other.row(context) + (1.0 - self.mix) * own

    @staticmethod
    def _sleep(
        seconds: float, cancel: threading.Event | None, started: float | None = None
    ) -> None:
        """Sleep until `seconds` after `started` (default: now); `cancel` ends it at once."""
        end = (time.perf_counter() if started is None else started) + seconds
        while (left := end - time.perf_counter()) > 0:
            if cancel is None:
                time.sleep(left)
            elif cancel.wait(left):
                raise Cancelled("decode cancelled")
        if cancel is not None and cancel.is_set():
            raise Cancelled("decode cancelled")

    def _prefill_wait(self, cancel: threading.Event | None, started: float) -> None:
        self._sleep(self.prefill_s, cancel, started)

    def _decode_wait(
        self, seq_len: int, n: int, cancel: threading.Event | None, started: float
    ) -> None:
        self._sleep(self.base_s + self.per_token_s * n, cancel, started)

    def prefill(self, ids, cancel: threading.Event | None = None) -> SleepState:
        started = time.perf_counter()
        ids = [int(t) for t in ids]
        logits = self.row(tuple(ids)).unsqueeze(0)
        self._prefill_wait(cancel, started)
        return SleepState(ids=ids, logits=logits)

    def decode(self, state: SleepState, ids, cancel: threading.Event | None = None):
        started = time.perf_counter()
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if ids and isinstance(ids[0], list):  # [batch, n] with batch 1
            assert len(ids) == 1, "SleepLM decodes one row"
            ids = ids[0]
        new = [int(t) for t in ids]
        rows = [self.row(tuple(state.ids + new[: i + 1])) for i in range(len(new))]
        self._decode_wait(state.seq_len, len(new), cancel, started)
        state.ids = state.ids + new
        state.logits = rows[-1].unsqueeze(0)
        return torch.stack(rows).unsqueeze(0)  # [1, n, vocab]

    def crop(self, state: SleepState, seq_len: int) -> None:
        if not 0 < seq_len <= state.seq_len:
            raise ValueError(f"crop to {seq_len} outside 1..{state.seq_len}")
        state.ids = state.ids[:seq_len]
        state.logits = self.row(tuple(state.ids)).unsqueeze(0)

    def rollback(self, state: SleepState, num_tokens: int) -> None:
        if num_tokens:
            self.crop(state, state.seq_len - num_tokens)

    def score(self, ids: list[int]) -> torch.Tensor:  # [len(ids), vocab]
        return torch.stack([self.row(tuple(ids[: i + 1])) for i in range(len(ids))])
