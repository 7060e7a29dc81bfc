"""A model plus the token sequence it conditions on, fed lazily (one side's KV bookkeeping).

Words used here:
- *ids*: prompt + output tokens this side currently believes in (committed and, on the
  device, drafted). *fed*: how many of them are in the KV cache (`state.seq_len`); the rest
  are *pending* and get fed with the next forward pass, together with any new tokens.
- *rows*: next-token logits. `logits(extra)` returns len(extra) + 1 rows: the row that
  predicts extra[0], ..., and the row after the last one (the *bonus* row).
- *token calls* (`token_calls=True`): every forward pass feeds one token, so a block of n
  tokens is n passes. Engines whose kernels are not batch-invariant (llama.cpp: a token's
  logits depend a little on how many tokens share its call, tandem.models.llamacpp NUMERICS)
  then give every row the logits plain autoregressive decoding gives it, bit for bit, as long
  as the row's KV cells lie where AR's would (one session at a time on the model): the
  cloud's `SpecConfig.verify_calls = "token"`. It costs the block's saving: n passes, not one.

Rollback is `truncate(n)`: keep prompt + n output tokens and crop the cache to match.
Cancellation comes from the backend: a cancelled decode leaves the state (and `ids`) as they
were, so a caller can always retry or roll back.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from tandem.models.base import CausalLM, State, release


class LMContext:
    """One side's model state: `ids` with a lazily fed KV cache."""

    def __init__(
        self, lm: CausalLM, prompt_ids: Sequence[int], *, token_calls: bool = False
    ) -> None:
        if not prompt_ids:
            raise ValueError("the prompt must have at least one token")
        self.lm = lm
        self.token_calls = token_calls
        self.ids: list[int] = [int(t) for t in prompt_ids]
        self.prompt_len = len(self.ids)
        self.state: State | None = None
        self.forward_passes = 0  # decode calls that completed

    def prefill(self, cancel: threading.Event | None = None) -> None:
        self.state = self.lm.prefill(self.ids, cancel=cancel)

    def release(self) -> None:
        """Drop the KV state now (the generation is over): its cells go back to the model,
        before the session's last message, so the next session's rows lie where they would
        on a fresh model (token calls' bit-exactness depends on it, module docstring). A
        backend that can (`free`: llama.cpp) takes the cells back at once; otherwise they go
        when the state is collected."""
        if self.state is not None:
            release(self.lm, self.state)
        self.state = None

    @property
    def fed(self) -> int:
        return self.state.seq_len if self.state is not None else 0

    @property
    def row_ready(self) -> bool:
        """Whether the row after `ids` is computed: `logits()` needs no forward pass."""
        return (
            self.state is not None and self.fed == len(self.ids) and self.state.logits is not None
        )

    @property
    def output(self) -> list[int]:
        return self.ids[self.prompt_len :]

    def append(self, tokens: Sequence[int]) -> None:
        """Add tokens to the sequence; they are fed with the next forward pass."""
        self.ids.extend(int(t) for t in tokens)

    def truncate(self, num_output: int) -> None:
        """Keep the prompt and the first `num_output` output tokens (rollback)."""
        length = self.prompt_len + num_output
        assert num_output >= 0 and length <= len(self.ids), (num_output, len(self.ids))
        del self.ids[length:]
        if self.state is not None and self.state.seq_len > length:
            self.lm.crop(self.state, length)

    def logits(
        self, extra: Sequence[int] = (), cancel: threading.Event | None = None
    ) -> torch.Tensor:  # [len(extra) + 1, vocab]
        """Feed pending + `extra` tokens in one forward pass; `extra` joins `ids` on success."""
        assert self.state is not None, "prefill first"
        extra = [int(t) for t in extra]
        if self.fed == len(self.ids) and self.state.logits is None:
            self._unfeed_last()  # a crop dropped the kept logits: recompute the last row
        pending = self.ids[self.fed :]
        if not pending and not extra:
            return self.state.logits[0:1].clone()
        before = self.state.logits
        out = self._decode(pending + extra, cancel)  # [n, vocab]
        self.forward_passes += 1
        self.ids.extend(extra)
        if pending:
            return out[len(pending) - 1 :]
        return torch.cat([before[0:1], out])

    def _decode(self, tokens: list[int], cancel: threading.Event | None) -> torch.Tensor:
        """Logits [len(tokens), vocab] of feeding `tokens`: one pass, or one per token."""
        if not self.token_calls or len(tokens) == 1:
            return self.lm.decode(self.state, tokens, cancel=cancel)[0]
        length, logits = self.state.seq_len, self.state.logits
        rows = []
        try:
            for token in tokens:
                rows.append(self.lm.decode(self.state, [token], cancel=cancel)[0])
        except BaseException:  # the protocol's contract: a cancelled decode changes nothing
            if self.state.seq_len > length:
                self.lm.crop(self.state, length)
                self.state.logits, self.state.recent_logits = logits, None
            raise
        out = torch.cat(rows)
        self.state.recent_logits = out.unsqueeze(0)  # a crop inside the block keeps its row
        return out

    def _unfeed_last(self) -> None:
        """Make the last fed token pending again (or re-prefill a one-token context)."""
        if self.fed > 1:
            self.lm.crop(self.state, self.fed - 1)
        else:
            self.state = self.lm.prefill(self.ids[:1])
