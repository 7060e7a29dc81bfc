"""The asyncio TCP driver on loopback: many concurrent sessions, refusals with clear
messages over the wire, dead peers, handshake timeouts, TLS, and an emulated link."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import ssl
import statistics
import time

import numpy as np
import pytest

from tandem.transport import (
    PROTOCOL_VERSION,
    AuthenticationFailed,
    ConnectError,
    FingerprintMismatch,
    FrameParser,
    HandshakeError,
    LinkConfig,
    PeerDead,
    ServerHandshake,
    TlsConfig,
    TransportConfig,
    VerifyRequest,
    VerifyResult,
    VersionMismatch,
    connect,
    encode_message,
    make_self_signed,
    serve,
)

from .support import config
from .test_channel import arun

HOST = "127.0.0.1"


async def verify_handler(channel):
    """A toy cloud: accepts the first draft and echoes the request's array back."""
    async for msg in channel:
        await channel.send(
            VerifyResult(
                seq=msg.seq,
                position=msg.position,
                num_accepted=1,
                next_token=msg.tokens[-1] + 1,
                arrays=msg.arrays,
            )  # fmt: skip
        )


def test_many_concurrent_sessions():
    clients = 8

    async def one_client(port, index):
        channel = await connect(HOST, port, config=config(compression="lz4"))
        rows = np.full((4, 16), index, dtype=np.float32)  # [draft tokens, top-k]
        for step in range(5):
            await channel.send(VerifyRequest(seq=step, position=step * 4, tokens=(index, step),
                                             arrays={"rows": rows}))  # fmt: skip
        results = [await channel.recv() for _ in range(5)]
        assert [r.seq for r in results] == list(range(5))
        assert all(r.next_token == step + 1 for step, r in enumerate(results))
        assert all(np.array_equal(r.arrays["rows"], rows) for r in results)
        rtt = await channel.ping(timeout=5)
        session_id = channel.session.session_id
        assert channel.bytes_sent > 0 and channel.bytes_received > 0
        await channel.close()
        return session_id, rtt

    async def main():
        server = await serve(verify_handler, HOST, 0, config=config(role="cloud"))
        async with server:
            assert server.host == HOST
            outcomes = await asyncio.gather(*(one_client(server.port, i) for i in range(clients)))
            for _ in range(50):  # the handlers notice the Byes
                if not server.sessions:
                    break
                await asyncio.sleep(0.02)
            assert not server.sessions and not server.refused
        return outcomes

    outcomes = arun(main())
    assert len({session_id for session_id, _ in outcomes}) == clients
    assert all(0 < rtt < 1.0 for _, rtt in outcomes)


def test_sessions_are_served_at_the_same_time():
    """While one client is mid-session, another completes whole sessions."""

    async def main():
        server = await serve(verify_handler, HOST, 0, config=config(role="cloud"))
        async with server:
            slow = await connect(HOST, server.port, config=config())
            fast = await connect(HOST, server.port, config=config())
            assert len(server.sessions) == 2
            await fast.send(VerifyRequest(seq=1, position=0, tokens=(1,)))
            assert (await fast.recv()).next_token == 2
            await fast.close()
            await slow.send(VerifyRequest(seq=1, position=0, tokens=(5,)))
            assert (await slow.recv()).next_token == 6
            await slow.close()

    arun(main())


@pytest.mark.parametrize(
    ("client_overrides", "error", "message"),
    [
        (dict(secret=b"wrong"), AuthenticationFailed,
         "authentication failed: wrong shared secret (the client's HMAC does not match)"),
        (dict(tokenizer_hash="other-tokenizer"), FingerprintMismatch,
         "model fingerprint mismatch: device has tokenizer other-tokenizer and vocab 300, "
         "cloud has tokenizer toy-tokenizer and vocab 300"),
        (dict(vocab_size=301), FingerprintMismatch,
         "model fingerprint mismatch: device has tokenizer toy-tokenizer and vocab 301, "
         "cloud has tokenizer toy-tokenizer and vocab 300"),
    ],
)  # fmt: skip
def test_refusals_over_tcp(client_overrides, error, message):
    async def main():
        server = await serve(verify_handler, HOST, 0, config=config(role="cloud"))
        async with server:
            with pytest.raises(error) as caught:
                await connect(HOST, server.port, config=config(**client_overrides))
            assert str(caught.value) == message
            await asyncio.sleep(0.05)
            assert [str(e) for e in server.refused] == [message]
            assert not server.sessions

    arun(main())


class NewerClientConfig(TransportConfig):
    """A client from the future: speaks protocol version 7."""

    def hello(self):
        return dataclasses.replace(super().hello(), protocol_version=7)


def test_wrong_version_refused_over_tcp():
    async def main():
        server = await serve(verify_handler, HOST, 0, config=config(role="cloud"))
        async with server:
            newer = NewerClientConfig(**vars(config()))
            with pytest.raises(VersionMismatch) as caught:
                await connect(HOST, server.port, config=newer)
            message = (
                f"protocol version mismatch: client speaks 7, server speaks {PROTOCOL_VERSION}"
            )
            assert str(caught.value) == message
            await asyncio.sleep(0.05)
            assert [str(e) for e in server.refused] == [message]

    arun(main())


def test_connect_errors_are_clear():
    async def main():
        server = await serve(verify_handler, HOST, 0, config=config())
        port = server.port
        await server.close()
        with pytest.raises(ConnectError, match=f"cannot connect to 127.0.0.1:{port}"):
            await connect(HOST, port, config=config())

    arun(main())


async def mute_server(*, handshake: bool):
    """A raw TCP server that (optionally) completes the handshake, then never speaks."""
    done = asyncio.Event()

    async def on_connection(reader, writer):
        if handshake:
            machine = ServerHandshake(hello=config(role="cloud").hello(), secret=b"test-secret")
            parser = FrameParser()
            machine.start()
            while not machine.done:
                event = parser.next_event()
                if event is None:
                    parser.receive_data(await reader.read(65536))
                    continue
                for msg in machine.receive(event):
                    writer.write(encode_message(msg))
        await done.wait()  # read nothing more, answer nothing
        writer.close()

    server = await asyncio.start_server(on_connection, HOST, 0)
    return server, done


def test_dead_peer_detected_over_tcp():
    async def main():
        server, done = await mute_server(handshake=True)
        port = server.sockets[0].getsockname()[1]
        channel = await connect(HOST, port, config=config(ping_interval=0.1, dead_peer_timeout=0.5))
        started = time.monotonic()
        with pytest.raises(PeerDead, match="peer silent for"):
            await channel.recv()
        elapsed = time.monotonic() - started
        done.set()
        server.close()
        await server.wait_closed()
        return elapsed

    elapsed = arun(main())
    assert 0.5 <= elapsed <= 0.5 + 0.1 + 0.3


def test_handshake_timeout():
    async def main():
        server, done = await mute_server(handshake=False)
        port = server.sockets[0].getsockname()[1]
        started = time.monotonic()
        with pytest.raises(HandshakeError, match=r"handshake timed out after 0.3 s \(WAIT_HELLO\)"):
            await connect(HOST, port, config=config(handshake_timeout=0.3))
        assert time.monotonic() - started < 1.5
        done.set()
        server.close()
        await server.wait_closed()

    arun(main())


def test_emulated_link_on_tcp():
    """TransportConfig.link delays the client's outgoing direction (and the server's)."""

    async def main():
        link = LinkConfig(delay_ms=25)
        server = await serve(verify_handler, HOST, 0, config=config(role="cloud", link=link))
        async with server:
            channel = await connect(HOST, server.port, config=config(link=link))
            samples = [await channel.ping(timeout=5) for _ in range(6)]
            await channel.close()
        return samples

    samples = arun(main())
    assert statistics.median(samples) == pytest.approx(0.050, rel=0.10, abs=0.005)


# ---- TLS ------------------------------------------------------------------------------

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    server = make_self_signed(directory, name="server")
    client = make_self_signed(directory, name="client")
    stranger = make_self_signed(directory, name="stranger")
    return {"server": server, "client": client, "stranger": stranger}


@needs_openssl
def test_tls_with_client_certificates(certs):
    server_tls = TlsConfig(certfile=certs["server"][0], keyfile=certs["server"][1],
                           cafile=certs["client"][0], require_client_cert=True)  # fmt: skip
    client_tls = TlsConfig(certfile=certs["client"][0], keyfile=certs["client"][1],
                           cafile=certs["server"][0])  # fmt: skip

    async def main():
        server = await serve(verify_handler, HOST, 0, config=config(role="cloud", tls=server_tls))
        async with server:
            channel = await connect(HOST, server.port, config=config(tls=client_tls))
            await channel.send(VerifyRequest(seq=1, position=0, tokens=(41,)))
            assert (await channel.recv()).next_token == 42
            assert channel._stream.writer.get_extra_info("ssl_object") is not None
            await channel.close()

            # a client trusting another CA refuses the server's certificate
            wrong_ca = TlsConfig(certfile=certs["client"][0], keyfile=certs["client"][1],
                                 cafile=certs["stranger"][0])  # fmt: skip
            with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await connect(HOST, server.port, config=config(tls=wrong_ca))

            # a client with no (or an untrusted) certificate is refused by the server
            for client_cert in (None, certs["stranger"]):
                anonymous = TlsConfig(cafile=certs["server"][0],
                                      certfile=client_cert and client_cert[0],
                                      keyfile=client_cert and client_cert[1])  # fmt: skip
                with pytest.raises((ConnectError, HandshakeError)):
                    await connect(HOST, server.port, config=config(tls=anonymous))

            # a plain-TCP client cannot talk to a TLS server
            with pytest.raises((ConnectError, HandshakeError)):
                await connect(HOST, server.port, config=config(handshake_timeout=1.0))

    arun(main())


@needs_openssl
def test_tls_context_basics(certs):
    from tandem.transport.tlsutil import client_context, server_context

    context = server_context(TlsConfig(certfile=certs["server"][0], keyfile=certs["server"][1]))
    assert context.verify_mode == ssl.CERT_NONE
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert client_context(TlsConfig(cafile=certs["server"][0])).check_hostname


def test_open_session_over_memory_streams():
    """The handshake pump works over any ByteStream, not only TCP."""
    from tandem.transport import memory_stream_pair, open_session

    async def main():
        client_stream, server_stream = memory_stream_pair()
        client, server = await asyncio.gather(
            open_session(client_stream, config=config(), side="client"),
            open_session(server_stream, config=config(role="cloud"), side="server"),
        )
        assert client.session.session_id == server.session.session_id
        assert client.session.peer.role == "cloud"
        await client.send(VerifyRequest(seq=3, position=0, tokens=(1,)))
        assert (await server.recv()).seq == 3
        await client.close()
        await server.close()

        client_stream, server_stream = memory_stream_pair()
        outcome = await asyncio.gather(
            open_session(client_stream, config=config(secret=b"nope"), side="client"),
            open_session(server_stream, config=config(role="cloud"), side="server"),
            return_exceptions=True,
        )
        assert all(isinstance(e, AuthenticationFailed) for e in outcome)

    arun(main())
