"""The event loop every tandem process runs its sessions on.

uvloop (libuv) where it is installed, which the package's dependencies make the default on
Linux and macOS; asyncio's own selector loop otherwise, or when `$TANDEM_EVENT_LOOP` says
`asyncio`. The protocols do not depend on the choice (they use asyncio's public API only);
what changes is the CPU each message costs, which lands on the machine's own cores: a
Ping/Pong round trip over loopback, client, server and delay proxy in one process, took
68 us of CPU on uvloop against 90 us on asyncio (docs/network.md).

    from tandem.transport import loop
    result = loop.run(main())        # asyncio.run(main()) on the chosen loop
    loop.name()                      # "uvloop" or "asyncio", as `run` would choose

`$TANDEM_EVENT_LOOP` is read by each process, so the testbed's side processes, spawned with
the caller's environment, follow the caller's choice.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tandem.errors import TandemError

ENV = "TANDEM_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")  # auto: uvloop where installed

T = TypeVar("T")


def _uvloop():
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def name() -> str:
    """The loop `run` uses in this process: "uvloop" or "asyncio" ($TANDEM_EVENT_LOOP: auto,
    the default, takes uvloop where it is installed)."""
    choice = os.environ.get(ENV) or "auto"
    if choice not in CHOICES:
        raise TandemError(f"{ENV}={choice!r}: choose one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return "asyncio"
    if _uvloop() is not None:
        return "uvloop"
    if choice == "uvloop":
        raise TandemError(
            f"{ENV}=uvloop but uvloop is not installed: pip install uvloop, or set {ENV}=asyncio"
        )
    return "asyncio"


def factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """A new-loop function for the chosen loop (`asyncio.Runner(loop_factory=...)`)."""
    if name() == "uvloop":
        return _uvloop().new_event_loop
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the chosen loop."""
    try:
        make = factory()
    except TandemError:
        main.close()  # never awaited: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=make) as runner:
        return runner.run(main)
