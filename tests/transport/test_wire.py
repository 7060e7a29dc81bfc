"""The frame format: every message round-trips whole, byte by byte, with trailing bytes;
malformed or oversized frames are refused with ProtocolError before allocating."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tandem.transport import (
    CONNECTION_CLOSED,
    DraftTokens,
    FrameParser,
    Hello,
    LimitExceeded,
    Limits,
    Ping,
    ProtocolError,
    VerifyRequest,
    VerifyResult,
    encode_message,
)
from tandem.transport.wire import PREFIX

from .support import sample_messages

COMPRESSIONS = [None, "lz4", "zstd"]
SAMPLES = sample_messages()
IDS = [f"{type(m).__name__}{i}" for i, m in enumerate(SAMPLES)]


def parse_all(data: bytes, *, chunk: int | None = None, limits: Limits | None = None) -> list:
    """Feed `data` in chunks of `chunk` bytes (all at once if None), then end of stream."""
    parser = FrameParser(limits=limits)
    events = []
    chunks = [data] if chunk is None else [data[i : i + chunk] for i in range(0, len(data), chunk)]
    for piece in chunks:
        parser.receive_data(piece)
        while (event := parser.next_event()) is not None:
            events.append(event)
    parser.receive_data(b"")
    events.append(parser.next_event())
    return events


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("msg", SAMPLES, ids=IDS)
def test_round_trip_whole(msg, compression):
    events = parse_all(encode_message(msg, compression=compression))
    assert events == [msg, CONNECTION_CLOSED]
    assert type(events[0]) is type(msg)


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("msg", SAMPLES, ids=IDS)
def test_round_trip_byte_by_byte(msg, compression):
    frame = encode_message(msg, compression=compression)
    parser = FrameParser()
    for i, byte in enumerate(frame):
        assert parser.next_event() is None  # nothing complete before the last byte
        parser.receive_data(bytes([byte]))
        if i < len(frame) - 1:
            assert parser.next_event() is None
    assert parser.next_event() == msg
    assert parser.next_event() is None


@pytest.mark.parametrize("msg", SAMPLES, ids=IDS)
def test_round_trip_with_trailing_partial_frame(msg):
    frame = encode_message(msg)
    nxt = encode_message(Ping(seq=1, sent_ns=2))
    parser = FrameParser()
    parser.receive_data(frame + nxt[:7])
    assert parser.next_event() == msg
    assert parser.next_event() is None
    assert parser.buffered == 7
    parser.receive_data(nxt[7:])
    assert parser.next_event() == Ping(seq=1, sent_ns=2)
    parser.receive_data(b"")
    assert parser.next_event() is CONNECTION_CLOSED


def test_all_samples_in_one_stream_any_split():
    stream = b"".join(
        encode_message(m, compression=COMPRESSIONS[i % 3]) for i, m in enumerate(SAMPLES)
    )
    for chunk in (1, 3, 16, 17, 1000, None):
        assert parse_all(stream, chunk=chunk) == [*SAMPLES, CONNECTION_CLOSED]


def test_arrays_keep_dtype_shape_and_are_writable():
    msg = SAMPLES[8]
    out = parse_all(encode_message(msg))[0]
    for key, array in msg.arrays.items():
        assert out.arrays[key].dtype == array.dtype and out.arrays[key].shape == array.shape
        assert out.arrays[key].flags.writeable and out.arrays[key].flags.aligned


def test_big_endian_and_numpy_scalars_are_normalised():
    msg = VerifyRequest(
        seq=np.int64(3),
        position=np.int32(0),
        tokens=[np.int64(5), 6],
        arrays={"x": np.arange(4, dtype=">f4"), "t": np.arange(6).reshape(2, 3).T},
    )
    out = parse_all(encode_message(msg))[0]
    assert out.tokens == (5, 6) and out.seq == 3
    assert out.arrays["x"].dtype == np.float32
    np.testing.assert_array_equal(out.arrays["x"], [0, 1, 2, 3])
    np.testing.assert_array_equal(out.arrays["t"], [[0, 3], [1, 4], [2, 5]])
    assert type(out.seq) is int


def test_inequality_is_detected():
    a = SAMPLES[9]
    b = VerifyResult(**{**{n: getattr(a, n) for n in a.KINDS}, "arrays": {}})
    assert a != b
    assert a != VerifyResult(**{**{n: getattr(a, n) for n in a.KINDS}, "next_token": 98})


def test_compression_shrinks_redundant_payload_and_is_skipped_when_useless():
    msg = DraftTokens(seq=1, position=0, tokens=(1,), arrays={"z": np.zeros(10_000, np.float32)})
    plain = encode_message(msg)
    for compression in ("lz4", "zstd"):
        packed = encode_message(msg, compression=compression)
        assert len(packed) < len(plain) / 20
        assert packed[3] != 0  # flag set
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)
    msg = DraftTokens(seq=1, position=0, tokens=(1,), arrays={"n": noise})
    assert encode_message(msg, compression="lz4")[3] == 0  # incompressible: sent plain


def test_encoder_rejects_disallowed_dtypes_and_unknown_compression():
    with pytest.raises(ValueError, match="not allowed"):
        encode_message(
            DraftTokens(seq=0, position=0, tokens=(), arrays={"o": np.array([object()])})
        )
    with pytest.raises(ValueError, match="not allowed"):
        encode_message(
            DraftTokens(seq=0, position=0, tokens=(), arrays={"c": np.ones(2, np.complex64)})
        )
    with pytest.raises(ValueError, match="compression"):
        encode_message(Ping(seq=0, sent_ns=0), compression="gzip")


# ---- refusals -------------------------------------------------------------------------


def frame_with(prefix_fields=None, header=None, payload=b"") -> bytes:
    """A frame built by hand: defaults are a valid Ping."""
    header_bytes = msgpack.packb(
        header or {"t": 32, "f": {"seq": 1, "sent_ns": 2}, "a": [], "b": []}
    )
    fields = {"magic": b"TD", "version": 1, "flags": 0, "header": len(header_bytes),
              "payload": len(payload), "raw": len(payload)}  # fmt: skip
    fields.update(prefix_fields or {})
    prefix = PREFIX.pack(*fields.values())
    return prefix + header_bytes + payload


def refuse(data: bytes, match: str, *, limits: Limits | None = None, error=ProtocolError):
    parser = FrameParser(limits=limits)
    parser.receive_data(data)
    with pytest.raises(error, match=match):
        parser.next_event()
    # a broken parser stays broken
    with pytest.raises(error, match=match):
        parser.next_event()
    assert parser.state == "ERROR"


def test_hand_built_valid_frame_parses():
    assert parse_all(frame_with())[0] == Ping(seq=1, sent_ns=2)


def test_four_gigabyte_claim_refused_after_the_prefix():
    data = frame_with({"payload": 0xFFFFFFFF, "raw": 0xFFFFFFFF})[: PREFIX.size]
    refuse(data, "payload of 4294967295 bytes", error=LimitExceeded)


def test_decompression_bomb_claim_refused_before_decompressing():
    data = frame_with({"flags": 2, "payload": 10, "raw": 0xFFFFFFFF})[: PREFIX.size]
    refuse(data, "decompressed payload", error=LimitExceeded)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"magic": b"HT"}, "bad frame magic"),
        ({"version": 2}, "unsupported frame version 2"),
        ({"flags": 0x04}, "bad frame flags"),
        ({"flags": 0x03}, "bad frame flags"),
        ({"header": 0}, "frame header of 0 bytes"),
        ({"header": 70_000}, "frame header of 70000 bytes"),
        ({"payload": 5, "raw": 6}, "uncompressed frame"),
    ],
)
def test_bad_prefix(fields, match):
    refuse(frame_with(fields), match)


@pytest.mark.parametrize(
    ("header", "payload", "match"),
    [
        ({"t": 99, "f": {}, "a": [], "b": []}, b"", "unknown message type 99"),
        ({"t": 32, "f": {"seq": 1}, "a": [], "b": []}, b"", "do not match the message schema"),
        ({"t": 32, "f": {"seq": "1", "sent_ns": 2}, "a": [], "b": []}, b"", "expected a 64-bit int"),
        ({"t": 32, "f": {"seq": 2**64 - 1, "sent_ns": 2}, "a": [], "b": []}, b"", "64-bit"),
        ({"t": 32, "f": {"seq": True, "sent_ns": 2}, "a": [], "b": []}, b"", "64-bit"),
        ({"t": 32, "f": {"seq": 1, "sent_ns": 2}}, b"", "keys t, f, a, b"),
        ([1, 2, 3], b"", "keys t, f, a, b"),
        ({"t": 32, "f": {"seq": 1, "sent_ns": 2}, "a": [["x", "f4", [1]]], "b": []}, b"\0" * 4, "carries no arrays"),
    ],
)  # fmt: skip
def test_bad_header(header, payload, match):
    refuse(frame_with(header=header, payload=payload), match)


def draft_header(arrays=(), blobs=None, tokens=(1,)):
    return {
        "t": 16,
        "f": {"seq": 0, "position": 0, "tokens": list(tokens), "codec": ""},
        "a": [list(a) for a in arrays],
        "b": blobs if blobs is not None else [["distributions", []]],
    }


@pytest.mark.parametrize(
    ("header", "payload", "match"),
    [
        (draft_header([["x", "O8", [1]]]), b"\0" * 8, "dtype 'O8' is not allowed"),
        (draft_header([["x", "f4", [2**22]]]), b"", "dimension 4194304 outside"),
        (draft_header([["x", "f4", [2000, 2000, 2000]]]), b"", "elements"),
        (draft_header([["x", "f4", [1, 1, 1, 1, 1]]]), b"", "dims"),
        (draft_header([["x", "f4", [-1]]]), b"", "outside"),
        (draft_header([["x", "f4", [2]], ["x", "f4", [2]]]), b"\0" * 16, "given twice"),
        (draft_header([["x", "f4", [3]]]), b"\0" * 8, "describes 12 payload bytes"),
        (draft_header([["b", "b1", [2]]]), b"\x01\x02", "bool bytes"),
        (draft_header(blobs=[]), b"", "blob fields do not match"),
        (draft_header(blobs=[["distributions", [5]]]), b"\0" * 4, "bad blob length"),
        (draft_header(blobs=[["distributions", [1, 1]]]), b"\0\0", "2 distributions for 1 tokens"),
        (draft_header(tokens=[-3]), b"", "token id outside"),
        (draft_header(tokens=list(range(5000))), b"", "5000 items"),
    ],
)  # fmt: skip
def test_bad_arrays_and_blobs(header, payload, match):
    refuse(frame_with(header=header, payload=payload), match)


def test_hello_vocab_over_limit():
    msg = Hello(protocol_version=1, vocab_size=10**9)
    refuse(encode_message(msg), "vocab_size 1000000000")


def test_limits_are_configurable():
    msg = DraftTokens(seq=0, position=0, tokens=(1,), arrays={"x": np.zeros(100, np.float32)})
    small = Limits(max_array_elements=50)
    refuse(encode_message(msg), "100 elements", limits=small, error=LimitExceeded)
    refuse(encode_message(msg), "payload of", limits=Limits(max_payload_bytes=100))


def test_corrupt_compressed_payloads():
    msg = DraftTokens(seq=0, position=0, tokens=(1,), arrays={"z": np.zeros(1000, np.float32)})
    for compression in ("lz4", "zstd"):
        frame = bytearray(encode_message(msg, compression=compression))
        _, _, _, header_len, payload_len, raw_len = PREFIX.unpack_from(frame)
        # lie about the raw length by a little (consistent with a different header)
        start = PREFIX.size + header_len
        refuse(bytes(frame[:start]) + b"\xff" * payload_len, "compressed|content size")
    # zstd frame announcing more content than the prefix
    import zstandard

    header = draft_header([["x", "u1", [10]]])
    packed = zstandard.ZstdCompressor().compress(b"\0" * 1_000_000)
    data = frame_with({"flags": 2, "raw": 10}, header=header, payload=packed)
    data = data[:8] + struct.pack("<I", len(packed)) + data[12:]
    refuse(data, "content size does not match")


def test_end_of_stream_inside_a_frame():
    frame = encode_message(Ping(seq=1, sent_ns=1))
    for cut in (1, PREFIX.size, len(frame) - 1):
        parser = FrameParser()
        parser.receive_data(frame[:cut])
        assert parser.next_event() is None
        parser.receive_data(b"")
        with pytest.raises(ProtocolError, match="stream ended inside a frame"):
            parser.next_event()


def test_no_data_after_end_of_stream():
    parser = FrameParser()
    parser.receive_data(b"")
    assert parser.next_event() is CONNECTION_CLOSED
    assert parser.next_event() is CONNECTION_CLOSED
    with pytest.raises(RuntimeError):
        parser.receive_data(b"x")


def test_msgpack_ext_and_bin_types_refused():
    ext = msgpack.packb(
        {"t": 32, "f": {"seq": msgpack.ExtType(1, b"x"), "sent_ns": 0}, "a": [], "b": []}
    )
    data = frame_with({"header": len(ext)})[: PREFIX.size] + ext
    refuse(data, "undecodable frame header")
    timestamp = msgpack.packb(
        {"t": 32, "f": {"seq": msgpack.Timestamp(1, 0), "sent_ns": 0}, "a": [], "b": []}
    )
    refuse(frame_with({"header": len(timestamp)})[: PREFIX.size] + timestamp, "undecodable")
    binary = msgpack.packb({"t": 32, "f": {"seq": b"1", "sent_ns": 0}, "a": [], "b": []})
    refuse(frame_with({"header": len(binary)})[: PREFIX.size] + binary, "undecodable")


# ---- property: random well-formed messages round-trip in any split ---------------------

WIRE_DTYPES = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
               "float16", "float32", "float64"]  # fmt: skip


@st.composite
def verify_requests(draw):
    arrays = {}
    for key in draw(st.lists(st.text(max_size=8), max_size=3, unique=True)):
        dtype = draw(st.sampled_from(WIRE_DTYPES))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
        arrays[key] = draw(hnp.arrays(dtype, shape))
    tokens = draw(st.lists(st.integers(0, 151_935), max_size=8))
    distributions = draw(st.one_of(st.just([]), st.lists(st.binary(max_size=40),
                                                         min_size=len(tokens), max_size=len(tokens))))  # fmt: skip
    return VerifyRequest(
        seq=draw(st.integers(-(2**63), 2**63 - 1)),
        position=draw(st.integers(0, 2**40)),
        tokens=tokens,
        codec=draw(st.text(max_size=20)),
        distributions=distributions,
        arrays=arrays,
    )


@settings(max_examples=200, deadline=None)
@given(msg=verify_requests(), compression=st.sampled_from(COMPRESSIONS),
       chunk=st.integers(1, 64))  # fmt: skip
def test_random_messages_round_trip(msg, compression, chunk):
    frame = encode_message(msg, compression=compression)
    assert parse_all(frame + frame, chunk=chunk) == [msg, msg, CONNECTION_CLOSED]
