"""Session control: build and read the typed Start / Ready / End / Stats messages (their
JSON bodies), and the protocols' data-carrying control frames.

Every mode opens with `Start` (the cloud's registry dispatches on `Start.mode`), is set up
when the cloud answers `Ready`, and may close with `End` (device) and `Stats` (cloud) before
the channel's Bye. What a mode puts in the JSON bodies is its own (its config, question,
measurements); this module only encodes and checks them.

A few protocol messages carry data that has no message type of its own (DRAGON's padding
bursts, the DRAGON baselines' documents, KV parts and whole sequences): they ride on a
`DraftTokens` frame with position -1 and a reserved codec name (the *kind*), a JSON body in
`arrays["body"]` (`control_message` / `control_kind`; `body` reads them too).
"""

from __future__ import annotations

import json

import numpy as np

from tandem.transport.messages import DraftTokens, End, Ready, Start, Stats


def _json(body: dict) -> bytes:
    return json.dumps(body).encode()


def start(mode: str, body: dict | None = None, tokens: tuple[int, ...] = ()) -> Start:
    """The first message of a `mode` session: settings `body`, prompt `tokens`."""
    return Start(mode=mode, tokens=tokens, body=_json(body or {}))


def ready(body: dict | None = None) -> Ready:
    return Ready(body=_json(body or {}))


def end(tokens: tuple[int, ...] = ()) -> End:
    return End(tokens=tokens)


def stats(body: dict) -> Stats:
    return Stats(body=_json(body))


def body(msg: Start | Ready | Stats | DraftTokens) -> dict:
    """The JSON body of a control message; ValueError when it is malformed."""
    if isinstance(msg, DraftTokens):
        blob = msg.arrays.get("body")
        raw, name = (blob.tobytes() if blob is not None else b""), msg.codec
    else:
        raw, name = msg.body, type(msg).__name__
    try:
        value = json.loads(raw.decode()) if raw else None
    except (ValueError, UnicodeDecodeError):
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"malformed {name} message")
    return value


def start_mode(msg: object) -> str | None:
    """The mode a session's first message asks for; None when it is not a Start."""
    return msg.mode if isinstance(msg, Start) else None


def control_message(
    kind: str, body: dict, *, seq: int = 0, tokens: tuple[int, ...] = (), padding: int = 0
) -> DraftTokens:
    """A data-carrying control frame of `kind` with JSON `body` and `padding` extra bytes."""
    blob = np.frombuffer(_json(body) + b" " * padding, dtype=np.uint8)
    return DraftTokens(seq=seq, position=-1, tokens=tokens, codec=kind, arrays={"body": blob})


def control_kind(msg: object, kinds: tuple[str, ...] | frozenset[str]) -> str | None:
    """The kind of a control frame whose kind is in `kinds`, None for anything else."""
    if isinstance(msg, DraftTokens) and msg.position < 0 and msg.codec in kinds:
        return msg.codec
    return None
