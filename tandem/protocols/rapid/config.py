"""Typed settings of a RAPID run: how the drafter's short context is retrieved, and how tokens
are drafted and verified.

Words used here (as in the paper, Sec. 2-3):
- *long context* C: what the target reads in full; *retrieval context* C^S: the chunks of C
  the RAG drafter reads instead.
- *budget*: the most tokens C^S may hold, `min(|C|, max(min_tokens, |C| / compression))`
  (paper: between 4096 tokens and |C| / 24; our defaults are scaled to a CPU, see below).
- *gamma*: draft tokens per round (paper: 10); *eta*: knowledge-transfer strength (Eq. 6).
- *mode*: "exact" (output ~ p_hat) or "paper" (Eq. 10 residual; see tandem.sampling.rapid).
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.errors import TandemError
from tandem.sampling.rapid import MODES, TAIL_RULES


@dataclass(frozen=True, kw_only=True)
class RetrievalConfig:
    """How C^S is cut from C. Defaults: the paper's chunking (512 tokens, cosine >= 0.3) and
    compression (|C| / 24), with the floor lowered from 4096 to 1024 tokens because our CPU runs
    contexts of 1K-8K tokens, not 128K (4096 would hand the drafter the whole context)."""

    chunk_tokens: int = 512  # chunk size in the *generating model's* tokens
    threshold: float = 0.3  # chunks with cosine similarity below this are dropped
    min_tokens: int = 1024  # floor of the budget (paper: 4096)
    compression: float = 24.0  # lambda: the budget is at least |C| / compression
    min_chunks: int = 1  # keep this many best chunks even below the threshold (0: none)
    piece_tokens: int = 128  # embedder window: a chunk scores max over its pieces' cosines
    embedder: str = "all-minilm-l6-v2"

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1 or self.piece_tokens < 1:
            raise TandemError("chunk_tokens and piece_tokens must be at least 1")
        if self.min_tokens < self.chunk_tokens:
            raise TandemError(
                f"retrieval min_tokens ({self.min_tokens}) must hold at least one chunk "
                f"({self.chunk_tokens} tokens)"
            )
        if self.compression < 1:
            raise TandemError(f"compression must be >= 1 (got {self.compression})")
        if not -1.0 <= self.threshold <= 1.0:
            raise TandemError(f"threshold is a cosine similarity in [-1, 1] (got {self.threshold})")
        if self.min_chunks < 0:
            raise TandemError("min_chunks must be >= 0")


@dataclass(frozen=True, kw_only=True)
class RapidConfig:
    """Drafting and verification. temperature 0 = greedy (then eta has no effect: p_hat is the
    target's argmax, so every mode reproduces the target's greedy output)."""

    gamma: int = 5  # paper: 10; fewer on a CPU, where a verify block is not ~free
    eta: float = 10.0  # paper: {5, 10, 20} self-speculation, {40, 50} upward
    mode: str = "exact"
    temperature: float = 0.1  # paper: 0.1 on LongBench v2, 1.0 on InfiniteBench
    tail: str = "paper"  # tail rule of Eq. 9 (see tandem.sampling.rapid)
    tail_ratio: float = 0.1
    bonus_from_draft: bool | None = None  # draft a (gamma+1)-th law so the bonus ~ p_hat;
    # None: yes in "exact" mode (its output law is then p_hat at every position), no in "paper"
    max_new_tokens: int = 64
    seed: int = 0
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        if self.gamma < 1:
            raise TandemError(f"gamma must be >= 1 (got {self.gamma})")
        if self.mode not in MODES:
            raise TandemError(f"unknown RAPID mode {self.mode!r}; choose one of {MODES}")
        if self.tail not in TAIL_RULES:
            raise TandemError(f"unknown tail rule {self.tail!r}; choose one of {TAIL_RULES}")
        if self.temperature < 0:
            raise TandemError(f"temperature must be >= 0 (got {self.temperature})")
        if self.max_new_tokens < 1:
            raise TandemError("max_new_tokens must be >= 1")

    @property
    def draft_bonus_row(self) -> bool:
        """Whether the drafter also gives its law at the bonus position."""
        if self.bonus_from_draft is None:
            return self.mode == "exact"
        return self.bonus_from_draft
