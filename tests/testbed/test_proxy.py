"""The TCP delay proxy: pure scheduling math, then real sockets on 127.0.0.1.

Delay is one-way per direction, so an echo through the proxy takes 2 * delay_ms.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.errors import TandemError
from tandem.testbed import probe
from tandem.testbed import proxy as proxy_module
from tandem.testbed.proxy import (
    Bucket,
    DelayProxy,
    ProxyConfig,
    bucket_take,
    check_target,
    defer_past_outages,
    jitter_sample,
    outage_windows,
    parse_hostport,
    parse_outage,
    release_time,
)

# ---------------------------------------------------------------- pure math


def test_bucket_burst_goes_at_once_then_serialises_at_rate():
    bucket = Bucket(tokens=1000.0, time=0.0)
    bucket, ready = bucket_take(bucket, now=0.0, size=1000, rate_bps=1000.0, burst=1000)
    assert ready == 0.0  # within the burst
    bucket, ready = bucket_take(bucket, now=0.0, size=500, rate_bps=1000.0, burst=1000)
    assert ready == pytest.approx(0.5)  # 500 bytes owed at 1000 B/s
    bucket, ready = bucket_take(bucket, now=0.1, size=500, rate_bps=1000.0, burst=1000)
    assert ready == pytest.approx(1.0)  # queued behind the first 500


def test_bucket_refills_up_to_burst_only():
    bucket = Bucket(tokens=0.0, time=0.0)
    bucket, ready = bucket_take(bucket, now=100.0, size=2000, rate_bps=1000.0, burst=1000)
    assert ready == pytest.approx(101.0)  # an idle hour does not bank more than `burst`


@given(sizes=st.lists(st.integers(1, 100_000), min_size=1, max_size=200), rate=st.floats(1e3, 1e8))
def test_bucket_long_run_rate(sizes, rate):
    burst = 16384
    bucket, ready = Bucket(tokens=float(burst), time=0.0), 0.0
    for size in sizes:
        bucket, ready = bucket_take(bucket, now=0.0, size=size, rate_bps=rate, burst=burst)
    assert ready == pytest.approx(max(0.0, (sum(sizes) - burst) / rate), rel=1e-9, abs=1e-12)


@settings(max_examples=200)
@given(
    gaps=st.lists(st.floats(0.0, 0.05), min_size=1, max_size=100),
    delay_s=st.floats(0.0, 0.3),
    jitter_s=st.floats(0.0, 0.3),
    seed=st.integers(0, 2**32),
)
def test_release_never_reorders_and_respects_jitter_bounds(gaps, delay_s, jitter_s, seed):
    rng = random.Random(seed)
    now, previous = 0.0, 0.0
    for gap in gaps:
        now += gap
        release = release_time(previous, now, delay_s + jitter_sample(rng, jitter_s))
        assert release >= previous  # bytes keep their order
        assert release >= now + max(0.0, delay_s - jitter_s) - 1e-12
        assert release <= max(previous, now + delay_s + jitter_s) + 1e-12
        previous = release


def test_jitter_sample_is_uniform_within_bounds():
    rng = random.Random(0)
    samples = [jitter_sample(rng, 0.01) for _ in range(20_000)]
    assert min(samples) >= -0.01 and max(samples) <= 0.01
    assert abs(statistics.mean(samples)) < 3e-4
    assert statistics.pstdev(samples) == pytest.approx(0.01 / 3**0.5, rel=0.03)  # uniform's sd
    assert jitter_sample(rng, 0.0) == 0.0


def test_outage_windows_defer_release():
    windows = outage_windows(((1.0, 0.5), (1.4, 1.0), (5.0, 1.0)), origin=10.0)
    assert windows == [(11.0, 11.5), (11.4, 12.4), (15.0, 16.0)]
    assert defer_past_outages(10.9, windows) == 10.9
    assert defer_past_outages(11.0, windows) == 12.4  # overlapping windows chain
    assert defer_past_outages(12.4, windows) == 12.4  # the end is open
    assert defer_past_outages(15.5, windows) == 16.0


def test_only_loopback_and_the_project_link_are_targets():
    for host in ("127.0.0.1", "127.8.9.10", "::1", "10.203.0.1", "10.203.0.2"):
        check_target(host)
    for host in ("8.8.8.8", "10.203.0.5", "192.168.1.1", "0.0.0.0", "localhost"):
        with pytest.raises(TandemError):
            check_target(host)
    with pytest.raises(TandemError):
        ProxyConfig(upstream_host="1.1.1.1", upstream_port=80)


def test_config_and_parsers_refuse_nonsense():
    with pytest.raises(TandemError):
        ProxyConfig(upstream_port=1, delay_ms=-1)
    with pytest.raises(TandemError):
        ProxyConfig(upstream_port=1, rate_mbit=0)
    with pytest.raises(TandemError):
        ProxyConfig(upstream_port=1, outages=((1.0, 0.0),))
    assert parse_hostport("10.203.0.2:7401") == ("10.203.0.2", 7401)
    assert parse_outage("10:2.5") == (10.0, 2.5)
    with pytest.raises(TandemError):
        parse_hostport("7401")
    with pytest.raises(TandemError):
        parse_outage("soon")


# ---------------------------------------------------------------- real sockets


async def _with_proxy(coro_fn, **link):
    server = await probe.start_server()
    try:
        config = ProxyConfig(upstream_port=server.sockets[0].getsockname()[1], **link)
        async with DelayProxy(config) as proxy:
            return await coro_fn(proxy)
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("delay_ms", [50, 100])
def test_round_trip_is_twice_the_one_way_delay(delay_ms):
    async def go(proxy):
        return await probe.measure_rtt("127.0.0.1", proxy.port, count=7)

    samples = asyncio.run(_with_proxy(go, delay_ms=delay_ms))
    assert statistics.median(samples) == pytest.approx(2 * delay_ms / 1e3, rel=0.10)
    assert min(samples) >= 2 * delay_ms / 1e3 - 0.002


@pytest.mark.parametrize("delayed", ["down", "up"])
def test_one_delayed_direction_adds_the_delay_once_and_only_there(delayed):
    """`delayed="down"` (the DRAGON paper's netem on the server's NIC) delays upstream ->
    client only: a round trip gains the delay once and a byte going up arrives at once;
    "up" the other way round."""
    arrived: list[float] = []

    async def upstream(reader, writer):
        while data := await reader.read(1):
            arrived.append(time.monotonic())
            writer.write(data)
            await writer.drain()
        writer.close()

    async def go():
        server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        config = ProxyConfig(
            upstream_port=server.sockets[0].getsockname()[1], delay_ms=80, delayed=delayed
        )
        try:
            async with DelayProxy(config) as proxy:
                reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
                trips = []
                for _ in range(5):
                    sent = time.monotonic()
                    writer.write(b"x")
                    await writer.drain()
                    await reader.readexactly(1)
                    trips.append((arrived[-1] - sent, time.monotonic() - sent))
                writer.close()
                return trips
        finally:
            server.close()
            await server.wait_closed()

    trips = asyncio.run(go())
    up = statistics.median(u for u, _ in trips)
    rtt = statistics.median(r for _, r in trips)
    assert rtt == pytest.approx(0.080, abs=0.015)
    assert up < 0.015 if delayed == "down" else up == pytest.approx(0.080, abs=0.015)
    with pytest.raises(TandemError, match="delayed"):
        ProxyConfig(upstream_port=1, delayed="sideways")


def test_jitter_stays_within_bounds():
    async def go(proxy):
        return await probe.measure_rtt("127.0.0.1", proxy.port, count=15)

    samples = asyncio.run(_with_proxy(go, delay_ms=50, jitter_ms=20, seed=3))
    assert min(samples) >= 2 * 0.030 - 0.002
    assert max(samples) <= 2 * 0.070 + 0.030  # + scheduling slack on a busy machine
    assert statistics.pstdev(samples) > 0.005  # jitter is really applied
    assert statistics.median(samples) == pytest.approx(0.100, rel=0.15)


def test_rate_is_enforced_each_direction():
    nbytes = 3_000_000

    async def go(proxy):
        rtt = statistics.median(await probe.measure_rtt("127.0.0.1", proxy.port, count=3))
        upload_s = await probe.measure_upload("127.0.0.1", proxy.port, nbytes=nbytes)
        download_s = await probe.measure_download("127.0.0.1", proxy.port, nbytes=nbytes)
        return probe.rate_mbit(nbytes, upload_s, rtt), probe.rate_mbit(nbytes, download_s, rtt)

    upload_mbit, download_mbit = asyncio.run(_with_proxy(go, delay_ms=20, rate_mbit=30))
    assert upload_mbit == pytest.approx(30, rel=0.10)
    assert download_mbit == pytest.approx(30, rel=0.10)


def test_outage_holds_data_and_releases_it_afterwards():
    message = bytes(range(200)) * 5

    async def go(proxy):
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(probe.HEADER.pack(b"E", 0) + message)
        assert await reader.readexactly(len(message)) == message  # before the outage: fast
        assert loop.time() - proxy.started < 0.3
        await asyncio.sleep(proxy.started + 0.4 - loop.time())  # inside the outage
        writer.write(message)
        echoed = await reader.readexactly(len(message))
        arrived = loop.time() - proxy.started
        writer.close()
        await writer.wait_closed()
        return echoed, arrived

    echoed, arrived = asyncio.run(_with_proxy(go, delay_ms=5, outages=((0.3, 0.6),)))
    assert echoed == message  # held, not dropped
    assert 0.9 <= arrived < 1.0  # released when the outage ends (0.9 s) plus the return delay


def test_close_ends_open_connections_and_refused_upstream_closes_client():
    async def go():
        server = await probe.start_server()
        upstream_port = server.sockets[0].getsockname()[1]
        proxy = await DelayProxy(ProxyConfig(upstream_port=upstream_port, delay_ms=1)).start()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(probe.HEADER.pack(b"E", 0) + b"hi")
        assert await reader.readexactly(2) == b"hi"
        await proxy.close()
        assert await asyncio.wait_for(reader.read(), 2.0) == b""  # the proxy hung up
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        # Nothing listens on the upstream port any more: the proxy closes the client.
        async with DelayProxy(ProxyConfig(upstream_port=upstream_port)) as dead:
            reader, writer = await asyncio.open_connection("127.0.0.1", dead.port)
            assert await asyncio.wait_for(reader.read(), 2.0) == b""
            writer.close()
            await writer.wait_closed()

    asyncio.run(go())


def test_an_upstream_that_never_reads_holds_the_proxy_at_its_buffer_bound():
    """The client offers 64 MiB to an upstream that never reads: the proxy stops reading at
    max_buffer_bytes (+ one read), the rest waits in the kernel, and the client blocks."""
    limit, offered, chunk = 256 * 1024, 64 << 20, bytes(1 << 16)

    async def go():
        stop = asyncio.Event()

        async def never_read(reader, writer):
            await stop.wait()
            writer.close()

        server = await asyncio.start_server(never_read, "127.0.0.1", 0)
        upstream_port = server.sockets[0].getsockname()[1]
        config = ProxyConfig(upstream_port=upstream_port, max_buffer_bytes=limit)
        async with DelayProxy(config) as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)

            async def send():
                for _ in range(offered // len(chunk)):
                    writer.write(chunk)
                    await writer.drain()

            client = asyncio.create_task(send())
            try:
                async with asyncio.timeout(20):
                    while proxy.held_bytes < limit and not client.done():
                        await asyncio.sleep(0.01)
                await asyncio.sleep(0.3)
                held, blocked = proxy.held_bytes, not client.done()
            finally:  # the upstream goes before the proxy closes, or closing waits on it
                client.cancel()
                writer.close()
                stop.set()
        server.close()
        await server.wait_closed()
        return held, blocked

    held, blocked = asyncio.run(go())
    assert limit <= held <= limit + proxy_module.READ_BYTES
    assert blocked


def test_a_client_that_never_reads_holds_the_proxy_at_its_buffer_bound_the_other_way():
    """The same bound downstream: the upstream offers 16 MiB to a client that never reads;
    the proxy stops reading the upstream at max_buffer_bytes (+ one read) and the upstream
    blocks. Then the client reads it all, in order, and the connection ends cleanly."""
    limit, offered, chunk = 256 * 1024, 16 << 20, bytes(range(256)) * 256  # 64 KiB chunks

    async def go():
        blocked = asyncio.Event()

        async def flood(reader, writer):
            for _ in range(offered // len(chunk)):
                writer.write(chunk)
                try:
                    await asyncio.wait_for(writer.drain(), 0.5)
                except TimeoutError:
                    blocked.set()
                    await writer.drain()
            writer.close()

        server = await asyncio.start_server(flood, "127.0.0.1", 0)
        config = ProxyConfig(
            upstream_port=server.sockets[0].getsockname()[1], max_buffer_bytes=limit
        )
        async with DelayProxy(config) as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            async with asyncio.timeout(20):
                await blocked.wait()  # the upstream could not write on: the proxy stopped
            held = proxy.held_bytes
            received = 0
            async with asyncio.timeout(30):
                while data := await reader.read(1 << 20):
                    expected = np.arange(received, received + len(data)) % 256  # the pattern
                    assert np.array_equal(np.frombuffer(data, dtype=np.uint8), expected)
                    received += len(data)
            writer.close()
        server.close()
        await server.wait_closed()
        return held, received

    held, received = asyncio.run(go())
    assert limit <= held <= limit + proxy_module.READ_BYTES
    assert received == offered


def test_replies_on_the_wire_arrive_although_the_upstream_hung_up_on_later_writes():
    """The upstream answers and closes at once; the client keeps writing. Its later writes
    fail at the proxy (the upstream is gone) while the answer is still held by the delay:
    the answer must arrive all the same, then the connection ends (as on a real link)."""
    answer = bytes(range(256)) * 8

    async def go():
        async def answer_and_hang_up(reader, writer):
            await reader.read(1)
            writer.write(answer)
            await writer.drain()
            writer.transport.abort()  # unread client bytes are left: the kernel resets

        server = await asyncio.start_server(answer_and_hang_up, "127.0.0.1", 0)
        upstream_port = server.sockets[0].getsockname()[1]
        async with DelayProxy(ProxyConfig(upstream_port=upstream_port, delay_ms=100)) as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(b"?")
            for _ in range(12):  # reach the upstream after it hung up, before the answer is back
                await asyncio.sleep(0.01)
                writer.write(b"more")
            received = await asyncio.wait_for(reader.read(), 3.0)  # to EOF
            writer.close()
        server.close()
        await server.wait_closed()
        return received

    assert asyncio.run(go()) == answer
