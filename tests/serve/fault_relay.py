"""A TCP relay in front of a cloud that can fail like a killed cloud process.

`cut()` aborts every relayed connection at once (both sockets reset, no Bye, no goodbye
frame: what the device sees when the cloud's process is SIGKILLed or its machine vanishes);
`down` makes the relay refuse new connections until `up()`. Real sockets, real bytes: the
device and the cloud run their normal code on either side.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class FaultRelay:
    def __init__(self, target_port: int, *, host: str = "127.0.0.1") -> None:
        self.host, self.target_port = host, target_port
        self.down = False
        self.cuts = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = self._call(asyncio.start_server(self._on_client, host, 0))
        self.port = self.server.sockets[0].getsockname()[1]

    def _call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _on_client(self, reader, writer) -> None:
        if self.down:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pump(src, dst) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self, *, stay_down: bool = True) -> None:
        """Reset every relayed connection now (callable from any thread)."""
        self.down = stay_down
        self.cuts += 1

        def abort() -> None:
            for writer in list(self._writers):
                writer.transport.abort()

        self.loop.call_soon_threadsafe(abort)

    def up(self) -> None:
        self.down = False

    async def _close_server(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    def close(self) -> None:
        self.cut()
        # asyncio.Server is not thread-safe: closing it from this thread raced the loop
        # thread's transports detaching (both ran Server._wakeup; CI saw the TypeError).
        with contextlib.suppress(Exception):
            self._call(self._close_server(), timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
