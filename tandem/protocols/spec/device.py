"""The device's asyncio layer: pumps a `Drafter` over a `Channel` (sync or async pipeline).

Theory of operation. The device sends the start message and prefills its draft model while
the cloud prefills the target. A reader task receives verdicts; a rejection sets the
drafter's cancel event at once (PicoSpec's interrupt: the draft model stops between layers)
and is applied once the running draft step has returned or been cancelled.

- sync (stop-and-wait): draft up to `draft_len` tokens (fewer if the bit budget or the token
  budget says so), send them as one final request, wait for the verdict, repeat.
- async (PicoSpec Sec. 3.2-3.3): keep drafting while earlier chunks are verified, assuming
  they will be accepted, up to `lookahead_blocks` blocks ahead (auto: enough to draft through
  a measured round trip, 2-8 blocks). Chunks are sent at block
  boundaries; with fast verification the first chunk of each epoch is sent after
  `first_chunk` tokens (the cloud starts on a prefix while the rest is drafted); with
  latency-aware truncation a partial block is sent once drafting it took `truncate_factor`
  times longer than expected. Model work runs in a thread, so sends and receives overlap it.
- eager ("the cloud never idles", eager.py): the async pump, an `EagerDrafter`, and every
  committed token that comes down (an AR token or an eager verdict's tokens) is adopted: drafts
  equal to it stay in flight, a different one restarts drafting after it (new epoch). With a
  `planner.Controller` the session re-plans each round: the block length, and whether to
  draft at all (not drafting = the cloud's AR stream alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

from tandem.errors import TandemError
from tandem.models.base import Cancelled, CausalLM
from tandem.protocols.decoding import OnToken
from tandem.protocols.spec import wire
from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.drafter import Drafter, DraftItem
from tandem.protocols.spec.eager import EagerDrafter
from tandem.protocols.spec.planner import Controller
from tandem.protocols.spec.stats import SpecReport, VerdictRecord
from tandem.transport import ChannelClosed, Error, TargetToken, TransportError, VerifyResult

STATS_TIMEOUT_S = 10.0


class DeviceSession:
    """One generation on the device side of an open channel."""

    def __init__(
        self,
        channel,
        lm: CausalLM,
        prompt_ids: list[int],
        config: SpecConfig,
        *,
        on_token: OnToken | None = None,
        start: tuple[dict, tuple[int, ...]] | None = None,
        controller: Controller | None = None,
    ) -> None:
        self.channel = channel
        # the start message's body and tokens (default: mode spec, the prompt itself; a mode
        # whose cloud builds its own prompt sends something else, e.g. private-spec)
        self.start = start or (
            {"mode": "spec", "config": config.to_json()},
            tuple(int(t) for t in prompt_ids),
        )
        self.lm = lm
        self.prompt_ids = list(prompt_ids)
        self.config = config
        self.on_token = on_token
        self.eager = config.pipeline == "eager"
        kind = EagerDrafter if self.eager else Drafter
        self.drafter = kind(lm, prompt_ids, config, eos_id=lm.tokenizer.eos_token_id)
        self.controller = controller  # eager: re-plans gamma and drafting each round
        self._gamma = config.draft_len  # the current block length
        self._speculate = True  # eager: False = let the cloud's AR stream run alone
        self._chunks: dict[int, int] = {}  # seq -> drafts in that request
        self.results: asyncio.Queue = asyncio.Queue()
        self.stats_future: asyncio.Future | None = None
        self.report = SpecReport(
            mode="spec", config=config.to_json(), tokens=[], text="", total_s=0.0, token_times=[]
        )
        self._seq = 0
        self._sent_at: dict[int, float] = {}
        self._start = 0.0
        self._epoch_start = 0  # frontier when the current epoch began
        self._step_ema: float | None = None
        self._latency_ema: float | None = None  # request sent -> verdict received
        self._chunk_started: float | None = None

    # ---- entry point --------------------------------------------------------------------

    async def run(self) -> SpecReport:
        loop = asyncio.get_running_loop()
        self.stats_future = loop.create_future()
        up0, down0 = self.channel.bytes_sent, self.channel.bytes_received
        self._start = time.perf_counter()
        await self._send_message(wire.control_message(wire.START, *self.start))
        reader = loop.create_task(self._read())
        try:
            t0 = time.perf_counter()
            try:
                await asyncio.to_thread(self.drafter.prefill)
                self.report.device_prefill_s = time.perf_counter() - t0
                if self.config.pipeline == "sync":
                    await self._run_sync()
                else:
                    await self._run_async()
            except Cancelled:
                failure = getattr(self, "_failure", None)
                if failure is None:
                    raise
                raise failure from None  # the cloud refused or vanished: say that, not "cancelled"
            self.report.total_s = time.perf_counter() - self._start
            end = wire.control_message(wire.END, {}, tuple(self.drafter.committed))
            with contextlib.suppress(asyncio.TimeoutError, TransportError):
                await self.channel.send(end)  # the output is complete: stats are a bonus
                self.report.cloud = await asyncio.wait_for(self.stats_future, STATS_TIMEOUT_S)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        self.report.uplink_bytes = self.channel.bytes_sent - up0
        self.report.downlink_bytes = self.channel.bytes_received - down0
        self.report.tokens = list(self.drafter.committed)
        self.report.text = self.lm.tokenizer.decode(self.report.tokens)
        return self.report

    # ---- receiving ----------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while True:
                msg = await self.channel.recv()
                if isinstance(msg, VerifyResult):
                    fields = wire.parse_result(msg)
                    if fields["rejected"]:
                        self.drafter.cancel.set()  # interrupt the draft step in flight
                    self.results.put_nowait((fields, msg.seq, time.perf_counter()))
                elif isinstance(msg, TargetToken) and self.eager:
                    self.results.put_nowait((wire.parse_token(msg), None, time.perf_counter()))
                elif isinstance(msg, Error):
                    self._fail(TandemError(f"cloud error: {msg.message}"))
                    return
                elif wire.control_kind(msg) == wire.STATS and not self.stats_future.done():
                    self.stats_future.set_result(wire.control_body(msg))
        except (ChannelClosed, TransportError) as exc:
            self._fail(TandemError(f"connection to the cloud lost: {exc}"))
        except ValueError as exc:
            self._fail(TandemError(f"bad message from the cloud: {exc}"))

    def _fail(self, error: TandemError) -> None:
        self._failure = error  # reported instead of the Cancelled it causes in a draft step
        self.drafter.cancel.set()
        self.results.put_nowait(error)
        if self.stats_future is not None and not self.stats_future.done():
            self.stats_future.set_result({})

    async def _next_result(self) -> None:
        """Wait for one verdict and apply it."""
        self._apply(await self.results.get())

    def _apply_ready(self) -> None:
        while not self.results.empty():
            self._apply(self.results.get_nowait())

    def _apply(self, item) -> None:
        if isinstance(item, TandemError):
            raise item
        fields, seq, received = item
        if "tokens" in fields:
            self._adopt(fields, seq, received)
            return
        sent = self._sent_at.pop(seq, received)
        latency, ema = received - sent, self._latency_ema
        self._latency_ema = latency if ema is None else 0.7 * ema + 0.3 * latency
        if fields["epoch"] != self.drafter.epoch:
            return  # for drafts already voided (after a device interrupt)
        outcome = self.drafter.apply(
            epoch=fields["epoch"],
            position=fields["position"],
            num_accepted=fields["num_accepted"],
            next_token=fields["next_token"],
            target_payload=fields["target_payload"],
        )
        self.report.verdicts.append(
            VerdictRecord(
                num_accepted=outcome.num_accepted,
                has_next=len(outcome.committed) > outcome.num_accepted,
                rejected=outcome.rejected,
                verify_s=fields["verify_s"],
                latency_s=latency,
            )
        )
        now = time.perf_counter() - self._start
        for token in self.drafter.committed[len(self.report.token_times) :]:
            self.report.token_times.append(now)
            if self.on_token is not None:
                self.on_token(token)
        if outcome.rejected:
            self._epoch_start = self.drafter.frontier
            self._chunk_started = None

    def _adopt(self, fields: dict, seq: int | None, received: float) -> None:
        """Eager: commit the cloud's tokens (an AR token when `seq` is None, else a verdict)."""
        outcome = self.drafter.adopt(fields["position"], fields["tokens"])
        if seq is not None:
            sent = self._sent_at.pop(seq, received)
            latency, ema = received - sent, self._latency_ema
            self._latency_ema = latency if ema is None else 0.7 * ema + 0.3 * latency
            self.report.verdicts.append(
                VerdictRecord(
                    num_accepted=fields["num_accepted"],
                    has_next=fields["rejected"],
                    rejected=fields["rejected"],
                    verify_s=fields["verify_s"],
                    latency_s=latency,
                )
            )
            if self.controller is not None:
                self.controller.observe_verify(self._chunks.pop(seq, 1), fields["verify_s"])
                self.controller.observe_network(max(0.0, latency - fields["verify_s"]))
        elif self.controller is not None:
            self.controller.observe_ar(fields["step_s"])
        if self.controller is not None:
            self.controller.observe_drafts(outcome.num_accepted, int(outcome.rejected))
        self._note_committed(received)
        if outcome.rejected:
            self._epoch_start = self.drafter.frontier
            self._chunk_started = None

    def _note_committed(self, received: float) -> None:
        now = received - self._start  # known since it arrived (perhaps during the prefill)
        for token in self.drafter.committed[len(self.report.token_times) :]:
            self.report.token_times.append(now)
            if self.on_token is not None:
                self.on_token(token)

    def _replan(self) -> None:
        """Eager with a controller: this round's block length, and whether to draft at all."""
        if self.controller is None or not self.eager:
            return
        plan = self.controller.plan(("ar", "eager"))
        self._speculate = plan.method != "ar"
        self._gamma = plan.gamma if plan.gamma else self._gamma

    # ---- drafting and sending -----------------------------------------------------------

    def _draft_step(self, bits_left: int | None) -> DraftItem | None:
        """One draft step (runs in a worker thread); records its duration."""
        start = time.perf_counter()
        passes = self.drafter.ctx.forward_passes
        item = self.drafter.draft_next(bits_left)
        elapsed = time.perf_counter() - start
        if self.drafter.ctx.forward_passes > passes:  # not the step right after the prefill
            self.report.draft_steps.append(elapsed)
            if self.controller is not None:
                self.controller.observe_draft(elapsed)
            ema = self._step_ema
            self._step_ema = elapsed if ema is None else 0.7 * ema + 0.3 * elapsed
        if item is not None:
            self.report.drafted += 1
        return item

    def _bits_left(self) -> int | None:
        """Bits the next draft may use in the current chunk (None: no budget, or first draft)."""
        if self.config.bit_budget is None or self.drafter.unsent == 0:
            return None
        return self.config.bit_budget - self.drafter.unsent_bits()

    async def _send(self) -> None:
        chunk = self.drafter.take_chunk()
        self._seq += 1
        self._sent_at[self._seq] = time.perf_counter()
        self.report.drafts_sent += len(chunk.drafts)
        self.report.chunk_sizes.append(len(chunk.drafts))
        self._chunks[self._seq] = len(chunk.drafts)
        self.report.payload_bits += sum(8 * len(d.payload) for d in chunk.drafts)
        self._chunk_started = None
        await self._send_message(wire.request_message(self._seq, chunk, self.config.codec))

    async def _send_message(self, msg) -> None:
        """Send; if the channel is gone, raise what the cloud said before closing, if anything."""
        try:
            await self.channel.send(msg)
        except TransportError as exc:
            await asyncio.sleep(0.05)  # let the reader deliver what arrived before the close
            while not self.results.empty():
                item = self.results.get_nowait()
                if isinstance(item, TandemError):
                    raise item from None
            raise TandemError(f"connection to the cloud lost: {exc}") from None

    async def _run_sync(self) -> None:
        drafter = self.drafter
        while not drafter.done:
            drafter.cancel.clear()  # the last verdict's interrupt has been applied
            while drafter.unsent < self.config.draft_len and drafter.can_draft():
                item = await asyncio.to_thread(self._draft_step, self._bits_left())
                if item is None:
                    break  # the next payload would overflow the bit budget
            await self._send()
            await self._next_result()

    def _boundary(self) -> int:
        """Tokens drafted in this epoch at which the current chunk is due."""
        sent = self.drafter.frontier + self.drafter.sent - self._epoch_start
        gamma, first = self._gamma, min(self.config.first_chunk, self._gamma)
        if self.config.fast_verify and sent < first:
            return first
        return (sent // gamma + 1) * gamma

    def _chunk_due(self) -> bool:
        drafter = self.drafter
        if drafter.unsent == 0:
            return False
        drafted = drafter.frontier + len(drafter.drafts) - self._epoch_start
        idle = drafter.sent == 0 and not drafter.can_draft()  # nothing in flight to wait for
        return drafted >= self._boundary() or drafter.exhausted() or idle

    def _truncation_timeout(self) -> float | None:
        """Seconds until the partial chunk should go (latency-aware truncation), or None."""
        if not self.config.truncate_factor or self._step_ema is None or not self.drafter.unsent:
            return None
        if self._chunk_started is None:
            return None
        remaining = self._boundary() - (
            self.drafter.frontier + self.drafter.sent - self._epoch_start
        )
        expected = self.config.truncate_factor * remaining * self._step_ema
        return max(0.0, self._chunk_started + expected - time.perf_counter())

    def _auto_lookahead(self) -> int:
        """Drafts to hold so that drafting never stalls waiting for a verdict: a block plus
        what the device drafts during one request's round trip (RTT + T_verify), measured;
        between 2 and 8 blocks (PicoSpec's consecutive pre-drafts)."""
        gamma = self._gamma
        if self.config.lookahead_blocks or not self._latency_ema or not self._step_ema:
            return self.config.lookahead
        blocks = math.ceil(self._latency_ema / (self._step_ema * gamma)) + 1
        return min(8, max(2, blocks)) * gamma

    async def _run_async(self) -> None:
        drafter = self.drafter
        while True:
            self._apply_ready()
            if drafter.done:
                return
            self._replan()
            drafter.lookahead = self._auto_lookahead()
            if self._chunk_due():
                await self._send()
                continue  # verdicts may have arrived meanwhile
            if not drafter.can_draft() or not self._speculate:
                await self._next_result()
                continue
            drafter.cancel.clear()
            if self._chunk_started is None:
                self._chunk_started = time.perf_counter()
            task = asyncio.ensure_future(asyncio.to_thread(self._draft_step, self._bits_left()))
            while not task.done():
                await asyncio.wait({task}, timeout=self._truncation_timeout())
                if not task.done() and drafter.unsent:
                    self.report.truncated_chunks += 1
                    await self._send()  # drafting is slow: send what we have now
            try:
                item = task.result()
            except Cancelled:
                self.report.cancelled_steps += 1
                continue  # a rejection arrived: apply it, roll back, draft again
            if item is None and drafter.unsent:
                await self._send()  # bit budget exhausted: the chunk is full


async def run_device(
    channel,
    lm: CausalLM,
    prompt_ids: list[int],
    config: SpecConfig,
    *,
    on_token: OnToken | None = None,
    close: bool = True,
    start: tuple[dict, tuple[int, ...]] | None = None,
    controller: Controller | None = None,
) -> SpecReport:
    """The device side of one speculative generation over an open channel (`start`: another
    start message, see DeviceSession)."""
    try:
        session = DeviceSession(
            channel, lm, prompt_ids, config, on_token=on_token, start=start, controller=controller
        )
        return await session.run()
    finally:
        if close:
            with contextlib.suppress(TransportError):
                await channel.close("spec done")
