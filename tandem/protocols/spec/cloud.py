"""The cloud's asyncio layer: pumps a `Verifier` over a `Channel` for one session.

Theory of operation. The first message is the device's start message (prompt + settings).
The cloud prefills the target, says ready, then loops: take every message that has arrived,
join contiguous requests of the current epoch into one (fast verification: whatever prefix
of a block is here gets verified now, in one forward pass), drop stale ones, verify in a
worker thread and send the verdict at once. A device Interrupt sets the verifier's cancel
event (the target stops between layers) and rolls the cloud back. The session ends with the
device's end message (answered with the cloud's measurements) or when the channel closes.

With a `VerifyBatcher` (tandem.models.batching) the verifier's model is a `BatchedLM` and
verification runs on the batcher's executor: the forward pass joins those of other sessions
that are ready at the same time. Nothing else changes (same Verifier, same verdicts). An
`observer` (the cloud's metrics) hears every verdict: drafts verified, accepted, tokens added.

Pipeline "eager" (eager.py): whenever the inbox is empty and the output is not complete, or
the step is free (its row is there: before any waiting request), the cloud runs one AR step
of its `EagerVerifier` in a worker thread and streams the token down; a
request arriving meanwhile sets the cancel event (the step stops between layers, nothing is
committed) and is admitted (chain and content checks), then its remaining drafts verified.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from typing import Protocol

from tandem.codecs import make_codec
from tandem.errors import TandemError
from tandem.models.base import Cancelled, CausalLM
from tandem.models.batching import BatchedLM
from tandem.protocols.spec import wire
from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.eager import EagerVerifier
from tandem.protocols.spec.verifier import Request, Verifier, merge
from tandem.transport import (
    ChannelClosed,
    End,
    Interrupt,
    Start,
    TransportError,
    VerifyRequest,
    control,
)

INBOX_MESSAGES = 1024  # read ahead of the verifier; beyond, the channel's queue (then TCP) holds


class Observer(Protocol):
    def verdict(self, drafts: int, accepted: int, tokens: int) -> None: ...


def parse_start(msg) -> tuple[SpecConfig, list[int], str]:
    """(config, prompt ids, mode) of a start message; ValueError / TandemError if bad."""
    if not isinstance(msg, Start):
        raise ValueError("expected a spec start message")
    body = control.body(msg)
    config = SpecConfig.from_json(dict(body.get("config", {})))
    prompt = [int(t) for t in msg.tokens]
    if not prompt:
        raise ValueError("empty prompt")
    return config, prompt, msg.mode


class CloudSession:
    """One speculative session on the cloud side."""

    def __init__(
        self,
        channel,
        lm: CausalLM,
        config: SpecConfig,
        prompt: list[int],
        *,
        batcher=None,  # a tandem.models.batching.VerifyBatcher, or None: this session's own passes
        observer: Observer | None = None,
    ) -> None:
        self.channel = channel
        self.lm = lm
        self.config = config
        self.batcher = batcher
        self.observer = observer
        if batcher is not None:
            lm = BatchedLM(lm, batcher)
        self.eager = config.pipeline == "eager"
        kind = EagerVerifier if self.eager else Verifier
        self.verifier = kind(lm, prompt, config, eos_id=lm.tokenizer.eos_token_id)
        self._ar_running: float | None = None  # when the eager AR step in flight started
        self.codec = None if config.separate else make_codec(config.codec, **config.codec_params)
        self.inbox: asyncio.Queue = asyncio.Queue(maxsize=INBOX_MESSAGES)
        self.stats: dict = {
            "model": getattr(lm, "name", ""),
            "prefill_s": 0.0,
            "verify_s": [],
            "verify_drafts": [],  # drafts in each verification pass (verify_s's sizes)
            "requests": 0,
            "stale_requests": 0,
            "merged_requests": 0,
            "interrupts": 0,
            "cancelled_verifications": 0,
            "drafts_verified": 0,
            "drafts_accepted": 0,
            "tokens": 0,
            "ar_tokens": 0,  # eager: tokens committed by AR steps
            "ar_step_s": [],  # eager: AR steps that ran a forward pass
            "free_ar_steps": 0,  # eager: AR steps whose row a verification had computed
            "cancelled_ar_steps": 0,
            "skipped_drafts": 0,  # eager: drafts matching tokens already committed
            "branches_promoted": 0,  # eager: branches taken as the next chain
        }
        self.output: list[int] = []

    async def run(self) -> dict:
        reader = asyncio.get_running_loop().create_task(self._read())
        if self.batcher is not None:
            self.batcher.attach()
        try:
            start = time.perf_counter()
            await asyncio.to_thread(self.verifier.prefill)
            self.stats["prefill_s"] = time.perf_counter() - start
            await self.channel.send(
                control.ready({"model": self.stats["model"], "prefill_s": self.stats["prefill_s"]})
            )
            await (self._eager_loop() if self.eager else self._loop())
        finally:
            if self.batcher is not None:
                self.batcher.detach()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        return self.stats

    async def _read(self) -> None:
        try:
            while True:
                msg = await self.channel.recv()
                if isinstance(msg, Interrupt) or self._preempts(msg):
                    self.verifier.cancel.set()
                await self.inbox.put(msg)
        except TransportError:
            self.verifier.cancel.set()
            await self.inbox.put(None)

    async def _loop(self) -> None:
        while True:
            requests = await self._take(await self.inbox.get())
            if requests is None:
                return
            await self._verify_all(requests)

    async def _eager_loop(self) -> None:
        verifier: EagerVerifier = self.verifier
        while True:
            if verifier.step_free or (self.inbox.empty() and not verifier.done):
                await self._ar_step()  # a free step goes first (eager.py: free step first)
                continue
            requests = await self._take(await self.inbox.get())
            if requests is None:
                return
            for request in merge(requests):
                admission = verifier.admit(request)
                self.stats["skipped_drafts"] += admission.skipped
                self.stats["branches_promoted"] = verifier.branches
                if admission.stale:
                    self.stats["stale_requests"] += 1
                if admission.verify is None:
                    continue
                verifier.cancel.clear()
                try:
                    result = await self._run_verify(admission.verify)
                except Cancelled:  # only the channel's end cancels a verification here
                    self.stats["cancelled_verifications"] += 1
                    break
                verifier.note_pass(len(admission.verify.drafts), result.verify_s)
                self._record(admission.verify, result)
                committed = tuple(verifier.committed[result.position :])
                await self.channel.send(wire.eager_result_message(result, committed))

    def _preempts(self, msg) -> bool:
        """Eager: whether `msg` should stop the AR step in flight (eager.py: *preempt*)."""
        if self._ar_running is None or not isinstance(msg, VerifyRequest):
            return False
        meta = msg.arrays.get("meta")
        epoch, fixed = (
            (int(meta[0]), int(meta[1])) if meta is not None and meta.shape == (3,) else (0, 0)
        )
        elapsed = time.perf_counter() - self._ar_running
        return self.verifier.worth_preempting(epoch, msg.position, msg.tokens, elapsed, fixed)

    async def _ar_step(self) -> None:
        """One eager AR step, preempted by a request that arrives meanwhile if that pays."""
        self.verifier.cancel.clear()
        start = time.perf_counter()
        self._ar_running = None if self.verifier.step_free else start  # nothing to preempt
        try:
            token = await asyncio.to_thread(self.verifier.ar_step)
        except Cancelled:
            self.stats["cancelled_ar_steps"] += 1
            return
        finally:
            self._ar_running = None
        if token is None:
            return
        step_s = time.perf_counter() - start
        if self.verifier.last_step_free:  # no forward pass: its time says nothing of t_ar
            step_s = 0.0
            self.stats["free_ar_steps"] += 1
        else:
            self.verifier.note_pass(1, step_s)
            self.stats["ar_step_s"].append(step_s)
        self.stats["ar_tokens"] += 1
        self._count_tokens(self.verifier.frontier)
        await self.channel.send(wire.token_message(self.verifier.frontier - 1, token, step_s))

    async def _take(self, first) -> list[Request] | None:
        """Parse `first` and every message already in the inbox: the requests in order,
        applying interrupts; None when the session is over (end message or the device gone)."""
        batch = [first]
        while not self.inbox.empty():
            batch.append(self.inbox.get_nowait())
        requests: list[Request] = []
        for msg in batch:
            if msg is None:
                return None  # the device is gone
            if isinstance(msg, VerifyRequest):
                self.stats["requests"] += 1
                requests.append(
                    wire.parse_request(
                        msg,
                        codec_name=self.config.codec,
                        codec=self.codec,
                        vocab_size=self.lm.vocab_size,
                    )
                )
            elif isinstance(msg, Interrupt):
                self.stats["interrupts"] += 1
                requests.clear()  # everything sent before the interrupt is void
                self.verifier.rollback(msg.position, msg.seq)
            elif isinstance(msg, End):
                self.output = [int(t) for t in msg.tokens]
                self._count_tokens(len(self.output))  # incl. tokens only the device saw
                self.verifier.ctx.release()  # free the KV before the device hears we are done
                await self._send_stats()
                return None
        return requests

    async def _verify_all(self, requests: list[Request]) -> None:
        merged = merge(requests)
        self.stats["merged_requests"] += len(requests) - len(merged)
        for request in merged:
            if not self.verifier.accepts(request):
                self.stats["stale_requests"] += 1
                continue
            self.verifier.cancel.clear()
            try:
                result = await self._run_verify(request)
            except Cancelled:
                self.stats["cancelled_verifications"] += 1
                return  # an Interrupt is waiting in the inbox
            self._record(request, result)
            await self.channel.send(wire.result_message(result))

    def _record(self, request: Request, result) -> None:
        self.stats["verify_s"].append(result.verify_s)
        self.stats["verify_drafts"].append(len(request.drafts))
        drafts = min(len(request.drafts), self.config.max_new_tokens - result.position)
        drafts = min(max(0, drafts), result.num_accepted + (1 if result.rejected else 0))
        self.stats["drafts_verified"] += drafts
        self.stats["drafts_accepted"] += result.num_accepted
        if self.observer is not None:
            self.observer.verdict(drafts, result.num_accepted, 0)
        self._count_tokens(self.verifier.frontier)

    def _count_tokens(self, total: int) -> None:
        """The session has `total` output tokens: tell the observer about the new ones."""
        new = total - self.stats["tokens"]
        if new > 0:
            self.stats["tokens"] = total
            if self.observer is not None:
                self.observer.verdict(0, 0, new)

    async def _run_verify(self, request: Request):
        if self.batcher is None:
            return await asyncio.to_thread(self.verifier.verify, request)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.batcher.executor, self.verifier.verify, request)

    async def _send_stats(self) -> None:
        stats = dict(self.stats)
        stats["forward_passes"] = self.verifier.forward_passes
        stats["bytes_sent"] = self.channel.bytes_sent
        stats["bytes_received"] = self.channel.bytes_received
        stats["agrees_with_device"] = (
            self.verifier.committed == self.output[: self.verifier.frontier]
        )
        with contextlib.suppress(TransportError):
            await self.channel.send(control.stats(stats))


async def serve_session(
    channel,
    lm: CausalLM,
    *,
    first=None,
    batcher=None,
    observer: Observer | None = None,
    live: weakref.WeakSet | None = None,
) -> dict | None:
    """The cloud side of one speculative session; returns the cloud's stats, or None if the
    peer left or sent a bad start message (it is told why). `batcher`: verify in batches with
    other sessions; `observer`: told every verdict; `live`: the session object is added to it
    (a weak set: the caller can check that finished sessions are freed)."""
    try:
        msg = first if first is not None else await channel.recv()
    except ChannelClosed:
        return None
    try:
        config, prompt, mode = parse_start(msg)
        if mode != "spec":
            raise ValueError(f"mode {mode!r} is not served by the spec session")
    except (ValueError, TypeError, TandemError) as exc:
        with contextlib.suppress(TransportError):
            await channel.send(wire.error_message(f"bad start message: {exc}"))
        return None
    return await run_session(
        channel, lm, config, prompt, batcher=batcher, observer=observer, live=live
    )


async def run_session(
    channel,
    lm: CausalLM,
    config: SpecConfig,
    prompt: list[int],
    *,
    batcher=None,
    observer: Observer | None = None,
    live: weakref.WeakSet | None = None,
    stats: dict | None = None,
) -> dict | None:
    """Serve one session whose start message is already read (config and the target's
    prompt known); `stats` are added to the session's stats. None if it failed (told why)."""
    session = CloudSession(channel, lm, config, prompt, batcher=batcher, observer=observer)
    session.stats.update(stats or {})
    if live is not None:
        live.add(session)
    try:
        return await session.run()
    except (ValueError, TandemError) as exc:
        with contextlib.suppress(TransportError):
            await channel.send(wire.error_message(str(exc)))
        return None
