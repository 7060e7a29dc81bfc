"""A DRAGON side's sending (`sideio.SideIO._send`): a message decided while nothing waits is
written at once, in order with what is queued, and the queue (which drains the channel's
buffer) takes over past `UNDRAINED_BYTES` or while anything waits in it."""

from __future__ import annotations

import asyncio

from tandem.protocols.dragon import wire
from tandem.protocols.dragon.profiler import Timeline
from tandem.protocols.dragon.sideio import UNDRAINED_BYTES, SideIO
from tandem.transport import TransportError

FRAME = 40_000  # bytes a fake write reports: two fit under the bound, the third does not


class FakeChannel:
    def __init__(self, *, fail: bool = False) -> None:
        self.written: list[tuple[str, int]] = []  # (how, seq)
        self.fail = fail

    def send_nowait(self, msg) -> int:
        if self.fail:
            raise TransportError("connection lost: broken pipe")
        self.written.append(("at once", msg.seq))
        return FRAME

    async def send(self, msg) -> None:
        self.written.append(("queued", msg.seq))
        await asyncio.sleep(0)  # the drain


class QueueOnlyChannel:
    def __init__(self) -> None:
        self.written: list[tuple[str, int]] = []

    async def send(self, msg) -> None:
        self.written.append(("queued", msg.seq))


class Side(SideIO):
    def __init__(self, channel) -> None:
        self.channel, self.degraded, self._seq = channel, False, 0
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.timeline = Timeline()
        self.lost: list[str] = []

    def _link_lost(self, reason: str) -> None:
        self.lost.append(reason)
        self.degraded = True

    def target(self, position: int) -> None:
        self._send(wire.target_message(0, position, 7, {"device": True, "cloud": True}))

    async def flush(self) -> None:
        loop = asyncio.create_task(self._send_loop())
        await self.outbox.join()
        loop.cancel()


def test_written_at_once_until_the_bound_then_queued_in_order():
    async def main():
        side = Side(FakeChannel())
        side.target(0)
        side.target(1)  # 40 KB written since the last drain: still under the bound
        assert side._undrained == 2 * FRAME >= UNDRAINED_BYTES
        side.target(2)  # over it: the queue, whose send drains
        side.target(3)  # something waits in the queue: behind it
        assert side.outbox.qsize() == 2
        await side.flush()
        assert side._undrained == 0
        side.target(4)  # drained and nothing queued: at once again
        return side

    side = asyncio.run(main())
    assert side.channel.written == [
        ("at once", 1), ("at once", 2), ("queued", 3), ("queued", 4), ("at once", 5)
    ]  # fmt: skip
    assert not side.lost


def test_a_channel_without_send_nowait_gets_everything_through_the_queue():
    async def main():
        side = Side(QueueOnlyChannel())
        for position in range(3):
            side.target(position)
        await side.flush()
        return side

    assert asyncio.run(main()).channel.written == [("queued", 1), ("queued", 2), ("queued", 3)]


def test_a_failed_write_is_a_lost_link_and_nothing_more_is_sent():
    async def main():
        side = Side(FakeChannel(fail=True))
        side.target(0)
        side.target(1)
        return side

    side = asyncio.run(main())
    assert side.lost == ["send failed: connection lost: broken pipe"]
    assert side.outbox.empty() and side.channel.written == []
