"""Link probe: a tiny TCP server and client that measure round-trip time and rate.

Used by the emulation tests and `tandem bench link` to check that a link (the delay
proxy on loopback, or the namespaces made by `tandem net up`) delivers what it was
configured for. The probe server is the "cloud-side service" behind the proxy.

Protocol (one request per connection): the client sends a 9-byte header, an op byte and
a big-endian uint64 `n`, then:

- ``E``: echo. The server echoes every byte until the client half-closes. The client
  sends small messages one at a time and times each echo: *RTT samples*.
- ``U``: upload. The client sends `n` bytes; after the last one the server answers ``K``.
  Time from the first byte to ``K`` = n / rate + one RTT.
- ``D``: download. The server sends `n` bytes. Time from the request to the last byte
  = n / rate + one RTT.

Rates are reported as payload Mbit/s (10**6 bits) with the median RTT subtracted.

Processes (as `tandem net exec` runs them)::

    python -m tandem.testbed.probe serve --listen 127.0.0.1:7400 --ready-file F
    python -m tandem.testbed.probe measure --connect 10.203.0.2:7401 --pings 10 \
        --upload-bytes 4000000 --download-bytes 4000000      # prints one JSON object
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import struct
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tandem.errors import TandemError
from tandem.testbed.proxy import check_target, parse_hostport

HEADER = struct.Struct(">cQ")
CHUNK = 65536


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    _nodelay(writer)
    try:
        op, n = HEADER.unpack(await reader.readexactly(HEADER.size))
        if op == b"E":
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
        elif op == b"U":
            left = n
            while left > 0:
                data = await reader.read(min(CHUNK, left))
                if not data:
                    return
                left -= len(data)
            writer.write(b"K")
            await writer.drain()
        elif op == b"D":
            block = bytes(CHUNK)
            left = n
            while left > 0:
                writer.write(block[: min(CHUNK, left)])
                left -= min(CHUNK, left)
                await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def start_server(host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """Start the probe server; `server.sockets[0].getsockname()[1]` is its port."""
    check_target(host)
    return await asyncio.start_server(_handle, host, port)


async def _open(
    host: str, port: int, op: bytes, n: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    check_target(host)
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        raise TandemError(f"probe cannot connect to {host}:{port}: {exc}") from None
    _nodelay(writer)
    writer.write(HEADER.pack(op, n))
    return reader, writer


async def measure_rtt(
    host: str, port: int, *, count: int, size: int = 16, warmup: int = 1
) -> list[float]:
    """`count` round-trip times (seconds) of `size`-byte messages, after `warmup` discarded."""
    reader, writer = await _open(host, port, b"E", 0)
    message = bytes(size)
    samples = []
    try:
        for index in range(warmup + count):
            start = time.perf_counter()
            writer.write(message)
            await writer.drain()
            await reader.readexactly(len(message))
            if index >= warmup:
                samples.append(time.perf_counter() - start)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return samples


async def measure_upload(host: str, port: int, *, nbytes: int) -> float:
    """Seconds from sending the first of `nbytes` to the server's acknowledgement."""
    start = time.perf_counter()
    reader, writer = await _open(host, port, b"U", nbytes)
    block = bytes(CHUNK)
    try:
        left = nbytes
        while left > 0:
            writer.write(block[: min(CHUNK, left)])
            left -= min(CHUNK, left)
            await writer.drain()
        await reader.readexactly(1)
        return time.perf_counter() - start
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def measure_download(host: str, port: int, *, nbytes: int) -> float:
    """Seconds from the request to the last of `nbytes` received."""
    start = time.perf_counter()
    reader, writer = await _open(host, port, b"D", nbytes)
    try:
        left = nbytes
        while left > 0:
            data = await reader.read(CHUNK)
            if not data:
                raise TandemError(f"probe download ended {left} bytes early")
            left -= len(data)
        return time.perf_counter() - start
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def rate_mbit(nbytes: int, elapsed_s: float, rtt_s: float) -> float:
    """Payload Mbit/s of a transfer that took `elapsed_s`, one round trip `rtt_s` removed."""
    return nbytes * 8 / 1e6 / max(elapsed_s - rtt_s, 1e-9)


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What `measure` found: RTT samples (s), and transfer times (s) and rates (Mbit/s)."""

    rtt_s: list[float]
    rtt_median_s: float | None = None
    upload_bytes: int = 0
    upload_s: float | None = None
    upload_mbit: float | None = None
    download_bytes: int = 0
    download_s: float | None = None
    download_mbit: float | None = None


async def measure(
    host: str, port: int, *, pings: int = 10, upload_bytes: int = 0, download_bytes: int = 0
) -> Measurement:
    """RTT samples, then an upload and a download (each optional) to one probe server."""
    rtt_s = await measure_rtt(host, port, count=max(pings, 1))
    median = statistics.median(rtt_s)
    upload_s = await measure_upload(host, port, nbytes=upload_bytes) if upload_bytes else None
    download_s = (
        await measure_download(host, port, nbytes=download_bytes) if download_bytes else None
    )
    return Measurement(
        rtt_s=rtt_s,
        rtt_median_s=median,
        upload_bytes=upload_bytes,
        upload_s=upload_s,
        upload_mbit=None if upload_s is None else rate_mbit(upload_bytes, upload_s, median),
        download_bytes=download_bytes,
        download_s=download_s,
        download_mbit=None if download_s is None else rate_mbit(download_bytes, download_s, median),
    )


async def _serve_forever(host: str, port: int, ready_file: Path | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = await start_server(host, port)
    if ready_file is not None:  # atomic, like the proxy's: {pid, listen}
        partial = ready_file.with_name(ready_file.name + ".partial")
        partial.write_text(
            json.dumps(
                {"pid": os.getpid(), "listen": f"{host}:{server.sockets[0].getsockname()[1]}"}
            )
        )
        partial.replace(ready_file)
    await stop.wait()
    server.close()
    await server.wait_closed()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tandem.testbed.probe", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the probe server until SIGTERM")
    serve.add_argument("--listen", default="127.0.0.1:7400")
    serve.add_argument("--ready-file", type=Path, default=None)
    run = commands.add_parser("measure", help="measure RTT and rate; print JSON")
    run.add_argument("--connect", required=True)
    run.add_argument("--pings", type=int, default=10)
    run.add_argument("--upload-bytes", type=int, default=0)
    run.add_argument("--download-bytes", type=int, default=0)
    args = parser.parse_args(argv)
    from tandem.transport import loop as event_loop  # here: the package is heavy to import

    try:
        if args.command == "serve":
            event_loop.run(_serve_forever(*parse_hostport(args.listen), args.ready_file))
        else:
            host, port = parse_hostport(args.connect)
            found = event_loop.run(
                measure(
                    host,
                    port,
                    pings=args.pings,
                    upload_bytes=args.upload_bytes,
                    download_bytes=args.download_bytes,
                )
            )
            print(json.dumps(asdict(found)))
    except TandemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
