"""A device that vanishes mid-generation: by a reset connection, or by going silent with the
socket left open (caught by the cloud's dead-peer timeout). The cloud releases the session
(its slot, its KV state, its batcher entries), counts it as ended by `peer_lost` in its
metrics, and keeps serving."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tandem.protocols.spec import SpecConfig
from tandem.protocols.spec.device import run_device
from tandem.transport import TransportConfig, connect

from .cloud_helpers import SECRET, LoopbackCloud, generate, metric, session_config

HEARTBEAT = {"ping_interval": 0.1, "dead_peer_timeout": 1.0}  # the cloud's


async def until(condition, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("how", ["reset", "silent"])
def test_a_device_that_vanishes_mid_generation_is_released(tiny_lm, tiny_lm_b, how):
    records = []

    async def main():
        async with LoopbackCloud(tiny_lm_b, on_record=records.append, **HEARTBEAT) as cloud:
            transport = TransportConfig.for_model(
                tiny_lm, role="device", secret=SECRET, ping_interval=None
            )
            channel = await connect("127.0.0.1", cloud.port, config=transport)
            socket = channel._stream.writer.transport
            tokens = []
            vanished = asyncio.Event()

            def on_token(token):  # the 4th token: the device disappears, no Bye
                tokens.append(token)
                if len(tokens) == 4:
                    if how == "reset":
                        socket.abort()  # RST
                    else:
                        socket.pause_reading()  # alive socket, nothing read or sent
                    vanished.set()

            prompt = list(b"def add(a, b):")
            config = SpecConfig(max_new_tokens=400, stop_at_eos=False)
            device = asyncio.create_task(
                run_device(channel, tiny_lm, prompt, config, on_token=on_token, close=False)
            )
            await until(lambda: vanished.is_set() or device.done())
            assert vanished.is_set(), "the generation ended before the device vanished"
            if how == "silent":
                for task in channel._tasks:  # the device's channel stops too (no Pongs)
                    task.cancel()
            device.cancel()
            await asyncio.gather(device, return_exceptions=True)

            batcher = cloud.resources.batcher
            await until(lambda: not cloud.cloud.open)
            await until(lambda: batcher.queued_tokens == 0 and batcher.attached == 0)
            gc.collect()
            text, live = cloud.cloud.render_metrics(), len(cloud.resources.live)
            served = await generate(tiny_lm, cloud.port, *session_config(0))  # still serving
            socket.abort()
            return text, live, served

    text, live, served = asyncio.run(main())
    assert metric(text, "tandem_cloud_sessions_open") == 0
    assert metric(text, 'tandem_cloud_sessions_ended_total{reason="peer_lost"}') == 1
    assert live == 0 and metric(text, "tandem_cloud_session_states") == 0  # KV state freed
    assert metric(text, "tandem_cloud_queued_tokens") == 0
    ends = [r for r in records if r["event"] == "session_end"]
    assert [r["reason"] for r in ends] == ["peer_lost", "completed"]
    expected = "ChannelClosed" if how == "reset" else "PeerDead"
    assert ends[0]["error"].startswith(expected), ends[0]["error"]
    assert len(served.tokens) == 16
