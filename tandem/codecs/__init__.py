"""tandem.codecs: next-token distributions <-> bytes, each with its inverse and bit count.

`make_codec(name, **params)` builds one by name (`CODEC_NAMES`); both sides of a link build
the same codec from the same configuration. See `tandem.codecs.base` for the protocol and
docs/codecs.md for every wire format, size formula and error bound.
"""

from __future__ import annotations

from typing import Any

from tandem.codecs.base import (
    Codec,
    CodecBase,
    CodecError,
    Draft,
    Sent,
    draft,
    tv_distance,
)
from tandem.codecs.dense import DenseCodec, IdentityCodec
from tandem.codecs.sparse import TopKCodec, TopPCodec
from tandem.codecs.sqs import ConformalThreshold, CSQSCodec, KSQSCodec

_CODECS: dict[str, type] = {
    "identity": IdentityCodec,
    "dense": DenseCodec,
    "top-k": TopKCodec,
    "top-p": TopPCodec,
    "k-sqs": KSQSCodec,
    "c-sqs": CSQSCodec,
}
CODEC_NAMES = tuple(_CODECS)


def make_codec(name: str, **params: Any) -> Codec:
    """A fresh codec by name, e.g. `make_codec("top-p", p=0.8)`, `make_codec("k-sqs", k=8)`.

    Parameters: top-k: k=32; top-p: p=0.8; k-sqs: k=32, ell=100; c-sqs: ell=100,
    alpha=0.0005, eta=0.001, beta=0.001, max_support=1024; dense, identity: none.
    """
    if name not in _CODECS:
        raise CodecError(f"unknown codec {name!r}; choose one of {', '.join(CODEC_NAMES)}")
    try:
        return _CODECS[name](**params)
    except TypeError as error:
        raise CodecError(f"bad parameters for codec {name!r}: {error}") from None


__all__ = [
    "CODEC_NAMES",
    "CSQSCodec",
    "Codec",
    "CodecBase",
    "CodecError",
    "ConformalThreshold",
    "DenseCodec",
    "Draft",
    "IdentityCodec",
    "KSQSCodec",
    "Sent",
    "TopKCodec",
    "TopPCodec",
    "draft",
    "make_codec",
    "tv_distance",
]
