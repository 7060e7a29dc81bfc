"""The exception tree of tandem.transport.

Every exception raised by the transport layer is a `TransportError` (itself a
`tandem.errors.TandemError`, so the CLI prints it as one line)::

    TandemError
     └─ TransportError              anything raised by tandem.transport
         ├─ ProtocolError           the peer's bytes break the wire format; the connection is dead
         │   └─ LimitExceeded       a frame asked for more than `Limits` allows (refused before
         │                          anything is allocated or decompressed)
         ├─ HandshakeError          the session could not be opened
         │   ├─ VersionMismatch       the two sides speak different protocol versions
         │   ├─ AuthenticationFailed  a side could not prove it holds the shared secret
         │   └─ FingerprintMismatch   the two models do not share a tokenizer / vocabulary
         ├─ ChannelClosed           the peer said Bye or closed the connection (or we closed it,
         │                          or our receive queue stayed full: `recv_stall_timeout`)
         ├─ PeerDead                nothing heard from the peer within `dead_peer_timeout`
         └─ ConnectError            TCP or TLS could not connect

A `HandshakeError` raised on the side that refused is the same class the other side
raises when it receives the `Refuse` message, with the same one-line text.
"""

from __future__ import annotations

from tandem.errors import TandemError


class TransportError(TandemError):
    """Anything that went wrong in tandem.transport."""


class ProtocolError(TransportError):
    """The bytes received do not form valid frames or messages.

    Once a `FrameParser` has raised this it stays broken: every later call raises again
    (the byte stream cannot be resynchronised), so the connection must be dropped.
    """


class LimitExceeded(ProtocolError):
    """A frame declared a size, shape or count above the configured `Limits`."""


class HandshakeError(TransportError):
    """The handshake failed; `code` says why ("version", "auth", "fingerprint", ...)."""

    code = "handshake"


class VersionMismatch(HandshakeError):
    code = "version"


class AuthenticationFailed(HandshakeError):
    code = "auth"


class FingerprintMismatch(HandshakeError):
    code = "fingerprint"


class ChannelClosed(TransportError):
    """The channel is closed: the peer said Bye, the stream ended, or close() was called."""


class PeerSaidBye(ChannelClosed):
    """The peer closed the channel with a Bye; `reason` is what it said (may be empty)."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)  # args = (reason,): a copy is made from them
        self.reason = reason

    def __str__(self) -> str:
        return f"peer said bye{': ' + self.reason if self.reason else ''}"


class PeerDead(TransportError):
    """The peer stayed silent (no data, no Pong) for longer than the dead-peer timeout."""


class ConnectError(TransportError):
    """The TCP (or TLS) connection could not be established."""


HANDSHAKE_ERRORS: dict[str, type[HandshakeError]] = {
    cls.code: cls
    for cls in (HandshakeError, VersionMismatch, AuthenticationFailed, FingerprintMismatch)
}


def handshake_error(code: str, reason: str) -> HandshakeError:
    """The HandshakeError subclass for a Refuse `code` (unknown codes give the base class)."""
    return HANDSHAKE_ERRORS.get(code, HandshakeError)(reason)
