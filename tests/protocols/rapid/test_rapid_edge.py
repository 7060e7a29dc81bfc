"""RAPID split over the transport: drafter on the device, target in the cloud."""

from __future__ import annotations

import asyncio

import pytest

from tandem.codecs import make_codec
from tandem.errors import TandemError
from tandem.protocols.rapid.config import RapidConfig
from tandem.protocols.rapid.edge import cloud_handler, cloud_session, device_generate
from tandem.protocols.rapid.engine import rapid
from tandem.protocols.rapid.prompts import drafter_prompt, target_prompt
from tandem.protocols.rapid.states import Prefilled
from tandem.transport import TransportConfig, connect, memory_pair, serve

CONTEXT = " ".join(f"key{i} maps to value{i * 3};" for i in range(50))
QUESTION = "What does key9 map to?"
RETRIEVED = "key9 maps to value27;"
TRANSPORT = TransportConfig(secret=b"test", ping_interval=None, dead_peer_timeout=None)


def arun(coro, timeout: float = 120.0):
    async def bounded():
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


def local_run(target_lm, drafter_lm, cfg, codec):
    return rapid(
        Prefilled(target_lm, target_prompt(target_lm.tokenizer, CONTEXT, QUESTION)),
        Prefilled(drafter_lm, drafter_prompt(drafter_lm.tokenizer, RETRIEVED, QUESTION)),
        cfg,
        codec=make_codec(codec[0], **codec[1]),
    )


@pytest.mark.parametrize("mode", ["exact", "paper"])
def test_split_run_equals_local_run(tiny_lm, tiny_lm_b, mode):
    cfg = RapidConfig(
        temperature=1.0, eta=10.0, mode=mode, gamma=3, max_new_tokens=20, stop_at_eos=False
    )
    codec = ("top-k", {"k": 32})

    async def main():
        device, cloud = memory_pair()
        serving = asyncio.create_task(cloud_session(cloud, tiny_lm, CONTEXT))
        result = await device_generate(device, tiny_lm_b, RETRIEVED, QUESTION, cfg, codec=codec)
        await device.close()
        await serving
        return result

    split = arun(main())
    local = local_run(tiny_lm, tiny_lm_b, cfg, codec)
    assert split.tokens == local.tokens
    assert split.accepted_per_round == local.accepted_per_round
    assert split.extra["uplink_bytes"] > 0 and split.extra["downlink_bytes"] > 0


def test_split_run_over_tcp_loopback_greedy_equals_local(tiny_lm):
    cfg = RapidConfig(temperature=0.0, eta=0.0, gamma=4, max_new_tokens=16, stop_at_eos=False)
    codec = ("top-k", {"k": 8})

    async def main():
        transport = TransportConfig(secret=b"test", ping_interval=None, dead_peer_timeout=None)
        server = await serve(cloud_handler(tiny_lm, CONTEXT), "127.0.0.1", 0, config=transport)
        channel = await connect("127.0.0.1", server.port, config=transport)
        try:
            return await device_generate(channel, tiny_lm, RETRIEVED, QUESTION, cfg, codec=codec)
        finally:
            await channel.close()
            await server.close()

    split = arun(main())
    assert split.tokens == local_run(tiny_lm, tiny_lm, cfg, codec).tokens


# RAPID served by the one cloud server beside every other mode (`tandem cloud serve
# --long-context FILE`).


async def _through_cloud_server(cloud, lm, cfg, codec, records=None):
    """One RAPID generation from a device through `cloud`; with `records` (the server's
    on_record list), also wait for the session's end record before shutting down."""
    server = await cloud.start("127.0.0.1", 0, transport=TRANSPORT)
    channel = await connect("127.0.0.1", server.port, config=TRANSPORT)
    try:
        return await device_generate(channel, lm, RETRIEVED, QUESTION, cfg, codec=codec)
    finally:
        await channel.close()
        for _ in range(500 if records is not None else 0):  # the end follows the device's Bye
            if any(r["event"] == "session_end" for r in records):
                break
            await asyncio.sleep(0.01)
        await server.close()
        await cloud.close()


def test_the_one_cloud_server_serves_every_mode_rapid_included():
    from tandem.serve.cloud import MODES

    assert set(MODES) == {"spec", "ar", "dragon", "private-spec", "rapid"}


@pytest.mark.parametrize("mode", ["exact", "paper"])
def test_rapid_through_the_multi_mode_cloud_server_equals_the_local_engine(
    tiny_lm, tiny_lm_b, mode
):
    from tandem.serve.cloud import CloudServer, cloud_resources

    cfg = RapidConfig(
        temperature=1.0, eta=10.0, mode=mode, gamma=3, max_new_tokens=16, stop_at_eos=False
    )
    codec = ("top-k", {"k": 32})
    records = []
    resources = cloud_resources(tiny_lm, batching=False)
    resources.extra["long_context"] = CONTEXT
    cloud = CloudServer(resources, on_record=records.append)  # every mode

    split = arun(_through_cloud_server(cloud, tiny_lm_b, cfg, codec, records))
    assert split.tokens == local_run(tiny_lm, tiny_lm_b, cfg, codec).tokens
    end = next(r for r in records if r["event"] == "session_end")
    assert (end["mode"], end["reason"]) == ("rapid", "completed")
    stats = resources.reports[-1][1]
    assert stats["generations"] == 1
    assert end["accepted"] == stats["drafts_accepted"] == sum(split.accepted_per_round)
    assert end["drafts"] == stats["drafts_verified"] >= stats["drafts_accepted"]
    assert stats["tokens"] >= len(split.tokens)


def test_a_cloud_server_without_a_long_context_refuses_rapid_by_name(tiny_lm):
    from tandem.serve.cloud import CloudServer, cloud_resources

    cfg = RapidConfig(temperature=0.0, eta=0.0, gamma=2, max_new_tokens=4, stop_at_eos=False)
    cloud = CloudServer(cloud_resources(tiny_lm, batching=False), modes=["spec", "rapid"])
    with pytest.raises(TandemError, match=r"no long context \(--long-context\)"):
        arun(_through_cloud_server(cloud, tiny_lm, cfg, ("top-k", {"k": 8})))
