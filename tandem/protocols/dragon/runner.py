"""Entry points: run the device side, serve the cloud side, or both in one process.

- `run_device(channel, ...)`: send the start message, run the device side, close; returns
  the device's `SideReport` (the answer and every measurement).
- `serve_cloud(channel, ...)`: a cloud session handler: read the start message, run the
  cloud side until the device is done or gone. Plug it into `tandem.transport.serve`
  (`start_cloud`) or into a server that dispatches several modes (pass `first`).
- `run_pair(...)`: both sides in this process over `memory_pair` (optionally an emulated
  link): what tests and benchmarks use. `connect_device(...)`: TCP client.
"""

from __future__ import annotations

import contextlib

from tandem.errors import TandemError
from tandem.protocols.decoding import OnToken, after_tokens
from tandem.protocols.dragon import wire
from tandem.protocols.dragon.config import CLOUD, DEVICE, DragonConfig
from tandem.protocols.dragon.knowledge import Knowledge
from tandem.protocols.dragon.profiler import LatencyModel
from tandem.protocols.dragon.report import SideReport
from tandem.protocols.dragon.session import DragonSide
from tandem.protocols.pair import run_in_process
from tandem.transport import (
    ChannelClosed,
    LinkConfig,
    TransportConfig,
    TransportError,
    connect,
    control,
    serve,
)


async def run_device(
    channel,
    *,
    lm,
    knowledge: Knowledge,
    question: str,
    config: DragonConfig,
    profile: LatencyModel | None = None,
    on_token: OnToken | None = None,
    close: bool = True,
) -> SideReport:
    """The device side of one generation over an open channel."""
    side = DragonSide(
        role=DEVICE,
        channel=channel,
        config=config,
        lm=lm,
        knowledge=knowledge,
        question=question,
        profile=profile,
        on_token=on_token,
    )
    try:
        return await side.run()
    finally:
        if close:
            with contextlib.suppress(TransportError):
                await channel.close("dragon done")


async def serve_cloud(
    channel,
    *,
    lm,
    knowledge: Knowledge,
    profile: LatencyModel | None = None,
    first=None,
) -> SideReport | None:
    """The cloud side of one session; returns None if the peer left before starting."""
    try:
        msg = first if first is not None else await channel.recv()
    except ChannelClosed:
        return None
    if control.start_mode(msg) != wire.MODE:
        await channel.send(wire.error_message("expected a dragon start message"))
        return None
    try:
        body = control.body(msg)
        config = DragonConfig.from_json(body["config"])
        question = str(body["question"])
    except (KeyError, TypeError, ValueError, TandemError) as exc:
        await channel.send(wire.error_message(f"bad start message: {exc}"))
        return None
    side = DragonSide(
        role=CLOUD,
        channel=channel,
        config=config,
        lm=lm,
        knowledge=knowledge,
        question=question,
        profile=profile,
        peer_profile=LatencyModel.from_list(body.get("profile")),
    )
    return await side.run()


async def start_cloud(
    host: str,
    port: int,
    *,
    lm,
    knowledge: Knowledge,
    transport: TransportConfig,
    profile: LatencyModel | None = None,
    reports: list | None = None,
):
    """A listening cloud (`Server`): one DRAGON session per connection."""

    async def handler(channel) -> None:
        report = await serve_cloud(channel, lm=lm, knowledge=knowledge, profile=profile)
        if reports is not None and report is not None:
            reports.append(report)

    return await serve(handler, host, port, config=transport)


async def connect_device(
    host: str,
    port: int,
    *,
    transport: TransportConfig,
    lm,
    knowledge: Knowledge,
    question: str,
    config: DragonConfig,
    profile: LatencyModel | None = None,
    on_token: OnToken | None = None,
) -> SideReport:
    """Connect to a cloud over TCP and run the device side."""
    channel = await connect(host, port, config=transport)
    return await run_device(
        channel,
        lm=lm,
        knowledge=knowledge,
        question=question,
        config=config,
        profile=profile,
        on_token=on_token,
    )


async def run_pair(
    *,
    device_lm,
    cloud_lm,
    device_knowledge: Knowledge,
    cloud_knowledge: Knowledge,
    question: str,
    config: DragonConfig,
    link: LinkConfig | None = None,
    device_profile: LatencyModel | None = None,
    cloud_profile: LatencyModel | None = None,
    on_token: OnToken | None = None,
    kill_cloud_after: int | None = None,
) -> tuple[SideReport, SideReport | None]:
    """Device and cloud in this process, joined in memory. `kill_cloud_after=n` drops the
    cloud abruptly (no Bye) once the device knows n target tokens: a crash mid-generation."""

    def device(channel, kill_cloud):
        return run_device(
            channel,
            lm=device_lm,
            knowledge=device_knowledge,
            question=question,
            config=config,
            profile=device_profile,
            on_token=after_tokens(on_token, kill_cloud_after, kill_cloud),
        )

    def cloud(channel):
        return serve_cloud(channel, lm=cloud_lm, knowledge=cloud_knowledge, profile=cloud_profile)

    return await run_in_process(device, cloud, link=link)
