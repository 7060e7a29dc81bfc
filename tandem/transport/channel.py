"""Channels: messages over a byte stream, with heartbeats, RTT and byte counters.

Why one file: the `Channel` protocol, its one implementation and that implementation's
config are read together; heartbeats, RTT and byte counts all live in `FramedChannel`.

Owns the `Channel` protocol every collaboration algorithm talks to, the `ByteStream`
protocol under it (TCP, in-memory, emulated link), `FramedChannel` (the one channel
implementation: FrameParser + encode_message over a ByteStream), `TransportConfig`,
and `memory_pair()`, the in-memory fake.

A FramedChannel runs two tasks. The *reader* reads bytes, parses frames and dispatches:

    received     action
    Ping         answer Pong at once (the application never sees it)
    Pong         one RTT sample -> `rtt`, wakes `ping()`
    Bye          the channel closes; recv() raises ChannelClosed after queued messages
    end / error  the channel fails; recv() raises ChannelClosed / ProtocolError
    other        queued for recv()

The *heartbeat* sends a Ping every `ping_interval` seconds and fails the channel with
PeerDead when nothing at all was received for `dead_peer_timeout` seconds; it checks
every min(ping_interval, dead_peer_timeout / 4) s, so a dead peer is detected at most
that long after the timeout. Messages queued before a failure are still delivered.

Bounded memory. The *receive queue* (messages waiting for recv()) is bounded by
`recv_queue_messages` and `recv_queue_bytes` (a message counts its decoded frame size):
once either is reached the reader stops reading the stream, so the bytes stay in the
peer's socket buffers and TCP back-pressure blocks the peer's `send()` (which awaits the
stream's drain: a sender never buffers more than the stream's limit plus one frame).
recv() making room resumes reading. If the queue stays full for `recv_stall_timeout`
seconds the channel closes with ChannelClosed("receive queue full ...") and tells the
peer `Bye("receive queue full: peer not reading")`. While reading is paused the channel
cannot hear the peer, so its dead-peer check is suspended (the clock restarts on resume),
and it keeps sending heartbeat Pings, which the peer reads: neither side declares the
other dead because one application is slow. The trade-off: a peer that dies while we are
paused is noticed only at `recv_stall_timeout` (None: only when the application reads).
A Ping is answered at once, but while earlier Pongs wait to drain (the peer is not
reading) only the newest 64 Pings are kept for later, so a peer that sends Pings and never
reads cannot grow our write buffer. The in-memory streams (`max_buffer_bytes` per
direction) and the link emulator (`LinkConfig.max_buffer_bytes`) make drain() wait the
same way a full socket buffer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from tandem.transport.emulator import ByteStream, EmulatedStream, LinkConfig
from tandem.transport.errors import (
    ChannelClosed,
    PeerDead,
    PeerSaidBye,
    ProtocolError,
    TransportError,
)
from tandem.transport.handshake import PROTOCOL_VERSION, SessionInfo
from tandem.transport.messages import Bye, Error, Hello, Message, Ping, Pong
from tandem.transport.tlsutil import TlsConfig
from tandem.transport.wire import COMPRESSION_FLAGS, CONNECTION_CLOSED, FrameParser, Limits
from tandem.transport.wire import encode_message as _encode

COMPRESSIONS = ("lz4", "zstd")


@dataclass(frozen=True, kw_only=True)
class TransportConfig:
    """Everything one side needs to open sessions (keyword-only, immutable)."""

    secret: bytes | None = None  # shared secret for HMAC auth; None = no auth (tests)
    role: str = ""  # "device" / "cloud": named in logs and refusals
    tokenizer_hash: str = ""  # model fingerprint, must equal the peer's
    vocab_size: int = 0  # logit width, must equal the peer's
    model_name: str = ""
    capabilities: tuple[str, ...] = COMPRESSIONS
    compression: str | None = None  # "lz4" / "zstd" for payloads, if the peer offers it
    limits: Limits = field(default_factory=Limits)
    ping_interval: float | None = 5.0  # seconds between heartbeat Pings; None: no Pings
    dead_peer_timeout: float | None = 20.0  # silence that declares the peer dead; None: never
    handshake_timeout: float = 10.0
    connect_timeout: float = 10.0
    tls: TlsConfig | None = None
    link: LinkConfig | None = None  # emulate this link on our outgoing direction
    session_id: str = ""  # client: propose a session id ("" = server assigns)
    recv_queue_messages: int = 4096  # messages waiting for recv() before reading pauses
    recv_queue_bytes: int = 64 << 20  # their decoded bytes before reading pauses
    recv_stall_timeout: float | None = 60.0  # a full queue this long closes; None: wait

    def __post_init__(self) -> None:
        if isinstance(self.secret, str):
            object.__setattr__(self, "secret", self.secret.encode())
        if self.compression not in COMPRESSION_FLAGS:
            raise ValueError(f"compression must be None, 'lz4' or 'zstd', not {self.compression!r}")
        if self.recv_queue_messages < 1 or self.recv_queue_bytes < 1:
            raise ValueError("recv_queue_messages and recv_queue_bytes must be >= 1")
        for name in ("ping_interval", "dead_peer_timeout", "recv_stall_timeout"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or None")
        if self.ping_interval and self.dead_peer_timeout:
            if self.ping_interval >= self.dead_peer_timeout:
                raise ValueError("ping_interval must be shorter than dead_peer_timeout")

    @classmethod
    def for_model(cls, lm, *, role: str, secret: bytes | str | None, **kwargs) -> TransportConfig:
        """One side's config for a model: the handshake checks its tokenizer and vocab."""
        return cls(
            secret=secret,
            role=role,
            tokenizer_hash=lm.tokenizer.fingerprint,
            vocab_size=lm.vocab_size,
            model_name=getattr(lm, "name", ""),
            **kwargs,
        )

    def hello(self) -> Hello:
        """The Hello this side introduces itself with."""
        return Hello(
            protocol_version=PROTOCOL_VERSION,
            session_id=self.session_id,
            role=self.role,
            tokenizer_hash=self.tokenizer_hash,
            vocab_size=self.vocab_size,
            model_name=self.model_name,
            capabilities=self.capabilities,
        )


@runtime_checkable
class Channel(Protocol):
    """Messages both ways, plus link measurements. What the protocols are written against."""

    session: SessionInfo | None
    bytes_sent: int
    bytes_received: int

    async def send(self, msg: Message) -> None: ...
    async def recv(self) -> Message: ...  # raises ChannelClosed, PeerDead, ProtocolError
    async def ping(self, timeout: float | None = None) -> float: ...  # one RTT, seconds
    async def close(self, reason: str = "") -> None: ...

    @property
    def rtt(self) -> float | None: ...  # smoothed RTT in seconds, None before a sample


class RttEstimator:
    """Smoothed round-trip time as TCP keeps it (RFC 6298: srtt += (sample - srtt) / 8)."""

    def __init__(self) -> None:
        self.srtt: float | None = None
        self.min_rtt: float | None = None
        self.last: float | None = None
        self.samples = 0

    def add(self, sample: float) -> None:
        self.last = sample
        self.samples += 1
        self.min_rtt = sample if self.min_rtt is None else min(self.min_rtt, sample)
        self.srtt = sample if self.srtt is None else self.srtt + (sample - self.srtt) / 8


MEMORY_BUFFER_BYTES = 1 << 16  # an in-memory pipe's "socket buffer" (asyncio's high-water mark)


class _Pipe:
    """One direction of an in-memory byte pipe: the chunks written and not yet read."""

    def __init__(self, limit: int) -> None:
        self.chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self.buffered = 0  # bytes in `chunks`
        self.limit = limit  # drain() waits while more than this is buffered
        self.room = asyncio.Event()
        self.room.set()
        self.reader_gone = False  # the reading end closed: writes are lost, a waiting drain fails


class MemoryStream:
    """One end of an in-memory byte pipe (see memory_stream_pair)."""

    def __init__(self, inbox: _Pipe, outbox: _Pipe) -> None:
        self._inbox, self._outbox = inbox, outbox
        self._closed = False
        self._eof = False

    def write(self, data: bytes) -> None:
        if self._closed:
            raise ConnectionResetError("write on a closed memory stream")
        if data and not self._outbox.reader_gone:  # else lost, as on a reset socket
            self._outbox.chunks.put_nowait(bytes(data))
            self._outbox.buffered += len(data)
            if self._outbox.buffered > self._outbox.limit:
                self._outbox.room.clear()

    async def drain(self) -> None:
        """Wait until the peer has read enough that at most `limit` bytes are buffered
        (raises if the peer closes instead)."""
        while True:
            if self._closed:
                raise ConnectionResetError("memory stream closed")
            if self._outbox.buffered <= self._outbox.limit:
                return
            if self._outbox.reader_gone:
                raise ConnectionResetError("the peer closed the memory stream")
            await self._outbox.room.wait()

    async def read(self) -> bytes:
        if self._eof:
            return b""
        data = await self._inbox.chunks.get()
        self._inbox.buffered -= len(data)
        if self._inbox.buffered <= self._inbox.limit:
            self._inbox.room.set()
        self._eof = not data
        return data

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._outbox.chunks.put_nowait(b"")  # the peer reads end of stream
            self._inbox.chunks.put_nowait(b"")  # and so does our own reader
            self._inbox.reader_gone = True  # the peer's writes are lost from now on
            self._inbox.room.set()
            self._outbox.room.set()  # wake our own drain() (it raises)


def memory_stream_pair(
    *, max_buffer_bytes: int = MEMORY_BUFFER_BYTES
) -> tuple[MemoryStream, MemoryStream]:
    """Two connected in-memory byte streams; each direction's drain() waits while more than
    `max_buffer_bytes` are written and not yet read (writes themselves never block)."""
    a_to_b, b_to_a = _Pipe(max_buffer_bytes), _Pipe(max_buffer_bytes)
    return MemoryStream(b_to_a, a_to_b), MemoryStream(a_to_b, b_to_a)


class _Closed:
    """Queue marker: the channel has failed or closed; recv raises the stored error."""


STALLED_BYE = "receive queue full: peer not reading"  # the Bye a stalled channel sends
MAX_UNANSWERED = 64  # Pings we remember (ours awaiting a Pong; the peer's awaiting ours)


class FramedChannel:
    """A Channel over a ByteStream. Call `start()` inside a running event loop."""

    def __init__(
        self,
        stream: ByteStream,
        *,
        config: TransportConfig | None = None,
        session: SessionInfo | None = None,
        parser: FrameParser | None = None,
    ) -> None:
        self.config = config or TransportConfig()
        self.session = session
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0
        self.messages_received = 0
        self.rtt_estimator = RttEstimator()
        self._stream = stream
        self._parser = parser or FrameParser(limits=self.config.limits)
        self._inbox: asyncio.Queue[tuple[Message, int] | _Closed] = asyncio.Queue()
        self.queued_messages = 0  # messages waiting for recv()
        self.queued_bytes = 0  # their decoded bytes (frame sizes, payload decompressed)
        self._room = asyncio.Event()  # set while the receive queue is under both limits
        self._room.set()
        self._error: TransportError | None = None
        self._closed_locally = False
        self._tasks: list[asyncio.Task] = []
        self._pong_drain: asyncio.Task | None = None  # a Pong waiting for the stream to drain
        self._unanswered: deque[Ping] = deque(maxlen=MAX_UNANSWERED)  # Pings that came meanwhile
        self._pings: dict[int, tuple[int, asyncio.Future | None]] = {}  # seq -> sent_ns, waiter
        self._ping_seq = 0
        self._last_heard = 0.0
        self._last_ping = 0.0
        offered = session.capabilities if session else COMPRESSIONS
        self._compression = self.config.compression if self.config.compression in offered else None

    # ---- lifecycle --------------------------------------------------------------------

    def start(self) -> FramedChannel:
        loop = asyncio.get_running_loop()
        self._last_heard = self._last_ping = loop.time()
        self._tasks.append(loop.create_task(self._read_loop()))
        if self.config.ping_interval or self.config.dead_peer_timeout:
            self._tasks.append(loop.create_task(self._heartbeat()))
        return self

    @property
    def closed(self) -> bool:
        return self._error is not None

    @property
    def failure(self) -> TransportError | None:
        """What closed the channel (the peer's Bye, end of stream, PeerDead, ...), or None
        while it is open or when close() closed it."""
        if self._error is None or self._closed_locally:
            return None
        return _copy(self._error)

    @property
    def reading_paused(self) -> bool:
        """True while the receive queue is full and the reader has stopped reading."""
        return not self._room.is_set()

    @property
    def rtt(self) -> float | None:
        return self.rtt_estimator.srtt

    async def close(self, reason: str = "") -> None:
        """Say Bye (best effort) and close; pending recv() calls raise ChannelClosed."""
        if self._error is None:
            self._closed_locally = True
            self._fail(ChannelClosed("channel closed locally"), close_stream=False)
            with contextlib.suppress(Exception):
                self._write(Bye(reason=reason))
                await asyncio.wait_for(self._stream.drain(), 1.0)
            with contextlib.suppress(Exception):
                self._stream.close()
            wait_closed = getattr(self._stream, "wait_closed", None)
            if wait_closed is not None:  # an emulated link still delivering its last bytes
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2.0):
                        await wait_closed()
        current = asyncio.current_task()
        others = [t for t in (*self._tasks, self._pong_drain) if t and t is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def _fail(self, error: TransportError, *, close_stream: bool = True) -> None:
        """Record the first error, wake recv() and ping() waiters, close the stream."""
        if self._error is not None:
            return
        self._error = error
        self._inbox.put_nowait(_Closed())
        for _, waiter in self._pings.values():
            if waiter is not None and not waiter.done():
                waiter.set_exception(_copy(error))
        self._pings.clear()
        if close_stream:
            with contextlib.suppress(Exception):
                self._stream.close()
        current = asyncio.current_task()
        for task in (*self._tasks, self._pong_drain):
            if task is not None and task is not current:
                task.cancel()

    # ---- sending ----------------------------------------------------------------------

    def _write(self, msg: Message) -> None:
        frame = _encode(msg, compression=self._compression)
        self._stream.write(frame)
        self.bytes_sent += len(frame)
        self.messages_sent += 1

    async def send(self, msg: Message) -> None:
        self.send_nowait(msg)
        try:
            await self._stream.drain()
        except OSError as exc:
            self._fail(ChannelClosed(f"connection lost: {exc}"))
            raise _copy(self._error) from None

    def send_nowait(self, msg: Message) -> int:
        """`send` without waiting for the write buffer to drain (the caller bounds what it
        writes between two `send`s, which drain); returns the bytes written."""
        if self._error is not None:
            raise _copy(self._error)
        sent = self.bytes_sent
        try:
            self._write(msg)
        except OSError as exc:
            self._fail(ChannelClosed(f"connection lost: {exc}"))
            raise _copy(self._error) from None
        return self.bytes_sent - sent

    def _send_ping(self, waiter: asyncio.Future | None) -> None:
        self._ping_seq += 1
        sent_ns = time.monotonic_ns()
        if len(self._pings) >= MAX_UNANSWERED:  # unanswered heartbeats: forget the oldest
            self._pings.pop(next(iter(self._pings)))
        self._pings[self._ping_seq] = (sent_ns, waiter)
        self._write(Ping(seq=self._ping_seq, sent_ns=sent_ns))

    async def ping(self, timeout: float | None = None) -> float:
        """Send one Ping and return the RTT (seconds) when its Pong comes back."""
        if self._error is not None:
            raise _copy(self._error)
        waiter = asyncio.get_running_loop().create_future()
        try:
            self._send_ping(waiter)
            await self._stream.drain()
        except OSError as exc:
            self._fail(ChannelClosed(f"connection lost: {exc}"))
            raise _copy(self._error) from None
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that arrives as the Pong does, and the caller's loop then never stops
        async with asyncio.timeout(timeout):
            return await waiter

    # ---- receiving --------------------------------------------------------------------

    async def recv(self) -> Message:
        item = await self._inbox.get()
        if isinstance(item, _Closed):
            self._inbox.put_nowait(item)  # every later recv() fails too
            raise _copy(self._error)
        msg, size = item
        self.queued_messages -= 1
        self.queued_bytes -= size
        if not self._full():
            self._room.set()  # the reader resumes
        return msg

    def _full(self) -> bool:
        return (
            self.queued_messages >= self.config.recv_queue_messages
            or self.queued_bytes >= self.config.recv_queue_bytes
        )

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.recv()
        except ChannelClosed:
            raise StopAsyncIteration from None

    def _dispatch(self, msg: Message, size: int) -> None:
        self.messages_received += 1
        if isinstance(msg, Ping):
            self._answer(msg)
        elif isinstance(msg, Pong):
            sent_ns, waiter = self._pings.pop(msg.seq, (None, None))
            if sent_ns is None:
                return  # not ours, or forgotten: no sample
            rtt = (time.monotonic_ns() - sent_ns) / 1e9
            self.rtt_estimator.add(rtt)
            if waiter is not None and not waiter.done():
                waiter.set_result(rtt)
        elif isinstance(msg, Bye):
            self._fail(PeerSaidBye(msg.reason))
        else:
            self._inbox.put_nowait((msg, size))
            self.queued_messages += 1
            self.queued_bytes += size
            if self._full():
                self._room.clear()  # the reader stops reading until recv() makes room

    def _answer(self, ping: Ping) -> None:
        """Pong at once, unless earlier Pongs still wait for the stream to drain: then keep
        the Ping (the newest MAX_UNANSWERED) and answer once they are out."""
        if self._pong_drain is not None and not self._pong_drain.done():
            self._unanswered.append(ping)
            return
        self._write(_pong(ping))
        self._pong_drain = asyncio.get_running_loop().create_task(self._drain_pongs())

    async def _drain_pongs(self) -> None:
        try:
            while True:
                await self._stream.drain()
                if not self._unanswered or self._error is not None:
                    return
                while self._unanswered:
                    self._write(_pong(self._unanswered.popleft()))
        except (OSError, RuntimeError):
            pass  # the reader (or the next send) reports the lost connection

    async def _wait_for_room(self) -> None:
        """The receive queue is full: read nothing (TCP back-pressure slows the peer) until
        recv() makes room, or close the channel after `recv_stall_timeout` seconds."""
        timeout = self.config.recv_stall_timeout
        try:
            async with asyncio.timeout(timeout):
                await self._room.wait()
        except TimeoutError:
            with contextlib.suppress(Exception):
                self._write(Bye(reason=STALLED_BYE))
            self._fail(
                ChannelClosed(
                    f"receive queue full for {timeout} s: the application did not recv() "
                    f"({self.queued_messages} messages, {self.queued_bytes} bytes queued; "
                    f"recv_queue_messages={self.config.recv_queue_messages}, "
                    f"recv_queue_bytes={self.config.recv_queue_bytes})"
                )
            )
        self._last_heard = asyncio.get_running_loop().time()  # deaf while paused: restart

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._error is None:
                if not self._room.is_set():
                    await self._wait_for_room()
                    continue
                event = self._parser.next_event()
                if event is None:
                    data = await self._stream.read()
                    self._last_heard = loop.time()
                    self.bytes_received += len(data)
                    self._parser.receive_data(data)
                elif event is CONNECTION_CLOSED:
                    self._fail(ChannelClosed("peer closed the connection"))
                else:
                    self._dispatch(event, self._parser.message_bytes)
        except ProtocolError as exc:
            with contextlib.suppress(Exception):
                self._write(Error(code="protocol", message=str(exc)))
            self._fail(exc)
        except TransportError as exc:
            self._fail(exc)
        except OSError as exc:
            self._fail(ChannelClosed(f"connection lost: {exc}"))

    async def _heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        interval, timeout = self.config.ping_interval, self.config.dead_peer_timeout
        tick = min(x for x in (interval, timeout / 4 if timeout else None) if x)
        while self._error is None:
            await asyncio.sleep(tick)
            now = loop.time()
            if not self._room.is_set():
                self._last_heard = now  # not reading is not silence: restart the clock
            silent = now - self._last_heard
            if timeout and silent > timeout:
                self._fail(
                    PeerDead(f"peer silent for {silent:.2f} s (dead_peer_timeout={timeout} s)")
                )
                return
            if interval and now - self._last_ping >= interval:
                self._last_ping = now
                try:
                    self._send_ping(None)
                except OSError as exc:
                    self._fail(ChannelClosed(f"connection lost: {exc}"))


def _pong(ping: Ping) -> Pong:
    return Pong(seq=ping.seq, ping_sent_ns=ping.sent_ns, sent_ns=time.monotonic_ns())


def _copy(error: TransportError | None) -> TransportError:
    """A fresh exception of the same class and text (an instance is raised only once)."""
    if error is None:
        return ChannelClosed("channel closed")
    return type(error)(*error.args)


def memory_pair(
    *,
    config: TransportConfig | None = None,
    link: LinkConfig | None = None,
    downlink: LinkConfig | None = None,
) -> tuple[FramedChannel, FramedChannel]:
    """Two started channels joined in memory (no sockets, no handshake). Call it inside a
    running loop. `link` emulates a -> b (and b -> a too unless `downlink` is given)."""
    a_stream, b_stream = memory_stream_pair()
    uplink, downlink = link, downlink or link
    a: ByteStream = EmulatedStream(a_stream, uplink) if uplink else a_stream
    b: ByteStream = EmulatedStream(b_stream, downlink) if downlink else b_stream
    return (
        FramedChannel(a, config=config).start(),
        FramedChannel(b, config=config).start(),
    )
