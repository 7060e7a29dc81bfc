"""Cross-session batching of verification forward passes on the cloud.

Words used here:
- *item*: one session's forward pass request: its single-row KV `State` and the block of
  token ids to append (the Verifier's pending token + fixed tokens + drafts).
- *batch*: the items that were waiting when the batch started, run as ONE forward pass.
- *window*: how long the batcher waits after the first item of an idle period for others
  (`window_ms`, default 2 ms); it ends early once every *attached* session (`attach()` /
  `detach()`, one per cloud session) has an item queued, so a lone session never waits.
  Items that arrive while a batch runs need no window: they are all waiting when that batch
  ends and form the next one.
- *queued tokens*: block tokens submitted and not yet answered (waiting or running); the
  cloud's admission control reads it (`max_queued_tokens`).

Theory of operation. Each session's `Verifier` runs in a worker thread of `executor` and sees
a `BatchedLM`: the model with `decode` replaced. A single-row decode is handed to the batcher
and the thread blocks until its batch is done. One batcher thread loops: wait for an item,
wait out the window (or until `max_batch` items), take everything queued, and `run_batch`:

    stack the rows' states                  lm.stack: left padding, one KV cache  [B, ...]
    right-pad each block to the longest     junk tokens after a row's real block
    one decode of [B, n_max] tokens         logits [B, n_max, vocab]
    split the state back into rows          lm.split_rows: copies, left padding removed
    crop each row to its real block         the junk tokens' KV and logits disappear

Right padding is exact because attention is causal: a row's real positions never attend to
the junk after them, and the crop removes the junk from the cache. Left padding is masked out
and positions count only real tokens (tandem.models.hf). So each row gets the logits it would
get alone, up to float rounding: a batched matmul may sum in another order, so logits differ
by ~1e-6 (measured on the tiny models); greedy tokens and seeded draws are the same unless two
logits tie, or a uniform draw falls, within that rounding.

Cancellation: a batch is not preemptible per row. An item whose cancel event is set before
its batch starts is answered with `Cancelled` at once; one set during the batch gets
`Cancelled` afterwards and its state is left as it was (the batch worked on copies), which is
the `CausalLM.decode` contract. A batch of one runs the row's own pass (preemptible between
layers, no copies); models without `split_rows` fall back to one pass per item.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch

from tandem.models.base import Cancelled, CausalLM, State

OnBatch = Callable[[int, int], None]  # (items in the batch, block tokens in it)


@dataclass
class _Item:
    state: State
    ids: list[int]
    cancel: threading.Event | None
    future: Future = field(default_factory=Future)


def run_batch(lm: CausalLM, states: list[State], blocks: list[list[int]]) -> list[tuple]:
    """One forward pass for every (single-row state, block); returns (new state, logits) per
    row, logits [1, len(block), vocab]. The input states are not modified."""
    assert len(states) == len(blocks) and all(s.batch == 1 for s in states)
    width = max(len(b) for b in blocks)
    pad_id = getattr(lm, "pad_id", 0)
    filled = [
        s if s.logits is not None else replace(s, logits=torch.zeros(1, lm.vocab_size))
        for s in states
    ]  # stack concatenates logits; decode overwrites them anyway
    stacked = lm.stack(filled)
    ids = torch.tensor([b + [pad_id] * (width - len(b)) for b in blocks], dtype=torch.long)
    logits = lm.decode(stacked, ids)  # [B, width, vocab]
    rows = lm.split_rows(stacked)
    out = []
    for row, (state, block) in enumerate(zip(rows, blocks, strict=True)):
        if len(block) < width:
            lm.crop(state, state.seq_len - (width - len(block)))
        out.append((state, logits[row : row + 1, : len(block)].clone()))
    return out


class VerifyBatcher:
    """Runs single-row decodes submitted from many threads as batched forward passes."""

    def __init__(
        self,
        lm: CausalLM,
        *,
        window_ms: float = 2.0,
        max_batch: int = 64,
        max_workers: int = 64,
        on_batch: OnBatch | None = None,
    ) -> None:
        self.lm = lm
        self.window_s = max(0.0, window_ms) / 1000.0
        self.max_batch = max_batch
        self.on_batch = on_batch
        self.executor = ThreadPoolExecutor(max_workers, thread_name_prefix="tandem-verify")
        self.batch_sizes: dict[int, int] = {}  # batch size -> how many batches had it
        self._queue: list[_Item] = []
        self._queued_tokens = 0
        self._cond = threading.Condition()
        self._closed = False
        self._attached = 0  # sessions using the batcher (0: unknown, always wait the window)
        self._thread: threading.Thread | None = None

    @property
    def queued_tokens(self) -> int:
        with self._cond:
            return self._queued_tokens

    def decode(
        self, state: State, ids: list[int], cancel: threading.Event | None = None
    ) -> torch.Tensor:  # [1, len(ids), vocab]
        """`CausalLM.decode` for one row, batched with whatever else is waiting (blocks)."""
        if cancel is not None and cancel.is_set():
            raise Cancelled("decode cancelled")
        item = _Item(state=state, ids=[int(t) for t in ids], cancel=cancel)
        with self._cond:
            if self._closed:
                raise RuntimeError("the verify batcher is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="tandem-batcher", daemon=True
                )
                self._thread.start()
            self._queue.append(item)
            self._queued_tokens += len(item.ids)
            self._cond.notify_all()
        new, logits = item.future.result()
        if new is state:
            return logits
        state.ids, state.pads, state.cache = new.ids, new.pads, new.cache
        state.logits, state.recent_logits = new.logits, new.recent_logits
        return logits

    @property
    def attached(self) -> int:
        """Sessions attached now (one per cloud session using the batcher)."""
        with self._cond:
            return self._attached

    def attach(self) -> None:
        """A session that will submit items starts; the window ends early once every attached
        session has an item queued (a lone session never waits)."""
        with self._cond:
            self._attached += 1

    def detach(self) -> None:
        with self._cond:
            self._attached -= 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.executor.shutdown(wait=False, cancel_futures=True)

    # -- the batcher thread -------------------------------------------------------------------

    def _take(self) -> list[_Item] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            deadline = time.monotonic() + self.window_s
            expected = min(self.max_batch, self._attached or self.max_batch)
            while len(self._queue) < expected and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            return batch

    def _loop(self) -> None:
        while self._step():
            pass

    def _step(self) -> bool:
        """Take and run one batch; False once closed. (Its own frame, so that nothing of a
        finished batch, states included, stays referenced while the next is awaited.)"""
        batch = self._take()
        if batch is None:
            return False
        live = []
        for item in batch:
            if item.cancel is not None and item.cancel.is_set():
                item.future.set_exception(Cancelled("decode cancelled"))
            else:
                live.append(item)
        try:
            if live:
                self._run(live)
        finally:
            with self._cond:
                self._queued_tokens -= sum(len(item.ids) for item in batch)
        return True

    def _run(self, items: list[_Item]) -> None:
        tokens = sum(len(item.ids) for item in items)
        if len(items) == 1 or not hasattr(self.lm, "split_rows"):
            for item in items:  # unbatched: the row's own pass, preemptible by its cancel
                try:
                    logits = self.lm.decode(item.state, item.ids, cancel=item.cancel)
                except Exception as exc:  # noqa: BLE001 - the waiting session re-raises it
                    item.future.set_exception(exc)
                else:
                    item.future.set_result((item.state, logits))
            self._count(1, tokens, batches=len(items))
            return
        try:
            results = run_batch(self.lm, [i.state for i in items], [i.ids for i in items])
        except Exception as exc:  # noqa: BLE001 - every waiting session must hear about it
            for item in items:
                item.future.set_exception(exc)
            return
        self._count(len(items), tokens)
        for item, result in zip(items, results, strict=True):
            if item.cancel is not None and item.cancel.is_set():
                item.future.set_exception(Cancelled("decode cancelled"))
            else:
                item.future.set_result(result)

    def _count(self, size: int, tokens: int, *, batches: int = 1) -> None:
        self.batch_sizes[size] = self.batch_sizes.get(size, 0) + batches
        if self.on_batch is not None:
            for _ in range(batches):
                self.on_batch(size, tokens // batches)


class BatchedLM:
    """A `CausalLM` whose single-row decodes go through a `VerifyBatcher`; everything else
    (prefill, crop, tokenizer, ...) is the wrapped model's."""

    def __init__(self, lm: CausalLM, batcher: VerifyBatcher) -> None:
        self._lm = lm
        self._batcher = batcher

    def decode(self, state: State, ids, cancel: threading.Event | None = None) -> torch.Tensor:
        if (
            state.batch != 1
            or isinstance(ids, torch.Tensor)
            or not all(isinstance(t, int) for t in ids)
        ):
            return self._lm.decode(state, ids, cancel=cancel)
        return self._batcher.decode(state, ids, cancel=cancel)

    def __getattr__(self, name: str):
        return getattr(self._lm, name)
