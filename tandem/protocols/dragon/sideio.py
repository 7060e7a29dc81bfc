"""The network half of a live DRAGON side: its outbox, receive loop, link probes and the
end-of-session timeline exchange (`session.DragonSide` mixes it in).

Words used here:
- *outbox*: one queue of messages, sent by one task in the order they were decided (a target
  token always precedes the drafts made after it). A message's time in the queue is the
  timeline's `outbox` phase, `channel.send` its `send` phase. A message decided while the
  queue is empty and nothing is being sent is written at once instead (the same order, no
  hop through the event loop), up to `UNDRAINED_BYTES` between two drains of the channel's
  write buffer: past that, the queue's `send` waits for the buffer to drain.
- *timeline exchange*: with `DragonConfig.timeline`, the cloud sends its timeline summary
  (a `Stats` message) once it is done and the device waits for it a little (`TIMELINE_WAIT_S`)
  before closing, so one report holds both sides. Token times are already taken by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

from tandem.errors import TandemError
from tandem.protocols.dragon import wire
from tandem.protocols.dragon.config import CLOUD
from tandem.transport import ProtocolError, Stats, TransportError, control

TIMELINE_WAIT_S = 3.0
UNDRAINED_BYTES = 64 * 1024  # written at once between two drains, at most


class SideIO:
    """Expects the attributes `DragonSide` sets: channel, config, role, degraded, done,
    outbox, timeline, report, link, _seq; and the methods _handle, _link_lost, _fail."""

    _sending = False  # the send loop is inside `channel.send`
    _undrained = 0  # bytes written at once since the channel's buffer last drained

    def _send(self, msg) -> None:
        if self.degraded:
            return
        self._seq += 1
        if hasattr(msg, "seq"):
            msg = dataclasses.replace(msg, seq=self._seq)
        send_nowait = getattr(self.channel, "send_nowait", None)
        waits = self._sending or not self.outbox.empty()  # then behind what waits: in order
        if send_nowait is None or waits or self._undrained >= UNDRAINED_BYTES:
            self.outbox.put_nowait((time.perf_counter(), msg))
            return
        began = time.perf_counter()
        try:
            self._undrained += send_nowait(msg)
        except TransportError as exc:
            self._link_lost(f"send failed: {exc}")
        finally:
            self.timeline.since("send", began)

    async def _send_loop(self) -> None:
        while True:
            queued, msg = await self.outbox.get()
            began = self.timeline.since("outbox", queued)
            self._sending = True
            try:
                if not self.degraded:
                    await self.channel.send(msg)  # writes, then waits for the buffer to drain
                    self._undrained = 0
            except TransportError as exc:
                self._link_lost(f"send failed: {exc}")
            finally:
                self._sending = False
                self.timeline.since("send", began)
                self.outbox.task_done()

    async def _receive_loop(self) -> None:
        while True:  # after `done`, only the peer's timeline is still read (see `_handle`)
            try:
                msg = await self.channel.recv()
            except TransportError as exc:
                self._link_lost(str(exc) or type(exc).__name__)
                return
            try:
                if isinstance(msg, Stats):
                    self.report.peer_timeline = control.body(msg)
                    self.peer_timeline_seen.set()
                    continue
                self._handle(msg)
            except (ValueError, TandemError, ProtocolError) as exc:
                self._fail(TandemError(f"dragon {self.role}: bad message from peer: {exc}"))
                return

    async def _probe_loop(self) -> None:
        config = self.config
        try:
            if config.bandwidth_probe_bytes:
                pad = wire.pad_message(0, config.bandwidth_probe_bytes)
                await self.link.probe_bandwidth(pad, config.bandwidth_probe_bytes)
                self.report.probe_bytes = config.bandwidth_probe_bytes
            while config.rtt_probe_s and not self.degraded and not self.done.is_set():
                await asyncio.sleep(config.rtt_probe_s)
                with contextlib.suppress(TimeoutError):
                    await self.channel.ping(timeout=max(1.0, 8 * config.rtt_probe_s))
        except (TransportError, TimeoutError):
            return  # the receive loop reports a dead link

    async def _exchange_timelines(self) -> None:
        """After `done`: the cloud sends its timeline, the device waits for it (bounded)."""
        if not self.config.timeline or self.degraded or self.error is not None:
            return
        if self.role == CLOUD:
            self._send(control.stats(self.timeline.summary()))
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.peer_timeline_seen.wait(), TIMELINE_WAIT_S)
