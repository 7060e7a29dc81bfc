"""One side of a live DRAGON session: the decoder thread, the link, and the sans-I/O
`machine.SideMachine` (draft queues, aggregation, scheduling) they feed.

Why one file: it is one side's asyncio layer; its handlers are each a few lines that turn
messages into the machine's events and its actions into messages, and every rule they follow
lives in the sans-I/O modules it drives (machine.py, scheduler.py, queues.py, worker.py); the
outbox, receive loop and probes are already apart (sideio.py).

Words used here (see the sibling modules for each part):
- *side* / *role*: "device" or "cloud"; the device starts the session and owns the result.
- *committed*: the target tokens resolved so far (identical on both sides, in order).
- *aggregator*: the one side that currently runs Algorithm 1. It resolves the next position
  as soon as both drafts for it are queued, sends the target token (TargetToken) or, when the
  scheduler moves the aggregator, a SwitchAggregator carrying the target token.

Theory of operation (event loop, one per side; the decoder runs in `worker.DraftWorker`;
the rules are `SideMachine`'s, this module pumps events into it and carries out its actions):

    local draft made  -> queue it, send it to the peer at once, try to aggregate
    peer draft        -> drop if its epoch is old, else queue it, try to aggregate
    aggregate (here)  -> Algorithm 1 on the front pair; resolve; send target or switch
    target / switch   -> resolve; a switch naming this side makes it the aggregator
    resolve(t, x)     -> per side: pop the front draft if it equals x, else clear the queue
                         and bump that side's epoch; tell the worker (a rejection cancels
                         its decode in flight and rolls its KV back to ... + x)
    link lost         -> device: degrade (local law only: its own queued drafts become
                         target tokens as they are, no token lost); cloud: stop

Every message goes through one outbox task, so the peer sees them in the order they were
decided (a target token always precedes the drafts made after it); the outbox, receive loop
and probes live in `sideio.SideIO`. Both sides keep a `profiler.Timeline` (report.timeline).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

from tandem.codecs import Codec, make_codec
from tandem.protocols.decoding import OnToken
from tandem.protocols.dragon import wire
from tandem.protocols.dragon.config import DEVICE, SIDES, DragonConfig, peer_of
from tandem.protocols.dragon.decoder import DocDecoder, SideLaw
from tandem.protocols.dragon.knowledge import Knowledge, build_decoder, named, retrieved
from tandem.protocols.dragon.machine import (
    Committed,
    Decided,
    Finished,
    MakeBranch,
    SendDraft,
    SendSwitch,
    SendTarget,
    SideMachine,
    SpeculativeAggregation,
)
from tandem.protocols.dragon.profiler import LatencyModel, LinkEstimator, Timeline
from tandem.protocols.dragon.queues import Draft, make_draft
from tandem.protocols.dragon.report import SideReport
from tandem.protocols.dragon.scheduler import Decision, Estimates, Scheduler
from tandem.protocols.dragon.sideio import SideIO
from tandem.protocols.dragon.worker import DraftWorker
from tandem.transport import (
    DraftTokens,
    Error,
    Ready,
    Start,
    SwitchAggregator,
    TargetToken,
    control,
)

TARGET_BYTES = 40  # about one TargetToken frame on the wire


class DragonSide(SideIO):
    def __init__(
        self,
        *,
        role: str,
        channel,
        config: DragonConfig,
        lm,
        knowledge: Knowledge,
        question: str,
        codec: Codec | None = None,
        profile: LatencyModel | None = None,
        peer_profile: LatencyModel | None = None,
        on_token: OnToken | None = None,
        decoder: DocDecoder | None = None,
    ):
        """`decoder`: an already built one (e.g. reused across many short sessions in tests);
        by default the worker retrieves and builds it when the session starts."""
        self.role, self.peer = role, peer_of(role)
        self.prebuilt = decoder
        self.channel, self.config, self.lm = channel, config, lm
        self.knowledge, self.question = knowledge, question
        self.codec = codec or make_codec(config.codec, **config.codec_params)
        self.on_token = on_token
        self.eos_id = lm.tokenizer.eos_token_id if config.stop_at_eos else None
        self.own_profile = list((profile or LatencyModel()).to_list())
        self.draft_bytes = 0.0
        self.link = LinkEstimator(channel)
        self.report = SideReport(role=role, first_aggregator=config.first_aggregator)
        self.timeline = Timeline()
        self.scheduler = Scheduler.for_config(config)
        self.machine = SideMachine(
            role,
            rule=_TimedRule(SpeculativeAggregation(config.seed, config.greedy), self.timeline),
            scheduler=_TimedScheduler(self.scheduler, self.timeline),
            first_aggregator=config.first_aggregator,
            max_new_tokens=config.max_new_tokens,
            latency={
                role: dataclasses.replace(profile) if profile else LatencyModel(),
                self.peer: dataclasses.replace(peer_profile) if peer_profile else LatencyModel(),
            },
            rtt=self._round_trip,
            acceptance_ema=config.acceptance_ema,
            slope_weight=config.slope_weight,
            eos_id=self.eos_id,
            branch=config.branch,
            mirror=config.mirror,
        )
        self.error: BaseException | None = None
        self._seq = 0

    @property
    def degraded(self) -> bool:
        return self.machine.degraded

    # ---- running ----------------------------------------------------------------------

    async def run(self) -> SideReport:
        self.loop = asyncio.get_running_loop()
        self.started = time.perf_counter()
        self.done = asyncio.Event()
        self.peer_timeline_seen = asyncio.Event()
        self.outbox: asyncio.Queue = asyncio.Queue()  # (queued at, message)
        self.timeline.started = self.started
        self.worker = DraftWorker(
            build=self._build_decoder,
            make_draft=self._make_draft,
            emit=lambda draft: self._threadsafe(self._on_local_draft, draft),
            on_ready=lambda decoder, s: self._threadsafe(self._on_ready, decoder, s),
            on_error=lambda exc: self._threadsafe(self._fail, exc),
            max_new_tokens=self.config.max_new_tokens,
            lookahead=self.config.lookahead,
            eos_id=self.eos_id,
            name=f"dragon-{self.role}",
        )
        if self.role == DEVICE:
            self._send(
                wire.start_message(
                    config=self.config, question=self.question, profile=self.own_profile
                )
            )
        self.worker.start()
        tasks = [
            asyncio.create_task(self._receive_loop()),
            asyncio.create_task(self._send_loop()),
            asyncio.create_task(self._probe_loop()),
        ]
        try:
            await self.done.wait()
            await self._exchange_timelines()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.outbox.join(), 5.0)
        finally:
            self.worker.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if await asyncio.to_thread(self.worker.join, 30.0):
                self._close_decoder()
        if self.error is not None:
            raise self.error
        return self._final_report()

    def _close_decoder(self) -> None:
        """Give the rows' KV cells back now. The session and its worker's callbacks form
        reference cycles, so the cells waited for the cyclic collector; in llama.cpp's unified
        cache every decode of the process attends over every cell in use (measured: a 200-token
        row 32.5 ms per token alone, 49.2 ms beside 7,200 cells of other rows), and the
        testbed's device worker slowed run after run. A prebuilt decoder is the caller's."""
        if self.prebuilt is None and self.worker.decoder is not None:
            self.worker.decoder.close()

    def _threadsafe(self, fn, *args) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: the session is over
            self.loop.call_soon_threadsafe(self._guarded, fn, *args)

    def _guarded(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - a bug must end the session, not hang it
            self._fail(exc)

    def _build_decoder(self) -> DocDecoder:  # worker thread
        if self.prebuilt is not None:
            decoder = self.prebuilt
        else:
            began = time.perf_counter()
            decoder, docs = build_decoder(self.lm, self.knowledge, self.question, self.config)
            self.timeline.since("retrieve", began)
            self.report.docs = [(d.doc_id, d.score) for d in retrieved(docs)]
            self.report.put_back = named(docs)[1]
        decoder.clock = self.timeline
        return decoder

    def _make_draft(
        self, law: SideLaw, position: int, epoch: int, seconds: float, context: int
    ) -> Draft:  # worker thread
        began = time.perf_counter()
        draft = make_draft(
            law,
            codec=self.codec,
            side=self.role,
            position=position,
            epoch=epoch,
            seed=self.config.seed,
            greedy=self.config.greedy,
            context=context,
        )
        self.timeline.since("codec", began)
        return dataclasses.replace(draft, decode_s=seconds + time.perf_counter() - began)

    def _on_ready(self, decoder: DocDecoder, seconds: float) -> None:
        self.report.ready_s = seconds
        self.report.kv_hits = decoder.kv_hits
        if self.role != DEVICE:  # READY leaves ahead of this side's first draft
            first = self.scheduler.first(self.machine.estimates())
            body = {"profile": self.own_profile, "docs": len(self.report.docs), "ready_s": seconds}
            self._send(control.ready({**body, "aggregator": first}))
            self._place_first(first)

    def _place_first(self, first) -> None:
        """The cloud's pick of the first aggregator (`Scheduler.first`), on either side."""
        if first in SIDES and first != self.machine.aggregator:
            self._apply(self.machine.place_first(first))
        self.report.first_aggregator = self.machine.aggregator

    def _fail(self, exc: BaseException) -> None:
        if self.error is None and not self.done.is_set():
            self.error = exc
            if not self.machine.degraded:
                self._send(wire.error_message(f"{self.role} failed: {exc}"))
            self.done.set()

    def _finish(self, reason: str) -> None:
        if not self.done.is_set():
            self.report.finish_reason = reason
            self.worker.stop()
            self.done.set()

    # ---- network ----------------------------------------------------------------------

    def _link_lost(self, reason: str) -> None:
        if self.done.is_set():
            return
        if not self.machine.degraded:  # the first loss names the cause
            self.report.degraded_reason = reason
        self._apply(self.machine.link_lost())
        self.report.degraded = self.machine.degraded
        self.report.degraded_at = self.machine.degraded_at

    def _handle(self, msg) -> None:
        if self.done.is_set():
            return
        if wire.is_pad(msg):
            return
        if isinstance(msg, Ready):
            body = control.body(msg)
            self.machine.latency[self.peer] = LatencyModel.from_list(body.get("profile"))
            self.report.peer_docs = int(body.get("docs", 0))
            self.report.peer_ready_s = float(body.get("ready_s", 0.0))
            self._place_first(body.get("aggregator"))
            return
        if isinstance(msg, Start):  # the side was set up without reading it (tests)
            return
        if isinstance(msg, DraftTokens):
            began = time.perf_counter()
            draft = wire.parse_draft(
                msg, side=self.peer, codec=self.codec, vocab_size=self.lm.vocab_size
            )
            self.timeline.since("wire", began)
            dropped = self.machine.drafts_dropped[self.peer]
            actions = self.machine.peer_draft(draft, wire.draft_stamp(msg))
            if self.machine.drafts_dropped[self.peer] == dropped:  # queued: it counts
                self.timeline.mark("peer", draft.position)
            self._apply(actions)
        elif isinstance(msg, TargetToken):
            self.timeline.mark("peer", msg.position)
            self._apply(self.machine.target(msg.position, msg.token))
        elif isinstance(msg, SwitchAggregator):
            self.timeline.mark("peer", msg.position)
            self._apply(self.machine.switch(msg.position, msg.target_token, msg.aggregator))
        elif isinstance(msg, Error):
            self._link_lost(f"peer error: {msg.message}")

    # ---- the machine's actions ----------------------------------------------------------

    def _on_local_draft(self, draft: Draft) -> None:
        if self.done.is_set():  # failed or finished: the draft goes nowhere
            self.machine.drafts_dropped[self.role] += 1
            return
        if draft.branch_of is not None:
            self._apply(self.machine.own_branch(draft))
        else:
            self._apply(self.machine.own_draft(draft))

    def _apply(self, actions: list) -> None:
        self.worker.branch_own = self.machine.own_branching()
        for action in actions:
            if isinstance(action, SendDraft):
                draft = action.draft
                self.timeline.mark("own", draft.position)
                self.draft_bytes = 0.8 * self.draft_bytes + 0.2 * (len(draft.payload) + 60)
                began = time.perf_counter()
                msg = wire.draft_message(0, draft, self.codec.name, action.stamp)
                self.timeline.since("wire", began)  # the write itself is the "send" phase
                self._send(msg)
            elif isinstance(action, SendTarget):
                self._send(wire.target_message(0, action.position, action.token, action.accepted))
            elif isinstance(action, SendSwitch):
                self._send(wire.switch_message(0, action.position, action.token, action.aggregator))
            elif isinstance(action, Committed):
                self._committed(action)
            elif isinstance(action, Decided):
                self._log_decision(action)
            elif isinstance(action, MakeBranch):
                self.worker.request_branch(action.position, action.token, action.epoch)
            elif isinstance(action, Finished):
                self._finish(action.reason)

    def _committed(self, c: Committed) -> None:
        self.timeline.mark("commit", c.position)
        self.report.token_times.append(time.perf_counter() - self.started)
        resolution = {"position": c.position, "by": c.by, "aggregated": c.aggregated, **c.accepted}
        if c.rates is not None:  # Eq. 5 (0/1 when greedy): what a replay's scheduler must see
            resolution.update({f"rate_{side}": c.rates[side] for side in SIDES})
        self.report.resolutions.append(resolution)
        self.worker.resolve(
            c.token, accepted=c.accepted[self.role], epoch=c.epoch, adopted=c.adopted
        )
        if self.on_token is not None:
            self.on_token(c.token)

    def _log_decision(self, d: Decided) -> None:
        entry = {"position": d.position, "time": time.perf_counter() - self.started}
        entry.update({"by": self.role, "next": d.decision.aggregator, "gap": d.decision.gap})
        if d.estimates is not None:
            entry.update({f"c_dec_{side}": d.estimates.c_dec[side] for side in SIDES})
            entry.update({f"alpha_{side}": d.estimates.alpha[side] for side in SIDES})
            entry["rtt"] = d.estimates.rtt
        self.report.decisions.append(entry)

    def _round_trip(self) -> float:
        return self.link.round_trip(self.draft_bytes, TARGET_BYTES)

    def _final_report(self) -> SideReport:
        report = self.report
        machine = self.machine
        report.tokens = list(machine.committed)
        report.switches = list(machine.switches)
        report.drafts_made = machine.drafts_made
        report.drafts_dropped = dict(machine.drafts_dropped)
        report.branches_made = machine.branches_made
        report.branches_adopted = dict(machine.branches_adopted)
        report.mirrored = machine.mirrored
        report.decode_times = {side: list(t) for side, t in machine.decode_times.items()}
        shown = report.tokens[:-1] if report.finish_reason == "eos" else report.tokens
        report.text = self.lm.tokenizer.decode(shown)
        report.bytes_sent = int(getattr(self.channel, "bytes_sent", 0))
        report.bytes_received = int(getattr(self.channel, "bytes_received", 0))
        report.decodes_cancelled = self.worker.cancelled
        report.rollbacks = self.worker.rollbacks
        report.rtt_s = self.channel.rtt
        report.bandwidth_bps = self.link.bandwidth_bps
        report.wall_s = time.perf_counter() - self.started
        report.timeline = self.timeline.summary()
        return report


@dataclasses.dataclass(frozen=True)
class _TimedRule:
    """The live rule, its time booked as the timeline's "aggregate" phase."""

    rule: SpeculativeAggregation
    timeline: Timeline

    def aggregate(self, device: Draft, cloud: Draft) -> int:
        began = time.perf_counter()
        token = self.rule.aggregate(device, cloud)
        self.timeline.since("aggregate", began)
        return token

    def rates(self, device: Draft, cloud: Draft, accepted: dict[str, bool]) -> dict[str, float]:
        return self.rule.rates(device, cloud, accepted)


@dataclasses.dataclass(frozen=True)
class _TimedScheduler:
    """The scheduler, its time booked as the timeline's "schedule" phase."""

    scheduler: Scheduler
    timeline: Timeline

    def decide(self, here: str, position: int, estimates: Estimates | None) -> Decision:
        began = time.perf_counter()
        decision = self.scheduler.decide(here, position, estimates)
        self.timeline.since("schedule", began)
        return decision
