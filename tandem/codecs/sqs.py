"""SQS-SD codecs: sparsify, lattice-quantize, and send exact enumerative ranks.

Words used here:
- *support*: the K token ids kept, sorted increasing; *dropped mass*: the mass outside it.
- *counts*: the lattice point (K ints summing to the resolution `ell`); the sent probability of
  support[i] is counts[i] / ell (`tandem.codecs.lattice`).
- `KSQSCodec` ("k-sqs"): the support is the top K tokens (K fixed; zero-probability tokens
  fill it when fewer are non-zero). SQS-SD section 2.
- `CSQSCodec` ("c-sqs"): the support is {x : probs(x) >= beta} plus the most probable token,
  capped at `max_support` tokens; beta follows the online conformal rule (SQS-SD eq. 8,
  Algorithm 1) held in a `ConformalThreshold`.

Wire format, most significant bit first, zero-padded to a whole byte:
    k-sqs: [subset rank : ceil(log2 C(V, K))][counts rank : ceil(log2 C(ell+K-1, K-1))]
    c-sqs: [K - 1 : ceil(log2 V)] then the same two fields
(SQS-SD eqs. 1, 2, 5 and section 3 "Communication Overhead"); K (k-sqs), ell and max_support
are configuration, not on the wire. Bytes = ceil(bits / 8), no header.

Error bound: TV(probs, sent) <= dropped mass + K / (4 ell) (Theorem 1 / eq. 20) + 2**-24 (the
float32 output). Decoding costs O(K) big-integer binomials: keep K in the hundreds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from tandem.codecs.base import (
    BitReader,
    BitWriter,
    CodecBase,
    CodecError,
    as_numpy_probs,
    ceil_log2,
    check_vocab_size,
)
from tandem.codecs.lattice import (
    composition_bits,
    quantize,
    rank_composition,
    rank_subset,
    subset_bits,
    unrank_composition,
    unrank_subset,
)
from tandem.codecs.sparse import top_sorted

FLOAT32_OUTPUT_ERROR = 2.0**-24


def lattice_probs(vocab_size: int, support: np.ndarray, counts: np.ndarray, ell: int) -> np.ndarray:
    """[vocab] float32 sent probs: counts / ell on the support, zero elsewhere."""
    sent = np.zeros(vocab_size, dtype=np.float32)
    sent[support] = (counts.astype(np.float64) / ell).astype(np.float32)
    return sent


def sqs_bits(vocab_size: int, support_size: int, ell: int, *, adaptive: bool) -> int:
    """Bits of one SQS payload: subset + counts (+ the support size for C-SQS)."""
    size_bits = ceil_log2(vocab_size) if adaptive else 0
    return size_bits + subset_bits(vocab_size, support_size) + composition_bits(ell, support_size)


class _SQSCodec(CodecBase):
    """Shared quantize / encode / decode; subclasses choose the support."""

    adaptive = False  # True: the support size K is on the wire

    def __init__(self, *, ell: int) -> None:
        if ell < 1:
            raise CodecError(f"lattice resolution ell must be >= 1, got {ell}")
        self.ell = ell

    def support(self, probs: np.ndarray) -> np.ndarray:
        """Sorted ids kept for normalized `probs` ([vocab])."""
        raise NotImplementedError

    def quantized(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(support [K], counts [K]) for normalized `probs` ([vocab])."""
        support = self.support(probs)
        kept = probs[support]
        return support, quantize(kept / kept.sum(), self.ell)

    def encode(self, probs: torch.Tensor) -> bytes:
        values = as_numpy_probs(probs)
        support, counts = self.quantized(values)
        vocab_size, support_size = values.shape[0], support.shape[0]
        writer = BitWriter()
        if self.adaptive:
            writer.write(support_size - 1, ceil_log2(vocab_size))
        writer.write(rank_subset(support.tolist()), subset_bits(vocab_size, support_size))
        writer.write(rank_composition(counts), composition_bits(self.ell, support_size))
        return writer.to_bytes()

    def _decode_support_size(self, reader: BitReader, vocab_size: int) -> int:
        raise NotImplementedError

    def decode(self, data: bytes, vocab_size: int) -> torch.Tensor:
        check_vocab_size(vocab_size)
        reader = BitReader(data)
        support_size = self._decode_support_size(reader, vocab_size)
        expected = (sqs_bits(vocab_size, support_size, self.ell, adaptive=self.adaptive) + 7) // 8
        if len(data) != expected:
            raise CodecError(f"{self.name} payload of {len(data)} bytes, expected {expected}")
        subset_rank = reader.read(subset_bits(vocab_size, support_size))
        counts_rank = reader.read(composition_bits(self.ell, support_size))
        reader.finish()
        support = np.asarray(unrank_subset(subset_rank, support_size, vocab_size), dtype=np.int64)
        counts = unrank_composition(counts_rank, support_size, self.ell)
        return torch.from_numpy(lattice_probs(vocab_size, support, counts, self.ell))

    def bits(self, probs: torch.Tensor) -> int:
        values = as_numpy_probs(probs)
        support_size = self.support(values).shape[0]
        return sqs_bits(values.shape[0], support_size, self.ell, adaptive=self.adaptive)

    def _sent_row(self, probs: np.ndarray) -> np.ndarray:
        support, counts = self.quantized(probs)
        return lattice_probs(probs.shape[0], support, counts, self.ell)

    def dropped_mass(self, probs: torch.Tensor) -> float:
        values = as_numpy_probs(probs)
        return max(0.0, 1.0 - float(values[self.support(values)].sum()))

    def tv_bound(self, probs: torch.Tensor) -> float:
        """Upper bound on TV(probs, transmitted_probs(probs)) for this [vocab] input."""
        values = as_numpy_probs(probs)
        support_size = self.support(values).shape[0]
        lattice_error = min(1.0, support_size / (4 * self.ell))
        return min(1.0, self.dropped_mass(probs) + lattice_error + FLOAT32_OUTPUT_ERROR)


class KSQSCodec(_SQSCodec):
    """Top-K support, lattice resolution ell (SQS-SD K-SQS)."""

    name = "k-sqs"

    def __init__(self, *, k: int = 32, ell: int = 100) -> None:
        super().__init__(ell=ell)
        if k < 1:
            raise CodecError(f"k-sqs needs k >= 1, got {k}")
        self.k = k

    def support(self, probs: np.ndarray) -> np.ndarray:
        return np.sort(top_sorted(probs, min(self.k, probs.shape[0])))

    def _decode_support_size(self, reader: BitReader, vocab_size: int) -> int:
        return min(self.k, vocab_size)

    def wire_params(self) -> dict[str, int]:
        return {"k": self.k, "ell": self.ell}


@dataclass(frozen=True, kw_only=True)
class ConformalThreshold:
    """The C-SQS sender state: threshold beta, target dropped mass alpha, learning rate eta.

    Defaults are the paper's (SQS-SD section 4: alpha = 0.0005, eta = 0.001); the paper gives
    no initial beta, we start at 0.001.
    """

    beta: float = 0.001
    alpha: float = 0.0005
    eta: float = 0.001

    def updated(self, dropped_mass: float) -> ConformalThreshold:
        """SQS-SD eq. 8: beta <- beta - eta (dropped_mass - alpha).

        beta is kept >= -eta (1 - alpha), the bound of Lemma 4: every beta <= 0 keeps the whole
        (capped) support, so this only matters when the `max_support` cap drops mass at any
        beta, where the unclamped rule would drift down without limit.
        """
        beta = self.beta - self.eta * (dropped_mass - self.alpha)
        return replace(self, beta=max(beta, -self.eta * (1.0 - self.alpha)))


class CSQSCodec(_SQSCodec):
    """Conformal support {probs >= beta} (SQS-SD C-SQS), with checkpoint and backtrack.

    Per drafted token call `observe(probs)` after encoding it (`tandem.codecs.draft` does);
    when the verifier answers, `backtrack(num_accepted)` returns beta to its value after the
    last accepted draft (Algorithm 1, lines 11-13) and checkpoints there.
    """

    name = "c-sqs"
    adaptive = True

    def __init__(
        self,
        *,
        ell: int = 100,
        alpha: float = 0.0005,
        eta: float = 0.001,
        beta: float = 0.001,
        max_support: int = 1024,
    ) -> None:
        super().__init__(ell=ell)
        if not 0 < alpha < 1 or eta < 0:
            raise CodecError(f"c-sqs needs 0 < alpha < 1 and eta >= 0, got {alpha}, {eta}")
        if max_support < 1:
            raise CodecError(f"c-sqs needs max_support >= 1, got {max_support}")
        self.max_support = max_support
        self.state = ConformalThreshold(beta=beta, alpha=alpha, eta=eta)
        self._anchor = self.state  # state at the last checkpoint
        self._trail: list[ConformalThreshold] = []  # state after each draft since then

    def support(self, probs: np.ndarray) -> np.ndarray:
        support = np.flatnonzero(probs >= self.state.beta)  # sorted
        if support.shape[0] == 0:  # beta above every probability: keep the top token
            return top_sorted(probs, 1)
        if support.shape[0] > self.max_support:
            return np.sort(top_sorted(probs, self.max_support))
        return support

    def _decode_support_size(self, reader: BitReader, vocab_size: int) -> int:
        support_size = reader.read(ceil_log2(vocab_size)) + 1
        if support_size > min(vocab_size, self.max_support):
            raise CodecError(
                f"c-sqs support of {support_size} exceeds min(vocab, max_support)"
                f" = {min(vocab_size, self.max_support)}"
            )
        return support_size

    def wire_params(self) -> dict[str, int]:
        return {"ell": self.ell, "max_support": self.max_support}

    def observe(self, probs: torch.Tensor) -> None:
        """Advance beta by the dropped mass of this drafted distribution ([vocab])."""
        self.state = self.state.updated(self.dropped_mass(probs))
        self._trail.append(self.state)

    def checkpoint(self) -> None:
        self._anchor = self.state
        self._trail = []

    def backtrack(self, num_accepted: int = 0) -> None:
        """Return to the state after the first `num_accepted` drafts since the checkpoint."""
        if not 0 <= num_accepted <= len(self._trail):
            raise CodecError(f"cannot keep {num_accepted} of {len(self._trail)} drafts")
        self.state = self._trail[num_accepted - 1] if num_accepted else self._anchor
        self.checkpoint()
