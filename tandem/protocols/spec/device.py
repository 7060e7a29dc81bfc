"""The device's asyncio layer: pumps a `Drafter` over a `Channel` (sync or async pipeline),
asking the sans-I/O `edge.EdgeMachine` when to send, draft or wait.

Why one file: it is the one asyncio layer of the device; the sync, async and eager pumps share
its reader, its sending and its adoption of verdicts, and every rule they follow lives in the
sans-I/O objects it drives (drafter.py, eager.py, edge.py, planner.py).

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
  equal to it stay in flight, a different one stops the draft step in flight at once and
  restarts drafting after it (new epoch). With a
  `planner.Controller` the session re-plans each round: the block length, and whether to
  draft at all (not drafting = the cloud's AR stream alone). With branches (`branch_below`),
  a draft that opens one is sent at once, then the branch is drafted and sent (eager.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from tandem.errors import TandemError
from tandem.models.base import Cancelled, CausalLM
from tandem.protocols.decoding import OnToken
from tandem.protocols.spec import wire
from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.drafter import Drafter, DraftItem
from tandem.protocols.spec.eager import EagerDrafter
from tandem.protocols.spec.edge import EdgeMachine
from tandem.protocols.spec.planner import Controller
from tandem.protocols.spec.stats import SpecReport, VerdictRecord
from tandem.transport import (
    ChannelClosed,
    Error,
    Start,
    Stats,
    TargetToken,
    TransportError,
    VerifyResult,
    control,
)

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
        start: Start | None = None,
        controller: Controller | None = None,
    ) -> None:
        self.channel = channel
        # the session's first message (default: mode spec on the prompt itself; a mode whose
        # cloud builds its own prompt sends something else, e.g. private-spec)
        self.start = start or wire.start_message("spec", config.to_json(), prompt_ids)
        self.lm = lm
        self.prompt_ids = list(prompt_ids)
        self.config = config
        self.on_token = on_token
        self.eager = config.pipeline == "eager"
        kind = EagerDrafter if self.eager else Drafter
        self.drafter = kind(lm, prompt_ids, config, eos_id=lm.tokenizer.eos_token_id)
        self.controller = controller  # eager: re-plans gamma and drafting each round
        self.machine = EdgeMachine(config, controller=controller, eager=self.eager)
        self._chunks: dict[int, int] = {}  # seq -> drafts in that request
        self.results: asyncio.Queue = asyncio.Queue()
        self.stats_future: asyncio.Future | None = None
        self.report = SpecReport(
            mode="spec", config=config.to_json(), tokens=[], text="", total_s=0.0, token_times=[]
        )
        self._seq = 0
        self._sent_at: dict[int, float] = {}
        self._start = 0.0

    # ---- entry point --------------------------------------------------------------------

    async def run(self) -> SpecReport:
        loop = asyncio.get_running_loop()
        self.stats_future = loop.create_future()
        up0, down0 = self.channel.bytes_sent, self.channel.bytes_received
        self._start = time.perf_counter()
        await self._send_message(self.start)
        reader = loop.create_task(self._read())
        pricing = self._price_branches()
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
            end = control.end(tuple(self.drafter.committed))
            with contextlib.suppress(asyncio.TimeoutError, TransportError):
                await self.channel.send(end)  # the output is complete: stats are a bonus
                self.report.cloud = await asyncio.wait_for(self.stats_future, STATS_TIMEOUT_S)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            if pricing is not None:  # its answer is the next generation's start (cached)
                await asyncio.wait({pricing})
        self.report.uplink_bytes = self.channel.bytes_sent - up0
        self.report.downlink_bytes = self.channel.bytes_received - down0
        self.report.tokens = list(self.drafter.committed)
        if self.eager and self.config.branch_below:
            self.report.branches.update(self.drafter.branches)
            self.report.branches["confidence"] = dict(self.drafter.confidence)
            if self.controller is not None:
                self.controller.observe_confidence(**self.drafter.confidence)
        self.report.text = self.lm.tokenizer.decode(self.report.tokens)
        return self.report

    def _price_branches(self) -> asyncio.Future | None:
        """Eager with branches and a controller: whether branches pay (planner.Controller.
        branches_pay_at), priced in a thread from the estimates as they stand; until the answer
        comes, the drafter branches as the controller's last answer says. Timing only: the
        answer depends on earlier generations, never on a value drawn in this one."""
        controller = self.controller
        if not (self.eager and self.config.branch_below and controller is not None):
            return None
        self.drafter.branching = controller.branch_choice
        args = (
            controller.alpha_estimate,
            self.machine.gamma,
            controller.costs(),
            controller.branching(self.config.branch_len),
        )
        pricing = asyncio.ensure_future(asyncio.to_thread(controller.branches_pay_at, *args))

        def priced(task: asyncio.Future) -> None:
            if not task.cancelled() and task.exception() is None:
                choice, gain = task.result()
                self.drafter.branching = choice
                self.report.branches.update(chosen=choice, predicted_gain=gain)

        pricing.add_done_callback(priced)
        return pricing

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
                    fields = wire.parse_token(msg)
                    if self.drafter.contradicts(fields["position"], fields["tokens"]):
                        self.drafter.cancel.set()  # the chain is dead (eager.py: interrupt)
                    self.results.put_nowait((fields, None, time.perf_counter()))
                elif isinstance(msg, Error):
                    self._fail(TandemError(f"cloud error: {msg.message}"))
                    return
                elif isinstance(msg, Stats) and not self.stats_future.done():
                    self.stats_future.set_result(control.body(msg))
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
        latency = received - self._sent_at.pop(seq, received)
        self.machine.verdict_latency(latency)
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
            self.machine.rejected(self.drafter.frontier)

    def _adopt(self, fields: dict, seq: int | None, received: float) -> None:
        """Eager: commit the cloud's tokens (an AR token when `seq` is None, else a verdict)."""
        outcome = self.drafter.adopt(fields["position"], fields["tokens"])
        if seq is not None:
            latency = received - self._sent_at.pop(seq, received)
            self.machine.verdict_latency(latency)
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
        elif self.controller is not None and fields["step_s"] > 0:  # 0: a free step
            self.controller.observe_ar(fields["step_s"])
        if self.controller is not None:
            self.controller.observe_drafts(outcome.num_accepted, int(outcome.rejected))
        self._note_committed(received)
        if outcome.rejected:  # a promoted branch's drafts are this epoch's first chunk
            self.machine.rejected(self.drafter.frontier + self.drafter.sent)

    def _note_committed(self, received: float) -> None:
        now = received - self._start  # known since it arrived (perhaps during the prefill)
        for token in self.drafter.committed[len(self.report.token_times) :]:
            self.report.token_times.append(now)
            if self.on_token is not None:
                self.on_token(token)

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
            self.machine.step_timed(elapsed)
        if item is not None:
            self.report.drafted += 1
        return item

    def _bits_left(self) -> int | None:
        """Bits the next draft may use in the current chunk (None: no budget, or first draft)."""
        if self.config.bit_budget is None or self.drafter.unsent == 0:
            return None
        return self.config.bit_budget - self.drafter.unsent_bits()

    async def _send(self, chunk=None) -> None:
        """Send the unsent drafts (or `chunk`: a branch, outside the block schedule)."""
        branch = chunk is not None
        chunk = chunk if branch else self.drafter.take_chunk()
        self._seq += 1
        self._sent_at[self._seq] = time.perf_counter()
        self.report.drafts_sent += len(chunk.drafts)
        self.report.chunk_sizes.append(len(chunk.drafts))
        self._chunks[self._seq] = len(chunk.drafts)
        self.report.payload_bits += sum(8 * len(d.payload) for d in chunk.drafts)
        if not branch:
            self.machine.chunk_sent()
        await self._send_message(wire.request_message(self._seq, chunk, self.config.codec))

    async def _branch(self) -> None:
        """Eager: a draft opened a branch. Send it (and the drafts before it) now, then draft
        the branch and send it (eager.py: *branch*)."""
        drafter = self.drafter
        if drafter.unsent:
            await self._send()
        self._apply_ready()
        if drafter.done or not drafter.branch_due():
            return
        drafter.cancel.clear()
        start = time.perf_counter()
        try:
            chunk = await asyncio.to_thread(drafter.draft_branch)
        except Cancelled:
            self.report.cancelled_steps += 1
            return
        self.report.branch_s.append(time.perf_counter() - start)
        if chunk is not None:
            await self._send(chunk)

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

    async def _run_async(self) -> None:
        drafter, machine = self.drafter, self.machine
        while True:
            self._apply_ready()
            if drafter.done:
                return
            machine.replan()
            drafter.lookahead = machine.lookahead()
            action = machine.next_action(drafter)
            if action == "send":
                await self._send()
                continue  # verdicts may have arrived meanwhile
            if action == "wait":
                await self._next_result()
                continue
            drafter.cancel.clear()
            machine.drafting(time.perf_counter())
            task = asyncio.ensure_future(asyncio.to_thread(self._draft_step, self._bits_left()))
            while not task.done():
                timeout = machine.truncation_timeout(drafter, time.perf_counter())
                await asyncio.wait({task}, timeout=timeout)
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
            elif self.eager and drafter.branch is not None and not drafter.branch.sent:
                await self._branch()


async def run_device(
    channel,
    lm: CausalLM,
    prompt_ids: list[int],
    config: SpecConfig,
    *,
    on_token: OnToken | None = None,
    close: bool = True,
    start: Start | None = None,
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
