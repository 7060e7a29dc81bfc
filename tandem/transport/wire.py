"""The wire format, sans-I/O: messages <-> bytes, with hard limits checked before allocating.

Why one file: it is the wire format's specification; every message type, its encoding
and its limits are meant to be read in one place, next to the frame layout below.

A *frame* is a 16-byte fixed prefix, a msgpack *header*, and a raw *payload*::

    offset size  field
    0      2     magic b"TD"
    2      1     frame format version (WIRE_VERSION)
    3      1     flags: bits 0-1 compression (0 none, 1 lz4 block, 2 zstd); bits 2-7 zero
    4      4     header length (uint32 LE)
    8      4     payload length on the wire (uint32 LE)
    12     4     payload length after decompression (uint32 LE; = wire length if none)

The header is a msgpack map ``{"t": type code, "f": {scalar fields}, "a": [[key, dtype,
shape], ...], "b": [[field, [blob lengths]], ...]}``; the payload is the arrays (C order,
little-endian, dtype in DTYPES) then the blobs, concatenated in header order. Only the
payload is compressed. msgpack is read with raw=False, strict_map_key, no ext types.
Never pickle.

Theory of operation of FrameParser (h11 style: feed bytes, pull events)::

    state      waits for              then                              on failure
    PREFIX     16 bytes               check magic/version/flags/sizes   ProtocolError
    HEADER     header-length bytes    unpack + validate the header,     ProtocolError
                                      sizes must add up to raw length
    PAYLOAD    payload-length bytes   decompress (bounded), slice       ProtocolError
                                      arrays/blobs -> Message, -> PREFIX
    CLOSED     (end of stream seen at a frame boundary)
    ERROR      (a ProtocolError was raised; every later call raises it again)

Every size is compared with `Limits` as soon as it is known (a prefix claiming a 4 GB
payload is refused after 16 bytes), decompression is told the exact output size, and
the buffered data never exceed 16 + max_header_bytes + max_payload_bytes per frame.
"""

from __future__ import annotations

import math
import operator
import struct
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from tandem.transport.errors import LimitExceeded, ProtocolError
from tandem.transport.messages import MESSAGE_TYPES, Hello, Message

MAGIC = b"TD"
WIRE_VERSION = 1
PREFIX = struct.Struct("<2sBBIII")  # magic, version, flags, header, payload, raw payload
COMPRESSION_FLAGS = {None: 0, "lz4": 1, "zstd": 2}
COMPRESSION_NAMES = {code: name for name, code in COMPRESSION_FLAGS.items()}
COMPRESSION_MASK = 0b11
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# wire dtype code -> little-endian numpy dtype (the whitelist)
DTYPES = {
    code: np.dtype(code).newbyteorder("<")
    for code in ("b1", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8")
}


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Hard limits a received frame must respect (checked before any allocation)."""

    max_header_bytes: int = 64 * 1024
    max_payload_bytes: int = 64 * 2**20  # on the wire (compressed)
    max_decompressed_bytes: int = 64 * 2**20
    max_vocab: int = 1 << 21  # any array dimension, Hello.vocab_size
    max_batch: int = 4096  # items in a tuple field (tokens, flags, blobs); arrays per message
    max_array_elements: int = 1 << 24
    max_array_ndim: int = 4
    max_string: int = 4096  # characters in a str field or array key


class ConnectionClosed:
    """Event: the stream ended cleanly, at a frame boundary."""

    def __repr__(self) -> str:
        return "CONNECTION_CLOSED"


CONNECTION_CLOSED = ConnectionClosed()


# ---- encoding -------------------------------------------------------------------------


def _scalar(kind: str, name: str, value: Any) -> Any:
    """A field value as the plain Python object msgpack packs (numpy ints become int)."""
    if kind == "int":
        return operator.index(value)
    if kind == "bool":
        return bool(value)
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"field {name!r} must be str, got {type(value).__name__}")
        return value
    if kind == "float":
        return float(value)
    if kind == "ints":
        return [operator.index(v) for v in value]
    if kind == "bools":
        return [bool(v) for v in value]
    return [str(v) for v in value]  # strs


def _array_bytes(key: str, value: np.ndarray) -> tuple[list, bytes]:
    array = np.asarray(value)
    code = f"{array.dtype.kind}{array.dtype.itemsize}"
    if code not in DTYPES:
        raise ValueError(f"array {key!r}: dtype {array.dtype} is not allowed on the wire")
    array = array.astype(DTYPES[code], order="C", copy=False)  # 0-d arrays stay 0-d
    return [key, code, list(array.shape)], array.tobytes()


def _compress(payload: bytes, compression: str) -> bytes:
    if compression == "lz4":
        import lz4.block

        return lz4.block.compress(payload, store_size=False)
    import zstandard

    return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(payload)


def encode_message(msg: Message, *, compression: str | None = None) -> bytes:
    """One frame holding `msg`. `compression` is None, "lz4" or "zstd" (payload only;
    skipped when it would not make the payload smaller)."""
    if compression not in COMPRESSION_FLAGS:
        raise ValueError(f"unknown compression {compression!r} (use None, 'lz4' or 'zstd')")
    fields: dict[str, Any] = {}
    array_descs, array_chunks, blob_descs, blob_chunks = [], [], [], []
    for name, kind in msg.KINDS.items():
        value = getattr(msg, name)
        if kind == "arrays":
            for key, array in value.items():
                desc, data = _array_bytes(key, array)
                array_descs.append(desc)
                array_chunks.append(data)
        elif kind == "bytes":
            blob = bytes(value)
            blob_descs.append([name, [len(blob)]])
            blob_chunks.append(blob)
        elif kind == "blobs":
            blobs = [bytes(b) for b in value]
            blob_descs.append([name, [len(b) for b in blobs]])
            blob_chunks.extend(blobs)
        else:
            fields[name] = _scalar(kind, name, value)
    header = msgpack.packb(
        {"t": msg.TYPE, "f": fields, "a": array_descs, "b": blob_descs}, use_bin_type=True
    )
    payload = b"".join(array_chunks + blob_chunks)
    flags, wire_payload = 0, payload
    if compression is not None and payload:
        packed = _compress(payload, compression)
        if len(packed) < len(payload):
            flags, wire_payload = COMPRESSION_FLAGS[compression], packed
    if len(payload) > 0xFFFFFFFF or len(header) > 0xFFFFFFFF:
        raise ValueError("message too large for one frame (4 GiB)")
    prefix = PREFIX.pack(MAGIC, WIRE_VERSION, flags, len(header), len(wire_payload), len(payload))
    return prefix + header + wire_payload


# ---- decoding -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prefix:
    flags: int
    header_len: int
    payload_len: int
    raw_len: int


@dataclass(frozen=True)
class _Plan:
    """A validated header: what the payload must contain, before it is read."""

    cls: type[Message]
    fields: dict[str, Any]
    arrays: list[tuple[str, str, tuple[int, ...]]]  # key, dtype code, shape
    blobs: list[tuple[str, list[int]]]  # field, lengths


def parse_prefix(data: bytes, limits: Limits) -> _Prefix:
    magic, version, flags, header_len, payload_len, raw_len = PREFIX.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r} (expected {MAGIC!r}): not a tandem peer")
    if version != WIRE_VERSION:
        raise ProtocolError(
            f"unsupported frame version {version} (this side speaks {WIRE_VERSION})"
        )
    if flags & ~COMPRESSION_MASK or (flags & COMPRESSION_MASK) not in COMPRESSION_NAMES:
        raise ProtocolError(f"bad frame flags 0x{flags:02x}")
    if header_len == 0 or header_len > limits.max_header_bytes:
        raise LimitExceeded(f"frame header of {header_len} bytes (limit {limits.max_header_bytes})")
    if payload_len > limits.max_payload_bytes:
        raise LimitExceeded(
            f"frame payload of {payload_len} bytes (limit {limits.max_payload_bytes})"
        )
    if raw_len > limits.max_decompressed_bytes:
        raise LimitExceeded(
            f"decompressed payload of {raw_len} bytes (limit {limits.max_decompressed_bytes})"
        )
    if flags == 0 and raw_len != payload_len:
        raise ProtocolError(f"uncompressed frame: payload {payload_len} != raw {raw_len} bytes")
    if flags != 0 and (payload_len == 0 or raw_len == 0):
        raise ProtocolError("compressed frame with an empty payload")
    return _Prefix(flags, header_len, payload_len, raw_len)


def _check_int(name: str, value: Any) -> int:
    if type(value) is not int or not INT64_MIN <= value <= INT64_MAX:
        raise ProtocolError(f"field {name!r}: expected a 64-bit int, got {type(value).__name__}")
    return value


def _check_str(name: str, value: Any, limits: Limits) -> str:
    if type(value) is not str or len(value) > limits.max_string:
        raise ProtocolError(f"field {name!r}: expected a str of <= {limits.max_string} chars")
    return value


def _check_list(name: str, value: Any, limits: Limits) -> list:
    if type(value) is not list:
        raise ProtocolError(f"field {name!r}: expected a list, got {type(value).__name__}")
    if len(value) > limits.max_batch:
        raise LimitExceeded(f"field {name!r}: {len(value)} items (limit {limits.max_batch})")
    return value


def _check_field(name: str, kind: str, value: Any, limits: Limits) -> Any:
    if kind == "int":
        return _check_int(name, value)
    if kind == "bool":
        if type(value) is not bool:
            raise ProtocolError(f"field {name!r}: expected a bool")
        return value
    if kind == "str":
        return _check_str(name, value, limits)
    if kind == "float":
        if type(value) is not float:
            raise ProtocolError(f"field {name!r}: expected a float")
        return value
    items = _check_list(name, value, limits)
    if kind == "ints":
        return tuple(_check_int(name, v) for v in items)
    if kind == "bools":
        if any(type(v) is not bool for v in items):
            raise ProtocolError(f"field {name!r}: expected a list of bools")
        return tuple(items)
    return tuple(_check_str(name, v, limits) for v in items)  # strs


def _check_shape(key: str, shape: Any, limits: Limits) -> tuple[int, ...]:
    if type(shape) is not list or len(shape) > limits.max_array_ndim:
        raise LimitExceeded(
            f"array {key!r}: shape must be a list of <= {limits.max_array_ndim} dims"
        )
    for dim in shape:
        if type(dim) is not int or not 0 <= dim <= limits.max_vocab:
            raise LimitExceeded(f"array {key!r}: dimension {dim!r} outside 0..{limits.max_vocab}")
    if math.prod(shape) > limits.max_array_elements:
        raise LimitExceeded(
            f"array {key!r}: {math.prod(shape)} elements (limit {limits.max_array_elements})"
        )
    return tuple(shape)


def _unpack_header(data: bytes) -> Any:
    size = len(data)
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=size,
            max_bin_len=0,
            max_array_len=size,
            max_map_len=size,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types; all mean "bad bytes"
        raise ProtocolError(f"undecodable frame header: {type(exc).__name__}") from None


def parse_header(data: bytes, raw_len: int, limits: Limits) -> _Plan:
    """Validate a header against the message schema and the limits; nothing is allocated
    for the payload yet."""
    header = _unpack_header(data)
    if type(header) is not dict or header.keys() != {"t", "f", "a", "b"}:
        raise ProtocolError("frame header must be a map with keys t, f, a, b")
    code = header["t"]
    cls = MESSAGE_TYPES.get(code) if type(code) is int else None
    if cls is None:
        raise ProtocolError(f"unknown message type {code!r}")
    kinds = cls.KINDS
    scalar_names = {n for n, k in kinds.items() if k not in ("arrays", "bytes", "blobs")}
    raw_fields = header["f"]
    if type(raw_fields) is not dict or raw_fields.keys() != scalar_names:
        raise ProtocolError(f"{cls.__name__}: header fields do not match the message schema")
    fields = {
        name: _check_field(name, kinds[name], raw_fields[name], limits) for name in raw_fields
    }

    arrays, total = [], 0
    descs = _check_list("arrays", header["a"], limits)
    if descs and "arrays" not in kinds.values():
        raise ProtocolError(f"{cls.__name__} carries no arrays")
    seen: set[str] = set()
    for desc in descs:
        if type(desc) is not list or len(desc) != 3:
            raise ProtocolError("array descriptor must be [key, dtype, shape]")
        key = _check_str("array key", desc[0], limits)
        if key in seen:
            raise ProtocolError(f"array {key!r} given twice")
        seen.add(key)
        if type(desc[1]) is not str or desc[1] not in DTYPES:
            raise ProtocolError(f"array {key!r}: dtype {desc[1]!r} is not allowed")
        shape = _check_shape(key, desc[2], limits)
        arrays.append((key, desc[1], shape))
        total += math.prod(shape) * DTYPES[desc[1]].itemsize

    blob_names = {n for n, k in kinds.items() if k in ("bytes", "blobs")}
    blobs = []
    entries = _check_list("blobs", header["b"], limits)
    if [e[0] if type(e) is list and e else None for e in entries] != [
        n for n in kinds if n in blob_names
    ]:
        raise ProtocolError(f"{cls.__name__}: blob fields do not match the message schema")
    for entry in entries:
        if len(entry) != 2:
            raise ProtocolError("blob descriptor must be [field, [lengths]]")
        name, lengths = entry
        lengths = _check_list(name, lengths, limits)
        if kinds[name] == "bytes" and len(lengths) != 1:
            raise ProtocolError(f"field {name!r}: exactly one blob expected")
        for length in lengths:
            if type(length) is not int or not 0 <= length <= raw_len:
                raise ProtocolError(f"field {name!r}: bad blob length {length!r}")
            total += length
        blobs.append((name, lengths))
    if total != raw_len:
        raise ProtocolError(f"header describes {total} payload bytes, frame carries {raw_len}")
    return _Plan(cls, fields, arrays, blobs)


def _decompress(payload: bytes, flags: int, raw_len: int) -> bytes:
    """Decompress to exactly raw_len bytes, never allocating more than that."""
    if flags == 0:
        return payload
    try:
        if COMPRESSION_NAMES[flags] == "lz4":
            import lz4.block

            raw = lz4.block.decompress(payload, uncompressed_size=raw_len)
        else:
            import zstandard

            # a zstd frame may state its own content size, which decompress() would trust
            if zstandard.frame_content_size(payload) != raw_len:
                raise ProtocolError("zstd frame content size does not match the frame prefix")
            raw = zstandard.ZstdDecompressor().decompress(payload, max_output_size=raw_len)
    except ProtocolError:
        raise
    except Exception as exc:  # LZ4BlockError, ZstdError, ValueError: all corrupt input
        raise ProtocolError(f"corrupt compressed payload: {type(exc).__name__}") from None
    if len(raw) != raw_len:
        raise ProtocolError(f"payload decompressed to {len(raw)} bytes, expected {raw_len}")
    return raw


def build_message(plan: _Plan, raw: bytes, limits: Limits) -> Message:
    """The Message a validated plan and its (decompressed) payload describe."""
    values = dict(plan.fields)
    offset = 0
    arrays = {}
    for key, code, shape in plan.arrays:
        count = math.prod(shape)
        if code == "b1" and count and np.frombuffer(raw, np.uint8, count, offset).max() > 1:
            raise ProtocolError(f"array {key!r}: bool bytes other than 0/1")
        array = np.frombuffer(raw, DTYPES[code], count, offset).reshape(shape)
        arrays[key] = array.astype(DTYPES[code].newbyteorder("="), copy=True)
        offset += count * DTYPES[code].itemsize
    for name, kind in plan.cls.KINDS.items():
        if kind == "arrays":
            values[name] = arrays
    for name, lengths in plan.blobs:
        chunks = []
        for length in lengths:
            chunks.append(raw[offset : offset + length])
            offset += length
        values[name] = chunks[0] if plan.cls.KINDS[name] == "bytes" else tuple(chunks)
    msg = plan.cls(**values)
    problem = check_message(msg, limits)
    if problem:
        raise ProtocolError(f"{plan.cls.__name__}: {problem}")
    return msg


def check_message(msg: Message, limits: Limits) -> str | None:
    """What is semantically wrong with a well-formed message (None if nothing)."""
    if isinstance(msg, Hello) and not 0 <= msg.vocab_size <= limits.max_vocab:
        return f"vocab_size {msg.vocab_size} outside 0..{limits.max_vocab}"
    tokens = getattr(msg, "tokens", None)
    if tokens is not None:
        if any(not 0 <= t < limits.max_vocab for t in tokens):
            return "token id outside the vocabulary limit"
        distributions = getattr(msg, "distributions", ())
        if len(distributions) not in (0, len(tokens)):
            return f"{len(distributions)} distributions for {len(tokens)} tokens"
    return None


class FrameParser:
    """Sans-I/O frame parser: `receive_data(bytes)` in any split, `next_event()` out.

    `next_event()` returns a Message, None (needs more data), or CONNECTION_CLOSED once
    `receive_data(b"")` marked the end of the stream at a frame boundary. Raises
    ProtocolError (and then keeps raising it) on anything malformed or over `limits`.
    """

    def __init__(self, *, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._buffer = bytearray()
        self._eof = False
        self._state = "PREFIX"
        self._prefix: _Prefix | None = None
        self._plan: _Plan | None = None
        self._error: ProtocolError | None = None
        self.message_bytes = 0  # size of the last message returned: prefix + header + raw payload

    @property
    def state(self) -> str:
        return self._state

    @property
    def buffered(self) -> int:
        """Bytes received but not yet turned into a message."""
        return len(self._buffer)

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the stream; b"" means the stream has ended."""
        if self._eof and data:
            raise RuntimeError("receive_data() after end of stream")
        if data:
            self._buffer += data
        else:
            self._eof = True

    def next_event(self) -> Message | ConnectionClosed | None:
        if self._error is not None:
            raise type(self._error)(*self._error.args)
        try:
            return self._next_event()
        except ProtocolError as exc:
            self._state = "ERROR"
            self._error = exc
            self._buffer.clear()
            raise

    def _take(self, size: int) -> bytes:
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def _need_data(self) -> ConnectionClosed | None:
        if not self._eof:
            return None
        if self._state == "PREFIX" and not self._buffer:
            self._state = "CLOSED"
            return CONNECTION_CLOSED
        if self._state == "CLOSED":
            return CONNECTION_CLOSED
        raise ProtocolError(f"stream ended inside a frame ({len(self._buffer)} bytes pending)")

    def _next_event(self) -> Message | ConnectionClosed | None:
        if self._state == "PREFIX":
            if len(self._buffer) < PREFIX.size:
                return self._need_data()
            self._prefix = parse_prefix(self._take(PREFIX.size), self.limits)
            self._state = "HEADER"
        prefix = self._prefix
        if self._state == "HEADER":
            if len(self._buffer) < prefix.header_len:
                return self._need_data()
            self._plan = parse_header(self._take(prefix.header_len), prefix.raw_len, self.limits)
            self._state = "PAYLOAD"
        if self._state == "PAYLOAD":
            if len(self._buffer) < prefix.payload_len:
                return self._need_data()
            raw = _decompress(self._take(prefix.payload_len), prefix.flags, prefix.raw_len)
            msg = build_message(self._plan, raw, self.limits)
            self.message_bytes = PREFIX.size + prefix.header_len + prefix.raw_len
            self._state, self._prefix, self._plan = "PREFIX", None, None
            return msg
        return self._need_data()  # CLOSED
