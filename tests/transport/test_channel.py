"""Channels over in-memory streams: message delivery, Ping/Pong and RTT, Bye, errors,
heartbeats and dead-peer detection within a bounded time."""

from __future__ import annotations

import asyncio
import time

import pytest

from tandem.transport import (
    Channel,
    ChannelClosed,
    FramedChannel,
    Interrupt,
    PeerDead,
    ProtocolError,
    TransportConfig,
    encode_message,
    memory_pair,
    memory_stream_pair,
)

from .support import sample_messages


def arun(coro, timeout: float = 20.0):
    async def bounded():
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


def test_memory_pair_delivers_every_message_in_order():
    session_messages = [
        m for m in sample_messages() if type(m).__name__ not in ("Ping", "Pong", "Bye")
    ]

    async def main():
        a, b = memory_pair()
        assert isinstance(a, Channel)
        for msg in session_messages:
            await a.send(msg)
        received = [await b.recv() for _ in session_messages]
        assert received == session_messages
        assert (
            a.bytes_sent
            == b.bytes_received
            == sum(len(encode_message(m)) for m in session_messages)
        )
        await a.close()
        await b.close()

    arun(main())


def test_compression_reduces_bytes_and_is_transparent():
    msg = sample_messages()[8]  # VerifyRequest with a large int64 array

    async def measure(compression):
        a, b = memory_pair(config=TransportConfig(compression=compression, ping_interval=None))
        await a.send(msg)
        assert await b.recv() == msg
        await a.close()
        await b.close()
        return a.bytes_sent

    plain, packed = arun(measure(None)), arun(measure("zstd"))
    assert packed < plain / 2


def test_ping_measures_rtt_and_peer_answers_without_the_application():
    async def main():
        a, b = memory_pair()
        samples = [await a.ping(timeout=2) for _ in range(5)]
        assert all(0 < s < 0.5 for s in samples)
        assert a.rtt is not None and a.rtt_estimator.samples == 5
        assert a.rtt_estimator.min_rtt == min(samples)
        assert b.messages_received == 5 and b._inbox.empty()  # Pings never reach recv()
        await a.close()
        await b.close()

    arun(main())


def test_bye_ends_iteration_after_queued_messages():
    async def main():
        a, b = memory_pair()
        for i in range(3):
            await a.send(Interrupt(seq=i, position=i))
        await a.close("finished")
        got = [msg.seq async for msg in b]
        assert got == [0, 1, 2]
        with pytest.raises(ChannelClosed, match="peer said bye: finished"):
            await b.recv()
        with pytest.raises(ChannelClosed, match="closed locally"):
            await a.send(Interrupt(seq=9, position=0))
        await b.close()

    arun(main())


def test_garbage_from_the_peer_is_a_protocol_error():
    async def main():
        raw, mine = memory_stream_pair()
        channel = FramedChannel(mine).start()
        raw.write(encode_message(Interrupt(seq=1, position=2)))
        raw.write(b"GARBAGE GARBAGE GARBAGE")
        assert await channel.recv() == Interrupt(seq=1, position=2)
        with pytest.raises(ProtocolError, match="bad frame magic"):
            await channel.recv()
        assert channel.closed
        # the peer is told why before the stream closes
        reply = await raw.read()
        assert b"bad frame magic" in reply
        await channel.close()

    arun(main())


def test_stream_end_mid_frame_and_at_boundary():
    async def main():
        raw, mine = memory_stream_pair()
        channel = FramedChannel(mine).start()
        raw.write(encode_message(Interrupt(seq=1, position=2))[:-3])
        raw.close()
        with pytest.raises(ProtocolError, match="stream ended inside a frame"):
            await channel.recv()

        raw, mine = memory_stream_pair()
        channel = FramedChannel(mine).start()
        raw.close()
        with pytest.raises(ChannelClosed, match="peer closed the connection"):
            await channel.recv()

    arun(main())


@pytest.mark.parametrize("timeout", [0.3, 0.6])
def test_silent_peer_detected_within_bounded_time(timeout):
    """The peer's stream stays open but never says anything (not even Pong)."""

    async def main():
        _silent, mine = memory_stream_pair()
        config = TransportConfig(ping_interval=0.05, dead_peer_timeout=timeout)
        channel = FramedChannel(mine, config=config).start()
        started = time.monotonic()
        with pytest.raises(PeerDead, match=f"dead_peer_timeout={timeout} s"):
            await channel.recv()
        elapsed = time.monotonic() - started
        tick = min(config.ping_interval, timeout / 4)
        assert timeout <= elapsed <= timeout + tick + 0.25  # 0.25 s slack for a busy CPU
        with pytest.raises(PeerDead):
            await channel.ping()

    arun(main())


def test_heartbeats_keep_a_quiet_but_alive_peer_alive():
    async def main():
        config = TransportConfig(ping_interval=0.05, dead_peer_timeout=0.3)
        a, b = memory_pair(config=config)
        await asyncio.sleep(1.0)  # no application traffic, > 3 timeouts
        assert not a.closed and not b.closed
        assert a.rtt_estimator.samples >= 5 and b.rtt_estimator.samples >= 5
        await a.send(Interrupt(seq=1, position=1))
        assert (await b.recv()).seq == 1
        await a.close()
        await b.close()

    arun(main())


def test_config_validation():
    with pytest.raises(ValueError, match="shorter than dead_peer_timeout"):
        TransportConfig(ping_interval=5, dead_peer_timeout=1)
    with pytest.raises(ValueError, match="compression"):
        TransportConfig(compression="gzip")
    assert TransportConfig(secret="text").secret == b"text"
