"""tandem.transport: how the device and the cloud talk (frames, handshake, channels).

Layers, bottom up (each usable without the ones above it)::

    messages.py   frozen dataclasses, one per message kind (Hello, DraftTokens, Ping, ...)
    wire.py       sans-I/O framing: encode_message(msg) -> bytes; FrameParser fed bytes
    handshake.py  sans-I/O handshake state machines (version, HMAC auth, model fingerprint)
    channel.py    the Channel protocol, FramedChannel over a byte stream, memory_pair()
    emulator.py   LinkConfig + in-process link emulator (delay, jitter, rate, loss)
    driver.py     asyncio TCP: connect() and serve(), optional TLS (tlsutil.py)
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
of one Ping/Pong (the peer's channel answers Pings itself, no handler involvement);
heartbeats use the same messages every `ping_interval` seconds and feed `channel.rtt`.

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
