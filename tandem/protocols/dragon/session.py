"""One side of a live DRAGON session: decoder thread, draft queues, aggregator, scheduler.

Words used here (see the sibling modules for each part):
- *side* / *role*: "device" or "cloud"; the device starts the session and owns the result.
- *committed*: the target tokens resolved so far (identical on both sides, in order).
- *aggregator*: the one side that currently runs Algorithm 1. It resolves the next position
  as soon as both drafts for it are queued, sends the target token (TargetToken) or, when the
  scheduler moves the aggregator, a SwitchAggregator carrying the target token.

Theory of operation (event loop, one per side; the decoder runs in `worker.DraftWorker`):

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
from collections.abc import Callable

from tandem.codecs import Codec, make_codec
from tandem.protocols.dragon import wire
from tandem.protocols.dragon.aggregator import aggregate_step, expected_acceptance
from tandem.protocols.dragon.config import DEVICE, SIDES, DragonConfig, peer_of
from tandem.protocols.dragon.decoder import DocDecoder, SideLaw
from tandem.protocols.dragon.knowledge import Knowledge, build_decoder
from tandem.protocols.dragon.profiler import (
    AcceptanceTracker,
    LatencyModel,
    LinkEstimator,
    Timeline,
)
from tandem.protocols.dragon.queues import Draft, DraftQueue, make_draft
from tandem.protocols.dragon.report import SideReport
from tandem.protocols.dragon.scheduler import Decision, Estimates, Scheduler
from tandem.protocols.dragon.sideio import SideIO
from tandem.protocols.dragon.worker import DraftWorker
from tandem.protocols.local import IncrementalDetokenizer
from tandem.transport import DraftTokens, Error, SwitchAggregator, TargetToken

OnToken = Callable[[int, str], None]
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
        self.queues = {side: DraftQueue() for side in SIDES}
        self.epochs = dict.fromkeys(SIDES, 0)
        self.committed: list[int] = []
        self.aggregator = config.first_aggregator
        self.scheduler = Scheduler(config.strategy, seed=config.seed, margin=config.switch_margin_s)
        self.tracker = AcceptanceTracker(config.acceptance_ema)
        self.latency = {
            role: dataclasses.replace(profile) if profile else LatencyModel(),
            self.peer: dataclasses.replace(peer_profile) if peer_profile else LatencyModel(),
        }
        self.own_profile = list((profile or LatencyModel()).to_list())
        self.last_context = dict.fromkeys(SIDES, 0)
        self.draft_bytes = 0.0
        self.link = LinkEstimator(channel)
        self.report = SideReport(role=role)
        self.timeline = Timeline()
        self.degraded = False
        self.error: BaseException | None = None
        self._seq = 0
        self._detok = IncrementalDetokenizer(lm.tokenizer)

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
                    0, config=self.config, question=self.question, profile=self.own_profile
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
            await asyncio.to_thread(self.worker.join, 30.0)
        if self.error is not None:
            raise self.error
        return self._final_report()

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
            self.report.docs = [(d.doc_id, d.score) for d in docs]
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
        if self.role != DEVICE:
            self._send(
                wire.control_message(
                    wire.READY,
                    0,
                    {
                        "profile": self.own_profile,
                        "docs": len(self.report.docs),
                        "ready_s": seconds,
                    },
                )
            )

    def _fail(self, exc: BaseException) -> None:
        if self.error is None and not self.done.is_set():
            self.error = exc
            if not self.degraded:
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
        if self.role != DEVICE:
            self.report.degraded_reason = reason
            self._finish("aborted")
            return
        if not self.degraded:
            self.degraded = True
            self.report.degraded = True
            self.report.degraded_reason = reason
            self.report.degraded_at = len(self.committed)
            self.aggregator = self.role
        self._try_aggregate()

    def _handle(self, msg) -> None:
        if self.done.is_set():
            return
        kind = wire.control_kind(msg)
        if kind == wire.PAD:
            return
        if kind == wire.READY:
            body = wire.control_body(msg)
            self.latency[self.peer] = LatencyModel.from_list(body.get("profile"))
            self.report.peer_docs = int(body.get("docs", 0))
            self.report.peer_ready_s = float(body.get("ready_s", 0.0))
            return
        if kind == wire.START:  # the side was set up without reading it (tests)
            return
        if isinstance(msg, DraftTokens):
            began = time.perf_counter()
            draft = wire.parse_draft(
                msg, side=self.peer, codec=self.codec, vocab_size=self.lm.vocab_size
            )
            self.timeline.since("wire", began)
            self._on_remote_draft(draft)
        elif isinstance(msg, TargetToken):
            self._on_target(msg.position, msg.token)
        elif isinstance(msg, SwitchAggregator):
            self._on_target(msg.position, msg.target_token)
            self.report.switches.append((msg.position, msg.aggregator))
            if msg.aggregator == self.role:
                self.aggregator = self.role
                self._try_aggregate()
        elif isinstance(msg, Error):
            self._link_lost(f"peer error: {msg.message}")

    # ---- drafts and aggregation -------------------------------------------------------

    def _observe_timing(self, draft: Draft) -> None:
        self.latency[draft.side].update(draft.context, draft.decode_s, self.config.slope_weight)
        self.last_context[draft.side] = draft.context
        self.report.decode_times[draft.side].append((draft.context, draft.decode_s))

    def _on_local_draft(self, draft: Draft) -> None:
        if self.done.is_set() or draft.epoch != self.epochs[self.role]:
            self.report.drafts_dropped[self.role] += 1
            return
        self.queues[self.role].push(draft)
        self.timeline.mark("own", draft.position)
        self.report.drafts_made += 1
        self._observe_timing(draft)
        self.draft_bytes = 0.8 * self.draft_bytes + 0.2 * (len(draft.payload) + 60)
        began = time.perf_counter()
        self._send(wire.draft_message(0, draft, self.codec.name))
        self.timeline.since("wire", began)
        self._try_aggregate()

    def _on_remote_draft(self, draft: Draft) -> None:
        expected = self.epochs[self.peer]
        if draft.epoch > expected:
            raise ValueError(f"draft from epoch {draft.epoch}, expected {expected}")
        if draft.epoch < expected or draft.position < len(self.committed):
            self.report.drafts_dropped[self.peer] += 1
            return
        self.queues[self.peer].push(draft)
        self.timeline.mark("peer", draft.position)
        self._observe_timing(draft)
        self._try_aggregate()

    def _on_target(self, position: int, token: int) -> None:
        if position != len(self.committed):
            raise ValueError(f"target for position {position}, expected {len(self.committed)}")
        if self.aggregator == self.role:
            raise ValueError("target token from the peer while this side aggregates")
        self.timeline.mark("peer", position)
        self._resolve(position, token, by=self.peer)

    def _try_aggregate(self) -> None:
        while not self.done.is_set() and self.aggregator == self.role:
            position = len(self.committed)
            mine = self.queues[self.role].front_at(position)
            if mine is None:
                return
            if self.degraded:  # the local law alone: the draft is a sample of it
                self._resolve(position, mine.token, by=self.role)
                continue
            theirs = self.queues[self.peer].front_at(position)
            if theirs is None:
                return
            device, cloud = (mine, theirs) if self.role == DEVICE else (theirs, mine)
            began = time.perf_counter()
            outcome = aggregate_step(
                device, cloud, seed=self.config.seed, greedy=self.config.greedy
            )
            self.timeline.since("aggregate", began)
            self._resolve(position, outcome.token, by=self.role)
            began = time.perf_counter()
            if self.done.is_set():
                decision, estimates = Decision(self.role, 0.0), None
            else:
                estimates = self._estimates()
                decision = self.scheduler.decide(self.role, position, estimates)
            self.timeline.since("schedule", began)
            if decision.aggregator != self.role:
                self._send(wire.switch_message(0, position, outcome.token, decision.aggregator))
                self.report.switches.append((position, decision.aggregator))
            else:
                self._send(wire.target_message(0, position, outcome.token, outcome.accepted))
            self._log_decision(position, decision, estimates)
            self.aggregator = decision.aggregator

    def _estimates(self) -> Estimates:
        c_dec = {side: self.latency[side].predict(self.last_context[side] + 1) for side in SIDES}
        rtt = self.link.round_trip(self.draft_bytes, TARGET_BYTES)
        return Estimates(c_dec=c_dec, alpha=self.tracker.alpha(), rtt=rtt)

    def _log_decision(self, position: int, decision: Decision, estimates: Estimates | None) -> None:
        entry = {"position": position, "time": time.perf_counter() - self.started}
        entry.update({"by": self.role, "next": decision.aggregator, "gap": decision.gap})
        if estimates is not None:
            entry.update({f"c_dec_{side}": estimates.c_dec[side] for side in SIDES})
            entry.update({f"alpha_{side}": estimates.alpha[side] for side in SIDES})
            entry["rtt"] = estimates.rtt
        self.report.decisions.append(entry)

    def _resolve(self, position: int, token: int, *, by: str) -> None:
        drafts = {side: self.queues[side].front_at(position) for side in SIDES}
        accepted = {side: d is not None and d.token == token for side, d in drafts.items()}
        for side in SIDES:
            if accepted[side]:
                self.queues[side].pop()
            else:
                self.queues[side].clear()
                self.epochs[side] += 1
        aggregated = not self.degraded and all(d is not None for d in drafts.values())
        if aggregated:
            if self.config.greedy:
                rates = {side: float(accepted[side]) for side in SIDES}
            else:
                rates = expected_acceptance(drafts["device"], drafts["cloud"])
            self.tracker.observe(rates, accepted)
        self.committed.append(token)
        self.timeline.mark("commit", position)
        self.report.token_times.append(time.perf_counter() - self.started)
        self.report.resolutions.append(
            {"position": position, "by": by, "aggregated": aggregated, **accepted}
        )
        self.worker.resolve(token, accepted=accepted[self.role], epoch=self.epochs[self.role])
        if self.on_token is not None:
            self.on_token(token, "" if token == self.eos_id else self._detok.push(token))
        if self.eos_id is not None and token == self.eos_id:
            self._finish("eos")
        elif len(self.committed) >= self.config.max_new_tokens:
            self._finish("length")

    def _final_report(self) -> SideReport:
        report = self.report
        report.tokens = list(self.committed)
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
