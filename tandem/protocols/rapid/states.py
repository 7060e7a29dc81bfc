"""KV-state helpers shared by the drafter and the target side.

- *block prefill*: a long prompt is prefilled in blocks of `block` tokens (one `prefill`, then
  `decode` calls), which bounds the attention scratch memory of an 8K-32K prompt; the
  logits are the same as one prefill (causal attention, same positions).
- *mark* / *reset*: remember a prefilled prompt's length and next-token logits, and later
  cut the state back to it, so one prefill serves several methods side by side (benchmarks).
- *shared prefix*: many prompts that start with the same long context continue from one
  prefill of it (`Prefilled(..., prefix=...)`: a copy of the prefix's state, which the
  llama.cpp backend shares cell by cell, then the prompt's own tail).
- *KV file cache*: a long prefill is saved through the backend's `save_state` and loaded on
  the next run (`Prefilled.cached`), keyed by the model's fingerprint and the token ids; the
  time the prefill took when it was computed is kept beside it and reported as `prefill_s`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tandem.errors import TandemError
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
    its measured time `prefill_s`. With `prefix` (a Prefilled whose ids start `ids`), only the
    tail is computed; `prefill_s` is then the prefix's time plus the tail's (what this prompt
    alone would have cost), `tail_s` the tail's alone.
    """

    def __init__(
        self,
        lm: CausalLM,
        ids: list[int],
        *,
        block: int = PREFILL_BLOCK,
        prefix: Prefilled | None = None,
        state: State | None = None,
        prefill_s: float | None = None,
    ):
        import time

        start = time.perf_counter()
        self.lm, self.ids = lm, list(ids)
        self.loaded = state is not None
        self.load_s: float | None = None  # seconds to read it from a KV file (`cached`)
        if state is not None:  # `cached`: computed on an earlier run
            self.state = state
        elif prefix is not None:
            n = len(prefix.ids)
            if prefix.lm is not lm or self.ids[:n] != prefix.ids or len(self.ids) <= n:
                raise TandemError("a shared prefix must be a proper prefix on the same model")
            self.state = prefix.copy()
            for at in range(n, len(self.ids), block):
                lm.decode(self.state, [self.ids[at : at + block]])
        else:
            self.state = prefill_long(lm, self.ids, block)
        self.tail_s = time.perf_counter() - start
        base = prefix.prefill_s if prefix is not None else 0.0
        self.prefill_s = prefill_s if prefill_s is not None else base + self.tail_s
        self.mark = mark(self.state)

    @classmethod
    def cached(cls, lm: CausalLM, ids: list[int], folder: Path | None) -> Prefilled:
        """`ids` prefilled, or loaded from `folder` if an earlier run saved them there (and
        saved there now if not). `folder=None`: no cache."""
        if folder is None:
            return cls(lm, ids)
        import hashlib
        import json
        import time

        key = hashlib.sha256(f"{lm.fingerprint}:{','.join(map(str, ids))}".encode()).hexdigest()
        kv, meta = folder / f"{key[:32]}.kv", folder / f"{key[:32]}.json"
        if kv.is_file() and meta.is_file():
            start = time.perf_counter()
            try:
                seconds = float(json.loads(meta.read_text())["prefill_s"])
                state = lm.load_state(kv)
            except (TandemError, ValueError, KeyError, OSError):
                pass  # unreadable: compute it again (and overwrite)
            else:
                if state.row_ids(0) == list(ids):
                    loaded = cls(lm, ids, state=state, prefill_s=seconds)
                    loaded.load_s = time.perf_counter() - start
                    return loaded
        made = cls(lm, ids)
        folder.mkdir(parents=True, exist_ok=True)
        lm.save_state(made.state, kv)
        meta.write_text(json.dumps({"prefill_s": made.prefill_s, "tokens": len(ids)}))
        return made

    def fresh(self) -> State:
        reset(self.lm, self.state, self.mark)
        return self.state

    def copy(self) -> State:
        """An independent copy of the prompt's state (e.g. for a drafter that compresses it)."""
        return self.lm.stack([self.fresh()])
