"""An in-process link emulator: one-way delay, jitter, bandwidth and loss on a byte stream.

It owns `ByteStream` (what every layer above moves bytes through: channel.py frames
messages over one), `LinkConfig` (the knobs, named after netem's) and `EmulatedStream`, which
wraps the write side of any byte stream (memory or TCP) so that every write reaches the inner
stream at the time the emulated link would deliver it. Fast tests use it instead of
network namespaces; the delay proxy (proxy.py) applies the same model between processes.

Model, per write of n bytes (a frame), with `now` the event-loop clock::

    depart  = max(now, link_free) + n * 8 / rate        serialization (rate limit, FIFO)
    link_free = depart
    delay   = delay_ms + U(-jitter_ms, +jitter_ms), floored at 0
            + loss_rto_ms  if any of ceil(n / mss) segments is "lost" (prob. 1-(1-loss)^k)
    arrive  = max(depart + delay, last_arrive)           never reorders bytes (TCP)
    last_arrive = arrive

Loss: TCP never loses bytes, it retransmits them; so a loss is modelled as the extra
delay of one retransmission timeout (`loss_rto_ms`, default 200 ms = Linux TCP_RTO_MIN)
on the whole write, and later writes queue behind it (head-of-line blocking). Jitter is
uniform like netem's default, but clipped so that bytes stay in order (netem without
rate control would reorder packets; TCP would then reassemble them in order anyway).
Writes never block, but `drain()` waits while more than `max_buffer_bytes` written bytes
are still on the emulated link (a full socket buffer), so a sender that awaits drain, as
FramedChannel.send does, is slowed to the link instead of growing the queue.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class ByteStream(Protocol):
    """Ordered bytes in both directions (an asyncio StreamWriter/Reader pair, in short)."""

    def write(self, data: bytes) -> None: ...  # buffered, never interleaves two writes
    async def drain(self) -> None: ...  # wait until the write buffer has room
    async def read(self) -> bytes: ...  # some bytes; b"" at end of stream
    def close(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class LinkConfig:
    """One direction of an emulated link (same knobs as `tc qdisc ... netem` + `tbf`)."""

    delay_ms: float = 0.0  # one-way propagation delay
    jitter_ms: float = 0.0  # uniform +- jitter added to each write's delay (order kept)
    rate_mbit: float | None = None  # bandwidth in megabit/s; None = unlimited
    loss: float = 0.0  # segment loss probability, shown as retransmission delay
    loss_rto_ms: float = 200.0  # delay one loss adds (a TCP retransmission timeout)
    mss: int = 1448  # bytes per segment for the loss model
    seed: int = 0  # jitter and loss draws are reproducible
    max_buffer_bytes: int = 16 << 20  # bytes in flight before drain() waits (socket buffer)

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0 or self.loss_rto_ms < 0:
            raise ValueError("delay_ms, jitter_ms and loss_rto_ms must be >= 0")
        if self.rate_mbit is not None and self.rate_mbit <= 0:
            raise ValueError("rate_mbit must be > 0 (or None for unlimited)")
        if not 0.0 <= self.loss < 1.0:
            raise ValueError("loss must be in [0, 1)")
        if self.mss <= 0:
            raise ValueError("mss must be > 0")
        if self.max_buffer_bytes <= 0:
            raise ValueError("max_buffer_bytes must be > 0")


class LinkModel:
    """The delivery-time arithmetic of the module docstring, free of any I/O."""

    def __init__(self, link: LinkConfig) -> None:
        self.link = link
        self._rng = random.Random(link.seed)
        self._link_free = -math.inf
        self._last_arrive = -math.inf

    def arrival(self, now: float, size: int) -> float:
        """When a write of `size` bytes made at `now` (seconds) is delivered."""
        link = self.link
        serialization = 0.0 if link.rate_mbit is None else size * 8 / (link.rate_mbit * 1e6)
        depart = max(now, self._link_free) + serialization
        self._link_free = depart
        delay_ms = link.delay_ms
        if link.jitter_ms:
            delay_ms += self._rng.uniform(-link.jitter_ms, link.jitter_ms)
        delay_ms = max(0.0, delay_ms)
        if link.loss:
            segments = max(1, math.ceil(size / link.mss))
            if self._rng.random() < 1.0 - (1.0 - link.loss) ** segments:
                delay_ms += link.loss_rto_ms
        arrive = max(depart + delay_ms / 1000.0, self._last_arrive)
        self._last_arrive = arrive
        return arrive


class EmulatedStream:
    """A byte stream whose writes travel through an emulated link (reads pass through)."""

    def __init__(self, inner: ByteStream, link: LinkConfig) -> None:
        self.inner = inner
        self.model = LinkModel(link)
        self._queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()
        self._queued_bytes = 0  # written, not yet handed to the inner stream
        self._room = asyncio.Event()  # set while _queued_bytes <= link.max_buffer_bytes
        self._room.set()
        self._pump: asyncio.Task | None = None
        self._closed = False
        self._broken = False  # the inner stream failed: nothing will be delivered any more

    def write(self, data: bytes) -> None:
        if self._closed or self._broken:
            raise ConnectionResetError("write on a closed emulated stream")
        loop = asyncio.get_running_loop()
        self._queue.put_nowait((self.model.arrival(loop.time(), len(data)), bytes(data)))
        self._queued_bytes += len(data)
        if self._queued_bytes > self.model.link.max_buffer_bytes:
            self._room.clear()
        if self._pump is None:
            self._pump = loop.create_task(self._deliver())

    async def drain(self) -> None:
        """Wait while more than `max_buffer_bytes` are still on the emulated link."""
        while self._queued_bytes > self.model.link.max_buffer_bytes:
            if self._broken:
                raise ConnectionResetError("the emulated link's stream failed")
            await self._room.wait()

    async def read(self) -> bytes:
        return await self.inner.read()

    def close(self) -> None:
        """Close after the writes already queued have been delivered."""
        if self._closed:
            return
        self._closed = True
        if self._pump is None or self._pump.done():
            self.inner.close()
        else:
            self._queue.put_nowait((0.0, None))

    def abort(self) -> None:
        """Close now, dropping what is still in flight."""
        self._closed = True
        if self._pump is not None:
            self._pump.cancel()
        self._fail_pending()
        self.inner.close()

    async def wait_closed(self) -> None:
        """After close(): wait until the queued writes are out and the inner stream is closed."""
        if self._pump is not None and not self._pump.done():
            await asyncio.shield(self._pump)

    async def _deliver(self) -> None:
        try:
            await self._deliver_queued()
        except asyncio.CancelledError:
            self.inner.close()  # never leave the real socket open behind a cancelled pump
            raise
        finally:
            self._fail_pending()

    def _fail_pending(self) -> None:
        """The pump has stopped: a waiting drain() raises instead of waiting forever."""
        self._broken = True
        self._room.set()

    async def _deliver_queued(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            arrive, data = await self._queue.get()
            if data is None:
                self.inner.close()
                return
            wait = arrive - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                self.inner.write(data)
                self._queued_bytes -= len(data)
                if self._queued_bytes <= self.model.link.max_buffer_bytes:
                    self._room.set()
                await self.inner.drain()
            except (OSError, RuntimeError):
                return
