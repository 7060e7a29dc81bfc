"""KV-state helpers shared by the drafter and the target side.

- *block prefill*: a long prompt is prefilled in blocks of `block` tokens (one `prefill`, then
  `decode` calls), which bounds the attention scratch memory of an 8K-32K prompt; the
  logits are the same as one prefill (causal attention, same positions).
- *mark* / *reset*: remember a prefilled prompt's length and next-token logits, and later
  cut the state back to it, so one prefill serves several methods side by side (benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.models.base import CausalLM, State

PREFILL_BLOCK = 1024


def prefill_long(lm: CausalLM, ids: list[int], block: int = PREFILL_BLOCK) -> State:
    """Prefill `ids` in blocks of `block` tokens."""
    state = lm.prefill(ids[:block])
    for start in range(block, len(ids), block):
        lm.decode(state, [ids[start : start + block]])
    return state


@dataclass(frozen=True)
class Mark:
    seq_len: int
    logits: torch.Tensor  # [1, vocab]


def mark(state: State) -> Mark:
    return Mark(seq_len=state.seq_len, logits=state.logits.clone())


def reset(lm: CausalLM, state: State, at: Mark) -> None:
    """Cut `state` back to `at` (a prefix of it) and restore its next-token logits."""
    if state.seq_len > at.seq_len:
        lm.crop(state, at.seq_len)
    state.logits = at.logits.clone()
    state.recent_logits = None


class Prefilled:
    """A prompt prefilled once on one LM; `fresh()` hands the state back cut to the prompt.

    Methods compared side by side each start from `fresh()`, so they share one prefill and
    its measured time `prefill_s`.
    """

    def __init__(self, lm: CausalLM, ids: list[int], *, block: int = PREFILL_BLOCK):
        import time

        start = time.perf_counter()
        self.lm, self.ids = lm, list(ids)
        self.state = prefill_long(lm, self.ids, block)
        self.prefill_s = time.perf_counter() - start
        self.mark = mark(self.state)

    def fresh(self) -> State:
        reset(self.lm, self.state, self.mark)
        return self.state

    def copy(self) -> State:
        """An independent copy of the prompt's state (e.g. for a drafter that compresses it)."""
        return self.lm.stack([self.fresh()])
