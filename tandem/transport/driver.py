"""The asyncio driver: TCP (optionally TLS) client and server that open handshaken sessions.

Owns `connect()`, `serve()`/`Server` and `open_session()`, which pumps a sans-I/O
handshake machine (handshake.py) over any ByteStream and returns a started
FramedChannel. Nothing here parses bytes or decides protocol questions; it only moves
bytes between sockets and the sans-I/O layers.

    connect(host, port, config)           serve(handler, host, port, config)
      TCP (+TLS) connect                    accept -> per connection, in its own task:
      open_session(side="client")             open_session(side="server")
      -> Channel                              handler(channel); then channel.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from tandem.transport.channel import ByteStream, FramedChannel, TransportConfig
from tandem.transport.emulator import EmulatedStream
from tandem.transport.errors import ChannelClosed, ConnectError, HandshakeError, TransportError
from tandem.transport.handshake import ClientHandshake, ServerHandshake
from tandem.transport.messages import Message
from tandem.transport.tlsutil import client_context, server_context
from tandem.transport.wire import CONNECTION_CLOSED, FrameParser, encode_message

log = logging.getLogger(__name__)
READ_SIZE = 1 << 16

Handler = Callable[[FramedChannel], Awaitable[None]]


class TcpStream:
    """A ByteStream over an asyncio StreamReader/StreamWriter pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def write(self, data: bytes) -> None:
        if self.writer.is_closing():
            raise ConnectionResetError("write on a closed TCP stream")
        self.writer.write(data)

    async def drain(self) -> None:
        await self.writer.drain()

    async def read(self) -> bytes:
        return await self.reader.read(READ_SIZE)

    def close(self) -> None:
        self.writer.close()

    @property
    def peername(self) -> object:
        return self.writer.get_extra_info("peername")


def _wrap(stream: ByteStream, config: TransportConfig) -> ByteStream:
    return EmulatedStream(stream, config.link) if config.link else stream


async def _pump_handshake(
    stream: ByteStream, machine: ClientHandshake | ServerHandshake, parser: FrameParser
) -> None:
    def send(messages: list[Message]) -> None:
        for msg in messages:
            stream.write(encode_message(msg))

    send(machine.start())
    await stream.drain()
    while not machine.done and machine.error is None:
        event = parser.next_event()
        if event is None:
            parser.receive_data(await stream.read())
            continue
        if event is CONNECTION_CLOSED:
            raise HandshakeError("the peer closed the connection during the handshake")
        send(machine.receive(event))
        with contextlib.suppress(OSError):
            await stream.drain()
    if machine.error is not None:
        raise type(machine.error)(*machine.error.args)


async def open_session(stream: ByteStream, *, config: TransportConfig, side: str) -> FramedChannel:
    """Run the handshake as `side` ("client" or "server") over `stream`; on success return
    a started channel, else close the stream and raise a HandshakeError (or subclass)."""
    machine_cls = {"client": ClientHandshake, "server": ServerHandshake}[side]
    machine = machine_cls(hello=config.hello(), secret=config.secret)
    parser = FrameParser(limits=config.limits)
    try:
        async with asyncio.timeout(config.handshake_timeout):
            await _pump_handshake(stream, machine, parser)
    except TimeoutError:
        stream.close()
        raise HandshakeError(
            f"handshake timed out after {config.handshake_timeout} s ({machine.state})"
        ) from None
    except OSError as exc:
        stream.close()
        raise ConnectError(f"connection lost during the handshake: {exc}") from None
    except TransportError:
        await asyncio.sleep(0)  # let a queued Refuse reach the socket before closing
        stream.close()
        raise
    return FramedChannel(stream, config=config, session=machine.session, parser=parser).start()


async def connect(host: str, port: int, *, config: TransportConfig | None = None) -> FramedChannel:
    """Connect over TCP (TLS if `config.tls`), run the client handshake, return the channel."""
    config = config or TransportConfig()
    ssl_context = client_context(config.tls) if config.tls else None
    hostname = (config.tls.server_hostname or host) if config.tls else None
    try:
        async with asyncio.timeout(config.connect_timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=ssl_context, server_hostname=hostname, limit=READ_SIZE
            )
    except TimeoutError:
        raise ConnectError(f"connecting to {host}:{port} timed out") from None
    except OSError as exc:  # includes ssl.SSLError
        raise ConnectError(f"cannot connect to {host}:{port}: {exc}") from None
    return await open_session(
        _wrap(TcpStream(reader, writer), config), config=config, side="client"
    )


class Server:
    """A listening tandem server; each accepted connection becomes one session."""

    def __init__(self, handler: Handler, config: TransportConfig) -> None:
        self.handler = handler
        self.config = config
        self.sessions: set[FramedChannel] = set()
        self.refused: list[TransportError] = []  # handshakes that failed, newest last
        self._tasks: set[asyncio.Task] = set()
        self._handshaking: set[ByteStream] = set()
        self._closing = False
        self._server: asyncio.base_events.Server | None = None

    @property
    def host(self) -> str:
        return self._server.sockets[0].getsockname()[0]

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    async def _start(self, host: str, port: int) -> None:
        ssl_context = server_context(self.config.tls) if self.config.tls else None
        self._server = await asyncio.start_server(
            self._on_connection, host, port, ssl=ssl_context, limit=READ_SIZE
        )

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        task = asyncio.current_task()
        self._tasks.add(task)
        stream = _wrap(TcpStream(reader, writer), self.config)
        self._handshaking.add(stream)
        try:
            try:
                channel = await open_session(stream, config=self.config, side="server")
            except TransportError as exc:
                if not self._closing:
                    self.refused.append(exc)
                    del self.refused[:-100]
                    log.warning("session refused (%s): %s", writer.get_extra_info("peername"), exc)
                return
            finally:
                self._handshaking.discard(stream)
            self.sessions.add(channel)
            try:
                await self.handler(channel)
            except ChannelClosed:
                pass
            except Exception:
                log.exception("session %s: handler failed", channel.session.session_id)
            finally:
                self.sessions.discard(channel)
                await channel.close()
        finally:
            self._tasks.discard(task)

    async def close(self, *, grace: float = 2.0) -> None:
        """Stop listening, close every session (Bye), and wait for the handlers to end;
        handlers still running after `grace` seconds are cancelled."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for stream in list(self._handshaking):
            stream.close()
        await asyncio.gather(
            *(channel.close("server closing") for channel in list(self.sessions)),
            return_exceptions=True,
        )
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def serve_forever(self) -> None:
        await self._server.serve_forever()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def serve(
    handler: Handler, host: str, port: int, *, config: TransportConfig | None = None
) -> Server:
    """Listen on host:port (port 0 picks a free one: read `server.port`) and run
    `handler(channel)` for every session that completes the handshake. Only the
    project's own addresses should be bound (tests: 127.0.0.1)."""
    server = Server(handler, config or TransportConfig())
    await server._start(host, port)
    return server
