"""The codec protocol: a next-token distribution <-> bytes, with the law the receiver holds.

Words used here:
- *probs*: a distribution over the vocabulary, a float tensor `[vocab]` (some methods also
  take `[batch, vocab]`); inputs need not sum to exactly 1 (they are normalized in float64).
- *payload*: the bytes a codec puts on the wire for one distribution. It carries only the
  distribution: the drafted token and the message framing belong to `tandem.transport`.
- *sent probs*: `transmitted_probs(probs)`, exactly what `decode(encode(probs))` returns. A
  drafter samples its draft from the sent probs, never from the original (the QS principle of
  SQS-SD; DESIGN errata 2), so verification on the other side stays exact.
- *bits*: the information bits of a payload, by the codec's size formula; a payload is
  exactly `ceil(bits / 8)` bytes.

Codec parameters (k, p, ell, ...) are configuration both sides agree on before talking; they
are never on the wire. Decoding is stateless for every codec; only the sender of C-SQS has
state (its conformal threshold), advanced through `observe` / `checkpoint` / `backtrack`,
which are no-ops for the other codecs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch

from tandem.errors import TandemError
from tandem.sampling.warp import sample_one

MAX_VOCAB = 1 << 24  # larger vocabularies are refused before anything is allocated


class CodecError(TandemError, ValueError):
    """A payload that does not decode (wrong length, out-of-range field), or unusable probs."""


class Sent(NamedTuple):
    """One row as a drafter holds it after encoding: the payload, the sent probs, and the
    *support*, ids outside which the sent probs are exactly 0 (None where the codec does not
    keep them: dense codecs). A sparse codec's support lets greedy consumers look at a few
    ids instead of the whole vocabulary."""

    payload: bytes
    probs: torch.Tensor  # [vocab] float32
    support: np.ndarray | None = None  # [kept] int64, any order


@runtime_checkable
class Codec(Protocol):
    """Distribution <-> bytes. `decode(encode(probs))` equals `transmitted_probs(probs)` bit
    for bit; `len(encode(probs)) == ceil(bits(probs) / 8)`."""

    name: str

    # probs: [vocab]
    def encode(self, probs: torch.Tensor) -> bytes: ...

    # returns [vocab] float32 on the CPU
    def decode(self, data: bytes, vocab_size: int) -> torch.Tensor: ...

    # probs: [vocab]
    def bits(self, probs: torch.Tensor) -> int: ...

    # probs: [vocab] or [batch, vocab] -> same shape, float32, same device
    def transmitted_probs(self, probs: torch.Tensor) -> torch.Tensor: ...

    def wire_params(self) -> dict[str, int]:
        """The parameters `decode` depends on; both sides must agree on them (handshake)."""
        ...

    # probs: [vocab] -> Sent(encode(probs), transmitted_probs(probs), support or None)
    def encode_sent(self, probs: torch.Tensor) -> Sent: ...

    # -> (decode(data, vocab_size), the support of those probs or None)
    def decode_sent(
        self, data: bytes, vocab_size: int
    ) -> tuple[torch.Tensor, np.ndarray | None]: ...

    # probs: [vocab]; an upper bound on TV(probs, transmitted_probs(probs))
    def tv_bound(self, probs: torch.Tensor) -> float: ...

    # probs: [vocab]; called once per drafted token, after encoding it
    def observe(self, probs: torch.Tensor) -> None: ...

    def checkpoint(self) -> None: ...

    def backtrack(self, num_accepted: int = 0) -> None: ...


class CodecBase:
    """Shared plumbing: batched `transmitted_probs` from `_sent_row`, no-op state hooks."""

    name = "base"

    def wire_params(self) -> dict[str, int]:
        return {}

    def _sent_row(self, probs: np.ndarray) -> np.ndarray:
        """[vocab] float64 normalized -> [vocab] float32 sent probs."""
        raise NotImplementedError

    # probs: [vocab] or [batch, vocab]
    def transmitted_probs(self, probs: torch.Tensor) -> torch.Tensor:
        sent = np.stack([self._sent_row(as_numpy_probs(row)) for row in probs_rows(probs)])
        return torch.from_numpy(sent).reshape(probs.shape).to(probs.device)

    def encode_sent(self, probs: torch.Tensor) -> Sent:
        """Payload and sent probs of one [vocab] row; codecs that can share the work between
        the two override this (a drafter needs both for every token). No support here."""
        return Sent(self.encode(probs), self.transmitted_probs(probs))

    def decode_sent(self, data: bytes, vocab_size: int) -> tuple[torch.Tensor, np.ndarray | None]:
        """`decode`, with the support where the codec knows it (here: None)."""
        return self.decode(data, vocab_size), None

    def observe(self, probs: torch.Tensor) -> None:
        """Stateless: nothing to learn from a drafted token."""

    def checkpoint(self) -> None:
        """Stateless: nothing to remember."""

    def backtrack(self, num_accepted: int = 0) -> None:
        """Stateless: nothing to restore."""


@dataclass(frozen=True)
class Draft:
    """One drafted token with the distribution it was sampled from and its payload."""

    token: int
    sent_probs: torch.Tensor  # [vocab] float32: what the receiver will reconstruct
    payload: bytes


def draft(codec: Codec, draft_probs: torch.Tensor, generator: torch.Generator) -> Draft:
    """Encode `draft_probs` ([vocab]), sample the draft token from the sent probs, advance the
    codec's sender state. This is the QS step every drafter should use."""
    payload, sent_probs, _ = codec.encode_sent(draft_probs)
    token = sample_one(sent_probs, generator)
    codec.observe(draft_probs)
    return Draft(token=token, sent_probs=sent_probs, payload=payload)


def tv_distance(probs_a: torch.Tensor, probs_b: torch.Tensor) -> float:
    """Total variation distance between two [vocab] distributions (each normalized first)."""
    a = as_numpy_probs(probs_a)
    b = as_numpy_probs(probs_b)
    return 0.5 * float(np.abs(a - b).sum())


def probs_rows(probs: torch.Tensor) -> torch.Tensor:
    """[vocab] or [batch, vocab] -> [batch, vocab] (a view); CodecError for other shapes."""
    if probs.dim() not in (1, 2):
        raise CodecError(f"expected probs [vocab] or [batch, vocab], got {tuple(probs.shape)}")
    return probs.reshape(-1, probs.shape[-1])


def as_numpy_probs(probs: torch.Tensor | np.ndarray) -> np.ndarray:
    """[vocab] tensor -> [vocab] float64 numpy array summing to 1 (up to float64 rounding).

    Raises CodecError for a wrong shape, a non-finite or negative entry, or zero total mass.
    """
    values, total = checked_mass(probs)
    return values / total


def checked_mass(probs: torch.Tensor | np.ndarray) -> tuple[np.ndarray, float]:
    """([vocab] values, their float64 total), checked as `as_numpy_probs` checks them, whose
    result is values / total: a caller that needs few entries divides only those (float64
    numbers) instead of the whole vocabulary. float32 and float64 values come back as they
    are (no widened copy of the vocabulary: the total is summed in float64 all the same, and
    dividing a float32 entry by it widens it exactly); other dtypes as float64."""
    if isinstance(probs, torch.Tensor):
        probs = probs.detach().cpu()
        if probs.dtype not in (torch.float32, torch.float64):
            probs = probs.float()
        probs = probs.numpy()  # numpy converts without torch's thread pool (much faster here)
    values = np.asarray(probs)
    if values.dtype not in (np.float32, np.float64):
        values = values.astype(np.float64)
    if values.ndim != 1 or values.shape[0] < 1:
        raise CodecError(f"expected probs of shape [vocab], got {tuple(values.shape)}")
    if values.shape[0] > MAX_VOCAB:
        raise CodecError(f"vocabulary of {values.shape[0]} exceeds the limit {MAX_VOCAB}")
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, a signalling NaN: refused below
        total = values.sum(dtype=np.float64)  # NaN or inf anywhere makes it non-finite
    if not np.isfinite(total) or values.min() < 0:
        raise CodecError("probs must be finite and non-negative")
    if not total > 0:
        raise CodecError("probs have zero total mass")
    return values, total


def check_vocab_size(vocab_size: int) -> None:
    if not 1 <= vocab_size <= MAX_VOCAB:
        raise CodecError(f"vocab_size {vocab_size} outside [1, {MAX_VOCAB}]")


def normalized_fp16(values: np.ndarray) -> np.ndarray:
    """float16 values [n] -> float32 [n] summing to 1, bit-reproducible on any platform.

    Every float16 is a multiple of 2**-24 below 2**16, so for fewer than 2**24 values their
    float64 sum is exact in any order; the widening is exact, the division and the cast are
    correctly rounded.
    """
    half = np.asarray(values, dtype=np.float16)
    if half.shape == (1,):  # one kept token (most greedy drafts): v / v, without numpy's calls
        value = float(half[0])
        if not math.isfinite(value) or value < 0:
            raise CodecError("decoded values are negative or non-finite")
        if not value > 0:
            raise CodecError("decoded values are all zero")
        return np.ones(1, dtype=np.float32)
    if half.shape[0] > 1024:  # torch widens a long vector about twice as fast as numpy
        wide = torch.from_numpy(np.array(half)).float().numpy().astype(np.float64)
    else:  # a sparse law's few values: numpy, without torch's per-call cost
        wide = half.astype(np.float64)  # both widenings are exact: the same numbers
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, a signalling NaN: refused below
        total = wide.sum()  # exact; NaN or inf anywhere makes it non-finite
    if not np.isfinite(total) or (wide.shape[0] and wide.min() < 0):
        raise CodecError("decoded values are negative or non-finite")
    if not total > 0:
        raise CodecError("decoded values are all zero")
    return (wide / total).astype(np.float32)


def to_fp16(values: np.ndarray) -> np.ndarray:
    """[n] floats -> [n] float16, rounded to nearest even from float32. Uses torch's vectorized
    cast (numpy's is ~50x slower); only senders round, so the path need not match elsewhere."""
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).half().numpy()


def ceil_log2(count: int) -> int:
    """Bits needed to tell `count` >= 1 cases apart: ceil(log2(count)), exactly."""
    assert count >= 1, count
    return (count - 1).bit_length()


class BitWriter:
    """Concatenates unsigned fields of given widths, most significant bit first."""

    def __init__(self) -> None:
        self._value = 0
        self.num_bits = 0

    def write(self, value: int, width: int) -> None:
        assert 0 <= value < (1 << width) or (value == 0 and width == 0), (value, width)
        self._value = (self._value << width) | value
        self.num_bits += width

    def to_bytes(self) -> bytes:
        """The fields, zero-padded at the end to a whole byte: ceil(num_bits / 8) bytes."""
        pad = -self.num_bits % 8
        return (self._value << pad).to_bytes((self.num_bits + pad) // 8, "big")


class BitReader:
    """Reads fields written by `BitWriter`; `finish()` checks the padding and the length."""

    def __init__(self, data: bytes) -> None:
        self._value = int.from_bytes(data, "big")
        self._left = 8 * len(data)

    def read(self, width: int) -> int:
        if width > self._left:
            raise CodecError("payload too short")
        self._left -= width
        return (self._value >> self._left) & ((1 << width) - 1)

    def finish(self) -> None:
        if self._left >= 8:
            raise CodecError("payload has trailing bytes")
        if self._value & ((1 << self._left) - 1):
            raise CodecError("payload padding bits are not zero")
