"""The messages tandem's two sides exchange, as frozen dataclasses.

This module owns the message vocabulary and each message's type code on the wire; it
knows nothing about bytes (see wire.py). Every field has one of a few *kinds*, read
from its annotation, and the wire format is derived from the kinds:

    int, bool, str, float, tuple[int, ...], tuple[bool, ...], tuple[str, ...]
        small scalars: travel in the msgpack header
    bytes, tuple[bytes, ...]
        opaque blobs (nonces, MACs, codec payloads): travel raw in the payload
    Arrays (dict[str, numpy.ndarray])
        named numpy arrays: travel raw, little-endian, in the payload (dtype + shape in
        the header, whitelisted dtypes only)

Words: *seq* is the sender's message sequence number (per session, increasing);
*position* is a token position in the generated sequence (the index the first token
of the message will occupy); a *distribution payload* is the opaque bytes one codec
(tandem.codecs, named by `codec`) produced for one token's distribution.

Handshake messages: Hello, Challenge, AuthResponse, Welcome, Refuse (see handshake.py).
Session control, one vocabulary for every mode: Start, Ready, End, Stats (their JSON
bodies are read and written by control.py).
Session messages: DraftTokens, TargetToken, VerifyRequest, VerifyResult,
SwitchAggregator, Interrupt, Ping, Pong, Error, Bye.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

Arrays = dict[str, np.ndarray]

# kind of a field, from its annotation (wire.py encodes each kind its own way)
SCALAR_KINDS = {
    int: "int",
    bool: "bool",
    str: "str",
    float: "float",
    tuple[int, ...]: "ints",
    tuple[bool, ...]: "bools",
    tuple[str, ...]: "strs",
}
BLOB_KINDS = {bytes: "bytes", tuple[bytes, ...]: "blobs"}
ARRAY_KINDS = {Arrays: "arrays"}


class Message:
    """Base of every message: frozen dataclass fields, a wire type code, value equality.

    Lists given for tuple fields are turned into tuples; equality compares numpy arrays
    by dtype, shape and value (so round-trip tests can use ==).
    """

    TYPE: ClassVar[int]
    # name -> kind, filled by @message
    KINDS: ClassVar[dict[str, str]]

    def __post_init__(self) -> None:
        for name, kind in self.KINDS.items():
            value = getattr(self, name)
            if kind in ("ints", "bools", "strs", "blobs") and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
            elif kind == "arrays" and not isinstance(value, dict):
                object.__setattr__(self, name, dict(value))

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for name, kind in self.KINDS.items():
            mine, theirs = getattr(self, name), getattr(other, name)
            if kind == "arrays":
                if mine.keys() != theirs.keys():
                    return False
                for key, array in mine.items():
                    peer = theirs[key]
                    if array.dtype != peer.dtype or array.shape != peer.shape:
                        return False
                    if not np.array_equal(array, peer, equal_nan=array.dtype.kind == "f"):
                        return False
            elif mine != theirs:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]  # arrays are unhashable


MESSAGE_TYPES: dict[int, type[Message]] = {}


def message(code: int):
    """Class decorator: a frozen keyword-only dataclass registered under wire type `code`."""

    def wrap(cls):
        cls = dataclass(frozen=True, kw_only=True, eq=False)(cls)
        hints = typing.get_type_hints(cls)
        kinds = {}
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            kind = SCALAR_KINDS.get(hint) or BLOB_KINDS.get(hint) or ARRAY_KINDS.get(hint)
            if kind is None:
                raise TypeError(f"{cls.__name__}.{f.name}: unsupported field type {hint!r}")
            kinds[f.name] = kind
        if list(kinds.values()).count("arrays") > 1:
            raise TypeError(f"{cls.__name__}: at most one Arrays field")
        if code in MESSAGE_TYPES:
            raise TypeError(f"type code {code} used twice")
        cls.TYPE = code
        cls.KINDS = kinds
        MESSAGE_TYPES[code] = cls
        return cls

    return wrap


def _arrays() -> Arrays:
    return {}


# ---- handshake (see handshake.py for the order) -------------------------------------


@message(1)
class Hello(Message):
    """First message of each side: who I am and which model vocabulary I speak."""

    protocol_version: int
    session_id: str = ""  # client: "" (server assigns) or a session to resume
    role: str = ""  # "device" / "cloud" (free text, for logs and refusals)
    tokenizer_hash: str = ""
    vocab_size: int = 0
    model_name: str = ""
    capabilities: tuple[str, ...] = ()  # e.g. ("lz4", "zstd")


@message(2)
class Challenge(Message):
    """Server -> client: a fresh random nonce to be MACed with the shared secret."""

    nonce: bytes


@message(3)
class AuthResponse(Message):
    """Client -> server: MAC over the transcript, plus the client's own nonce."""

    mac: bytes
    nonce: bytes


@message(4)
class Welcome(Message):
    """Server -> client: session accepted; the server's MAC proves it holds the secret too."""

    session_id: str
    mac: bytes
    capabilities: tuple[str, ...] = ()  # those both sides have


@message(5)
class Refuse(Message):
    """The handshake is refused; `code` is "version", "auth", "fingerprint" or "handshake"."""

    code: str
    reason: str


# ---- session control (every mode; control.py builds and reads them) ------------------


@message(22)
class Start(Message):
    """Device -> cloud, the first message of a session: run `mode` (a name of the cloud's
    mode registry: "spec", "ar", "private-spec", "dragon", "rapid", a DRAGON baseline's
    name), on `tokens` (the prompt's ids, where the mode sends them); `body` is the mode's
    settings as UTF-8 JSON (its config, the question, ...)."""

    mode: str
    tokens: tuple[int, ...] = ()
    body: bytes = b""


@message(23)
class Ready(Message):
    """Cloud -> device: the session is set up (prefill done); `body` = JSON facts about it
    (model, prefill time, counts)."""

    body: bytes = b""


@message(24)
class End(Message):
    """Device -> cloud: the device is done; `tokens` = the output it committed."""

    tokens: tuple[int, ...] = ()


@message(25)
class Stats(Message):
    """Either side -> its peer, at the end: the sender's measurements as JSON `body`."""

    body: bytes = b""


# ---- session ------------------------------------------------------------------------


@message(16)
class DraftTokens(Message):
    """Draft tokens and, for each, the distribution payload its codec produced."""

    seq: int
    position: int
    tokens: tuple[int, ...]
    codec: str = ""
    distributions: tuple[bytes, ...] = ()  # one per token, or none
    arrays: Arrays = field(default_factory=_arrays)


@message(17)
class TargetToken(Message):
    """The token chosen at `position`, with which drafts were accepted (e.g. local, remote)."""

    seq: int
    position: int
    token: int
    accepted: tuple[bool, ...] = ()
    arrays: Arrays = field(default_factory=_arrays)


@message(18)
class VerifyRequest(Message):
    """Device -> cloud: verify these draft tokens (distributions encoded by `codec`)."""

    seq: int
    position: int
    tokens: tuple[int, ...]
    codec: str = ""
    distributions: tuple[bytes, ...] = ()
    arrays: Arrays = field(default_factory=_arrays)


@message(19)
class VerifyResult(Message):
    """Cloud -> device: how many drafts were accepted and the next (recovered or bonus) token.

    `payload` optionally carries a target distribution (e.g. top-K, encoded by `codec`).
    """

    seq: int
    position: int
    num_accepted: int
    next_token: int
    codec: str = ""
    payload: bytes = b""
    arrays: Arrays = field(default_factory=_arrays)


@message(20)
class SwitchAggregator(Message):
    """The aggregator moves to the side named `aggregator`, after `target_token` at `position`."""

    seq: int
    position: int
    target_token: int
    aggregator: str


@message(21)
class Interrupt(Message):
    """Stop the work in flight and roll back to `position` (tokens from there on are void)."""

    seq: int
    position: int
    reason: str = ""


@message(32)
class Ping(Message):
    """Heartbeat / RTT probe; `sent_ns` is the sender's time.monotonic_ns()."""

    seq: int
    sent_ns: int


@message(33)
class Pong(Message):
    """Answer to Ping: echoes its seq and sent_ns (RTT = now - ping_sent_ns, on the pinger)."""

    seq: int
    ping_sent_ns: int
    sent_ns: int


@message(34)
class Error(Message):
    """An application-level error; the session stays open unless followed by Bye."""

    code: str
    message: str


@message(35)
class Bye(Message):
    """Orderly end of the session."""

    reason: str = ""
