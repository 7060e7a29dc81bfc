"""DRAGON's events as `tandem.transport` messages (the only module that knows the mapping).

    event                      message
    start (device -> cloud)    Start: mode "dragon", body = JSON (settings, question, profile)
    ready (cloud -> device)    Ready: body = JSON (cloud profile, document count, ready_s)
    padding burst              DraftTokens, codec "dragon.pad", position -1 (ignored)
    timeline (cloud -> device) Stats: body = the cloud's `profiler.Timeline.summary()` (only
                               when `DragonConfig.timeline`; sent once the cloud is done)
    draft                      DraftTokens: position, tokens = (token,), codec name,
                               distributions = (payload,), arrays["meta"] = float64
                               [epoch, logweight, decode_s, context]; a branch draft also
                               arrays["branch"] = int64 [t, x] (queues.py); when
                               mirroring arrays["stamp"] = int64 [n, crc] (machine.py)
    target token               TargetToken: position, token, accepted = (device, cloud)
    switch                     SwitchAggregator: position, target_token, aggregator
    failure                    Error, code "dragon"

Start/Ready/Stats are the transport's session-control messages (tandem.transport.control);
padding rides on DraftTokens with a reserved codec name and a negative position (never a
real draft). Documents never travel: only counts and scores' summaries (logweights) do.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tandem.codecs import Codec
from tandem.codecs.sparse import SparseCodec
from tandem.protocols.dragon.config import DragonConfig
from tandem.protocols.dragon.queues import Draft
from tandem.transport import DraftTokens, Error, Start, SwitchAggregator, TargetToken, control

MODE = "dragon"  # Start.mode
PAD = "dragon.pad"


def control_message(kind: str, seq: int, body: dict, *, padding: int = 0) -> DraftTokens:
    return control.control_message(kind, body, seq=seq, padding=padding)


def is_pad(msg: object) -> bool:
    return control.control_kind(msg, (PAD,)) is not None


def start_message(*, config: DragonConfig, question: str, profile: list[float]) -> Start:
    body = {"config": config.to_json(), "question": question, "profile": profile}
    return control.start(MODE, body)


def pad_message(seq: int, nbytes: int) -> DraftTokens:
    return control_message(PAD, seq, {}, padding=nbytes)


def draft_message(
    seq: int, draft: Draft, codec_name: str, stamp: tuple[int, int] | None = None
) -> DraftTokens:
    arrays = {
        "meta": np.array(
            [draft.epoch, draft.logweight, draft.decode_s, draft.context], dtype=np.float64
        )
    }
    if draft.branch_of is not None:
        arrays["branch"] = np.array(draft.branch_of, dtype=np.int64)
    if stamp is not None:
        arrays["stamp"] = np.array(stamp, dtype=np.int64)
    return DraftTokens(
        seq=seq,
        position=draft.position,
        tokens=(draft.token,),
        codec=codec_name,
        distributions=(draft.payload,),
        arrays=arrays,
    )


def parse_draft(msg: DraftTokens, *, side: str, codec: Codec, vocab_size: int) -> Draft:
    """The peer's draft, with its sent probs decoded exactly as the peer computed them."""
    if len(msg.tokens) != 1 or len(msg.distributions) != 1:
        raise ValueError("a DRAGON draft carries exactly one token and one distribution")
    meta = msg.arrays.get("meta")
    meta = meta.tolist() if meta is not None and meta.shape == (4,) else None
    if meta is None or not all(map(math.isfinite, meta[:1] + meta[2:])):  # logweight: -inf ok
        raise ValueError("DRAGON draft without its [epoch, logweight, decode_s, context]")
    epoch, logweight, decode_s, context = meta
    token = int(msg.tokens[0])
    branch = msg.arrays.get("branch")
    branch_of = None
    if branch is not None:
        if branch.shape != (2,) or branch.dtype.kind not in "iu":
            raise ValueError("DRAGON branch draft without its [position, token]")
        branch_of = (int(branch[0]), int(branch[1]))
        if branch_of[0] + 1 != int(msg.position) or not 0 <= branch_of[1] < vocab_size:
            raise ValueError(f"DRAGON branch {branch_of} does not precede position {msg.position}")
    common = dict(side=side, position=int(msg.position), epoch=int(epoch), token=token)
    common.update(logweight=float(logweight), payload=msg.distributions[0])
    common.update(decode_s=float(decode_s), context=int(context), branch_of=branch_of)
    if isinstance(codec, SparseCodec):  # the kept form: no [vocab] array
        ids, values = codec.decode_kept(msg.distributions[0], vocab_size)
        held = values[ids == token]
        if not 0 <= token < vocab_size or not (held.shape[0] and held[0] > 0):
            raise ValueError(_NOT_HELD.format(token=token))
        kept = torch.from_numpy(ids)
        return Draft(dense=None, support=kept, values=values, vocab_size=vocab_size, **common)
    sent_probs, _ = codec.decode_sent(msg.distributions[0], vocab_size)  # no support: dense
    if not 0 <= token < vocab_size or not sent_probs[token] > 0:
        raise ValueError(_NOT_HELD.format(token=token))
    return Draft(dense=sent_probs, **common)


_NOT_HELD = "draft token {token} is not in the support of its sent distribution"


def draft_stamp(msg: DraftTokens) -> tuple[int, int] | None:
    """The (resolved count, prefix CRC) a mirroring peer sent with its draft, if any."""
    stamp = msg.arrays.get("stamp")
    if stamp is None:
        return None
    if stamp.shape != (2,) or stamp.dtype.kind not in "iu" or not 0 <= stamp[1] < 2**32:
        raise ValueError("DRAGON draft stamp is not [resolved count, crc32]")
    if stamp[0] < 0:
        raise ValueError(f"DRAGON draft stamp counts {int(stamp[0])} resolved tokens")
    return int(stamp[0]), int(stamp[1])


def target_message(seq: int, position: int, token: int, accepted: dict[str, bool]) -> TargetToken:
    return TargetToken(
        seq=seq,
        position=position,
        token=token,
        accepted=(accepted["device"], accepted["cloud"]),
    )


def switch_message(seq: int, position: int, token: int, aggregator: str) -> SwitchAggregator:
    return SwitchAggregator(seq=seq, position=position, target_token=token, aggregator=aggregator)


def error_message(text: str) -> Error:
    return Error(code="dragon", message=text[:4000])


# ---- baselines (tandem.baselines.dragon) ----------------------------------------------
#
#     event                         message
#     baseline start (dev -> cloud) Start: mode = the method's name, body: settings, question
#     documents (cloud -> device)   control "dragon.base.docs": texts (DRCG/Text only)
#     KV part (cloud -> device)     control "dragon.base.kv" + arrays["blob"] = uint8 bytes of
#                                   a safetensors state, in parts (DRCG/KV only)
#     sequence (cloud -> device)    "dragon.base.seq": tokens = the cloud's whole answer,
#                                   distributions = one codec payload per token (DRDG/SW)
#
# Documents cross the network only in DRCG's messages (that is what DRCG is).

BASE_DOCS, BASE_KV, BASE_SEQ = "dragon.base.docs", "dragon.base.kv", "dragon.base.seq"
BASE_KINDS = (BASE_DOCS, BASE_KV, BASE_SEQ)


def base_kind(msg: object) -> str | None:
    """One of BASE_KINDS for a baseline control message, None for anything else."""
    return control.control_kind(msg, BASE_KINDS)


def blob_message(kind: str, body: dict, blob: bytes, *, seq: int = 0) -> DraftTokens:
    """A control frame whose JSON body travels with raw bytes (`arrays["blob"]`)."""
    msg = control.control_message(kind, body, seq=seq)
    arrays = {**msg.arrays, "blob": np.frombuffer(blob, dtype=np.uint8)}
    return DraftTokens(seq=seq, position=-1, tokens=(), codec=kind, arrays=arrays)


def message_blob(msg: DraftTokens) -> bytes:
    blob = msg.arrays.get("blob")
    if blob is None or blob.dtype != np.uint8 or blob.ndim != 1:
        raise ValueError(f"{msg.codec} message without its bytes")
    return blob.tobytes()


def sequence_message(
    tokens: list[int], payloads: list[bytes], *, codec_name: str, logweight: float
) -> DraftTokens:
    """A side's whole answer with the codec payload of its law at every position."""
    head = control.control_message(BASE_SEQ, {"codec": codec_name, "logweight": logweight})
    return DraftTokens(
        seq=0,
        position=-1,
        tokens=tuple(int(t) for t in tokens),
        codec=BASE_SEQ,
        distributions=tuple(payloads),
        arrays=head.arrays,
    )
