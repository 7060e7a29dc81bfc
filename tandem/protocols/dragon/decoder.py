"""Per-document decoding on one side: one batched row per retrieved document, one law out.

Words used here:
- *generated tokens*: the tokens after the prompt, the same on every row. The decoder holds
  the KV state of some generated tokens; `sync(tokens)` makes it hold exactly `tokens`
  (crop to the common prefix, decode the rest), so a rejected draft is undone by one call.
- *relevance logits* R(d, prefix): one per document, from a `RelevanceScorer` on the question
  plus the generated text, refreshed every `interval` tokens. `RelevanceSchedule` makes them
  a pure function of the generated prefix (cached by prefix), so rollback never leaves
  scores computed from rejected tokens behind.
- *side law* (`SideLaw`): `local_probs = sum_d softmax(R)(d) softmax(logits_d / T)` and the
  side's logweight `h = logsumexp(R)` (paper Eq. 4, `tandem.sampling.aggregation`). Greedy
  (T = 0) uses the untempered laws.

The decoder is synchronous and single-threaded; `worker.DraftWorker` runs it in a thread and
passes a cancel event through to the model (preemption between layers).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from tandem.models.base import CausalLM, State, release
from tandem.retrieval.scorer import RelevanceScorer
from tandem.sampling.aggregation import document_mixture, side_logweight


@dataclass(frozen=True)
class SideLaw:
    probs: torch.Tensor  # [vocab] float32: the locally aggregated law (before any codec)
    logweight: float  # h = logsumexp of the relevance logits
    doc_weights: np.ndarray  # [docs] softmax of the relevance logits
    # probs is one float32 softmax row (one row per side, or one document): it sums to 1 up to
    # its float32 rounding, which a sparse codec may use (`TopPCodec.softmax_kept`)
    softmax: bool = False


class RelevanceSchedule:
    """Relevance logits [docs] as a pure function of the generated prefix.

    `prefetch(tokens)` starts scoring the prefix `scores(tokens)` will need on a background
    thread (`background=True`), so a decoder can run it alongside the decode of the last
    token (which the scores do not depend on); `scores` then waits for it. Same inputs, same
    scores: only when they are computed changes."""

    def __init__(
        self,
        *,
        num_docs: int,
        query: str,
        detokenize: Callable[[list[int]], str],
        scorer: RelevanceScorer | None = None,
        static_scores: np.ndarray | None = None,  # [docs], used when there is no scorer
        interval: int = 4,
        background: bool = False,
    ):
        self.num_docs = num_docs
        self.query = query
        self.detokenize = detokenize
        self.scorer = scorer
        self.static = (
            np.zeros(num_docs, np.float32) if static_scores is None else np.asarray(static_scores)
        )
        assert self.static.shape == (num_docs,), self.static.shape
        self.interval = interval
        self.background = background
        self._cache: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
        self._pending: dict[tuple[int, ...], Future] = {}
        self._lock = threading.Lock()  # cache and pending
        self._score_lock = threading.Lock()  # one scorer call at a time
        self.calls = 0
        self.prefetched = 0  # scores that were ready or in flight when asked for

    def _key(self, tokens: list[int]) -> tuple[int, tuple[int, ...]]:
        boundary = len(tokens) // self.interval * self.interval
        return boundary, tuple(tokens[:boundary])

    def prefetch(self, tokens: list[int]) -> None:
        """Start scoring the prefix `tokens` will be scored on, unless known or in flight."""
        if self.scorer is None or not self.background:
            return
        boundary, key = self._key(tokens)
        with self._lock:
            cached = self._cache.get(boundary)
            if (cached is not None and cached[0] == key) or key in self._pending:
                return
            self._pending[key] = _relevance_pool().submit(self._compute, boundary, key)

    def scores(self, tokens: list[int]) -> np.ndarray:  # [docs] float32
        if self.scorer is None:
            return self.static.astype(np.float32)
        boundary, key = self._key(tokens)
        with self._lock:
            cached = self._cache.get(boundary)
            pending = self._pending.get(key)
        if cached is not None and cached[0] == key:
            return cached[1]
        if pending is not None:
            self.prefetched += 1
            return pending.result()
        return self._compute(boundary, key)

    def _compute(self, boundary: int, key: tuple[int, ...]) -> np.ndarray:
        text = self.query if not boundary else f"{self.query}\n{self.detokenize(list(key))}"
        with self._score_lock:
            scores = np.asarray(self.scorer.score(text), dtype=np.float32)
            assert scores.shape == (self.num_docs,), scores.shape
            self.calls += 1
        with self._lock:
            for stale in [b for b in self._cache if b >= boundary]:
                del self._cache[stale]
            self._cache[boundary] = (key, scores)
            self._pending.pop(key, None)
        return scores


_POOL: ThreadPoolExecutor | None = None


def _relevance_pool() -> ThreadPoolExecutor:
    """One background scorer thread per process (sessions queue on it)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dragon-relevance")
    return _POOL


def side_law(
    logits: torch.Tensor,  # [docs, vocab]
    scores: np.ndarray,  # [docs] relevance logits
    temperature: float,
) -> SideLaw:
    """The side's locally aggregated law from its per-document next-token logits."""
    assert logits.dim() == 2 and scores.shape == (logits.shape[0],), (logits.shape, scores.shape)
    logweight, doc_weights = _relevance_terms(_score_key(scores))
    if len(scores) == 1:  # one row: its weight softmax([r]) is exactly 1, the mixture is the row
        return _one_row_law(logits, temperature, logweight, doc_weights)
    doc_probs = _row_probs(logits, temperature)  # [docs, vocab]
    probs = document_mixture(doc_probs, torch.from_numpy(np.asarray(scores, dtype=np.float32)))
    return SideLaw(probs=probs, logweight=logweight, doc_weights=doc_weights.copy())


def joined_side_law(
    logits: torch.Tensor,  # [1, vocab]: the one row that holds every document
    scores: np.ndarray,  # [docs] relevance logits
    temperature: float,
) -> SideLaw:
    """The side law when one row holds all the side's documents (`rows="side"`): that row's
    law, and the side logweight h = logsumexp(R) as with one row per document, so the
    aggregation across sides weighs the sides exactly as the per-document form does."""
    assert logits.dim() == 2 and logits.shape[0] == 1, logits.shape
    logweight, doc_weights = _joined_terms(_score_key(scores))
    return _one_row_law(logits, temperature, logweight, doc_weights)


def _one_row_law(
    logits: torch.Tensor, temperature: float, logweight: float, doc_weights: np.ndarray
) -> SideLaw:
    """The law of the one row of `logits` ([1, vocab]): its softmax."""
    probs = _row_probs(logits, temperature)[0]
    softmax = probs.dtype == torch.float32 and probs.device.type == "cpu"
    return SideLaw(probs, logweight, doc_weights.copy(), softmax=softmax)


def _row_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) per row ([rows, vocab]); T = 0 (greedy) uses T = 1."""
    scale = temperature if temperature > 0 else 1.0
    scaled = logits.float() if scale == 1.0 else logits.float() / scale  # x / 1 is x: no pass
    return torch.softmax(scaled, dim=-1)


def _score_key(scores: np.ndarray) -> bytes:
    return np.ascontiguousarray(scores, dtype=np.float32).tobytes()


# A side's relevance logits change rarely within an answer (never with the static scorer), so
# what the laws derive from them alone is computed once per distinct vector: the same numbers.
@functools.lru_cache(maxsize=256)
def _relevance_terms(key: bytes) -> tuple[float, np.ndarray]:
    """(h = logsumexp(R), softmax(R)) of the float32 relevance logits `key`."""
    relevance = torch.from_numpy(np.frombuffer(key, dtype=np.float32).copy()).double()
    return float(side_logweight(relevance)), torch.softmax(relevance, dim=0).numpy()


@functools.lru_cache(maxsize=256)
def _joined_terms(key: bytes) -> tuple[float, np.ndarray]:
    """`joined_side_law`'s (h, softmax(R)): h passes through a one-row law's float32 score,
    as the one row's own relevance logit."""
    logweight, doc_weights = _relevance_terms(key)
    one, _ = _relevance_terms(_score_key(np.array([logweight])))
    return one, doc_weights


class DocDecoder:
    """KV state of one side's document rows, kept in step with a list of generated tokens."""

    def __init__(
        self,
        lm: CausalLM,
        *,
        prefixes: list[list[int]],  # one document prefix per row ([] allowed: no prefix)
        suffix: list[int],  # the question turn, appended to every row
        relevance: RelevanceSchedule,
        temperature: float,
        kv_store=None,  # tandem.retrieval.kvstore.DocKVStore or None
    ):
        # one row per document, or one row holding them all (DragonConfig.rows == "side")
        assert prefixes and len(prefixes) in (1, relevance.num_docs), (
            len(prefixes),
            relevance.num_docs,
        )
        self.lm = lm
        self.prefixes = prefixes
        self.suffix = suffix
        self.relevance = relevance
        self.temperature = temperature
        self.kv_store = kv_store
        self.state: State | None = None
        self.tokens: list[int] = []  # generated tokens the state holds
        self.prompt_len = 0  # padded positions of the prompt part of the state
        self.prompt_logits: torch.Tensor | None = None  # [docs, vocab]
        self.kv_hits = 0
        self.decode_calls = 0
        self.clock = None  # tandem.protocols.dragon.profiler.Timeline, set by a live session

    @property
    def num_rows(self) -> int:
        return len(self.prefixes)

    @property
    def context_len(self) -> int:
        """Longest row's real length now (prompt + generated tokens held)."""
        return max(self.state.lengths) if self.state is not None else 0

    def prefill(self) -> float:
        """Build the rows (document KV from the store when present); returns seconds."""
        began = start = time.perf_counter()
        if self.kv_store is not None and all(self.prefixes) and self.suffix:
            states = []
            for prefix in self.prefixes:
                state, hit = self.kv_store.get_or_prefill(prefix)
                self.kv_hits += int(hit)
                states.append(state)
            self.state = self.lm.stack(states) if len(states) > 1 else states[0]
            start = self._clock("kv_load", start)
            cpu = time.thread_time()
            self.relevance.prefetch([])  # the first law's scores, alongside the question's decode
            # the question on all k rows in one call; only the last position's logits are
            # needed (llama.cpp: `extend` skips the vocab projection of the others)
            extend = getattr(self.lm, "extend", self.lm.decode)
            extend(self.state, [self.suffix] * self.num_rows)
        else:
            cpu = time.thread_time()
            self.relevance.prefetch([])
            self.state = self.lm.prefill([prefix + self.suffix for prefix in self.prefixes])
        self._clock("prefill", start, cpu)
        self.prompt_len = self.state.seq_len
        self.prompt_logits = self.state.logits.clone()
        self.tokens = []
        return time.perf_counter() - began

    def sync(self, tokens: list[int], cancel: threading.Event | None = None) -> int:
        """Make the state hold exactly `tokens`; returns how many tokens were decoded.

        Raises `tandem.models.base.Cancelled` (state unchanged) when `cancel` fires.
        """
        assert self.state is not None, "prefill first"
        common = 0
        for held, wanted in zip(self.tokens, tokens, strict=False):
            if held != wanted:
                break
            common += 1
        if common < len(self.tokens):
            self._crop(common)
        if self.state.logits is None and common == len(tokens):
            # cropped outside the last decode block and nothing follows: the law at the cut
            # needs its last token decoded again. With tokens to follow (a rejection's target
            # token) their decode gives the law, so they go alone: the cut's last token is not
            # decoded a second time (what a call of two costs against two calls is the
            # backend's business: llama.cpp's `split_calls`)
            self._crop(common - 1)
        todo = tokens[len(self.tokens) :]
        if todo:
            self.relevance.prefetch(tokens)  # scored while the rows decode (it needs no logits)
            began = time.perf_counter()
            cpu = time.thread_time() if self.clock is None else self.clock.cpu_began("decode")
            try:  # all k rows in one forward pass (one llama_decode / one HF call)
                self.lm.decode(self.state, [todo] * self.num_rows, cancel=cancel)
            finally:  # a cancelled decode's time was spent too
                self._clock("decode", began, cpu)
            self.tokens = self.tokens + list(todo)
            self.decode_calls += 1
        return len(todo)

    def close(self) -> None:
        """Free the rows' cache now (`models.base.release`); the decoder is unusable after."""
        if self.state is not None:
            release(self.lm, self.state)
            self.state = None

    def _clock(self, phase: str, began: float, cpu: float | None = None) -> float:
        """Wall time since `began` (and this thread's CPU time since `cpu`) to `phase`."""
        if self.clock is None:
            return time.perf_counter()
        if cpu is not None:  # one engine thread computes in the caller's thread: load-proof
            self.clock.add(phase, time.thread_time() - cpu, cpu=True)
        return self.clock.since(phase, began)

    def _crop(self, keep: int) -> None:
        self.lm.crop(self.state, self.prompt_len + keep)
        self.tokens = self.tokens[:keep]
        if keep == 0:
            self.state.logits = self.prompt_logits.clone()
            self.state.recent_logits = None

    def law(self) -> SideLaw:
        """The side law after the tokens held now."""
        assert self.state is not None and self.state.logits is not None
        return self._law_of(self.state.logits, self.tokens)

    def _law_of(self, logits: torch.Tensor, tokens: list[int]) -> SideLaw:
        began = time.perf_counter()
        scores = self.relevance.scores(tokens)
        began = self._clock("relevance", began)
        if self.num_rows == len(scores):
            law = side_law(logits, scores, self.temperature)
        else:  # one row holds every document: its law, weighted by all documents' relevance
            law = joined_side_law(logits, scores, self.temperature)
        self._clock("law", began)
        return law

    def fork_law(
        self, tokens: list[int], cancel: threading.Event | None = None
    ) -> tuple[SideLaw, int]:
        """(side law after `tokens`, context length) where `tokens` = a prefix of the tokens
        held + one more token, computed on a copy of the rows: the state is left as it is
        (llama.cpp shares the prefix's cells, transformers copies them). A branch draft's law.

        Raises `Cancelled` when `cancel` fires."""
        assert self.state is not None and self.state.logits is not None
        keep = len(tokens) - 1
        if keep > len(self.tokens) or self.tokens[:keep] != tokens[:keep]:
            raise ValueError("fork_law: tokens must extend a prefix of the tokens held by one")
        began, cpu = time.perf_counter(), time.thread_time()
        fork = self.lm.stack([self.state])
        try:
            if keep < len(self.tokens):
                self.lm.crop(fork, self.prompt_len + keep)
            self.lm.decode(fork, [[tokens[-1]]] * self.num_rows, cancel=cancel)
            logits, context = fork.logits, max(fork.lengths)
        finally:
            release(self.lm, fork)
            self._clock("branch", began, cpu)
        return self._law_of(logits, tokens), context
