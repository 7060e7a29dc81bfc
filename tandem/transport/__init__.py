"""tandem.transport: how the device and the cloud talk (frames, handshake, channels).

Layers, bottom up (each usable without the ones above it)::

    messages.py   frozen dataclasses, one per message kind (Hello, Start, DraftTokens, ...)
    control.py    session control: Start/Ready/End/Stats bodies, protocols' data frames
    wire.py       sans-I/O framing: encode_message(msg) -> bytes; FrameParser fed bytes
    handshake.py  sans-I/O handshake state machines (version, HMAC auth, model fingerprint)
    emulator.py   the ByteStream protocol, LinkConfig + in-process link emulator (delay,
                  jitter, rate, loss)
    channel.py    the Channel protocol, FramedChannel over a byte stream, memory_pair()
    driver.py     asyncio TCP: connect() and serve(), optional TLS (tlsutil.py)
    loop.py       the event loop a process runs on: run(main()), uvloop where installed
    errors.py     the exception tree (TransportError > ProtocolError, HandshakeError, ...)

Words: a *frame* is one encoded message on the wire; a *message* is the decoded frozen
dataclass; a *stream* moves bytes (TCP socket, in-memory queue, emulated link); a
*channel* moves messages over a stream and answers Pings by itself; a *session* is a
channel after a successful handshake.

Usage (asyncio)::

    from tandem.transport import TransportConfig, connect, serve, Ping, VerifyRequest

    config = TransportConfig(secret=b"shared", tokenizer_hash=lm.tokenizer.fingerprint,
                             vocab_size=lm.vocab_size, role="device")

    async def handler(channel):             # cloud side: one call per session
        async for msg in channel:           # ends when the peer says Bye / disconnects
            await channel.send(reply_to(msg))

    server = await serve(handler, "127.0.0.1", 0, config=cloud_config)   # port 0: any
    port = server.port
    channel = await connect("127.0.0.1", port, config=config)  # handshake done on return
    rtt_s = await channel.ping()            # one Ping/Pong round trip, seconds
    channel.rtt                             # smoothed RTT estimate (seconds) or None
    channel.bytes_sent, channel.bytes_received   # wire bytes, frame headers included
    await channel.send(VerifyRequest(...)); reply = await channel.recv()
    await channel.close()                   # sends Bye
    await server.close()

Round-trip timing of a small message: `await channel.ping()` returns the measured RTT
of one Ping/Pong (the peer's channel answers Pings itself, no handler involvement, so a
server whose handler only drains - `async for _ in channel: pass` - is enough);
heartbeats use the same messages every `ping_interval` seconds and feed `channel.rtt`.
A Ping frame is about 50 bytes on the wire (a Pong about 75). To time application
messages instead, echo them in the handler and time `send` + `recv` on the client.

Defaults: `TransportConfig()` has no secret (auth with an empty key: loopback tests
only), an empty model fingerprint, Pings every 5 s and a 20 s dead-peer timeout.
Memory is bounded on both paths (channel.py's docstring has the details): `send()`
awaits the stream's drain, so a peer that stops reading blocks the sender (TCP
back-pressure) instead of growing a buffer; the receive queue holds at most
`recv_queue_messages` (4096) or `recv_queue_bytes` (64 MiB) before the reader stops
reading, and a queue full for `recv_stall_timeout` (60 s; None: no limit) closes the
channel with `ChannelClosed("receive queue full ...")`, the peer hearing
`peer said bye: receive queue full: peer not reading`. In-memory streams buffer 64 KiB
per direction, the link emulator `LinkConfig.max_buffer_bytes` (16 MiB), the delay proxy
`ProxyConfig.max_buffer_bytes` (8 MiB) per direction of each connection.
Errors: every exception is a `TransportError` (see errors.py for the tree); `recv()`
raises `ChannelClosed` after the peer's Bye, `PeerDead`, or `ProtocolError`.

Fast tests: `a, b = memory_pair()` (inside a running loop) gives two connected channels
with no sockets and no handshake; `memory_pair(link=LinkConfig(delay_ms=50, ...))`
emulates a link in each direction. `TransportConfig(link=...)` applies the same
emulator to the outgoing direction of a real TCP channel.

Sans-I/O use (h11 style)::

    data = encode_message(Ping(seq=1, sent_ns=0), compression=None)   # -> bytes
    parser = FrameParser(limits=Limits())
    parser.receive_data(data)           # any split; b"" means end of stream
    msg = parser.next_event()           # a Message, None (need more data) or CONNECTION_CLOSED
"""

from tandem.transport.channel import (
    STALLED_BYE,
    Channel,
    FramedChannel,
    MemoryStream,
    RttEstimator,
    TransportConfig,
    memory_pair,
    memory_stream_pair,
)
from tandem.transport.driver import Server, TcpStream, connect, open_session, serve
from tandem.transport.emulator import ByteStream, EmulatedStream, LinkConfig, LinkModel
from tandem.transport.errors import (
    AuthenticationFailed,
    ChannelClosed,
    ConnectError,
    FingerprintMismatch,
    HandshakeError,
    LimitExceeded,
    PeerDead,
    PeerSaidBye,
    ProtocolError,
    TransportError,
    VersionMismatch,
)
from tandem.transport.handshake import (
    PROTOCOL_VERSION,
    ClientHandshake,
    ServerHandshake,
    SessionInfo,
)
from tandem.transport.messages import (
    AuthResponse,
    Bye,
    Challenge,
    DraftTokens,
    End,
    Error,
    Hello,
    Interrupt,
    Message,
    Ping,
    Pong,
    Ready,
    Refuse,
    Start,
    Stats,
    SwitchAggregator,
    TargetToken,
    VerifyRequest,
    VerifyResult,
    Welcome,
)
from tandem.transport.tlsutil import TlsConfig, make_self_signed
from tandem.transport.wire import (
    CONNECTION_CLOSED,
    WIRE_VERSION,
    ConnectionClosed,
    FrameParser,
    Limits,
    encode_message,
)

__all__ = [
    "AuthResponse", "AuthenticationFailed", "Bye", "ByteStream", "CONNECTION_CLOSED",
    "Challenge", "Channel", "PeerSaidBye", "STALLED_BYE", "ChannelClosed", "ClientHandshake", "ConnectError",
    "ConnectionClosed", "DraftTokens", "EmulatedStream", "End", "Error", "FingerprintMismatch",
    "FrameParser", "FramedChannel", "HandshakeError", "Hello", "Interrupt", "LimitExceeded",
    "Limits", "LinkConfig", "LinkModel", "MemoryStream", "Message", "PROTOCOL_VERSION",
    "PeerDead", "Ping", "Pong", "ProtocolError", "Ready", "Refuse", "RttEstimator", "Server",
    "ServerHandshake", "SessionInfo", "Start", "Stats", "SwitchAggregator", "TargetToken", "TcpStream",
    "TlsConfig", "TransportConfig", "TransportError", "VerifyRequest", "VerifyResult",
    "VersionMismatch", "WIRE_VERSION", "Welcome", "connect", "encode_message",
    "make_self_signed", "memory_pair", "memory_stream_pair", "open_session", "serve",
]  # fmt: skip
