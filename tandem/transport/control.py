"""Control messages: a small JSON body carried by a `DraftTokens` frame with position -1.

The transport has no dedicated session-control message yet; the collaboration protocols
(spec, DRAGON) mark control frames by a reserved codec name (the *kind*) and position -1.
This module is the one place that encodes and decodes their body.
"""

from __future__ import annotations

import json

import numpy as np

from tandem.transport.messages import DraftTokens


def control_message(
    kind: str, body: dict, *, seq: int = 0, tokens: tuple[int, ...] = (), padding: int = 0
) -> DraftTokens:
    """A control frame of `kind` carrying `body` (JSON) and `padding` extra bytes."""
    blob = np.frombuffer(json.dumps(body).encode() + b" " * padding, dtype=np.uint8)
    return DraftTokens(seq=seq, position=-1, tokens=tokens, codec=kind, arrays={"body": blob})


def control_kind(msg: object, kinds: tuple[str, ...] | frozenset[str]) -> str | None:
    """The kind of a control frame whose kind is in `kinds`, None for anything else."""
    if isinstance(msg, DraftTokens) and msg.position < 0 and msg.codec in kinds:
        return msg.codec
    return None


def control_body(msg: DraftTokens) -> dict:
    """The JSON body of a control frame; ValueError when it is malformed."""
    blob = msg.arrays.get("body")
    try:
        body = json.loads(blob.tobytes().decode()) if blob is not None else None
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        raise ValueError(f"malformed {msg.codec} message")
    return body
