"""A fake CausalLM for fast protocol tests: logits are a fixed function of the context.

`TableLM(vocab, salt)` gives every context (the tuple of ids so far) a deterministic logit
row drawn from a generator seeded by (salt, context). `correlate_with` mixes another table's
logits in, so a draft/target pair agrees often but not always. `step_delay_s` makes each
forward pass take that long per token, sleeping in small slices and checking the cancel
event in between (as the real backend checks it between layers).
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field

import torch

from tandem.models.base import Cancelled


class FakeTokenizer:
    eos_token_id = None

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.fingerprint = f"fake-{vocab_size}"

    def encode(self, text: str) -> list[int]:
        return [ord(c) % self.vocab_size for c in text]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


@dataclass
class FakeState:
    ids: list[int]
    logits: torch.Tensor | None
    pads: list[int] = field(default_factory=lambda: [0])

    @property
    def seq_len(self) -> int:
        return len(self.ids)

    @property
    def batch(self) -> int:
        return 1


class TableLM:
    """Deterministic logits per context; optional per-token forward delay (preemptible)."""

    def __init__(
        self,
        vocab_size: int = 8,
        salt: str = "a",
        *,
        scale: float = 2.0,
        correlate_with: TableLM | None = None,
        mix: float = 0.5,
        step_delay_s: float = 0.0,
    ) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = FakeTokenizer(vocab_size)
        self.name = f"table-{salt}"
        self.fingerprint = self.name
        self.salt = salt
        self.scale = scale
        self.other = correlate_with
        self.mix = mix
        self.step_delay_s = step_delay_s
        self.slow_positions: dict[int, float] = {}  # seq_len -> extra delay for that token
        self.forward_calls = 0
        self._lock = threading.Lock()

    def row(self, context: tuple[int, ...]) -> torch.Tensor:  # [vocab]
        digest = hashlib.blake2b(f"{self.salt}:{context}".encode(), digest_size=8).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
        own = self.scale * torch.randn(self.vocab_size, generator=generator)
        if self.other is None:
            return own
        return self.mix * self.other.row(context) + (1 - self.mix) * own

    def _wait(self, seq_len: int, n: int, cancel: threading.Event | None) -> None:
        delay = self.step_delay_s * n + sum(
            self.slow_positions.get(seq_len + i, 0.0) for i in range(n)
        )
        end = time.perf_counter() + delay
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled("decode cancelled")
            left = end - time.perf_counter()
            if left <= 0:
                return
            time.sleep(min(left, 0.002))

    def prefill(self, ids, cancel=None) -> FakeState:
        ids = [int(t) for t in ids]
        self._wait(0, 1, cancel)
        return FakeState(ids=ids, logits=self.row(tuple(ids)).unsqueeze(0))

    def decode(self, state: FakeState, ids, cancel=None) -> torch.Tensor:  # [1, n, vocab]
        new = [int(t) for t in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]
        with self._lock:
            self._wait(state.seq_len, len(new), cancel)
            self.forward_calls += 1
        rows = [self.row(tuple(state.ids + new[: i + 1])) for i in range(len(new))]
        state.ids = state.ids + new
        state.logits = rows[-1].unsqueeze(0)
        return torch.stack(rows).unsqueeze(0)

    def crop(self, state: FakeState, seq_len: int) -> None:
        if not 0 < seq_len <= state.seq_len:
            raise ValueError(f"crop to {seq_len} outside 1..{state.seq_len}")
        state.ids = state.ids[:seq_len]
        state.logits = self.row(tuple(state.ids)).unsqueeze(0)

    def rollback(self, state: FakeState, num_tokens: int) -> None:
        if num_tokens:
            self.crop(state, state.seq_len - num_tokens)

    def score(self, ids: list[int]) -> torch.Tensor:  # [len(ids), vocab]
        return torch.stack([self.row(tuple(ids[: i + 1])) for i in range(len(ids))])


def fake_pair(vocab_size: int = 8, mix: float = 0.6, **target_kwargs) -> tuple[TableLM, TableLM]:
    """(draft, target): the draft's logits are partly the target's."""
    target = TableLM(vocab_size, "target", **target_kwargs)
    draft = TableLM(vocab_size, "draft", correlate_with=target, mix=mix)
    return draft, target
