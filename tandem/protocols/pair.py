"""Both halves of one session in this process, joined by an in-memory channel pair.

Every mode has a device half and a cloud half written against `tandem.transport.Channel`;
tests, demos and the benchmarks' in-process runs join them with `memory_pair()` (optionally
an emulated link). `run_in_process` is the one place that does it: it starts the cloud half,
runs the device half, and returns both results; a cloud half that fails while the device is
still running re-raises its error (a crashed cloud would otherwise leave the device waiting),
and one that was cancelled (killed on purpose, see `kill_cloud`) gives None.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tandem.transport import Channel, LinkConfig, memory_pair

D = TypeVar("D")
C = TypeVar("C")

KillCloud = Callable[[], None]


async def run_in_process(
    device: Callable[[Channel, KillCloud], Awaitable[D]],
    cloud: Callable[[Channel], Awaitable[C]],
    *,
    link: LinkConfig | None = None,
    cloud_wait_s: float = 30.0,
) -> tuple[D, C | None]:
    """(device result, cloud result) of one session. `device(channel, kill_cloud)`:
    `kill_cloud()` drops the cloud abruptly (its task cancelled, its stream closed without a
    Bye), as a crashed process would; `cloud_wait_s`: how long the cloud may take to finish
    after the device has."""
    device_channel, cloud_channel = memory_pair(link=link)
    cloud_task = asyncio.create_task(cloud(cloud_channel))

    def kill_cloud() -> None:
        cloud_task.cancel()
        cloud_channel._stream.close()  # the socket dies with the process: EOF, no Bye

    device_task = asyncio.create_task(device(device_channel, kill_cloud))
    try:
        await asyncio.wait({device_task, cloud_task}, return_when=asyncio.FIRST_COMPLETED)
        if (
            cloud_task.done()
            and not device_task.done()
            and not cloud_task.cancelled()
            and cloud_task.exception() is not None
        ):
            raise cloud_task.exception()
        result = await device_task
        try:
            peer = await asyncio.wait_for(cloud_task, cloud_wait_s)
        except asyncio.CancelledError:
            if not cloud_task.cancelled():
                raise  # this coroutine itself was cancelled
            peer = None
        return result, peer
    finally:
        for task in (device_task, cloud_task):
            task.cancel()
        await asyncio.gather(device_task, cloud_task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await cloud_channel.close()
