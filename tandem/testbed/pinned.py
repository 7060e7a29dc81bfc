"""In-process pairs: each side's model runs on that side's cores.

Some benchmarks run the device and the cloud in ONE process (joined by `memory_pair`, or a
cloud server and its devices on loopback). They wrap each side's model in `PinnedModel`:
every method call (prefill, decode, crop, stack, ...) is handed to a few worker threads pinned
to the side's cpu set, and the caller waits for the answer. So the forward passes, and the
engine's own helper threads (OpenMP starts them from, and with the set of, the pinned worker),
stand on that side's cores; torch's intra-op count is set per worker to the set's size
(OpenMP keeps that count per thread). Attributes (tokenizer, name, vocab_size, threads, ...)
read straight through.

What is not a model call stays where its caller runs, on either side's cores: the event loop,
sampling, codecs, the in-process link emulator. Benchmarks say so in their results.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tandem.testbed.cpus import machine_state, pin_thread

WORKERS = 8  # concurrent calls per side (an engine serialises its own calls under its lock)


def _start_worker(cores: list[int]) -> None:
    import torch

    pin_thread(cores)
    torch.get_num_threads()  # torch's per-thread setup first, or it would overwrite ours
    torch.set_num_threads(len(cores))


class PinnedModel:
    """`lm` whose method calls run on `cores` (module docstring). `close()` stops the workers."""

    def __init__(self, lm, cores: Iterable[int], *, role: str) -> None:
        cores = sorted(set(cores))
        pool = ThreadPoolExecutor(
            WORKERS, f"tandem-{role}", initializer=_start_worker, initargs=(cores,)
        )
        object.__setattr__(self, "_lm", lm)
        object.__setattr__(self, "_pool", pool)
        object.__setattr__(self, "cores", cores)
        object.__setattr__(self, "role", role)

    def __getattr__(self, name: str):
        value = getattr(self._lm, name)
        if name.startswith("_") or not inspect.ismethod(value):
            return value  # data, the tokenizer, the torch module: as they are
        return functools.partial(self._call, value)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._lm, name, value)

    def _call(self, method, *args, **kwargs):
        return self._pool.submit(method, *args, **kwargs).result()

    def run(self, fn, *args, **kwargs):
        """`fn(model, *args, **kwargs)` on one of this side's workers, with the bare model (a
        whole measurement loop on the side's cores, without a hand-off per call)."""
        return self._pool.submit(fn, self._lm, *args, **kwargs).result()

    def observed(self) -> dict:
        """`machine_state` as one of this side's workers sees it (its cpu set, its torch
        threads, the engine's thread count)."""
        return self.run(machine_state)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __repr__(self) -> str:
        return f"PinnedModel({self._lm!r}, cores={self.cores}, role={self.role!r})"


@contextlib.contextmanager
def pinned(
    models: dict[str, Any], sets: dict[str, list[int]], observed: dict | None = None
) -> Iterator[dict[str, PinnedModel]]:
    """{role: model} -> {role: that model on `sets[role]`}; on a clean exit each side's
    `observed()` goes into `observed`; the workers stop either way."""
    sides = {role: PinnedModel(lm, sets[role], role=role) for role, lm in models.items()}
    try:
        yield sides
        if observed is not None:
            observed.update({role: side.observed() for role, side in sides.items()})
    finally:
        for side in sides.values():
            side.close()
