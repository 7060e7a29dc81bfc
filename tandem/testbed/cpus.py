"""Compute isolation: one set of CPU cores per emulated machine.

Words used here:
- *cpu set*: the cores a process may run on (`os.sched_setaffinity`); the engines (llama.cpp,
  torch) use as many threads as the set has cores.
- *role*: `device` or `cloud`. `plan()` splits the cores this process may use into one set per
  role: on a 2-core box device = core 0 and cloud = core 1; with one core both share it.
- *machine state*: cpu set, thread counts and load average, saved beside every measurement.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from tandem.errors import TandemError

ROLES = ("device", "cloud")


def parse_cpus(text: str) -> list[int]:
    """'0', '0,2', '1-3' -> sorted core numbers."""
    cores: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, _, hi = part.partition("-")
            cores.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise TandemError(f"bad cpu list {text!r}: use e.g. 0 or 0,2 or 1-3") from None
    if not cores:
        raise TandemError(f"bad cpu list {text!r}: no cores")
    return sorted(cores)


def available() -> list[int]:
    """Cores this process may run on now."""
    return sorted(os.sched_getaffinity(0))


def plan(roles: Sequence[str] = ROLES, cores: Iterable[int] | None = None) -> dict[str, list[int]]:
    """Split `cores` (default: `available()`) into one contiguous set per role, in order."""
    pool = sorted(cores) if cores is not None else available()
    if len(pool) < len(roles):
        return {role: pool for role in roles}  # fewer cores than machines: they share
    size = len(pool) // len(roles)
    return {role: pool[i * size : (i + 1) * size] for i, role in enumerate(roles)}


def pin(cores: Iterable[int]) -> list[int]:
    """Run this process (and the threads it starts from now on) on `cores`; torch's intra-op
    threads follow. Returns the set. llama.cpp reads the set when a model is loaded."""
    wanted = sorted(set(cores))
    try:
        os.sched_setaffinity(0, wanted)
    except (OSError, ValueError) as exc:
        raise TandemError(f"cannot pin to cores {wanted}: {exc}") from None
    try:
        import torch

        torch.set_num_threads(len(wanted))
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return wanted


def pin_role(role: str, cores: Iterable[int] | None = None) -> list[int]:
    """Pin this process to `role`'s share of `cores` (default: every core of the machine)."""
    if role not in ROLES:
        raise TandemError(f"unknown role {role!r}: choose one of {', '.join(ROLES)}")
    pool = cores if cores is not None else range(os.cpu_count() or 1)
    return pin(plan(ROLES, pool)[role])


def machine_state() -> dict:
    """The cpu set, thread counts and load average of this process, for a result file."""
    state: dict = {"cpus": available(), "loadavg": [round(x, 2) for x in os.getloadavg()]}
    try:
        import torch

        state["torch_threads"] = torch.get_num_threads()
    except ImportError:  # pragma: no cover
        pass
    return state
