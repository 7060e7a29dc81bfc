"""The decoder thread of one side: drafts continuously, ahead of the target sequence.

Words used here:
- *base*: the target tokens resolved so far; *pending*: this side's own unresolved drafts,
  in the current epoch. The thread drafts position len(base) + len(pending) from the state
  after base + pending, so it runs ahead of the aggregator by up to `lookahead` drafts.
- *resolve*: the session tells the worker the target token of the next position and whether
  this side's draft there was accepted. Accepted: the front pending draft becomes base.
  Rejected: pending is dropped, the epoch changes, and the decode in flight is cancelled
  (`lm.decode(..., cancel=event)` aborts between layers); the next sync crops the KV cache
  and decodes the target token instead. If the session adopted this side's branch draft
  there, its token is the one pending draft of the new epoch.
- *branch request* (t, x, epoch): draft t + 1 after base + pending up to t - 1 + [x], on a
  copy of the rows (`DocDecoder.fork_law`), before the next draft of the main chain; dropped
  if the epoch changed or pending no longer reaches t. Requests come from the session (the
  peer's draft at t was x, `DragonConfig.branch = "peer"`) or from the worker itself while
  the session sets `branch_own` ("own"): x = the second choice of its own draft at t when
  that draft holds less than `BRANCH_CONFIDENCE` of the law it sent.

Theory of operation: the session (event loop) and the thread share `base`, `pending`,
`epoch` and `stop` under one condition variable. The thread snapshots them, decodes without
the lock, and publishes its draft only if the epoch did not change meanwhile; drafts that
slip through anyway carry their epoch and are dropped by the session.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from tandem.models.base import CancelEvent, Cancelled
from tandem.protocols.dragon.decoder import DocDecoder, SideLaw
from tandem.protocols.dragon.queues import Draft

# a draft that holds less than this much of its sent law is branched on its second choice
# (when the session sets `branch_own`)
BRANCH_CONFIDENCE = 0.5

# (law, position, epoch, seconds spent, context length) -> Draft
MakeDraft = Callable[[SideLaw, int, int, float, int], Draft]


class DraftWorker:
    def __init__(
        self,
        *,
        build: Callable[[], DocDecoder],
        make_draft: MakeDraft,
        emit: Callable[[Draft], None],
        on_ready: Callable[[DocDecoder, float], None],
        on_error: Callable[[BaseException], None],
        max_new_tokens: int,
        lookahead: int,
        eos_id: int | None,
        name: str = "dragon-decoder",
    ):
        self._build, self._make, self._emit = build, make_draft, emit
        self._on_ready, self._on_error = on_ready, on_error
        self.max_new_tokens = max_new_tokens
        self.lookahead = lookahead
        self.eos_id = eos_id
        self._cond = threading.Condition()
        # a CancelEvent, not a plain Event: llama.cpp then checks a flag between graph nodes
        # instead of calling back into Python (and taking the GIL) at every node
        self.cancel = CancelEvent()
        self.base: list[int] = []
        self.pending: list[int] = []
        self.epoch = 0
        self.branch_requests: list[tuple[int, int, int]] = []  # (t, x, epoch)
        self.branch_own = False  # set by the session: branch on its own uncertain drafts
        self._stop = False
        self.decoder: DocDecoder | None = None
        self.cancelled = 0  # decodes aborted by a rejection
        self.discarded = 0  # drafts finished after their epoch ended
        self.rollbacks = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def resolve(
        self, token: int, *, accepted: bool, epoch: int, adopted: int | None = None
    ) -> None:
        with self._cond:
            self.base.append(token)
            if accepted and self.pending and self.pending[0] == token and epoch == self.epoch:
                self.pending.pop(0)
            else:
                self.pending.clear()
                if adopted is not None:
                    self.pending.append(adopted)
                self.epoch = epoch
                self.rollbacks += 1
                self.cancel.set()
            self._cond.notify_all()

    def request_branch(self, position: int, token: int, epoch: int) -> None:
        with self._cond:
            self.branch_requests.append((position, token, epoch))
            self._cond.notify_all()

    def _next_branch(self) -> tuple[list[int], int, int, int] | None:
        """(prefix, t, x, epoch) of the first request still valid; drops the others before it
        (call under the lock)."""
        while self.branch_requests:
            t, token, epoch = self.branch_requests[0]
            ahead = t - len(self.base)
            if epoch != self.epoch or not 0 <= ahead < len(self.pending):
                self.branch_requests.pop(0)
                continue
            return self.base + self.pending[:ahead] + [token], t, token, epoch
        return None

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self.cancel.set()
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread; True once it has ended (its decoder is then free to close)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _wants_draft(self) -> bool:
        if len(self.base) + len(self.pending) >= self.max_new_tokens:
            return False
        if len(self.pending) >= self.lookahead:
            return False
        if self.eos_id is not None and self.eos_id in self.pending:
            return False
        return not (self.base and self.base[-1] == self.eos_id)

    def _run(self) -> None:
        try:
            began = time.perf_counter()
            decoder = self._build()
            if decoder.state is None:
                decoder.prefill()
            self.decoder = decoder
            self._on_ready(decoder, time.perf_counter() - began)
            self._loop(decoder)
        except BaseException as exc:  # noqa: BLE001 - reported to the session, never lost
            self._on_error(exc)

    def _loop(self, decoder: DocDecoder) -> None:
        while True:
            with self._cond:
                waited = time.perf_counter()
                while not self._stop and not self._wants_draft():
                    if self._next_branch() is not None:
                        break
                    self._cond.wait()
                if decoder.clock is not None:  # no room ahead, or waiting for a resolution
                    decoder.clock.since("idle", waited)
                if self._stop:
                    return
                branch = self._next_branch()
                if branch is not None:
                    self.branch_requests.pop(0)
                prefix = self.base + self.pending
                epoch = self.epoch
                self.cancel.clear()
            if branch is not None:
                self._branch(decoder, *branch)
                continue
            began = time.perf_counter()
            try:
                decoder.sync(prefix, cancel=self.cancel)
            except Cancelled:
                self.cancelled += 1
                continue
            law = decoder.law()
            draft = self._make(
                law, len(prefix), epoch, time.perf_counter() - began, decoder.context_len
            )
            with self._cond:
                if epoch != self.epoch or self._stop:
                    self.discarded += 1
                    continue
                self.pending.append(draft.token)
                alternative = self._alternative(draft)
                if alternative is not None:
                    self.branch_requests.append((draft.position, alternative, epoch))
            self._emit(draft)

    def _alternative(self, draft: Draft) -> int | None:
        """With `branch_own`: the most probable other token of the law sent with `draft`,
        when the draft itself holds less than `BRANCH_CONFIDENCE` of it."""
        if not self.branch_own or draft.position + 1 >= self.max_new_tokens:
            return None
        probs = draft.sent_probs
        if float(probs[draft.token]) >= BRANCH_CONFIDENCE:
            return None
        others = probs.clone()
        others[draft.token] = 0.0
        token = int(others.argmax())
        return token if others[token] > 0 and token != self.eos_id else None

    def _branch(self, decoder: DocDecoder, prefix: list[int], t: int, token: int, epoch: int):
        began = time.perf_counter()
        try:
            if decoder.tokens[: len(prefix) - 1] != prefix[:-1]:  # e.g. just after an adoption
                decoder.sync(prefix[:-1], cancel=self.cancel)
            law, context = decoder.fork_law(prefix, cancel=self.cancel)
        except Cancelled:
            self.cancelled += 1
            return
        draft = self._make(law, t + 1, epoch + 1, time.perf_counter() - began, context)
        draft = replace(draft, branch_of=(t, token))
        with self._cond:
            if epoch != self.epoch or self._stop:
                self.discarded += 1
                return
        self._emit(draft)
