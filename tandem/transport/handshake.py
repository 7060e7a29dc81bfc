"""The session handshake, sans-I/O: version, mutual HMAC auth, model fingerprint.

Two state machines, fed decoded messages, answer with the messages to send; the driver
only pumps them (send what `start()` / `receive()` return, stop when `done` or `error`).

    client (device)                         server (cloud)
    ---------------                         --------------
    start() -> Hello(c)            ----->   WAIT_HELLO: check version, fingerprint
                                   <-----   Hello(s), Challenge(server_nonce)
    WAIT_HELLO: check Hello(s)
    WAIT_CHALLENGE -> AuthResponse(
        mac_client, client_nonce)  ----->   WAIT_AUTH: check mac_client
                                   <-----   Welcome(session_id, mac_server)
    WAIT_WELCOME: check mac_server
    DONE                                    DONE

    any failure: the side that finds it sends Refuse(code, reason), sets `error` (the
    HandshakeError subclass for `code`) and goes to FAILED; the side receiving Refuse
    sets the same error with the same text.

mac_side = HMAC-SHA256(secret, msgpack([side, version, session_id, client_nonce,
server_nonce, both fingerprints])), side = "client" / "server": the secret never travels,
both nonces are fresh 32-byte randoms (no replay), MACs are compared in constant time.
`secret=None` means "no shared secret" (an empty key): only a peer also configured
without one is accepted - for loopback tests only.

The *model fingerprint* is (tokenizer_hash, vocab_size): both must match exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

import msgpack

from tandem.transport.errors import (
    AuthenticationFailed,
    FingerprintMismatch,
    HandshakeError,
    VersionMismatch,
    handshake_error,
)
from tandem.transport.messages import AuthResponse, Challenge, Hello, Message, Refuse, Welcome

PROTOCOL_VERSION = 2  # 2: typed Start/Ready/End/Stats session control (was JSON control frames)
NONCE_BYTES = 32
SESSION_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class SessionInfo:
    """What a finished handshake established."""

    session_id: str
    side: str  # "client" or "server": the side holding this object
    local: Hello
    peer: Hello
    capabilities: tuple[str, ...]  # offered by both sides


def transcript_mac(
    secret: bytes | None,
    side: str,
    *,
    session_id: str,
    client_nonce: bytes,
    server_nonce: bytes,
    client_hello: Hello,
    server_hello: Hello,
) -> bytes:
    """HMAC-SHA256 by `side` over everything the handshake agreed on."""
    transcript = msgpack.packb(
        [
            "tandem-auth",
            side,
            PROTOCOL_VERSION,
            session_id,
            client_nonce,
            server_nonce,
            [client_hello.tokenizer_hash, client_hello.vocab_size, client_hello.role],
            [server_hello.tokenizer_hash, server_hello.vocab_size, server_hello.role],
        ],
        use_bin_type=True,
    )
    return hmac.new(secret or b"", transcript, hashlib.sha256).digest()


def _describe(hello: Hello, default_role: str) -> str:
    return (
        f"{hello.role or default_role} has tokenizer {hello.tokenizer_hash or '(none)'} "
        f"and vocab {hello.vocab_size}"
    )


def compatibility_problem(client: Hello, server: Hello) -> HandshakeError | None:
    """Why two Hellos cannot work together (version first, then fingerprint), or None."""
    if client.protocol_version != server.protocol_version:
        return VersionMismatch(
            f"protocol version mismatch: client speaks {client.protocol_version}, "
            f"server speaks {server.protocol_version}"
        )
    if (client.tokenizer_hash, client.vocab_size) != (server.tokenizer_hash, server.vocab_size):
        return FingerprintMismatch(
            f"model fingerprint mismatch: {_describe(client, 'client')}, "
            f"{_describe(server, 'server')}"
        )
    return None


class _Machine:
    side = ""

    def __init__(self, *, hello: Hello, secret: bytes | None) -> None:
        self.hello = hello
        self.secret = secret
        self.state = "START"
        self.error: HandshakeError | None = None
        self.session: SessionInfo | None = None
        self.peer: Hello | None = None  # the other side's Hello, once received
        self.session_id = ""
        self.client_nonce = b""
        self.server_nonce = b""

    @property
    def done(self) -> bool:
        return self.state == "DONE"

    def _fail(self, error: HandshakeError, *, notify: bool = True) -> list[Message]:
        self.state, self.error = "FAILED", error
        return [Refuse(code=error.code, reason=str(error))] if notify else []

    def receive(self, msg: Message) -> list[Message]:
        """Feed one message from the peer; returns the messages to send back."""
        if self.state in ("DONE", "FAILED"):
            raise RuntimeError(f"handshake already {self.state.lower()}")
        if isinstance(msg, Refuse):
            return self._fail(handshake_error(msg.code, msg.reason), notify=False)
        return self._receive(msg)

    def _unexpected(self, msg: Message) -> list[Message]:
        return self._fail(
            HandshakeError(f"unexpected {type(msg).__name__} during handshake ({self.state})")
        )

    def _receive(self, msg: Message) -> list[Message]:
        raise NotImplementedError


class ClientHandshake(_Machine):
    """The connecting side (usually the device)."""

    side = "client"

    def start(self) -> list[Message]:
        self.state = "WAIT_HELLO"
        return [self.hello]

    def _receive(self, msg: Message) -> list[Message]:
        if self.state == "WAIT_HELLO" and isinstance(msg, Hello):
            problem = compatibility_problem(self.hello, msg)
            if problem is not None:
                return self._fail(problem)
            self.peer = msg
            self.state = "WAIT_CHALLENGE"
            return []
        if self.state == "WAIT_CHALLENGE" and isinstance(msg, Challenge):
            if len(msg.nonce) != NONCE_BYTES:
                return self._fail(HandshakeError("server sent a malformed challenge"))
            self.server_nonce = msg.nonce
            self.client_nonce = secrets.token_bytes(NONCE_BYTES)
            self.state = "WAIT_WELCOME"
            self.session_id = self.peer.session_id
            mac = self._mac("client")
            return [AuthResponse(mac=mac, nonce=self.client_nonce)]
        if self.state == "WAIT_WELCOME" and isinstance(msg, Welcome):
            if msg.session_id != self.session_id or not hmac.compare_digest(
                msg.mac, self._mac("server")
            ):
                return self._fail(
                    AuthenticationFailed(
                        "authentication failed: the server could not prove the shared secret"
                    )
                )
            self.state = "DONE"
            self.session = SessionInfo(
                msg.session_id, "client", self.hello, self.peer, msg.capabilities
            )
            return []
        return self._unexpected(msg)

    def _mac(self, side: str) -> bytes:
        return transcript_mac(
            self.secret,
            side,
            session_id=self.session_id,
            client_nonce=self.client_nonce,
            server_nonce=self.server_nonce,
            client_hello=self.hello,
            server_hello=self.peer,
        )


class ServerHandshake(_Machine):
    """The accepting side (usually the cloud); one per incoming connection."""

    side = "server"

    def start(self) -> list[Message]:
        self.state = "WAIT_HELLO"
        return []

    def _receive(self, msg: Message) -> list[Message]:
        if self.state == "WAIT_HELLO" and isinstance(msg, Hello):
            problem = compatibility_problem(msg, self.hello)
            if problem is not None:
                return self._fail(problem)
            self.peer = msg
            proposed = msg.session_id
            self.session_id = proposed if SESSION_ID.fullmatch(proposed) else secrets.token_hex(8)
            self.server_nonce = secrets.token_bytes(NONCE_BYTES)
            self.state = "WAIT_AUTH"
            mine = dataclasses.replace(self.hello, session_id=self.session_id)
            self.hello = mine
            return [mine, Challenge(nonce=self.server_nonce)]
        if self.state == "WAIT_AUTH" and isinstance(msg, AuthResponse):
            self.client_nonce = msg.nonce
            if len(msg.nonce) != NONCE_BYTES or not hmac.compare_digest(
                msg.mac, self._mac("client")
            ):
                return self._fail(
                    AuthenticationFailed(
                        "authentication failed: wrong shared secret (the client's HMAC "
                        "does not match)"
                    )
                )
            shared = tuple(sorted(set(self.hello.capabilities) & set(self.peer.capabilities)))
            self.state = "DONE"
            self.session = SessionInfo(self.session_id, "server", self.hello, self.peer, shared)
            return [
                Welcome(session_id=self.session_id, mac=self._mac("server"), capabilities=shared)
            ]
        return self._unexpected(msg)

    def _mac(self, side: str) -> bytes:
        return transcript_mac(
            self.secret,
            side,
            session_id=self.session_id,
            client_nonce=self.client_nonce,
            server_nonce=self.server_nonce,
            client_hello=self.peer,
            server_hello=self.hello,
        )
