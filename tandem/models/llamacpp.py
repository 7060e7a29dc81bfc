"""llama.cpp backend for the `CausalLM` protocol: a GGUF run by llama-cpp-python's C API.

Why one file: one class implements the whole `CausalLM` protocol on llama.cpp's C API, and
every method depends on the same bookkeeping of which sequence owns which KV cells.

Owns: one llama context per model object, the mapping of `State` rows to llama sequences,
KV rollback, cancellation mid-graph, and saving a row's KV. Words as in `tandem.models.base`, and:
- *seq*: a llama.cpp sequence id. Each row of each live `State` owns one. The KV cache is
  *unified*: a cell may belong to several seqs, so copying a row (`stack`, `split_rows`) is a
  `seq_cp` that shares cells instead of copying keys and values.
- *pads*: kept in `State.ids` for the protocol's bookkeeping only; llama.cpp itself sees each
  row at positions 0..len-1 with no padding (the kernels still differ a little with the number
  of tokens per call: NUMERICS below).

Free seqs: a `State` that is garbage-collected hands its seqs back through a finalizer; they are
wiped at the next call under the model's lock (a finalizer may run on any thread, and the
context must never be touched by two threads at once).

Small calls: on some boxes and models llama.cpp's multi-token kernels cost more than the same
tokens fed one per call (the 0.5B's Q5_0/Q8_0 weights through llamafile's tiled gemm on the
AVX-512 box of 2026-11-29: a 2-token call 3.6 single steps). `split_calls` is the largest
call size that is fed one token per `llama_decode` instead, measured once per model, build,
CPU and thread count (`calibrated_split`, cached under $TANDEM_HOME/calibration) unless given.

Cancellation: llama.cpp calls an abort callback between graph nodes. With a `CancelEvent` the
callback is libc's `strlen` over a two-byte flag buffer (b"\\x00\\x00" or b"\\x01\\x00", so it
returns 0 or 1): the check costs nothing and never takes the GIL. A plain `threading.Event` gets a
Python callback instead (correct, slower). On abort, every row is cut back to its length before
the call, so the state is unchanged.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import hashlib
import json
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tandem.config import tandem_home
from tandem.errors import TandemError
from tandem.models.base import (
    CancelEvent,
    Cancelled,
    State,
    as_new_ids,
    as_rows,
    read_kv_file,
    state_tensors,
    write_kv_file,
)

FORMAT = "tandem-llamacpp-kv-1"
DEFAULT_N_CTX = 8192  # KV cells shared by every live row (unified cache)
N_BATCH = 512  # tokens per llama_decode call (longer inputs are chunked)

# NUMERICS. llama.cpp's CPU kernels are not batch-invariant: a token's logits depend a little on
# how many tokens share its llama_decode call (single-token gemv vs multi-token gemm paths,
# repacked weights, the tiled K-quant matmul, and attention once the context passes ~32 tokens).
# Measured on the 0.5B model: max |logit difference| 0.3-0.7 between a k-token block and k
# single-token steps (docs/backends.md). Greedy speculative decoding therefore equals plain
# greedy decoding except where the top two logits are nearer than that; the tests say so.
BATCH_SHAPE_ERROR = 1.0  # the bound the tests hold llama.cpp to (measured maximum: 0.74)
#
# `numerics="invariant"` (or $TANDEM_LLAMA_NUMERICS=invariant) removes those differences: a
# token's logits are then the same bit for bit whatever call it shares, so block verification
# equals single-token AR (docs/backends.md). It takes flash attention on (its per-query kernel
# does not depend on the batch below 64 query rows), no repacked weights (`use_extra_bufts`),
# ggml's tiled K-quant matmul off (GGML_CPU_TILED_MM=0, read once per process, so it is set
# before the first model runs), at most INVARIANT_CHUNK tokens per llama_decode call, and one
# engine thread (with more, single-token attention splits the cache across threads once it
# holds 512 cells). Cost measured here: decode steps 7-25% slower.
NUMERICS = ("default", "invariant")
# A k-token call (k in SPLIT_SIZES) is fed one token per call where the block costs more than
# SPLIT_MARGIN times its k one-token calls. Each size's cost is the fastest of SPLIT_REPEATS
# rounds that time every size in turn, after a warm-up round. Other work on the same cores
# skews that (a longer call is more likely to be interrupted), so a timing during which this
# process's threads waited for a core more than SPLIT_DISTURBED of the time is cached as
# *disturbed*: the next processes that load the model time it again (one timing each, at most
# SPLIT_TRIES disturbed timings in all, then the last one stands) until a quiet one replaces it.
# Where the kernel does not report the wait, the first timing stands, as the only one there is.
SPLIT_SIZES = (2, 3, 4, 5)
SPLIT_MARGIN = 1.15
SPLIT_REPEATS = 3
SPLIT_DISTURBED = 0.02
SPLIT_TRIES = 3
_SPLITS_TIMED: dict[str, int] = {}  # calibration key -> split_calls timed in this process
INVARIANT_CHUNK = 32  # below ggml's flash-attention tile of 64 query rows
_DECODED = False  # a llama_decode ran in this process: ggml has read GGML_CPU_TILED_MM by now


def _lib() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise TandemError(
            "the llamacpp backend needs llama-cpp-python: install tandem with the README's "
            "command (it builds llama-cpp-python), or run with --backend hf"
        ) from exc
    return llama_cpp


_BACKEND_READY = False
_LOG_CALLBACK: Any = None


def _init_backend(lib: Any) -> None:
    """Once per process: initialise ggml and silence llama.cpp's log (errors still raise)."""
    global _BACKEND_READY, _LOG_CALLBACK
    if _BACKEND_READY:
        return
    if not os.environ.get("TANDEM_LLAMA_LOG"):
        _LOG_CALLBACK = lib.llama_log_callback(lambda level, text, data: None)
        lib.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    lib.llama_backend_init()
    _BACKEND_READY = True


_STRLEN = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").strlen


def default_numerics() -> str:
    """$TANDEM_LLAMA_NUMERICS, else "default" (`NUMERICS`)."""
    value = os.environ.get("TANDEM_LLAMA_NUMERICS") or "default"
    if value not in NUMERICS:
        raise TandemError(f"TANDEM_LLAMA_NUMERICS={value!r}: choose one of {', '.join(NUMERICS)}")
    return value


def _invariant_kernels() -> None:
    """Turn ggml's tiled K-quant matmul off for this process (it is batch-dependent)."""
    if os.environ.get("GGML_CPU_TILED_MM") == "0":
        return
    if _DECODED:
        raise TandemError(
            "numerics='invariant' must be chosen before the first llama.cpp model runs in this "
            "process (ggml reads GGML_CPU_TILED_MM once): set TANDEM_LLAMA_NUMERICS=invariant "
            "in the environment instead"
        )
    os.environ["GGML_CPU_TILED_MM"] = "0"


def default_threads() -> int:
    """Engine threads: the cores this process owns (its affinity set), or fewer when torch was
    told to use fewer (`--threads`, `tandem.testbed.cpus.pin`): one thread knob for both engines."""
    return max(1, min(torch.get_num_threads(), len(os.sched_getaffinity(0))))


class _Rows:
    """`State.cache` of this backend: the seq of each row; frees them when dropped."""

    def __init__(self, lm: LlamaCppLM, seqs: list[int]):
        self.seqs = seqs
        self._finalizer = weakref.finalize(self, lm._release, list(seqs))

    def detach(self) -> list[int]:
        """The seqs, now owned by the caller (the finalizer will not release them)."""
        self._finalizer.detach()
        seqs, self.seqs = self.seqs, []
        return seqs


class LlamaCppLM:
    """A GGUF model run by llama.cpp behind the `CausalLM` protocol."""

    backend = "llamacpp"

    def __init__(
        self,
        path: Path,
        tokenizer: Any,
        *,
        name: str,
        identity: str | None = None,
        n_ctx: int = DEFAULT_N_CTX,
        n_seq_max: int = 64,
        threads: int | None = None,
        kv_type: str = "f16",
        flash_attn: bool = False,
        numerics: str | None = None,  # NUMERICS; None: default_numerics()
        split_calls: int | None = None,  # None: $TANDEM_LLAMA_SPLIT, else `calibrated_split`
    ):
        numerics = numerics or default_numerics()
        if numerics not in NUMERICS:
            raise TandemError(f"numerics must be one of {', '.join(NUMERICS)}, not {numerics!r}")
        invariant = numerics == "invariant"
        if invariant and threads not in (None, 1):
            raise TandemError(
                f"numerics='invariant' is bit-exact with one engine thread only, not {threads}"
            )
        lib = self._lib = _lib()
        _init_backend(lib)
        path = Path(path)
        if not path.is_file():
            raise TandemError(f"GGUF file not found: {path}")
        if invariant:
            _invariant_kernels()
        self.name, self.tokenizer, self.path = name, tokenizer, path
        self.numerics = numerics
        self.threads = 1 if invariant else threads or default_threads()
        self._chunk = INVARIANT_CHUNK if invariant else N_BATCH
        mparams = lib.llama_model_default_params()
        mparams.use_extra_bufts = not invariant  # repacked weights: batch-dependent kernels
        self._model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise TandemError(f"llama.cpp cannot load {path} (truncated or not a GGUF model?)")
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = N_BATCH
        cparams.n_ubatch = N_BATCH
        cparams.n_seq_max = n_seq_max
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.kv_unified = True
        cparams.no_perf = True
        types = {"f16": lib.GGML_TYPE_F16, "q8_0": lib.GGML_TYPE_Q8_0}
        if kv_type not in types:
            raise TandemError(f"kv_type must be one of {', '.join(types)}, not {kv_type!r}")
        # Off by default: measured slower here for every step and block at 4K-16K
        # (docs/rapid.md, rapid_steps.json). A quantized V cache needs it in llama.cpp.
        flash_attn = flash_attn or kv_type != "f16" or invariant
        cparams.flash_attn_type = (
            lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        cparams.type_k = cparams.type_v = types[kv_type]
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lib.llama_model_free(self._model)
            raise TandemError(f"llama.cpp cannot create a context for {path} (n_ctx={n_ctx})")
        self._mem = lib.llama_get_memory(self._ctx)
        self.n_ctx, self.kv_type, self.flash_attn = n_ctx, kv_type, flash_attn
        vocab = lib.llama_model_get_vocab(self._model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(vocab))
        self._batch = lib.llama_batch_init(N_BATCH, 0, 1)
        self._lock = threading.RLock()  # the context is used by one thread at a time
        self._free = list(range(n_seq_max - 1, -1, -1))  # seq ids not in use (pop from the end)
        self._dead: list[int] = []  # seqs of collected states, wiped at the next call
        self._dead_lock = threading.Lock()
        self._flag = ctypes.create_string_buffer(2)  # [flag, 0]: strlen() is the abort check
        self._py_abort: Any = None
        self.fingerprint = self._fingerprint(identity)
        self._closer = weakref.finalize(
            self, _free_native, lib, self._ctx, self._model, self._batch
        )
        # invariant numerics: blocks already equal one-token calls bit for bit
        self.split_calls = 0 if invariant else _split_setting(self, split_calls)

    def _fingerprint(self, identity: str | None) -> str:
        if identity is None:  # a user's GGUF: its size and the bytes of its header and tail
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(1 << 20)
                f.seek(max(0, size - (1 << 20)))
                tail = f.read()
            identity = hashlib.sha256(head + tail + str(size).encode()).hexdigest()
        layout = self.kv_type + (":flash" if self.flash_attn and self.kv_type == "f16" else "")
        layout += ":invariant" if self.numerics == "invariant" else ""
        digest = hashlib.sha256(f"llamacpp:{layout}:{identity}:".encode())  # KV files differ
        digest.update(self.tokenizer.fingerprint.encode())
        return digest.hexdigest()

    # -- seqs -------------------------------------------------------------------------------

    def _release(self, seqs: list[int]) -> None:
        with self._dead_lock:
            self._dead.extend(seqs)

    def _take(self, n: int) -> list[int]:
        """`n` free seq ids, wiping those of collected states first (call under the lock)."""
        with self._dead_lock:
            dead, self._dead = self._dead, []
        for seq in dead:
            self._lib.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._free.extend(dead)
        if len(self._free) < n:
            raise TandemError(
                f"{self.name}: more than {self.n_seq_max} live rows (llama sequences); "
                "drop unused states or load the model with a larger n_seq_max"
            )
        return [self._free.pop() for _ in range(n)]

    def rows_in_use(self) -> int:
        """Sequences holding KV cells now (freed and collected states' rows not counted once
        wiped). Every decode attends over all cells in use in this unified cache, so rows
        left behind slow every later decode of the process."""
        with self._lock:
            return sum(
                int(self._lib.llama_memory_seq_pos_max(self._mem, seq) >= 0)
                for seq in range(self.n_seq_max)
            )

    @property
    def n_seq_max(self) -> int:
        return int(self._lib.llama_n_seq_max(self._ctx))

    def _new_state(self, ids: torch.Tensor, pads: list[int], seqs: list[int], logits) -> State:
        return State(ids=ids, pads=pads, logits=logits, cache=_Rows(self, seqs))

    # -- forward passes ---------------------------------------------------------------------

    def _run(
        self,
        items: list[tuple[int, int, int, bool]],  # (token, position, seq, wants logits)
        cancel: threading.Event | None,
    ) -> np.ndarray:  # [number of items that want logits, vocab] float32
        """Decode `items` in chunks of N_BATCH (INVARIANT_CHUNK with invariant numerics);
        logits of the flagged items, in order."""
        global _DECODED
        _DECODED = True
        self._fit_threads()
        lib, batch = self._lib, self._batch
        out: list[np.ndarray] = []
        if 1 < len(items) <= self.split_calls:  # one token per call costs less here
            chunks = [[item] for item in items]
        else:
            chunks = [items[i : i + self._chunk] for i in range(0, len(items), self._chunk)]
        self._arm(cancel)
        try:
            for chunk in chunks:
                _fill(batch, chunk)
                if cancel is not None and cancel.is_set():
                    raise Cancelled("decode cancelled")
                status = lib.llama_decode(self._ctx, batch)
                if status == 2:
                    raise Cancelled("decode cancelled")
                if status != 0:
                    raise TandemError(
                        f"{self.name}: llama_decode failed (status {status}); the KV cache of "
                        f"{self.n_ctx} cells may be full: load the model with a larger n_ctx"
                    )
                n_out = sum(1 for item in chunk if item[3])
                if n_out:
                    ptr = lib.llama_get_logits(self._ctx)
                    out.append(np.ctypeslib.as_array(ptr, shape=(n_out, self.vocab_size)).copy())
        finally:
            self._disarm(cancel)
        if not out:
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _fit_threads(self) -> None:
        """No more engine threads than cores the calling thread may run on now: a process pinned
        to fewer cores after its model loaded (measured: loaded on two cores, then pinned to one)
        spun both threads in an OpenMP barrier on the one core, a decode that never returned.
        `threads` follows the set down, never back up. Checked every call (~0.3 us)."""
        cores = len(os.sched_getaffinity(0))
        if cores < self.threads:
            self._lib.llama_set_n_threads(self._ctx, cores, cores)
            self.threads = cores

    def _arm(self, cancel: threading.Event | None) -> None:
        self._flag[0] = b"\x00"
        if cancel is None:
            return
        lib = self._lib
        if isinstance(cancel, CancelEvent):
            cancel.listen(self._raise_flag)
            callback = ctypes.cast(_STRLEN, lib.ggml_abort_callback)
            lib.llama_set_abort_callback(self._ctx, callback, ctypes.addressof(self._flag))
            self._py_abort = callback
        else:
            self._py_abort = lib.ggml_abort_callback(lambda data: cancel.is_set())
            lib.llama_set_abort_callback(self._ctx, self._py_abort, None)

    def _disarm(self, cancel: threading.Event | None) -> None:
        if cancel is None:
            return
        if isinstance(cancel, CancelEvent):
            cancel.unlisten(self._raise_flag)
        self._lib.llama_set_abort_callback(self._ctx, self._lib.ggml_abort_callback(0), None)
        self._py_abort = None

    def _raise_flag(self) -> None:
        self._flag[0] = b"\x01"

    def _cut(self, seqs: list[int], lengths: list[int]) -> None:
        for seq, length in zip(seqs, lengths, strict=True):
            if not self._lib.llama_memory_seq_rm(self._mem, seq, length, -1):
                raise TandemError(f"{self.name}: cannot cut sequence {seq} back to {length}")

    def prefill(
        self, ids: list[int] | list[list[int]], cancel: threading.Event | None = None
    ) -> State:
        rows = as_rows(ids)
        width = max(len(r) for r in rows)
        pads = [width - len(r) for r in rows]
        with self._lock:
            seqs = self._take(len(rows))
            items = [
                (tok, pos, seq, pos == len(row) - 1)
                for row, seq in zip(rows, seqs, strict=True)
                for pos, tok in enumerate(row)
            ]
            try:
                logits = self._run(items, cancel)
            except BaseException:
                self._cut(seqs, [0] * len(seqs))
                self._free.extend(seqs)
                raise
        tokens = torch.tensor([[0] * p + r for p, r in zip(pads, rows, strict=True)])
        return self._new_state(tokens, pads, seqs, torch.from_numpy(logits))

    def decode(
        self,
        state: State,
        ids: torch.Tensor | list[list[int]] | list[int],
        cancel: threading.Event | None = None,
    ) -> torch.Tensor:
        return self._append(state, ids, cancel, last_only=False)

    def extend(
        self,
        state: State,
        ids: torch.Tensor | list[list[int]] | list[int],
        cancel: threading.Event | None = None,
    ) -> torch.Tensor:  # [batch, vocab]
        """`decode` that computes each row's last logits only (a prompt continued after stored
        KV, e.g. DRAGON's question after its documents): no vocab projection for the other
        positions. `state.recent_logits` is left None (a crop inside this block drops logits)."""
        return self._append(state, ids, cancel, last_only=True)

    def _append(self, state: State, ids, cancel, *, last_only: bool) -> torch.Tensor:
        new = as_new_ids(ids, state.batch)  # [batch, n]
        n = new.shape[1]
        seqs, lengths = state.cache.seqs, state.lengths
        rows = new.tolist()
        items = [
            (tok, length + j, seq, not last_only or j == n - 1)
            for seq, length, row in zip(seqs, lengths, rows, strict=True)
            for j, tok in enumerate(row)
        ]
        with self._lock:
            try:
                flat = self._run(items, cancel)
            except BaseException:
                self._cut(seqs, lengths)
                raise
        state.ids = torch.cat([state.ids, new], dim=1)
        if last_only:
            state.logits = torch.from_numpy(flat)  # [batch, vocab]
            state.recent_logits = None
            return state.logits
        logits = torch.from_numpy(flat).view(state.batch, n, self.vocab_size)
        state.logits = logits[:, -1]
        state.recent_logits = logits
        return logits

    def free(self, state: State) -> None:
        """Give a state's rows back to the cache now, not when the state is collected (which
        a reference cycle or a traceback can delay past the next session's prefill, and where
        a row's cells lie changes its logits a little: NUMERICS). The state is unusable
        afterwards."""
        rows = state.cache
        if not isinstance(rows, _Rows) or not rows.seqs:
            return
        seqs = rows.detach()
        with self._lock:
            self._cut(seqs, [0] * len(seqs))
            self._free.extend(seqs)

    def crop(self, state: State, seq_len: int) -> None:
        state.crop_bookkeeping(seq_len)
        with self._lock:
            self._cut(state.cache.seqs, state.lengths)

    def rollback(self, state: State, num_tokens: int) -> None:
        if num_tokens:
            self.crop(state, state.seq_len - num_tokens)

    def evict(self, state: State, start: int, end: int) -> None:
        """Drop positions [start, end) of a one-row unpadded state and shift the later ones
        down (StreamingLLM); llama.cpp re-rotates the shifted keys at the next decode.

        The kept cells may be shared with other rows (`stack` / `split_rows` copy rows by
        sharing cells), and a cell has one position for all its rows: shifting it in place
        would move the other rows too. So the kept cells are first made this row's own (its
        KV serialized and written back into fresh cells), then shifted."""
        state.evict_bookkeeping(start, end)
        seq, lib = state.cache.seqs[0], self._lib
        with self._lock:
            if not lib.llama_memory_seq_rm(self._mem, seq, start, end):
                raise TandemError(f"{self.name}: cannot evict [{start}, {end})")
            size = lib.llama_state_seq_get_size(self._ctx, seq)
            buf = (ctypes.c_uint8 * size)()
            written = lib.llama_state_seq_get_data(self._ctx, buf, size, seq)
            lib.llama_memory_seq_rm(self._mem, seq, -1, -1)
            if lib.llama_state_seq_set_data(self._ctx, buf, written, seq) == 0:
                raise TandemError(f"{self.name}: no room to keep the evicted row's cache")
            lib.llama_memory_seq_add(self._mem, seq, end, -1, start - end)

    def score(self, ids: list[int]) -> torch.Tensor:  # [len(ids), vocab]
        row = as_rows(ids)[0]
        with self._lock:
            (seq,) = self._take(1)
            try:
                logits = self._run([(t, p, seq, True) for p, t in enumerate(row)], None)
            finally:
                self._cut([seq], [0])
                self._free.append(seq)
        return torch.from_numpy(logits)

    def _copy_rows(self, pairs: list[tuple[int, int]]) -> list[int]:
        """New seqs sharing the cells of rows (src seq, length) (call under the lock)."""
        seqs = self._take(len(pairs))
        for (src, length), dst in zip(pairs, seqs, strict=True):
            self._lib.llama_memory_seq_cp(self._mem, src, dst, 0, length)
        return seqs

    def stack(self, states: list[State]) -> State:
        width = max(s.seq_len for s in states)
        ids, pads, logits, pairs = [], [], [], []
        for s in states:
            extra = width - s.seq_len
            ids.append(torch.nn.functional.pad(s.ids, (extra, 0), value=0))
            pads.extend(p + extra for p in s.pads)
            logits.append(s.logits)
            pairs.extend(zip(s.cache.seqs, s.lengths, strict=True))
        with self._lock:
            seqs = self._copy_rows(pairs)
        logits = None if any(x is None for x in logits) else torch.cat(logits)
        return self._new_state(torch.cat(ids), pads, seqs, logits)

    def split_rows(self, state: State) -> list[State]:
        """The inverse of `stack`: one single-row state per row, left padding removed; each
        continues decoding exactly as the row would alone (its cells are shared, not copied)."""
        with self._lock:
            seqs = self._copy_rows(list(zip(state.cache.seqs, state.lengths, strict=True)))
        rows = []
        for row, (pad, seq) in enumerate(zip(state.pads, seqs, strict=True)):
            logits = None if state.logits is None else state.logits[row : row + 1].clone()
            recent = state.recent_logits
            one = self._new_state(state.ids[row : row + 1, pad:].clone(), [0], [seq], logits)
            one.recent_logits = None if recent is None else recent[row : row + 1].clone()
            rows.append(one)
        return rows

    # -- persistence ------------------------------------------------------------------------

    def save_state(self, state: State, path: Path) -> None:
        lib = self._lib
        tensors = state_tensors(state)
        with self._lock:
            for row, seq in enumerate(state.cache.seqs):
                size = lib.llama_state_seq_get_size(self._ctx, seq)
                buf = (ctypes.c_uint8 * size)()
                written = lib.llama_state_seq_get_data(self._ctx, buf, size, seq)
                tensors[f"kv.{row}"] = torch.frombuffer(bytearray(buf[:written]), dtype=torch.uint8)
        write_kv_file(path, tensors, kind=FORMAT, lm=self)

    def load_state(self, path: Path) -> State:
        tensors = read_kv_file(path, kind=FORMAT, lm=self)
        pads = tensors["pads"].tolist()
        with self._lock:
            seqs = self._take(len(pads))
            for row, seq in enumerate(seqs):
                blob = tensors[f"kv.{row}"].numpy()
                read = self._lib.llama_state_seq_set_data(
                    self._ctx, blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), blob.size, seq
                )
                if read == 0:
                    self._cut(seqs, [0] * len(seqs))
                    self._free.extend(seqs)
                    raise TandemError(f"{path}: llama.cpp refused the KV of row {row}")
        return self._new_state(tensors["ids"], pads, seqs, tensors["logits"])

    def close(self) -> None:
        """Free the native model and context now (also done when the object is collected)."""
        self._closer()


def _fill(batch: Any, items: list[tuple[int, int, int, bool]]) -> None:
    """Put (token, position, seq, wants logits) items into a llama batch, one seq each."""
    for i, (token, pos, seq, wants) in enumerate(items):
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = wants
    batch.n_tokens = len(items)


def _split_setting(lm: LlamaCppLM, given: int | None) -> int:
    """`split_calls` as given, else $TANDEM_LLAMA_SPLIT, else `calibrated_split(lm)`."""
    text = os.environ.get("TANDEM_LLAMA_SPLIT") if given is None else str(given)
    if text is None or text == "auto":
        return calibrated_split(lm)
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise TandemError(
            f"split_calls / TANDEM_LLAMA_SPLIT must be 'auto' or a token count >= 0, not {text!r}"
        )
    return value


def calibrated_split(lm: LlamaCppLM) -> int:
    """The largest k in SPLIT_SIZES such that every call of 2..k tokens costs more than
    SPLIT_MARGIN times as many one-token calls on this box (0: none), timed once in a scratch
    context of the same model and cached per model, llama.cpp build, CPU and thread count; a
    timing disturbed by other work on the cores (SPLIT_DISTURBED) is taken again by the next
    processes, up to SPLIT_TRIES timings in all."""
    info = lm._lib.llama_print_system_info().decode(errors="replace")
    rule = f"{SPLIT_MARGIN}|fastest of {SPLIT_REPEATS} rounds|undisturbed {SPLIT_DISTURBED}"
    key = f"{lm.fingerprint}|{info}|{_cpu_line()}|{lm.threads}|{lm.flash_attn}|{rule}"
    path = (
        tandem_home()
        / "calibration"
        / f"split-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    )
    if key in _SPLITS_TIMED:  # timed by this process already
        return _SPLITS_TIMED[key]
    try:
        cached = json.loads(path.read_text())
        split, disturbed = int(cached["split_calls"]), int(cached.get("disturbed", 0))
        if not 0 < disturbed < SPLIT_TRIES:
            return split  # quiet, or disturbed as often as it will be timed
    except (OSError, ValueError, KeyError, TypeError):
        disturbed = 0  # no cache yet
    split, timings, waited = _measure_split(lm)
    _SPLITS_TIMED[key] = split
    if not timings:  # no scratch context: no timing, nothing to keep
        return split
    quiet = waited is None or waited <= SPLIT_DISTURBED  # None: the kernel does not say
    record = {"model": lm.name, "threads": lm.threads, "split_calls": split, "ms": timings}
    # share of the timing spent waiting for a core, and how many timings in a row were disturbed
    record["waited"] = None if waited is None else round(waited, 4)
    record["disturbed"] = 0 if quiet else disturbed + 1
    try:  # a read-only cache costs a calibration per process, nothing else
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(record, indent=1) + "\n")
        partial.replace(path)
    except OSError:
        pass
    return split


@functools.cache  # the processor does not change under a running process
def _cpu_line() -> str:
    """This box's processor as /proc/cpuinfo names it (model and flags), '' where unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    first = text.split("\n\n", 1)[0].splitlines()
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first)}
    return f"{fields.get('model name', '')}|{fields.get('flags', '')}"


def _queue_wait_s() -> float | None:
    """Seconds this process's threads have spent runnable but waiting for a core (the
    scheduler's run delay, /proc/self/task/*/schedstat), None where the kernel does not say."""
    total = 0
    try:
        for task in Path("/proc/self/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                total += int((task / "schedstat").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


def _measure_split(lm: LlamaCppLM) -> tuple[int, dict[str, float], float | None]:
    """(split_calls, fastest ms per call size, share of the timing this process's threads
    waited for a core or None) timed in a fresh small context of `lm`'s model, so the model's
    own cache (and where its rows' cells lie: NUMERICS) is untouched."""
    lib = lm._lib
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 256
    cparams.n_seq_max = 1
    cparams.n_threads = cparams.n_threads_batch = lm.threads
    cparams.no_perf = True
    cparams.flash_attn_type = (
        lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if lm.flash_attn else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    ctx = lib.llama_init_from_model(lm._model, cparams)
    if not ctx:
        return 0, {}, None
    batch = lib.llama_batch_init(64, 0, 1)
    mem = lib.llama_get_memory(ctx)
    prompt = 48  # a short context: what a small call costs does not hinge on it

    def call(tokens: int, position: int, logits: bool = True) -> float:
        # logits for every token, as a block of drafts wants them
        positions = range(position, position + tokens)
        _fill(
            batch,
            [((1000 + p) % lm.vocab_size, p, 0, logits or p == positions[-1]) for p in positions],
        )
        began = time.perf_counter()
        if lib.llama_decode(ctx, batch) != 0:
            raise TandemError(f"{lm.name}: llama_decode failed while timing call sizes")
        return time.perf_counter() - began

    sizes = (1, *SPLIT_SIZES)
    try:
        call(prompt, 0, logits=False)
        began, queued = time.perf_counter(), _queue_wait_s()
        fastest = dict.fromkeys(sizes, float("inf"))
        for round_ in range(SPLIT_REPEATS + 1):  # the first round is a warm-up
            for tokens in sizes:
                seconds = call(tokens, prompt)
                lib.llama_memory_seq_rm(mem, 0, prompt, -1)
                if round_:
                    fastest[tokens] = min(fastest[tokens], seconds)
        after = _queue_wait_s()
        waited = None
        if queued is not None and after is not None:
            waited = (after - queued) / max(time.perf_counter() - began, 1e-9)
        timings = {str(tokens): 1000 * fastest[tokens] for tokens in sizes}
        split = 0
        for k in SPLIT_SIZES:
            if fastest[k] <= SPLIT_MARGIN * k * fastest[1]:
                break
            split = k
        return split, timings, waited
    finally:
        lib.llama_batch_free(batch)
        lib.llama_free(ctx)


def _free_native(lib: Any, ctx: Any, model: Any, batch: Any) -> None:
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)
    lib.llama_model_free(model)
