"""Sparse codecs: the most probable tokens, their ids and float16 probabilities.

Words used here:
- *kept*: the K token ids sent, in decreasing probability; *dropped mass*: 1 - their mass.
- `TopKCodec` ("top-k"): the k most probable tokens with non-zero probability.
- `TopPCodec` ("top-p", DRAGON section 7.1, p = 0.8): the smallest set of most probable
  tokens whose mass is >= p.
- *kept form*: a sparse law as its kept ids and their sent values ([K] int64, [K] float32),
  without the [vocab] array (`encode_kept_sent`, `decode_kept`): what greedy consumers read.
- *softmax single*: a top-p set that a float32 softmax row proves to be its argmax alone
  without summing the row (`softmax_single_id`): most greedy drafts of a peaked law.

Wire format (both): with w = ceil(log2 V) bits,
    [K - 1 : w bits][id_1 : w bits] ... [id_K : w bits][zero pad to a byte]
    [value_1 : float16 LE] ... [value_K : float16 LE]
so bits = w (K + 1) + 16 K and bytes = ceil(w (K + 1) / 8) + 2 K. Fixed-width ids work for
any vocabulary (18 bits for Qwen's 151,936; DRAGON's code stores int16 offsets that wrap
above ~62k, DESIGN errata 2). The receiver renormalizes the values exactly.

Error bound: TV(probs, sent) <= dropped + fp16 bound of the kept values (`fp16_tv_bound`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tandem.codecs.base import (
    BitReader,
    BitWriter,
    CodecBase,
    CodecError,
    Sent,
    as_numpy_probs,
    ceil_log2,
    check_vocab_size,
    checked_mass,
    normalized_fp16,
    to_fp16,
)
from tandem.codecs.dense import fp16_tv_bound

CANDIDATE_THRESHOLDS = (1e-3, 1e-5)  # tried in turn before sorting the whole vocabulary


def sorted_head(
    probs: np.ndarray, *, count: int = 0, mass: float = 0.0, total: float = 1.0
) -> np.ndarray:
    """Ids of the law `probs` / `total` ([vocab]; `total` 1 for normalized `probs`) in
    decreasing probability (ties: lower id first), at least `count` of them or enough to
    reach `mass`, else all of them.

    Only entries above a threshold are sorted (and divided by `total`) when they suffice; the
    result is the same prefix a full stable sort of the normalized law gives, just cheaper.
    """
    for threshold in CANDIDATE_THRESHOLDS:
        # a superset of the entries whose normalized value reaches the threshold (the margin
        # covers the rounding of the division), then the exact test on those few
        near = np.flatnonzero(probs >= threshold * total * (1 - 1e-9))
        normalized = probs[near] / total
        reached = normalized >= threshold
        candidates, normalized = near[reached], normalized[reached]
        order = np.argsort(-normalized, kind="stable")
        if order.shape[0] >= max(count, 1) and normalized[order].cumsum()[-1] >= mass:
            return candidates[order]
    return np.argsort(-(probs / total), kind="stable")


def top_sorted(probs: np.ndarray, count: int, *, total: float = 1.0) -> np.ndarray:
    """Ids of the `count` largest entries of `probs` ([vocab]), in decreasing probability."""
    return sorted_head(probs, count=count, total=total)[:count]


def top_k_ids(probs: np.ndarray, k: int, *, total: float = 1.0) -> np.ndarray:
    """The min(k, nnz) most probable ids of the law `probs` / `total` ([vocab])."""
    ids = top_sorted(probs, k, total=total)
    return ids[probs[ids] > 0]


def top_p_ids(probs: np.ndarray, top_p: float, *, total: float = 1.0) -> np.ndarray:
    """The fewest most probable ids of the law `probs` / `total` ([vocab]) with mass >= top_p."""
    # most drafts: the most probable token alone reaches top_p. Distinct float32 values stay
    # distinct divided by a float64 total (or by 1), so the argmax (ties: the lowest id) is the
    # first entry of the normalized law's stable sort, and alone it is the first prefix
    # reaching top_p exactly when the test below holds (the same division as the sorted path)
    if probs.dtype == np.float32 and (isinstance(total, np.float64) or total == 1.0):
        best = int(probs.argmax())
        if probs[best] / total >= top_p:
            return np.array([best], dtype=np.int64)
    ids = sorted_head(probs, mass=top_p, total=total)
    mass = np.cumsum(probs[ids] / total)
    num_kept = int(np.searchsorted(mass, top_p)) + 1  # the first prefix reaching top_p
    ids = ids[: min(num_kept, ids.shape[0])]
    return ids[probs[ids] > 0]


def softmax_sum_bound(vocab_size: int) -> float:
    """How far from 1 the float64 total of a float32 softmax row of `vocab_size` entries can
    be. The softmax divides each exponential by their float32 sum S', which any summation
    order of n positive terms gets within gamma = n u / (1 - n u) of their exact sum S (u =
    2^-24, n = vocab_size); the total is S / S' up to a few u of per-entry rounding, and
    |S / S' - 1| <= gamma / (1 - gamma) = n u / (1 - 2 n u). 0.0092 for Qwen's 151,936."""
    nu = vocab_size * 2.0**-24
    return nu / (1 - 2 * nu) + 8 * 2.0**-24 if nu < 0.25 else math.inf


def softmax_single_id(probs: np.ndarray, top_p: float) -> int | None:
    """The id `top_p_ids(probs, top_p, total=probs.sum())` keeps alone, when the row proves it
    without the total: `probs` ([vocab] float32) must be one float32 softmax row, so its total
    is within `softmax_sum_bound` of 1, and the argmax (the one `top_p_ids` takes) holds at
    least top_p (1 + bound) of it. None otherwise (then the caller computes the total: also
    for NaN, which a softmax of non-finite logits gives and the general path refuses)."""
    best = int(np.argmax(probs))  # NaN is the largest for numpy: fails the test below
    bound = softmax_sum_bound(probs.shape[0])
    return best if float(probs[best]) >= top_p * (1 + bound) * (1 + 1e-12) else None


def index_width(vocab_size: int) -> int:
    return ceil_log2(vocab_size)


def sparse_bits(vocab_size: int, num_kept: int) -> int:
    return index_width(vocab_size) * (num_kept + 1) + 16 * num_kept


def encode_sparse(probs: np.ndarray, ids: np.ndarray) -> bytes:
    """Payload for the kept `ids` ([K], K >= 1) of `probs` ([vocab])."""
    return encode_kept(probs.shape[0], ids, probs[ids])


SMALL_SUPPORT = 64  # up to this many kept ids, the id bits go through BitWriter / BitReader


def encode_kept(vocab_size: int, ids: np.ndarray, kept: np.ndarray) -> bytes:
    """Payload for the kept `ids` ([K], K >= 1) and their probabilities `kept` ([K])."""
    width = index_width(vocab_size)
    values = to_fp16(kept).astype("<f2").tobytes()
    if ids.shape[0] <= SMALL_SUPPORT:  # a few fields: fewer calls than numpy's bit arrays
        writer = BitWriter()
        for field in [ids.shape[0] - 1, *ids.tolist()]:
            writer.write(field, width)
        return writer.to_bytes() + values
    fields = np.concatenate([[ids.shape[0] - 1], ids]).astype(np.int64)  # [K + 1]
    shifts = np.arange(width - 1, -1, -1, dtype=np.int64)  # [w], most significant first
    bits = ((fields[:, None] >> shifts) & 1).astype(np.uint8)  # [K + 1, w]
    return np.packbits(bits.reshape(-1)).tobytes() + values


def decode_sparse(data: bytes, vocab_size: int) -> torch.Tensor:
    """[vocab] float32 probs from a sparse payload; CodecError if it is malformed."""
    return decode_sparse_support(data, vocab_size)[0]


def decode_sparse_support(data: bytes, vocab_size: int) -> tuple[torch.Tensor, np.ndarray]:
    """([vocab] float32 probs, [K] int64 kept ids) from a sparse payload."""
    ids, values = decode_kept(data, vocab_size)
    return torch.from_numpy(sent_array(vocab_size, ids, values)), ids


def sent_array(vocab_size: int, ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """[vocab] float32: `values` at `ids` (a kept form), 0 elsewhere."""
    sent = np.zeros(vocab_size, dtype=np.float32)
    sent[ids] = values
    return sent


def decode_kept(data: bytes, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """([K] int64 kept ids, [K] float32 sent values) of a sparse payload, in payload order;
    CodecError if it is malformed."""
    check_vocab_size(vocab_size)
    width = index_width(vocab_size)
    data = bytes(data)
    head_bytes = (width + 7) // 8
    if len(data) < head_bytes:
        raise CodecError("sparse payload too short")
    num_kept = (int.from_bytes(data[:head_bytes], "big") >> (8 * head_bytes - width)) + 1
    if num_kept > vocab_size:
        raise CodecError(f"sparse payload keeps {num_kept} of {vocab_size} tokens")
    id_bytes = (width * (num_kept + 1) + 7) // 8
    if len(data) != id_bytes + 2 * num_kept:
        raise CodecError(f"sparse payload of {len(data)} bytes, expected {id_bytes + 2 * num_kept}")
    if num_kept <= SMALL_SUPPORT:  # a few fields: read as encode_kept wrote them
        reader = BitReader(data[:id_bytes])
        reader.read(width)  # the count, read above
        listed = [reader.read(width) for _ in range(num_kept)]
        reader.finish()  # the padding bits are zero
        ids = np.array(listed, dtype=np.int64)
    else:
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8, count=id_bytes))
        if bits[width * (num_kept + 1) :].any():
            raise CodecError("sparse payload padding bits are not zero")
        id_bits = bits[width : width * (num_kept + 1)].reshape(num_kept, width).astype(np.int64)
        ids = id_bits @ (1 << np.arange(width - 1, -1, -1, dtype=np.int64))  # [K]
        listed = ids.tolist()
    if max(listed) >= vocab_size or len(set(listed)) != num_kept:
        raise CodecError("sparse payload has out-of-range or repeated token ids")
    return ids, normalized_fp16(np.frombuffer(data, dtype="<f2", offset=id_bytes))


class SparseCodec(CodecBase):
    """Shared encode/decode; subclasses choose the kept ids."""

    def kept_ids(self, probs: np.ndarray, *, total: float = 1.0) -> np.ndarray:
        """The ids kept of the law `probs` / `total` ([vocab])."""
        raise NotImplementedError

    def encode(self, probs: torch.Tensor) -> bytes:
        values = as_numpy_probs(probs)
        return encode_sparse(values, self.kept_ids(values))

    def decode(self, data: bytes, vocab_size: int) -> torch.Tensor:
        return decode_sparse(data, vocab_size)

    def encode_sent(self, probs: torch.Tensor) -> Sent:
        """One validation and one sort for all three (DRAGON drafts every token with this);
        the support is the kept ids. Only the kept entries are normalized (the same numbers
        as `as_numpy_probs` gives them)."""
        payload, ids, values = self.encode_kept_sent(probs)
        vocab_size = probs.shape[-1]
        return Sent(payload, torch.from_numpy(sent_array(vocab_size, ids, values)), ids)

    def encode_kept_sent(self, probs: torch.Tensor) -> tuple[bytes, np.ndarray, np.ndarray]:
        """`encode_sent` in the kept form: (payload, [K] kept ids, [K] float32 sent values),
        the numbers `encode_sent` puts at those ids, without its [vocab] array."""
        values, total = checked_mass(probs)
        ids = self.kept_ids(values, total=total)
        kept = values[ids] / total
        return encode_kept(values.shape[0], ids, kept), ids, normalized_fp16(to_fp16(kept))

    def decode_sent(self, data: bytes, vocab_size: int) -> tuple[torch.Tensor, np.ndarray]:
        return decode_sparse_support(data, vocab_size)

    def decode_kept(self, data: bytes, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
        """`decode_sent` in the kept form: ([K] ids, [K] float32 sent values)."""
        return decode_kept(data, vocab_size)

    def softmax_kept(self, probs: torch.Tensor) -> tuple[bytes, np.ndarray, np.ndarray] | None:
        """`encode_kept_sent(probs)` for a float32 softmax row where the row decides it
        without its total, else None (here: never; `TopPCodec` decides most greedy drafts)."""
        return None

    def bits(self, probs: torch.Tensor) -> int:
        values = as_numpy_probs(probs)
        return sparse_bits(values.shape[0], self.kept_ids(values).shape[0])

    def _sent_row(self, probs: np.ndarray) -> np.ndarray:
        ids = self.kept_ids(probs)
        return sent_array(probs.shape[0], ids, normalized_fp16(to_fp16(probs[ids])))

    def tv_bound(self, probs: torch.Tensor) -> float:
        """Upper bound on TV(probs, transmitted_probs(probs)) for this [vocab] input."""
        values = as_numpy_probs(probs)
        kept = values[self.kept_ids(values)]
        return min(1.0, 1.0 - float(kept.sum()) + fp16_tv_bound(kept))


class TopKCodec(SparseCodec):
    name = "top-k"

    def __init__(self, *, k: int = 32) -> None:
        if k < 1:
            raise CodecError(f"top-k needs k >= 1, got {k}")
        self.k = k

    def kept_ids(self, probs: np.ndarray, *, total: float = 1.0) -> np.ndarray:
        return top_k_ids(probs, self.k, total=total)


class TopPCodec(SparseCodec):
    name = "top-p"

    def __init__(self, *, p: float = 0.8) -> None:
        if not 0 < p <= 1:
            raise CodecError(f"top-p needs 0 < p <= 1, got {p}")
        self.p = p

    def kept_ids(self, probs: np.ndarray, *, total: float = 1.0) -> np.ndarray:
        return top_p_ids(probs, self.p, total=total)

    def softmax_kept(self, probs: torch.Tensor) -> tuple[bytes, np.ndarray, np.ndarray] | None:
        """`encode_kept_sent(probs)` for a float32 softmax row ([vocab]) whose argmax alone
        reaches p whatever its total (`softmax_single_id`), else None: the same kept id and
        sent value (one id, value 1) without the pass that sums and checks the vocabulary.
        The payload's one value field holds 1: a single value always decodes to exactly 1."""
        best = softmax_single_id(probs.numpy(), self.p)
        if best is None:
            return None
        ids, values = np.array([best], dtype=np.int64), np.ones(1, dtype=np.float32)
        return encode_kept(probs.shape[0], ids, values), ids, values
