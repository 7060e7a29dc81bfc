"""DRAGON as real processes: a cloud server and a device client over TCP.

Words used here:
- *corpus*: a folder of documents, `stdlib` (the public corpus), or an index folder made by
  `tandem index build`. Folders are indexed once into `$TANDEM_HOME/indexes/` (64-token
  chunks, MiniLM embeddings, with a progress bar) and reused afterwards.
- *ready file*: JSON `{"host", "port", "pid"}` the cloud writes once it listens, so a parent
  process (`tandem demo`) can connect without parsing logs.
- *secret*: the shared HMAC key of the transport handshake, read from `$TANDEM_SECRET`
  (never from argv, which other users can read).

    python -m tandem.serve.dragon_session --corpus stdlib --model qwen2.5-coder-0.5b \
        --listen 127.0.0.1:0 --ready-file /tmp/cloud.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

from tandem.errors import TandemError
from tandem.protocols.dragon.setup import SideSetup, load_side, set_threads, transport_config
from tandem.transport import loop as event_loop


def emulated_link(delay_ms: float):
    """One direction of an emulated link: `delay_ms` one-way, jitter `JITTER` of it (the
    paper's 1/5, Sec. 7.3; the testbed's default too)."""
    from tandem.testbed.netns import JITTER
    from tandem.transport import LinkConfig

    return LinkConfig(delay_ms=delay_ms, jitter_ms=delay_ms * JITTER) if delay_ms > 0 else None


async def serve_cloud_forever(
    setup: SideSetup, host: str, port: int, *, ready_file: Path | None = None, link=None
) -> None:
    """Listen and serve DRAGON sessions until SIGTERM / SIGINT."""
    from tandem.protocols.dragon import start_cloud

    server = await start_cloud(
        host,
        port,
        lm=setup.lm,
        knowledge=setup.knowledge,
        transport=transport_config(setup.lm, role="cloud", link=link),
        profile=setup.profile,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    info = {"host": server.host, "port": server.port, "pid": os.getpid()}
    if ready_file is not None:
        partial = ready_file.with_name(ready_file.name + ".partial")
        partial.write_text(json.dumps(info))
        partial.replace(ready_file)
    print(f"dragon cloud listening on {server.host}:{server.port}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        await server.close()


async def run_device_session(
    setup: SideSetup,
    host: str,
    port: int,
    *,
    question: str,
    config,
    on_token=None,
    link=None,
    secret: bytes | None = None,
):
    """Connect to a DRAGON cloud and generate; returns the device's `SideReport`."""
    from tandem.protocols.dragon import connect_device

    return await connect_device(
        host,
        port,
        transport=transport_config(setup.lm, role="device", link=link, secret=secret),
        lm=setup.lm,
        knowledge=setup.knowledge,
        question=question,
        config=config,
        profile=setup.profile,
        on_token=on_token,
    )


def cloud_main(argv: list[str] | None = None) -> None:
    """Entry point of a cloud process (used by `tandem demo`)."""
    from tandem.testbed.proxy import parse_hostport

    parser = argparse.ArgumentParser(prog="python -m tandem.serve.dragon_session")
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--docs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--role", default="cloud", help="cores to pin to when --threads is 0")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="emulated one-way delay")
    args = parser.parse_args(argv)
    try:
        set_threads(args.threads, role=args.role)
        host, port = parse_hostport(args.listen)
        setup = load_side(
            corpus=args.corpus, model=args.model, docs=args.docs, profile=not args.no_profile
        )
        link = emulated_link(args.delay_ms)
        event_loop.run(
            serve_cloud_forever(setup, host, port, ready_file=args.ready_file, link=link)
        )
    except TandemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    cloud_main()
