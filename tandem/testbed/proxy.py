"""TCP delay proxy: one-way delay, jitter, rate and outages on a real TCP connection.

Why one file: the per-direction schedule (delay, jitter, rate, outages) and the pumps
that apply it to the bytes are one mechanism, tested as one.

The kernel here has no `netem` qdisc, so the emulated link between the device and the
cloud is this proxy: it accepts TCP connections on `listen`, opens one to `upstream` for
each, and moves bytes both ways through a per-direction schedule.

Words:
- *up* is client -> upstream (device -> cloud), *down* is upstream -> client.
- a *segment* is at most `segment_bytes` of what one read returned; it is the unit that
  is scheduled (a chunk of 64 KiB becomes four segments released one after the other).
- *ready time*: when the segment's last byte has been put on the link by the token bucket
  (`rate`, with `burst` bytes allowed at once); *release time*: when it is written to the
  other side. Times are event-loop seconds (monotonic).
- an *outage* `(start_s, duration_s)`, counted from the proxy's start, is a window in which
  nothing leaves or arrives in either direction; data is held (like a stalled TCP link),
  never dropped.

Schedule of one segment (pure functions below, tested on their own)::

    ready   = bucket_take(...)                       # serialisation at `rate`
    ready   = defer_past_outages(ready, windows)      # nothing leaves during an outage
    release = release_time(previous_release, ready, delay + jitter sample)
    release = defer_past_outages(release, windows)   # nothing arrives during an outage

`release_time` takes the max with the previous release of the same stream, so jitter
never reorders bytes (netem reorders packets with jitter; TCP would hide that anyway).
`delay_ms` and `jitter_ms` are ONE-WAY and apply to each direction `delayed` names: "both"
(the default: a round trip through the proxy takes `2 * delay_ms`, like netem on both ends of
a link), "down" (upstream -> client only: like netem on the server's NIC, the DRAGON paper's
setup, so a round trip gains `delay_ms`) or "up". Jitter is uniform in
`[-jitter_ms, +jitter_ms]`, clipped so a delay never goes below zero. `rate_mbit` is the
payload rate of each direction (1 Mbit = 10**6 bits).

Safety: the proxy only listens on and connects to loopback (127.0.0.0/8, ::1) or the
project's namespace link `LINK_SUBNET`; anything else is refused before any socket opens.

Run as a process (this is how `tandem net up` starts it inside the cloud namespace)::

    python -m tandem.testbed.proxy --listen 10.203.0.2:7401 --upstream 127.0.0.1:7400 \
        --delay-ms 50 --jitter-ms 5 --rate-mbit 20 --outage 10:2 --ready-file /run/tandem/x
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import random
import signal
import socket
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tandem.errors import TandemError

LINK_SUBNET = ipaddress.ip_network("10.203.0.0/30")
ALLOWED_NETWORKS = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
    LINK_SUBNET,
)
READ_BYTES = 65536
DELAYED = ("both", "down", "up")  # which directions carry the delay and jitter


def carries_delay(delayed: str, direction: str) -> bool:
    """Whether `direction` ("up": device -> cloud, "down": cloud -> device) carries the delay
    and jitter when `delayed` (one of `DELAYED`) names the delayed directions."""
    return delayed in ("both", direction)


DRAIN_GRACE_S = 0.5  # after a direction fails: the other may still flush this long


@dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    """Where the proxy listens and forwards, and the link it emulates (each direction)."""

    upstream_port: int
    upstream_host: str = "127.0.0.1"
    listen_host: str = "127.0.0.1"
    listen_port: int = 0  # 0: any free port (see `DelayProxy.port`)
    delay_ms: float = 0.0  # one-way, each direction: RTT gains 2 * delay_ms
    jitter_ms: float = 0.0  # uniform in [-jitter_ms, +jitter_ms], each direction
    rate_mbit: float | None = None  # payload Mbit/s, each direction; None: unlimited
    burst_bytes: int = 16384  # token-bucket depth
    outages: tuple[tuple[float, float], ...] = ()  # (start_s, duration_s) after start
    seed: int = 0  # jitter samples
    delayed: str = "both"  # which directions carry delay and jitter: both | down | up
    segment_bytes: int = 16384  # scheduling unit
    max_buffer_bytes: int = 8 << 20  # held bytes per stream before reading pauses

    def __post_init__(self) -> None:
        check_target(self.listen_host)
        check_target(self.upstream_host)
        if self.delay_ms < 0 or self.jitter_ms < 0:
            raise TandemError("proxy delay and jitter must be >= 0 ms")
        if self.delayed not in DELAYED:
            raise TandemError(f"delayed must be one of {', '.join(DELAYED)}, not {self.delayed!r}")
        if self.rate_mbit is not None and self.rate_mbit <= 0:
            raise TandemError(f"proxy rate must be > 0 Mbit/s, got {self.rate_mbit}")
        for start_s, duration_s in self.outages:
            if start_s < 0 or duration_s <= 0:
                raise TandemError(
                    f"bad outage {start_s}:{duration_s} (need start >= 0, duration > 0)"
                )


def check_target(host: str) -> None:
    """Refuse any address outside loopback and the project's namespace link."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise TandemError(f"proxy address must be a numeric IP, got {host!r}") from None
    if not any(
        address in network for network in ALLOWED_NETWORKS if network.version == address.version
    ):
        raise TandemError(f"proxy address {host} is outside loopback and {LINK_SUBNET}; refused")


# ---------------------------------------------------------------- pure scheduling math


@dataclass(frozen=True)
class Bucket:
    """Token bucket state: `tokens` bytes available at `time` (negative: bytes still owed)."""

    tokens: float
    time: float


def bucket_take(
    bucket: Bucket, *, now: float, size: int, rate_bps: float, burst: int
) -> tuple[Bucket, float]:
    """Put `size` bytes on a link of `rate_bps` bytes/s at `now`; return (bucket, ready time).

    The bucket refills at `rate_bps` up to `burst`; it may go negative (a queue of bytes
    waiting to be serialised), and the ready time is when that debt is paid off.
    """
    tokens = min(float(burst), bucket.tokens + (now - bucket.time) * rate_bps) - size
    ready = now if tokens >= 0 else now + (-tokens) / rate_bps
    return Bucket(tokens=tokens, time=now), ready


def jitter_sample(rng: random.Random, jitter_s: float) -> float:
    """One jitter offset, uniform in [-jitter_s, +jitter_s] (0 when jitter is off)."""
    return rng.uniform(-jitter_s, jitter_s) if jitter_s > 0 else 0.0


def release_time(previous_release: float, ready: float, delay_s: float) -> float:
    """Release of a segment ready at `ready` with this one-way `delay_s` (never before the last)."""
    return max(previous_release, ready + max(0.0, delay_s))


def defer_past_outages(when: float, windows: list[tuple[float, float]]) -> float:
    """Move `when` to the end of any outage window `[start, end)` it falls in (windows sorted)."""
    for start, end in windows:
        if start <= when < end:
            when = end
    return when


def outage_windows(
    outages: tuple[tuple[float, float], ...], origin: float
) -> list[tuple[float, float]]:
    """Absolute `[start, end)` windows, sorted, from `(start_s, duration_s)` after `origin`."""
    return sorted(
        (origin + start_s, origin + start_s + duration_s) for start_s, duration_s in outages
    )


# ---------------------------------------------------------------- asyncio proxy


class _Link:
    """One direction of the emulated link, shared by all connections (bucket, jitter rng)."""

    def __init__(
        self,
        config: ProxyConfig,
        windows: list[tuple[float, float]],
        *,
        origin: float,
        seed: int,
        direction: str,
    ) -> None:
        self.rate_bps = None if config.rate_mbit is None else config.rate_mbit * 1e6 / 8
        self.burst = config.burst_bytes
        delayed = carries_delay(config.delayed, direction)
        self.delay_s = config.delay_ms / 1e3 if delayed else 0.0
        self.jitter_s = config.jitter_ms / 1e3 if delayed else 0.0
        self.windows = windows
        self.rng = random.Random(seed)
        self.bucket = Bucket(tokens=float(config.burst_bytes), time=origin)

    def schedule(self, now: float, size: int, previous_release: float) -> float:
        ready = now
        if self.rate_bps is not None:
            self.bucket, ready = bucket_take(
                self.bucket, now=now, size=size, rate_bps=self.rate_bps, burst=self.burst
            )
        ready = defer_past_outages(ready, self.windows)
        delay_s = self.delay_s + jitter_sample(self.rng, self.jitter_s)
        return defer_past_outages(release_time(previous_release, ready, delay_s), self.windows)


class _Flow:
    """One direction of one connection: bytes read from one end are scheduled by the link,
    held, and written to the other end at their release time, in order.

    Callbacks only (no task per direction): a read hands its bytes to `feed`, which writes
    at once what is already due (everything, when the link has nothing to emulate) and arms
    one timer for the rest. Back-pressure: while the sink's buffer is full (`pause_writing`)
    nothing is written and bytes stay held; past `max_buffer_bytes` held, the source stops
    reading (the rest waits in the kernel and the sender blocks, like a full link buffer)."""

    def __init__(self, link: _Link, config: ProxyConfig, loop: asyncio.AbstractEventLoop):
        self.link, self.config, self.loop = link, config, loop
        self.source: asyncio.Transport | None = None  # read from
        self.sink: asyncio.Transport | None = None  # written to; None until connected
        self.held: deque[tuple[float, bytes]] = deque()  # (release, segment), non-decreasing
        self.held_bytes = 0
        self.last_release = 0.0
        self.eof = False  # the source has no more bytes
        self.blocked = False  # the sink's write buffer is full
        self.reading_paused = False
        self.finished = False  # eof delivered (or the sink is gone)
        self.timer: asyncio.TimerHandle | None = None
        self.on_finished: Callable[[], None] = lambda: None

    def feed(self, data: bytes) -> None:
        if self.finished:  # the sink is gone: nothing read now can arrive
            return
        now = self.loop.time()
        step = self.config.segment_bytes
        for offset in range(0, len(data), step):
            segment = data[offset : offset + step] if len(data) > step else data
            self.last_release = self.link.schedule(now, len(segment), self.last_release)
            self.held.append((self.last_release, segment))
            self.held_bytes += len(segment)
        if self.held_bytes >= self.config.max_buffer_bytes and not self.reading_paused:
            self.reading_paused = True
            self.source.pause_reading()
        self.flush()

    def end_of_input(self) -> None:
        if not self.eof:
            self.eof = True
            self.flush()

    def flush(self) -> None:
        """Write what is due, arm the timer for what is not; after the last byte, the eof."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.finished or self.sink is None or self.blocked:
            return
        if self.held:
            now = self.loop.time()
            if self.held[0][0] > now:
                self.timer = self.loop.call_at(self.held[0][0], self.flush)
                return
            batch = []
            while self.held and self.held[0][0] <= now:
                batch.append(self.held.popleft()[1])
            data = batch[0] if len(batch) == 1 else b"".join(batch)
            self.held_bytes -= len(data)
            self.sink.write(data)  # may call pause_writing (then `blocked`) before returning
            if self.reading_paused and self.held_bytes < self.config.max_buffer_bytes:
                self.reading_paused = False
                self.source.resume_reading()
            if self.held:
                if not self.blocked:
                    self.timer = self.loop.call_at(self.held[0][0], self.flush)
                return
        if self.eof:
            if self.sink.can_write_eof():
                with contextlib.suppress(OSError, RuntimeError):
                    self.sink.write_eof()
            self._finish()

    def lose_sink(self) -> None:
        """The sink is gone: what is held can never arrive."""
        self.stop()
        self._finish()

    def stop(self) -> None:
        """Nothing more is read or written (the connection is closing)."""
        self.finished = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _finish(self) -> None:
        self.finished = True
        self.on_finished()


def _set_nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _End(asyncio.BufferedProtocol):
    """One socket of a connection: the source of one flow and the sink of the other."""

    def __init__(self, connection: _Connection, reads: _Flow, writes: _Flow):
        self.connection, self.reads, self.writes = connection, reads, writes
        self.buffer = bytearray(READ_BYTES)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        _set_nodelay(transport)
        self.reads.source = self.transport
        self.connection.connected(self)

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.reads.feed(bytes(memoryview(self.buffer)[:nbytes]))

    def eof_received(self) -> bool:
        self.reads.end_of_input()
        return True  # a clean EOF only half-closes: the other direction goes on

    def pause_writing(self) -> None:
        self.writes.blocked = True

    def resume_writing(self) -> None:
        self.writes.blocked = False
        self.writes.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.reads.end_of_input()  # what was read is delivered (a read error ends input)
        self.writes.lose_sink()
        self.connection.lost(self)


class _Connection:
    """A client connection and the one the proxy opens upstream for it.

    A clean EOF only half-closes. A lost socket (reset, or the peer gone) ends the
    connection, but only once the other direction has delivered what it holds: the bytes
    were already on the wire, as on a real link (a cloud that closes while the device still
    sends must not take its last, delayed replies with it). `DRAIN_GRACE_S` past the last
    release time, whatever is left is dropped."""

    def __init__(self, proxy: DelayProxy, loop: asyncio.AbstractEventLoop):
        self.proxy, self.loop = proxy, loop
        assert proxy._up is not None and proxy._down is not None
        self.up = _Flow(proxy._up, proxy.config, loop)
        self.down = _Flow(proxy._down, proxy.config, loop)
        self.up.on_finished = self.down.on_finished = self._check_done
        self.client = _End(self, reads=self.up, writes=self.down)
        self.upstream: _End | None = None
        self.grace: asyncio.TimerHandle | None = None
        self.closed = False

    def connected(self, end: _End) -> None:
        if end is not self.client:
            self.upstream = end
        else:  # the client's bytes wait in the kernel until the upstream connection is up
            self.down.sink = end.transport
            end.transport.pause_reading()
            self.proxy._connections.add(self)
            task = self.loop.create_task(self._open_upstream())
            self.proxy._tasks.add(task)
            task.add_done_callback(self.proxy._tasks.discard)

    async def _open_upstream(self) -> None:
        config = self.proxy.config
        try:
            await self.loop.create_connection(
                lambda: _End(self, reads=self.down, writes=self.up),
                config.upstream_host,
                config.upstream_port,
            )
        except OSError as exc:
            where = f"{config.upstream_host}:{config.upstream_port}"
            print(f"proxy: upstream {where}: {exc}", file=sys.stderr)
            self.close()
            return
        if self.closed:  # the client went (or the proxy closed) meanwhile
            self.upstream.transport.close()
            return
        self.up.sink = self.upstream.transport  # (its `connection_made` set down.source)
        self.client.transport.resume_reading()
        self.up.flush()

    def lost(self, end: _End) -> None:
        """`end`'s socket is gone: the other direction delivers what it holds, then the
        connection closes (at the latest `DRAIN_GRACE_S` after the last release)."""
        if self.closed or self.grace is not None:
            return
        held_until = max(self.up.last_release, self.down.last_release)
        grace = max(0.0, held_until - self.loop.time()) + DRAIN_GRACE_S
        self.grace = self.loop.call_later(grace, self.close)
        self._check_done()

    def _check_done(self) -> None:
        if self.up.finished and self.down.finished:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.grace is not None:
            self.grace.cancel()
        for flow in (self.up, self.down):
            flow.stop()
        for end in (self.client, self.upstream):
            if end is not None and end.transport is not None:
                end.transport.close()
        self.proxy._connections.discard(self)


class DelayProxy:
    """The running proxy. `async with DelayProxy(config) as proxy:` then connect to `proxy.port`."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.started = 0.0  # loop time of start(); outages count from here
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()  # open ones
        self._tasks: set[asyncio.Task] = set()  # connections to the upstream being opened
        self._up: _Link | None = None
        self._down: _Link | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise TandemError("proxy is not started")
        return self._server.sockets[0].getsockname()[1]

    @property
    def held_bytes(self) -> int:
        """Bytes held (read, not yet written on) over all open connections; each direction of
        each connection holds at most `max_buffer_bytes` + one read (64 KiB)."""
        return sum(c.up.held_bytes + c.down.held_bytes for c in self._connections)

    async def start(self) -> DelayProxy:
        self.started = asyncio.get_running_loop().time()
        windows = outage_windows(self.config.outages, self.started)
        self._up = _Link(
            self.config, windows, origin=self.started, seed=2 * self.config.seed, direction="up"
        )
        self._down = _Link(
            self.config, windows, origin=self.started, seed=2 * self.config.seed + 1,
            direction="down",
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self, loop).client,
            self.config.listen_host,
            self.config.listen_port,
        )
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> DelayProxy:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


# ---------------------------------------------------------------- process entry point


def parse_hostport(text: str) -> tuple[str, int]:
    """ "10.203.0.2:7401" -> ("10.203.0.2", 7401)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise TandemError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def parse_outage(text: str) -> tuple[float, float]:
    """ "10:2.5" -> (10.0, 2.5): an outage 10 s after start that lasts 2.5 s."""
    start, sep, duration = text.partition(":")
    try:
        return float(start), float(duration)
    except ValueError:
        raise TandemError(f"expected START:DURATION in seconds, got {text!r}") from None


def _write_ready(ready_file: Path | None, **fields: object) -> None:
    """Atomically write `fields` as JSON (whoever polls the file never reads half of it)."""
    if ready_file is not None:
        partial = ready_file.with_name(ready_file.name + ".partial")
        partial.write_text(json.dumps({"pid": os.getpid(), **fields}))
        partial.replace(ready_file)


async def _serve_forever(config: ProxyConfig, ready_file: Path | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    listen = f"{config.listen_host}:{config.listen_port}"
    try:
        proxy = await DelayProxy(config).start()
    except OSError as exc:  # e.g. the port is taken: say so at once instead of timing out
        _write_ready(ready_file, error=f"proxy cannot listen on {listen}: {exc.strerror or exc}")
        raise TandemError(f"proxy cannot listen on {listen}: {exc.strerror or exc}") from None
    try:
        _write_ready(ready_file, listen=f"{config.listen_host}:{proxy.port}")
        upstream = f"{config.upstream_host}:{config.upstream_port}"
        print(f"proxy: {config.listen_host}:{proxy.port} -> {upstream}", flush=True)
        await stop.wait()
    finally:
        await proxy.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tandem.testbed.proxy", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept connections on")
    parser.add_argument("--upstream", required=True, help="HOST:PORT to forward each connection to")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay, each direction")
    parser.add_argument(
        "--jitter-ms", type=float, default=0.0, help="uniform +- jitter, each direction"
    )
    parser.add_argument(
        "--rate-mbit", type=float, default=None, help="payload rate, each direction"
    )
    parser.add_argument(
        "--outage", action="append", default=[], help="START:DURATION seconds after start"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--delayed", choices=DELAYED, default="both", help="directions with delay and jitter"
    )
    parser.add_argument(
        "--ready-file", type=Path, default=None, help="JSON {pid, listen}, written once listening"
    )
    args = parser.parse_args(argv)
    try:
        listen_host, listen_port = parse_hostport(args.listen)
        upstream_host, upstream_port = parse_hostport(args.upstream)
        config = ProxyConfig(
            listen_host=listen_host,
            listen_port=listen_port,
            upstream_host=upstream_host,
            upstream_port=upstream_port,
            delay_ms=args.delay_ms,
            jitter_ms=args.jitter_ms,
            rate_mbit=args.rate_mbit,
            outages=tuple(parse_outage(text) for text in args.outage),
            seed=args.seed,
            delayed=args.delayed,
        )
        from tandem.transport import loop as event_loop  # here: the package is heavy to import

        event_loop.run(_serve_forever(config, args.ready_file))
    except TandemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
