"""Bounded memory: a receiver that stops reading pauses its reader at the receive-queue
bound, back-pressure blocks the sender, keepalive survives the pause, a queue full for too
long closes the session with the reason, an emulated link holds its sender at its buffer
bound, and Pings from a peer that never reads get a bounded number of Pongs. Over TCP, 256 MiB offered to a server that never reads grow the
process by a small fraction of that."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tandem.transport import (
    ChannelClosed,
    DraftTokens,
    FramedChannel,
    LinkConfig,
    Ping,
    Pong,
    TransportConfig,
    connect,
    encode_message,
    memory_pair,
    memory_stream_pair,
    serve,
)
from tandem.transport.channel import MAX_UNANSWERED, MEMORY_BUFFER_BYTES, STALLED_BYE
from tandem.transport.wire import FrameParser

from .test_channel import arun

COUNT = 200
QUIET = {"ping_interval": None, "dead_peer_timeout": None}


def kib_message(seq: int) -> DraftTokens:
    return DraftTokens(seq=seq, position=0, tokens=(0,), distributions=(bytes(1024),))


async def until(condition, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


async def send_all(channel, count: int = COUNT) -> None:
    for seq in range(count):
        await channel.send(kib_message(seq))


def test_a_full_receive_queue_blocks_the_sender_until_recv_makes_room():
    frame = len(encode_message(kib_message(0)))

    async def main():
        a, b = memory_pair(config=TransportConfig(recv_queue_messages=4, **QUIET))
        sender = asyncio.create_task(send_all(a))
        await until(lambda: b.reading_paused)
        done, _ = await asyncio.wait({sender}, timeout=0.3)
        assert not done  # blocked in send(): drain() waits for the paused reader
        assert b.queued_messages == 4 and b.queued_bytes == 4 * frame
        assert b.bytes_received == 4 * frame  # the reader stopped right at the bound
        assert a.bytes_sent - b.bytes_received <= MEMORY_BUFFER_BYTES + frame
        got = [(await b.recv()).seq for _ in range(COUNT)]
        await sender
        assert got == list(range(COUNT)) and b.queued_messages == b.queued_bytes == 0
        await a.close()
        await b.close()

    arun(main())


def test_the_byte_bound_pauses_the_reader_too():
    frame = len(encode_message(kib_message(0)))

    async def main():
        config = TransportConfig(recv_queue_bytes=10 * frame - 1, **QUIET)
        a, b = memory_pair(config=config)
        sender = asyncio.create_task(send_all(a))
        await until(lambda: b.reading_paused)
        assert b.queued_messages == 10 and not sender.done()
        assert [(await b.recv()).seq for _ in range(COUNT)] == list(range(COUNT))
        await sender
        await a.close()
        await b.close()

    arun(main())


def test_a_paused_reader_is_not_a_dead_peer_on_either_side():
    """b stops reading for > 3 dead-peer timeouts: b does not count the time it did not
    listen as silence, and a keeps hearing b's heartbeat Pings."""
    config = TransportConfig(
        recv_queue_messages=4, ping_interval=0.05, dead_peer_timeout=0.3, recv_stall_timeout=None
    )

    async def main():
        a, b = memory_pair(config=config)
        sender = asyncio.create_task(send_all(a))
        await until(lambda: b.reading_paused)
        await asyncio.sleep(1.0)
        assert not a.closed and not b.closed and not sender.done()
        assert [(await b.recv()).seq for _ in range(COUNT)] == list(range(COUNT))
        await sender
        assert await b.ping(timeout=5) > 0  # and the heartbeat works after the pause
        await a.close()
        await b.close()

    arun(main())


def test_a_queue_full_for_too_long_closes_the_session_and_says_why():
    config = TransportConfig(recv_queue_messages=4, recv_stall_timeout=0.3, **QUIET)

    async def main():
        a, b = memory_pair(config=config)
        sender = asyncio.create_task(send_all(a))
        with pytest.raises(ChannelClosed, match=f"peer said bye: {STALLED_BYE}"):
            await sender
        assert a.messages_sent < COUNT
        # what was queued is still delivered, then the reason
        assert [(await b.recv()).seq for _ in range(4)] == [0, 1, 2, 3]
        with pytest.raises(ChannelClosed, match=r"receive queue full for 0.3 s: .* did not recv"):
            await b.recv()
        assert b.failure is not None and a.failure is not None
        await a.close()
        await b.close()

    arun(main())


def test_a_slow_emulated_link_holds_the_sender_at_its_buffer_bound():
    frame = len(encode_message(kib_message(0)))
    link = LinkConfig(rate_mbit=2.0, max_buffer_bytes=32 * 1024)  # 250 kB/s

    async def main():
        a, b = memory_pair(config=TransportConfig(**QUIET), link=link)
        sender = asyncio.create_task(send_all(a))
        await until(lambda: a.bytes_sent > 2 * link.max_buffer_bytes)
        in_flight = a.bytes_sent - b.bytes_received
        assert in_flight <= link.max_buffer_bytes + MEMORY_BUFFER_BYTES + 2 * frame
        assert not sender.done()  # ~200 kB at 250 kB/s: the sender waits for the link
        assert [(await b.recv()).seq for _ in range(COUNT)] == list(range(COUNT))
        await sender
        await a.close()
        await b.close()

    arun(main())


def test_pings_from_a_peer_that_never_reads_get_a_bounded_number_of_pongs():
    pings = 5000

    async def main():
        raw, mine = memory_stream_pair()
        channel = FramedChannel(mine, config=TransportConfig(**QUIET)).start()
        for seq in range(pings):  # in bursts, so the Pongs fill the pipe to its limit
            raw.write(encode_message(Ping(seq=seq, sent_ns=0)))
            if seq % 100 == 99:
                await asyncio.sleep(0)
        await until(lambda: channel.messages_received == pings)
        await asyncio.sleep(0.05)
        parser, pongs = FrameParser(), []
        while True:  # everything written so far, and what the channel writes as we read
            try:
                parser.receive_data(await asyncio.wait_for(raw.read(), 0.2))
            except TimeoutError:
                break
            while (msg := parser.next_event()) is not None:
                pongs.append(msg)
        assert all(isinstance(p, Pong) for p in pongs)
        pong_bytes = len(encode_message(pongs[-1]))
        assert len(pongs) <= MEMORY_BUFFER_BYTES // pong_bytes + 2 * MAX_UNANSWERED + 2
        assert pongs[-1].seq == pings - 1  # the newest Ping is answered
        await channel.close()

    arun(main())


def rss_bytes() -> int | None:
    """This process's resident set size (Linux /proc), or None elsewhere."""
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    found = re.search(r"^VmRSS:\s+(\d+) kB", status.read_text(), re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None


def test_a_server_that_never_reads_cannot_grow_memory_over_tcp():
    """The client offers 256 x 1 MiB; the server's handler never calls recv(). The server
    queues at most its 8 MiB bound (+ one message), the client's send() blocks on TCP
    back-pressure, and after the 1 s stall timeout the server closes, naming the reason."""
    blob, offered = bytes(1 << 20), 256
    limit = 8 << 20
    server_config = TransportConfig(recv_queue_bytes=limit, recv_stall_timeout=1.0)

    async def main():
        accepted: list[FramedChannel] = []
        finish = asyncio.Event()

        async def handler(channel):
            accepted.append(channel)
            await finish.wait()

        rss_before = rss_bytes()
        server = await serve(handler, "127.0.0.1", 0, config=server_config)
        client = await connect("127.0.0.1", server.port, config=TransportConfig())
        with pytest.raises(ChannelClosed) as stopped:
            for seq in range(offered):
                await client.send(
                    DraftTokens(seq=seq, position=0, tokens=(0,), distributions=(blob,))
                )
        rss_after = rss_bytes()
        (channel,) = accepted
        queued, queued_bytes = channel.queued_messages, channel.queued_bytes
        got = [(await channel.recv()).seq for _ in range(queued)]
        with pytest.raises(ChannelClosed, match="receive queue full for 1.0 s"):
            await channel.recv()
        finish.set()
        await client.close()
        await server.close()
        return stopped.value, client, queued_bytes, got, rss_before, rss_after

    stopped, client, queued_bytes, got, rss_before, rss_after = arun(main(), timeout=60)
    offered_bytes = offered * len(blob)
    print(
        f"offered {offered_bytes >> 20} MiB, client sent {client.bytes_sent / 2**20:.1f} MiB, "
        f"server queued {queued_bytes / 2**20:.1f} MiB, "
        f"RSS growth {(rss_after - rss_before) / 2**20 if rss_before else float('nan'):.1f} MiB; "
        f"client saw: {stopped}"
    )
    assert got == list(range(len(got))) and len(got) >= 1
    assert queued_bytes <= limit + (1 << 20) + 4096  # the bound plus one message
    assert client.bytes_sent < offered_bytes / 4  # the sender was held back
    if rss_before is not None:
        assert rss_after - rss_before < offered_bytes / 4
