"""Dense codecs: every vocabulary entry on the wire.

- `DenseCodec` ("dense"): V float16 values, little-endian, 16 V bits. The receiver
  renormalizes them (exactly, see `normalized_fp16`).
  Error bound: with u = 2**-11 + 2**-23 (float16 unit roundoff, after a float32 rounding) and
  n_sub the number of entries below 2**-14 (float16 subnormals, absolute rounding error
  <= 2**-25), the float16 values are off by eps <= u + n_sub * 2**-25 in L1, and
  TV(probs, sent) <= eps / (1 - eps) + 2**-24 (the last term: the float32 output).
- `IdentityCodec` ("identity"): V float32 values, sent as given: the fake codec for tests of
  other layers (sent probs == probs, bit for bit).
"""

from __future__ import annotations

import numpy as np
import torch

from tandem.codecs.base import (
    CodecBase,
    CodecError,
    Sent,
    as_numpy_probs,
    check_vocab_size,
    normalized_fp16,
    probs_rows,
    to_fp16,
)

FP16_UNIT_ROUNDOFF = 2.0**-11 + 2.0**-23  # float16 roundoff, plus the float32 step before it
FP16_SUBNORMAL_BELOW = 2.0**-14
FP16_SUBNORMAL_ERROR = 2.0**-25
FLOAT32_OUTPUT_ERROR = 2.0**-24


def fp16_tv_bound(values: np.ndarray) -> float:
    """Bound on TV(values / sum, normalized_fp16(values as float16)) for float64 values [n].

    Each float16 rounding errs by <= u * |x|, or <= 2**-25 below 2**-14; relative to the total
    this is eps in L1, and renormalizing at most doubles the L1 error, divided by (1 - eps).
    """
    total = float(values.sum())
    num_subnormal = int((values < FP16_SUBNORMAL_BELOW).sum())
    eps = FP16_UNIT_ROUNDOFF + num_subnormal * FP16_SUBNORMAL_ERROR / total
    return min(1.0, eps / (1 - eps) + FLOAT32_OUTPUT_ERROR) if eps < 1 else 1.0


class DenseCodec(CodecBase):
    """All V probabilities as float16 (2 V bytes)."""

    name = "dense"

    def encode(self, probs: torch.Tensor) -> bytes:
        return to_fp16(as_numpy_probs(probs)).astype("<f2").tobytes()

    def encode_sent(self, probs: torch.Tensor) -> Sent:
        """`encode` and `transmitted_probs` of one row with one validation and one float16
        rounding (the base class does each twice: an eager draft step on a 64-token
        vocabulary spent 0.26 ms here, half of it repeated)."""
        half = to_fp16(as_numpy_probs(probs))
        sent = torch.from_numpy(normalized_fp16(half)).reshape(probs.shape).to(probs.device)
        return Sent(half.astype("<f2").tobytes(), sent)

    def decode(self, data: bytes, vocab_size: int) -> torch.Tensor:
        check_vocab_size(vocab_size)
        if len(data) != 2 * vocab_size:
            raise CodecError(f"dense payload of {len(data)} bytes, expected {2 * vocab_size}")
        return torch.from_numpy(normalized_fp16(np.frombuffer(data, dtype="<f2")))

    def bits(self, probs: torch.Tensor) -> int:
        return 16 * int(probs.shape[-1])

    def _sent_row(self, probs: np.ndarray) -> np.ndarray:
        return normalized_fp16(to_fp16(probs))

    def tv_bound(self, probs: torch.Tensor) -> float:
        """Upper bound on TV(probs, transmitted_probs(probs)) for this [vocab] input."""
        return fp16_tv_bound(as_numpy_probs(probs))


class IdentityCodec(CodecBase):
    """Fake codec: the float32 probs as given (4 V bytes), nothing lost."""

    name = "identity"

    def encode(self, probs: torch.Tensor) -> bytes:
        as_numpy_probs(probs)  # validates
        return probs.detach().to("cpu", torch.float32).numpy().astype("<f4").tobytes()

    def decode(self, data: bytes, vocab_size: int) -> torch.Tensor:
        check_vocab_size(vocab_size)
        if len(data) != 4 * vocab_size:
            raise CodecError(f"identity payload of {len(data)} bytes, expected {4 * vocab_size}")
        values = np.frombuffer(data, dtype="<f4").astype(np.float32)
        as_numpy_probs(values)  # validates: finite, non-negative, some mass
        return torch.from_numpy(values)

    def bits(self, probs: torch.Tensor) -> int:
        return 32 * int(probs.shape[-1])

    def transmitted_probs(self, probs: torch.Tensor) -> torch.Tensor:
        for row in probs_rows(probs):
            as_numpy_probs(row)  # validates
        return probs.detach().to(torch.float32).clone()

    def tv_bound(self, probs: torch.Tensor) -> float:
        return 0.0
