"""The sans-I/O handshake: mutual HMAC auth, version and fingerprint checks, refusals
with clear messages on both sides, and no secret on the wire."""

from __future__ import annotations

import dataclasses

import pytest

from tandem.transport import (
    AuthenticationFailed,
    AuthResponse,
    ClientHandshake,
    FingerprintMismatch,
    FrameParser,
    HandshakeError,
    Hello,
    Refuse,
    ServerHandshake,
    VersionMismatch,
    Welcome,
    encode_message,
)

SECRET = b"correct horse battery staple 0123456789"


def hello(**overrides) -> Hello:
    values = dict(protocol_version=1, role="device", tokenizer_hash="tok-abc", vocab_size=151_936,
                  capabilities=("lz4", "zstd"))  # fmt: skip
    values.update(overrides)
    return Hello(**values)


def run(client: ClientHandshake, server: ServerHandshake) -> list[bytes]:
    """Pump the two machines against each other through real frames; return the wire."""
    wire = []
    to_server, to_client = list(client.start()), list(server.start())
    while to_server or to_client:
        for outbox, machine in ((to_server, server), (to_client, client)):
            replies_box = to_client if machine is server else to_server
            while outbox:
                frame = encode_message(outbox.pop(0))
                wire.append(frame)
                parser = FrameParser()
                parser.receive_data(frame)
                if machine.state in ("DONE", "FAILED"):
                    continue
                replies_box.extend(machine.receive(parser.next_event()))
    return wire


def pair(client_secret=SECRET, server_secret=SECRET, client_hello=None, server_hello=None):
    client = ClientHandshake(hello=client_hello or hello(), secret=client_secret)
    server = ServerHandshake(hello=server_hello or hello(role="cloud", capabilities=("zstd",)),
                             secret=server_secret)  # fmt: skip
    return client, server


def test_success_gives_both_sides_the_same_session():
    client, server = pair()
    wire = run(client, server)
    assert client.done and server.done
    assert client.error is None and server.error is None
    assert client.session.session_id == server.session.session_id != ""
    assert client.session.capabilities == server.session.capabilities == ("zstd",)
    assert client.session.peer.role == "cloud" and server.session.peer.role == "device"
    assert client.session.side == "client" and server.session.side == "server"
    assert len(wire) == 5  # Hello, Hello, Challenge, AuthResponse, Welcome
    # the secret never travels, not even in part
    blob = b"".join(wire)
    assert SECRET not in blob and SECRET[:16] not in blob and SECRET[-16:] not in blob


def test_client_proposed_session_id_is_kept():
    client, server = pair(client_hello=hello(session_id="resume-42"))
    run(client, server)
    assert client.session.session_id == server.session.session_id == "resume-42"


def test_nonces_differ_between_sessions():
    first, second = pair(), pair()
    run(*first)
    run(*second)
    assert first[0].server_nonce != second[0].server_nonce
    assert first[0].client_nonce != second[0].client_nonce


def test_wrong_secret_refused_on_both_sides():
    client, server = pair(client_secret=b"wrong secret")
    run(client, server)
    expected = "authentication failed: wrong shared secret (the client's HMAC does not match)"
    for machine in (client, server):
        assert isinstance(machine.error, AuthenticationFailed)
        assert str(machine.error) == expected
        assert machine.state == "FAILED"


def test_no_secret_on_one_side_only_is_refused():
    client, server = pair(client_secret=None)
    run(client, server)
    assert isinstance(server.error, AuthenticationFailed)
    client, server = pair(client_secret=None, server_secret=None)
    run(client, server)
    assert client.done and server.done


@pytest.mark.parametrize(
    ("client_hello", "expected"),
    [
        (hello(tokenizer_hash="tok-xyz"),
         "model fingerprint mismatch: device has tokenizer tok-xyz and vocab 151936, "
         "cloud has tokenizer tok-abc and vocab 151936"),
        (hello(vocab_size=32_000),
         "model fingerprint mismatch: device has tokenizer tok-abc and vocab 32000, "
         "cloud has tokenizer tok-abc and vocab 151936"),
    ],
)  # fmt: skip
def test_wrong_fingerprint_refused_naming_both_values(client_hello, expected):
    client, server = pair(client_hello=client_hello)
    wire = run(client, server)
    assert isinstance(server.error, FingerprintMismatch)
    assert isinstance(client.error, FingerprintMismatch)
    assert str(server.error) == str(client.error) == expected
    assert len(wire) == 2  # Hello, Refuse: no challenge for an incompatible client


def test_wrong_version_refused():
    client, server = pair(client_hello=hello(protocol_version=2))
    run(client, server)
    assert isinstance(client.error, VersionMismatch)
    assert str(client.error) == "protocol version mismatch: client speaks 2, server speaks 1"
    assert str(server.error) == str(client.error)


def test_client_rejects_server_without_the_secret():
    """A fake server (wrong secret) cannot fake the Welcome MAC."""
    client = ClientHandshake(hello=hello(), secret=SECRET)
    fake = ServerHandshake(hello=hello(role="cloud"), secret=b"impostor")
    client_out = client.start()
    fake.start()
    server_out = fake.receive(client_out[0])
    for msg in server_out:
        auth = client.receive(msg)
    # the impostor cannot verify the client, but replies with a Welcome anyway
    assert isinstance(auth[0], AuthResponse)
    forged = Welcome(session_id=fake.session_id, mac=b"\0" * 32)
    replies = client.receive(forged)
    assert isinstance(client.error, AuthenticationFailed)
    assert "server could not prove the shared secret" in str(client.error)
    assert isinstance(replies[0], Refuse) and replies[0].code == "auth"


def test_replayed_auth_response_fails_against_a_fresh_challenge():
    client, server = pair()
    run(client, server)
    recorded = AuthResponse(mac=client._mac("client"), nonce=client.client_nonce)
    server2 = ServerHandshake(hello=hello(role="cloud"), secret=SECRET)
    server2.start()
    server2.receive(hello())
    replies = server2.receive(recorded)
    assert isinstance(server2.error, AuthenticationFailed)
    assert isinstance(replies[0], Refuse)


def test_unexpected_message_fails_the_handshake():
    server = ServerHandshake(hello=hello(), secret=SECRET)
    server.start()
    replies = server.receive(AuthResponse(mac=b"", nonce=b""))
    assert type(server.error) is HandshakeError
    assert "unexpected AuthResponse during handshake (WAIT_HELLO)" in str(server.error)
    assert replies == [Refuse(code="handshake", reason=str(server.error))]
    with pytest.raises(RuntimeError):
        server.receive(hello())


def test_mac_binds_the_fingerprint():
    """Changing a Hello after the fact (a man in the middle) breaks the MAC."""
    client, server = pair()
    client.start()
    server.start()
    for msg in server.receive(client.hello):
        out = client.receive(msg)
    server.peer = dataclasses.replace(server.peer, role="tampered")
    server.receive(out[0])
    assert isinstance(server.error, AuthenticationFailed)
