"""Shared test material: one sample of every message type, and test configs."""

from __future__ import annotations

import numpy as np

from tandem.transport import (
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
    TransportConfig,
    VerifyRequest,
    VerifyResult,
    Welcome,
)
from tandem.transport.messages import MESSAGE_TYPES


def sample_messages() -> list[Message]:
    """At least one instance of every message type, with non-default values."""
    rng = np.random.default_rng(0)
    topk_probs = rng.random((2, 8), dtype=np.float32)  # [rows, k]
    samples = [
        Hello(
            protocol_version=1,
            session_id="abc-1",
            role="device",
            tokenizer_hash="f" * 64,
            vocab_size=151_936,
            model_name="qwen2.5-coder-0.5b",
            capabilities=("lz4", "zstd"),
        ),
        Challenge(nonce=bytes(range(32))),
        AuthResponse(mac=b"\x01" * 32, nonce=b"\x02" * 32),
        Welcome(session_id="abc-1", mac=b"\x03" * 32, capabilities=("zstd",)),
        Refuse(code="auth", reason="authentication failed: wrong shared secret"),
        DraftTokens(
            seq=7,
            position=120,
            tokens=(5, 151_935, 0),
            codec="k-sqs",
            distributions=(b"\x00\x01", b"", bytes(range(256)) * 3),
            arrays={"draft_topk_ids": np.array([[1, 2], [3, 4], [5, 6]], dtype=np.int32)},
        ),
        DraftTokens(seq=0, position=0, tokens=()),  # empty draft, no distributions
        TargetToken(
            seq=8,
            position=121,
            token=42,
            accepted=(True, False),
            arrays={"local_probs": np.linspace(0, 1, 10, dtype=np.float16)},
        ),
        VerifyRequest(
            seq=9,
            position=3,
            tokens=(1, 2, 3, 4),
            codec="dense-fp16",
            distributions=tuple(bytes([i]) * (i + 1) for i in range(4)),
            arrays={
                "mask": np.array([True, False, True]),
                "big": np.arange(3000, dtype=np.int64).reshape(30, 100),
                "f8": np.array([np.nan, -np.inf, 1.5]),
                "u2": np.array([[[65535]]], dtype=np.uint16),
                "empty": np.zeros((0, 4), dtype=np.float32),
            },
        ),
        VerifyResult(
            seq=10,
            position=3,
            num_accepted=2,
            next_token=99,
            codec="topk-8",
            payload=b"\x10\x20" * 40,
            arrays={"target_topk_probs": topk_probs, "ids": np.array([-1, 7], dtype=np.int8)},
        ),
        SwitchAggregator(seq=11, position=130, target_token=17, aggregator="cloud"),
        Interrupt(seq=12, position=118, reason="draft rejected"),
        Ping(seq=13, sent_ns=123_456_789_012),
        Pong(seq=13, ping_sent_ns=123_456_789_012, sent_ns=-5),
        Error(code="busy", message="über-busy: ✓ unicode survives"),
        Bye(reason="done"),
        Bye(),
        # session control (appended: tests index the samples above)
        Start(mode="spec", tokens=(1, 2, 151_935), body=b'{"config": {"draft_len": 4}}'),
        Start(mode="rapid"),
        Ready(body=b'{"model": "m", "prefill_s": 0.5}'),
        End(tokens=(3, 4)),
        End(),
        Stats(body=b"{}"),
    ]
    assert {type(m) for m in samples} == set(MESSAGE_TYPES.values())
    return samples


def config(**overrides) -> TransportConfig:
    """A loopback test config: shared secret, toy fingerprint, fast heartbeats."""
    values = dict(
        secret=b"test-secret",
        role="device",
        tokenizer_hash="toy-tokenizer",
        vocab_size=300,
        ping_interval=0.5,
        dead_peer_timeout=5.0,
        handshake_timeout=5.0,
    )
    values.update(overrides)
    return TransportConfig(**values)
