"""A fake CausalLM for fast protocol tests: logits are a fixed function of the context.

`TableLM(vocab, salt)` is the emulated-compute `SleepLM`
(tandem.models.emulated) with test-friendly timing: every context gets a deterministic
logit row seeded by (salt, context); `correlate_with` mixes another table's logits in, so a
draft/target pair agrees often but not always. `step_delay_s` makes each forward pass take
that long per token (plus `slow_positions` stalls), sleeping in small slices and checking the
cancel event in between (as the real backend checks it between layers). `forward_calls`
counts decodes.
"""

from __future__ import annotations

import threading
import time

from tandem.models.base import Cancelled
from tandem.models.emulated import SleepLM


class TableLM(SleepLM):
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
        super().__init__(
            f"table-{salt}",
            vocab_size=vocab_size,
            base_s=0.0,
            per_token_s=0.0,
            prefill_s=0.0,
            other=correlate_with,
            mix=mix if correlate_with is not None else 0.0,
            scale=scale,
            key=salt,
        )
        self.step_delay_s = step_delay_s
        self.slow_positions: dict[int, float] = {}  # seq_len -> extra delay for that token
        self.forward_calls = 0
        self._lock = threading.Lock()

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

    def _prefill_wait(self, cancel: threading.Event | None, started: float) -> None:
        self._wait(0, 1, cancel)

    def _decode_wait(
        self, seq_len: int, n: int, cancel: threading.Event | None, started: float
    ) -> None:
        with self._lock:
            self._wait(seq_len, n, cancel)
            self.forward_calls += 1


def fake_pair(vocab_size: int = 8, mix: float = 0.6, **target_kwargs) -> tuple[TableLM, TableLM]:
    """(draft, target): the draft's logits are partly the target's."""
    target = TableLM(vocab_size, "target", **target_kwargs)
    draft = TableLM(vocab_size, "draft", correlate_with=target, mix=mix)
    return draft, target
