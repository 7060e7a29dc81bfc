"""Faults and refusals at the cloud: a 2 s link outage with heavy jitter (the TCP delay proxy
on loopback) leaves the output exactly as without faults; sessions over a limit get a one-line
refusal naming the limit, and the cloud keeps serving the others."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from tandem.errors import TandemError
from tandem.protocols.spec import SpecConfig, wire
from tandem.serve.admission import CloudLimits, admit
from tandem.testbed.proxy import DelayProxy, ProxyConfig
from tandem.transport import Ready, TransportConfig, connect

from .cloud_helpers import SECRET, LoopbackCloud, generate, metric, session_config

# Heartbeats tight enough to matter, loose enough for a 2 s outage (+ delay and jitter).
HEARTBEAT = {"ping_interval": 0.5, "dead_peer_timeout": 4.0}


def test_outage_and_jitter_do_not_change_the_output(tiny_lm, tiny_lm_b):
    sessions = [session_config(i, max_new_tokens=48) for i in (0, 1, 6)]  # greedy sync, ...

    async def main():
        async with LoopbackCloud(tiny_lm_b, **HEARTBEAT) as cloud:
            clean = [await generate(tiny_lm, cloud.port, p, c) for p, c in sessions]
            link = ProxyConfig(
                upstream_port=cloud.port, delay_ms=15.0, jitter_ms=15.0, outages=((0.4, 2.0),)
            )
            async with DelayProxy(link) as proxy:
                faulty = await asyncio.gather(
                    *(generate(tiny_lm, proxy.port, p, c, **HEARTBEAT) for p, c in sessions)
                )
            return clean, faulty

    clean, faulty = asyncio.run(main())
    assert [r.tokens for r in faulty] == [r.tokens for r in clean]
    assert all(len(r.tokens) == 48 for r in faulty)
    for report in faulty:  # the outage really hit the sessions: a >= 1.5 s silence in each
        times = [0.0, *report.token_times]
        assert max(b - a for a, b in zip(times, times[1:], strict=False)) >= 1.5


async def open_idle_session(lm, port: int):
    """A session that has started (admitted, prefilled) and then waits: holds a slot."""
    channel = await connect(
        "127.0.0.1", port, config=TransportConfig.for_model(lm, role="device", secret=SECRET)
    )
    start = wire.start_message("spec", SpecConfig(max_new_tokens=8).to_json(), (1, 2, 3))
    await channel.send(start)
    assert isinstance(await channel.recv(), Ready)
    return channel


def test_over_max_sessions_is_refused_in_one_line_and_the_cloud_keeps_serving(tiny_lm, tiny_lm_b):
    records = []

    async def main():
        limits = CloudLimits(max_sessions=2)
        async with LoopbackCloud(tiny_lm_b, limits=limits, on_record=records.append) as cloud:
            idle = [await open_idle_session(tiny_lm, cloud.port) for _ in range(2)]
            with pytest.raises(TandemError) as refused:
                await generate(tiny_lm, cloud.port, *session_config(0))
            assert len(cloud.resources.live) == 2
            for channel in idle:
                await channel.close()
            while cloud.cloud.open:  # the cloud notices the two leave
                await asyncio.sleep(0.01)
            gc.collect()
            assert len(cloud.resources.live) == 0  # their sessions (and KV states) are freed
            served = await generate(tiny_lm, cloud.port, *session_config(0))
            return refused.value, served, cloud.cloud.render_metrics()

    error, served, text = asyncio.run(main())
    assert str(error) == "cloud error: cloud full: 2 sessions (max_sessions 2)"
    assert len(served.tokens) == 16
    assert metric(text, 'tandem_cloud_refusals_total{reason="max_sessions"}') == 1
    refusals = [r for r in records if r["event"] == "session_refused"]
    assert [r["refusal"] for r in refusals] == ["max_sessions"]


def test_too_long_a_context_is_refused(tiny_lm, tiny_lm_b):
    async def main():
        async with LoopbackCloud(tiny_lm_b, limits=CloudLimits(max_context=32)) as cloud:
            prompt, config = session_config(0, max_new_tokens=30)
            with pytest.raises(TandemError) as refused:
                await generate(tiny_lm, cloud.port, prompt, config)
            return refused.value, len(prompt) + 30

    error, context = asyncio.run(main())
    assert str(error) == (
        f"cloud error: context too long: {context} tokens (prompt + new) > max_context 32"
    )


def test_a_busy_batcher_refuses_new_sessions(tiny_lm, tiny_lm_b):
    """Verification tokens stuck in the batcher (the model is held) exceed max_queued_tokens."""

    async def main():
        async with LoopbackCloud(tiny_lm_b, limits=CloudLimits(max_queued_tokens=3)) as cloud:
            batcher = cloud.resources.batcher
            state = tiny_lm_b.prefill([1, 2, 3])
            with tiny_lm_b._lock:  # the batcher's forward pass waits for the model
                waiting = threading.Thread(target=batcher.decode, args=(state, [4, 5, 6, 7]))
                waiting.start()
                while batcher.queued_tokens < 4:
                    await asyncio.sleep(0.005)
                with pytest.raises(TandemError) as refused:
                    await generate(tiny_lm, cloud.port, *session_config(0))
            waiting.join()
            served = await generate(tiny_lm, cloud.port, *session_config(0))
            return refused.value, served, state

    error, served, state = asyncio.run(main())
    assert (
        str(error) == "cloud error: cloud busy: 4 verification tokens queued (max_queued_tokens 3)"
    )
    assert len(served.tokens) == 16 and state.seq_len == 7


def test_admit_checks_each_limit():
    limits = CloudLimits(max_sessions=4, max_context=100, max_queued_tokens=10)
    assert admit(limits, open_sessions=3, queued_tokens=10, context=100) is None
    assert admit(limits, open_sessions=4, queued_tokens=0, context=1).reason == "max_sessions"
    assert admit(limits, open_sessions=0, queued_tokens=0, context=101).reason == "max_context"
    assert admit(limits, open_sessions=0, queued_tokens=11, context=1).reason == "max_queued_tokens"
    with pytest.raises(ValueError):
        CloudLimits(max_sessions=0)
