"""The in-process link emulator: the delivery-time model (pure) and measured delay, rate,
jitter and loss through emulated memory channels."""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np
import pytest

from tandem.transport import DraftTokens, Interrupt, LinkConfig, LinkModel, memory_pair

from .test_channel import arun


def test_model_delay_and_serialization():
    model = LinkModel(LinkConfig(delay_ms=50, rate_mbit=8))  # 8 Mbit/s = 1 byte/us
    assert model.arrival(0.0, 1000) == pytest.approx(0.001 + 0.050)
    # a second write at the same instant queues behind the first (FIFO link)
    assert model.arrival(0.0, 1000) == pytest.approx(0.002 + 0.050)
    # after the link went idle, no queueing
    assert model.arrival(10.0, 0) == pytest.approx(10.050)


def test_model_jitter_never_reorders_and_is_reproducible():
    link = LinkConfig(delay_ms=20, jitter_ms=15, seed=7)
    model = LinkModel(link)
    arrivals = [model.arrival(i * 0.001, 100) for i in range(2000)]
    assert all(b >= a for a, b in zip(arrivals, arrivals[1:], strict=False))
    delays = [t - i * 0.001 for i, t in enumerate(arrivals)]
    assert min(delays) >= 0.005 - 1e-9 and max(delays) <= 0.035 + 0.015
    assert statistics.pstdev(delays) > 0.003  # jitter is really there
    again = LinkModel(link)
    assert arrivals == [again.arrival(i * 0.001, 100) for i in range(2000)]  # same seed


def test_model_loss_shows_as_retransmission_delay():
    model = LinkModel(LinkConfig(delay_ms=10, loss=0.1, loss_rto_ms=200, seed=1))
    delays = [model.arrival(i * 1.0, 500) - i * 1.0 for i in range(5000)]  # idle link
    hit = sum(d > 0.1 for d in delays) / len(delays)
    assert hit == pytest.approx(0.1, abs=0.02)
    assert {round(d, 6) for d in delays} == {0.01, 0.21}
    # a big write spans many segments: almost surely hit at least once
    big = LinkModel(LinkConfig(loss=0.1, seed=2))
    assert sum(big.arrival(i * 10.0, 100 * 1448) - i * 10.0 > 0.1 for i in range(100)) > 95


def test_link_config_validation():
    for bad in (dict(delay_ms=-1), dict(rate_mbit=0), dict(loss=1.0), dict(mss=0)):
        with pytest.raises(ValueError):
            LinkConfig(**bad)


@pytest.mark.parametrize("delay_ms", [0, 20, 60])
def test_emulated_rtt_matches_configured_delay(delay_ms):
    """RTT of a Ping = uplink + downlink delay (split evenly here) within 10% + 5 ms."""

    async def main():
        a, b = memory_pair(
            link=LinkConfig(delay_ms=delay_ms / 2), downlink=LinkConfig(delay_ms=delay_ms / 2)
        )
        samples = [await a.ping(timeout=5) for _ in range(8)]
        await a.close()
        await b.close()
        return samples

    samples = arun(main())
    expected = delay_ms / 1000
    assert statistics.median(samples) == pytest.approx(expected, rel=0.10, abs=0.005)
    assert min(samples) >= expected - 0.001


def test_asymmetric_links():
    async def main():
        a, b = memory_pair(link=LinkConfig(delay_ms=40), downlink=LinkConfig(delay_ms=5))
        started = time.monotonic()
        await a.send(Interrupt(seq=1, position=0))
        await b.recv()
        uplink = time.monotonic() - started
        started = time.monotonic()
        await b.send(Interrupt(seq=2, position=0))
        await a.recv()
        downlink = time.monotonic() - started
        await a.close()
        await b.close()
        return uplink, downlink

    uplink, downlink = arun(main())
    assert uplink == pytest.approx(0.040, abs=0.015)
    assert downlink == pytest.approx(0.005, abs=0.015)


def test_emulated_rate_within_ten_percent():
    payload = np.zeros(25_000, dtype=np.float32)  # ~100 kB per message
    count = 5

    async def main():
        a, b = memory_pair(link=LinkConfig(rate_mbit=8.0))  # 1 MB/s
        started = time.monotonic()
        for i in range(count):
            await a.send(DraftTokens(seq=i, position=0, tokens=(), arrays={"x": payload}))
        for _ in range(count):
            await b.recv()
        elapsed = time.monotonic() - started
        await a.close()
        await b.close()
        return a.bytes_sent, elapsed

    sent, elapsed = arun(main())
    rate_mbit = sent * 8 / elapsed / 1e6
    assert rate_mbit == pytest.approx(8.0, rel=0.10)


def test_jitter_keeps_order_through_channels():
    async def main():
        a, b = memory_pair(link=LinkConfig(delay_ms=10, jitter_ms=8, seed=3))
        for i in range(50):
            await a.send(Interrupt(seq=i, position=i))
            await asyncio.sleep(0.001)
        got = [(await b.recv()).seq for _ in range(50)]
        await a.close()
        await b.close()
        return got

    assert arun(main()) == list(range(50))
