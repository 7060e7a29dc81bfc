"""Fuzzing the frame parser: random and mutated frames only ever give ProtocolError.

No other exception, no hang (every call returns), and bounded memory: the parser never
buffers more than one frame's worth (prefix + max header + max payload) and refuses
oversized claims before allocating.
"""

from __future__ import annotations

import random
import struct

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.transport import CONNECTION_CLOSED, FrameParser, Limits, ProtocolError, encode_message
from tandem.transport.messages import Message
from tandem.transport.wire import PREFIX

from .support import sample_messages

# small limits make the limit checks reachable by random data
LIMITS = Limits(
    max_header_bytes=4096,
    max_payload_bytes=1 << 16,
    max_decompressed_bytes=1 << 16,
    max_vocab=1 << 17,
    max_batch=64,
    max_array_elements=1 << 14,
)
MAX_BUFFERED = PREFIX.size + LIMITS.max_header_bytes + LIMITS.max_payload_bytes
VALID_FRAMES = [
    encode_message(m, compression=c)
    for m in sample_messages()
    for c in (None, "lz4", "zstd")
    if len(encode_message(m)) < LIMITS.max_payload_bytes
]
FIELD_VALUES = [0, -1, 1, 2**31, 2**63, -(2**63), 2**64 - 1, 1.5, "x", "", b"b", None, True, [], {}, [1, 2],
                {"k": 1}, [[1]], ["x", "f4", [2]], [2**40], "f4", "O", [-1], "\u2603" * 10]  # fmt: skip


def feed(data: bytes, rng: random.Random) -> list[Message]:
    """Feed `data` in random splits then end of stream; return the messages. Any exception
    other than ProtocolError fails the test."""
    parser = FrameParser(limits=LIMITS)
    out = []
    pos = 0
    try:
        while pos < len(data):
            step = rng.choice((1, 2, 7, 16, 64, 4096, len(data)))
            parser.receive_data(data[pos : pos + step])
            pos += step
            assert parser.buffered <= MAX_BUFFERED
            while (event := parser.next_event()) is not None:
                out.append(event)
        parser.receive_data(b"")
        while (event := parser.next_event()) is not CONNECTION_CLOSED:
            assert event is not None
            out.append(event)
    except ProtocolError:
        pass
    return out


def mutate_header(frame: bytes, rng: random.Random) -> bytes:
    """Structure-aware: decode the msgpack header, change one value, re-encode."""
    try:
        _, _, flags, header_len, payload_len, raw_len = PREFIX.unpack_from(frame)
        header = msgpack.unpackb(frame[PREFIX.size : PREFIX.size + header_len], raw=False)
    except Exception:  # an earlier mutation broke it: nothing to walk
        return frame[::-1]
    if not isinstance(header, dict | list):
        return frame[::-1]
    payload = frame[PREFIX.size + header_len :]
    paths = []

    def walk(node, path):
        paths.append(path)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*path, key))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, (*path, i))

    walk(header, ())
    if len(paths) < 2:  # an empty header (an earlier mutation emptied it): nothing to change
        return frame[::-1]
    path = rng.choice(paths[1:])
    parent = header
    for step in path[:-1]:
        parent = parent[step]
    action = rng.random()
    if action < 0.7:
        parent[path[-1]] = rng.choice(FIELD_VALUES)
    elif isinstance(parent, dict):
        if action < 0.85:
            del parent[path[-1]]
        else:
            parent["extra"] = rng.choice(FIELD_VALUES)
    else:
        parent.append(rng.choice(FIELD_VALUES))
    new_header = msgpack.packb(header, use_bin_type=True)
    prefix = PREFIX.pack(b"TD", 1, flags, len(new_header), payload_len, raw_len)
    return prefix + new_header + payload


def mutate(frame: bytes, rng: random.Random) -> bytes:
    kind = rng.randrange(7) if len(frame) > PREFIX.size else 4  # short: only insert
    data = bytearray(frame)
    if kind == 0:  # flip bytes anywhere
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == 1:  # flip bytes in the prefix
        data[rng.randrange(PREFIX.size)] = rng.randrange(256)
    elif kind == 2:  # random size fields
        offset = rng.choice((4, 8, 12))
        struct.pack_into(
            "<I", data, offset, rng.choice((0, 1, 2**31, 2**32 - 1, rng.randrange(2**32)))
        )
    elif kind == 3:  # truncate
        del data[rng.randrange(len(data)) :]
    elif kind == 4:  # insert random bytes
        pos = rng.randrange(len(data) + 1)
        data[pos:pos] = rng.randbytes(rng.randint(1, 8))
    elif kind == 5:
        return mutate_header(frame, rng)
    else:  # splice two frames
        other = rng.choice(VALID_FRAMES)
        data = data[: rng.randrange(len(data))] + other[rng.randrange(len(other)) :]
    return bytes(data)


def random_frame(rng: random.Random) -> bytes:
    """Random bytes, half of them behind a plausible prefix so the header is reached."""
    body = rng.randbytes(rng.randint(0, 64))
    if rng.random() < 0.5:
        return body
    flags = rng.choice((0, 0, 1, 2))
    payload_len = rng.randint(0, 32)
    raw_len = payload_len if flags == 0 else rng.randint(0, 64)
    prefix = PREFIX.pack(b"TD", 1, flags, len(body), payload_len, raw_len)
    return prefix + body + rng.randbytes(payload_len)


def test_mutated_frames_100k_only_protocol_errors():
    rng = random.Random(1234)
    frames = parsed = 0
    while frames < 100_000:
        batch = [mutate(rng.choice(VALID_FRAMES), rng) if rng.random() < 0.8 else random_frame(rng)
                 for _ in range(rng.randint(1, 3))]  # fmt: skip
        if rng.random() < 0.3:  # a valid frame first: the parser must get past it
            batch.insert(0, rng.choice(VALID_FRAMES))
        parsed += len(feed(b"".join(batch), rng))
        frames += len(batch)
    assert parsed > 10_000  # the valid leaders (and harmless mutations) do parse


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=512), seed=st.integers(0, 2**32))
def test_hypothesis_random_bytes(data, seed):
    feed(data, random.Random(seed))
    feed(b"TD\x01\x00" + data, random.Random(seed))


@settings(max_examples=500, deadline=None)
@given(index=st.integers(0, len(VALID_FRAMES) - 1), seed=st.integers(0, 2**32),
       mutations=st.integers(1, 3))  # fmt: skip
def test_hypothesis_mutated_frames(index, seed, mutations):
    rng = random.Random(seed)
    frame = VALID_FRAMES[index]
    for _ in range(mutations):
        frame = mutate(frame, rng)
    feed(frame, rng)


@pytest.mark.parametrize("claim", [2**32 - 1, 2**31, LIMITS.max_payload_bytes + 1])
def test_huge_claims_refused_with_nothing_buffered(claim):
    parser = FrameParser(limits=LIMITS)
    parser.receive_data(PREFIX.pack(b"TD", 1, 0, 10, claim, claim))
    with pytest.raises(ProtocolError):
        parser.next_event()
    assert parser.buffered == 0
