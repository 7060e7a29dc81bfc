"""Compute isolation: one set of CPU cores per emulated machine.

Words used here:
- *cpu set*: the cores a process may run on (`os.sched_setaffinity`); the engines (llama.cpp,
  torch) use as many threads as the set has cores.
- *role*: `device` or `cloud`. `plan()` splits the cores this process may use into one set per
  role: on a 2-core box device = core 0 and cloud = core 1; with one core both share it.
- *machine state*: cpu set, thread counts and load average, saved beside every measurement;
  *cpu info*: the processor's model and the vector instruction sets it offers (the box has
  changed between sessions, with AVX-512 and without, and a decode step's time with it by
  2-2.7x: docs/network.md; never compare figures from different processors).
- *launcher*: `python -m tandem.testbed.cpus --cpus 0 -- CMD ...` pins itself, sets
  OMP_NUM_THREADS to the set's size and execs CMD (like `taskset -c 0`, no fork; affinity
  survives exec), so a process stands on its cores from its first instruction.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
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


def role_cpus(device: str = "", cloud: str = "") -> dict[str, list[int]]:
    """The `--device-cpus` / `--cloud-cpus` knob: each role's cores, from text like '0' or
    '2-3'; a role left empty gets its share of `plan()`. Every core must be one this process
    may use. Sets may overlap (the result then says so: `overlap`)."""
    sets = plan()
    for role, text in (("device", device), ("cloud", cloud)):
        if text:
            sets[role] = parse_cpus(text)
    allowed = set(available())
    for role, cores in sets.items():
        missing = sorted(set(cores) - allowed)
        if missing:
            raise TandemError(
                f"{role} cpus {format_cpus(cores)}: core(s) {format_cpus(missing)} not available "
                f"here (this process may use {format_cpus(sorted(allowed))})"
            )
    return sets


def overlap(sets: dict[str, list[int]]) -> list[int]:
    """Cores that more than one role owns (empty: every machine has cores of its own)."""
    seen: set[int] = set()
    shared: set[int] = set()
    for cores in sets.values():
        shared |= seen & set(cores)
        seen |= set(cores)
    return sorted(shared)


def format_cpus(cores: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the inverse of `parse_cpus`)."""
    ordered, parts = sorted(set(cores)), []
    start = prev = None
    for core in [*ordered, None]:
        if core is not None and prev is not None and core == prev + 1:
            prev = core
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = core
    return ",".join(parts)


def pin_thread(cores: Iterable[int]) -> list[int]:
    """Run the calling thread (only it, and the threads it starts later) on `cores`."""
    wanted = sorted(set(cores))
    try:
        os.sched_setaffinity(threading.get_native_id(), wanted)
    except (OSError, ValueError) as exc:
        raise TandemError(f"cannot pin to cores {wanted}: {exc}") from None
    return wanted


def pinned_argv(cores: Iterable[int], argv: Sequence[str]) -> list[str]:
    """`argv` run on `cores`, through the launcher (module docstring)."""
    return [sys.executable, "-m", "tandem.testbed.cpus", "--cpus", format_cpus(cores), "--", *argv]


def pin(cores: Iterable[int]) -> list[int]:
    """Run this process (and the threads it starts from now on) on `cores`; torch's intra-op
    threads follow. Returns the set. llama.cpp reads the set when a model is loaded. (Call it
    before other threads start: threads already running keep their own sets.)"""
    wanted = pin_thread(cores)
    try:
        import torch

        torch.set_num_threads(len(wanted))
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return wanted


@contextlib.contextmanager
def restored():
    """Give the calling thread back its cpu set and torch its thread count on leaving: for code
    that pins the process it runs in for a while (the demos, called from a test or a notebook,
    left it on the device's core)."""
    import torch

    cores, threads = available(), torch.get_num_threads()
    try:
        yield
    finally:
        pin_thread(cores)
        torch.set_num_threads(threads)


def pin_role(role: str, cores: Iterable[int] | None = None) -> list[int]:
    """Pin this process to `role`'s share of `cores` (default: every core of the machine)."""
    if role not in ROLES:
        raise TandemError(f"unknown role {role!r}: choose one of {', '.join(ROLES)}")
    pool = cores if cores is not None else range(os.cpu_count() or 1)
    return pin(plan(ROLES, pool)[role])


def machine_state(lm=None) -> dict:
    """The cpu set, thread counts, load average and event loop (`transport.loop.name()`) of
    this process (of the calling thread: affinity is per thread), for a result file; with
    `lm`, also its engine's thread count."""
    from tandem.transport import loop as event_loop

    state: dict = {"cpus": available(), "loadavg": loadavg(), "event_loop": event_loop.name()}
    try:
        import torch

        state["torch_threads"] = torch.get_num_threads()
    except ImportError:  # pragma: no cover
        pass
    if lm is not None:
        state["engine_threads"] = engine_threads(lm)
        split = getattr(lm, "split_calls", None)  # llama.cpp: calls fed one token at a time
        if split is not None:
            state["engine_split_calls"] = split
    return state


def engine_threads(lm) -> int:
    """Threads a model's forward pass uses: llama.cpp's n_threads, else torch's intra-op count."""
    threads = getattr(lm, "threads", None)
    if threads:
        return int(threads)
    import torch

    return torch.get_num_threads()


ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")  # fmt: skip


def parse_cpuinfo(text: str) -> dict:
    """The first processor of a /proc/cpuinfo text: {"model", "mhz", "isa": the ISA_FLAGS it
    has, in that order}; fields it lacks are None (or an empty list)."""
    first: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if first:
                break
            continue
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    flags = set(first.get("flags", "").split())
    mhz = first.get("cpu MHz")
    try:
        mhz_value = round(float(mhz), 1) if mhz else None
    except ValueError:
        mhz_value = None
    return {
        "model": first.get("model name"),
        "mhz": mhz_value,
        "isa": [f for f in ISA_FLAGS if f in flags],
    }


def cpu_info(path: str = "/proc/cpuinfo") -> dict:
    """`parse_cpuinfo` of this box (model None where there is no /proc/cpuinfo)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return parse_cpuinfo(file.read())
    except OSError:
        return parse_cpuinfo("")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> None:
    """The launcher: `python -m tandem.testbed.cpus --cpus 0-1 -- CMD ...`."""
    parser = argparse.ArgumentParser(prog="python -m tandem.testbed.cpus")
    parser.add_argument("--cpus", required=True, help="cores, e.g. 0 or 0,2 or 1-3")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (... --cpus 0 -- CMD ...)")
    try:
        cores = pin_thread(parse_cpus(args.cpus))
    except TandemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    os.environ["OMP_NUM_THREADS"] = str(len(cores))
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"error: cannot run {command[0]}: {exc}", file=sys.stderr)
        raise SystemExit(127) from None


if __name__ == "__main__":
    main()
