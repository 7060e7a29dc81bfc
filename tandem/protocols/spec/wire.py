"""Speculative decoding's events as `tandem.transport` messages (the only module that knows
the mapping).

    event                          message
    start (device -> cloud)        Start: mode "spec" | "ar" | "private-spec", tokens = prompt
                                   ids, body {"config": SpecConfig, ...}
    ready (cloud -> device)        Ready: body {model, prefill_s}
    verify request                 VerifyRequest: position of tokens[0], tokens = fixed + drafts,
                                   codec, distributions = one payload per draft (none under
                                   separate rejection; an empty one per fixed token before
                                   them: an eager branch), arrays: meta = int64 [epoch,
                                   num_fixed, final], draft_at = float32 [drafts] (separate only)
    verdict (the interrupt)        VerifyResult: position of the first draft, num_accepted,
                                   next_token (-1: none), payload = top-K target row with codec
                                   "top-k" (separate rejection), arrays: meta = int64 [epoch,
                                   rejected], verify_s = float64 [1]. A rejection is PicoSpec's
                                   interrupt: the device stops drafting as soon as it arrives.
    device interrupt               Interrupt: seq = the epoch the device continues with,
                                   position = output tokens kept (the cloud rolls back)
    end (device -> cloud)          End: tokens = the output
    stats (cloud -> device)        Stats: body = cloud measurements
    cloud AR token                 TargetToken: position, token (baseline "ar"; pipeline
                                   eager: a token the cloud committed on its own, arrays:
                                   step_s = float64 [1], its forward pass time; 0 when
                                   it needed none: the free step after a full acceptance)
    eager verdict                  VerifyResult as above, arrays also tokens = int64 [n]: every
                                   token it commits (accepted drafts, then the residual)
    failure                        Error, code "spec"

Start/Ready/End/Stats are the transport's session-control messages (tandem.transport.control),
the same for every mode.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from tandem.codecs import Codec
from tandem.protocols.spec.config import SEPARATE
from tandem.protocols.spec.drafter import Chunk
from tandem.protocols.spec.separate import sparse_draft_rows
from tandem.protocols.spec.verifier import Request, Result
from tandem.transport import (
    Error,
    Interrupt,
    Start,
    TargetToken,
    VerifyRequest,
    VerifyResult,
    control,
)


def start_message(mode: str, config_json: dict, prompt, **extra) -> Start:
    """The session's first message: `mode`, the SpecConfig's JSON, the prompt's ids."""
    return control.start(mode, {"config": config_json, **extra}, prompt)


def request_message(seq: int, chunk: Chunk, codec_name: str) -> VerifyRequest:
    arrays = {"meta": np.array([chunk.epoch, len(chunk.fixed), int(chunk.final)], dtype=np.int64)}
    if codec_name == SEPARATE:
        arrays["draft_at"] = np.array([d.draft_at for d in chunk.drafts], dtype=np.float32)
        payloads: tuple[bytes, ...] = ()
    else:  # the transport wants one per token: fixed tokens (an eager branch's) get none
        payloads = (b"",) * len(chunk.fixed) + tuple(d.payload for d in chunk.drafts)
    return VerifyRequest(
        seq=seq,
        position=chunk.position,
        tokens=chunk.tokens,
        codec=codec_name,
        distributions=payloads,
        arrays=arrays,
    )


def parse_request(
    msg: VerifyRequest, *, codec_name: str, codec: Codec | None, vocab_size: int
) -> Request:
    """The cloud's view of a request, draft rows decoded; ValueError if malformed."""
    meta = msg.arrays.get("meta")
    if msg.codec != codec_name or meta is None or meta.shape != (3,):
        raise ValueError(f"verify request with codec {msg.codec!r} or meta missing")
    epoch, num_fixed, final = (int(x) for x in meta)
    tokens = tuple(int(t) for t in msg.tokens)
    if not 0 <= num_fixed <= len(tokens) or any(not 0 <= t < vocab_size for t in tokens):
        raise ValueError("verify request with bad fixed count or token ids")
    fixed, drafts = tokens[:num_fixed], tokens[num_fixed:]
    rows = None
    if drafts and codec is None:
        draft_at = msg.arrays.get("draft_at")
        if draft_at is None or draft_at.shape != (len(drafts),):
            raise ValueError("separate verify request without one draft_at per draft")
        values = torch.from_numpy(draft_at.astype(np.float32))
        if not bool(((values > 0) & (values <= 1)).all()):
            raise ValueError("draft_at outside (0, 1]")
        rows = sparse_draft_rows(torch.tensor(drafts), values, vocab_size)
    elif drafts:
        if len(msg.distributions) != len(tokens) or any(msg.distributions[:num_fixed]):
            raise ValueError("verify request without one distribution per draft")
        rows = torch.stack([codec.decode(p, vocab_size) for p in msg.distributions[num_fixed:]])
        at = rows.gather(1, torch.tensor(drafts).view(-1, 1))
        if not bool((at > 0).all()):
            raise ValueError("a draft token is outside its sent distribution's support")
    return Request(
        seq=msg.seq,
        epoch=epoch,
        position=msg.position,
        fixed=fixed,
        drafts=drafts,
        draft_rows=rows,
        final=bool(final),
    )


def result_message(result: Result) -> VerifyResult:
    return VerifyResult(
        seq=result.seq,
        position=result.position,
        num_accepted=result.num_accepted,
        next_token=-1 if result.next_token is None else result.next_token,
        codec="top-k" if result.target_payload else "",
        payload=result.target_payload,
        arrays={
            "meta": np.array([result.epoch, int(result.rejected)], dtype=np.int64),
            "verify_s": np.array([result.verify_s], dtype=np.float64),
        },
    )


def eager_result_message(result: Result, tokens: tuple[int, ...]) -> VerifyResult:
    """An eager verdict: `result_message` plus the tokens it commits (eager.py)."""
    msg = result_message(result)
    return replace(msg, arrays={**msg.arrays, "tokens": np.array(tokens, dtype=np.int64)})


def token_message(position: int, token: int, step_s: float) -> TargetToken:
    """A token the eager cloud committed by itself (an AR step)."""
    arrays = {"step_s": np.array([step_s], dtype=np.float64)}
    return TargetToken(seq=position, position=position, token=token, arrays=arrays)


def parse_token(msg: TargetToken) -> dict:
    """An eager AR token as the fields `parse_result` gives (tokens = (token,))."""
    step_s = msg.arrays.get("step_s")
    if step_s is None or step_s.shape != (1,) or msg.token < 0:
        raise ValueError("malformed eager token")
    return {"position": msg.position, "tokens": (int(msg.token),), "step_s": float(step_s[0])}


def parse_result(msg: VerifyResult) -> dict:
    """Fields of a verdict as `Drafter.apply` takes them, plus `verify_s` and `rejected`."""
    meta = msg.arrays.get("meta")
    verify_s = msg.arrays.get("verify_s")
    if meta is None or meta.shape != (2,) or verify_s is None or verify_s.shape != (1,):
        raise ValueError("malformed verify result")
    return {
        "epoch": int(meta[0]),
        "position": msg.position,
        "num_accepted": msg.num_accepted,
        "next_token": None if msg.next_token < 0 else msg.next_token,
        "target_payload": msg.payload,
        "rejected": bool(meta[1]),
        "verify_s": float(verify_s[0]),
    } | ({"tokens": tuple(int(t) for t in msg.arrays["tokens"])} if "tokens" in msg.arrays else {})


def interrupt_message(epoch: int, position: int, reason: str = "") -> Interrupt:
    return Interrupt(seq=epoch, position=position, reason=reason)


def error_message(text: str) -> Error:
    return Error(code="spec", message=text[:4000])
