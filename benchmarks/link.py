"""`tandem bench link`: is the transport fast, and is the emulated network what it claims?

Three measurements, all in one run:

(a) *latency*: round trip of a small message over loopback, side by side (interleaved):
    `raw socket` (both ends in one thread, blocking send/recv: the floor), `asyncio frame`
    (4-byte length prefix + 16 bytes over asyncio streams), `tandem ping` (Ping/Pong over
    a handshaken `tandem.transport` session) and `tandem ping via proxy` (the same through
    the delay proxy at 0 ms: the proxy's own cost).
(b) *delay*: delivered vs configured one-way delay (0/50/100/300 ms, jitter 0 and 10 ms),
    from echo round trips through the emulated link (one-way = RTT / 2: the delay is
    configured per direction).
(c) *rate*: delivered vs configured payload rate (10/50/100 Mbit/s), upload and download,
    with one RTT removed from each transfer time.

(b) and (c) use the namespaces (`tandem net`, network name `tandem-bench`) when root,
else the proxy on loopback; the JSON records which (`link_path`) and what gave the delay
(`delay_path`: proxy or netem). Their probe server and client are processes on the cloud's
and the device's cores (`--device-cpus`, `--cloud-cpus`); (a) runs both ends in this one,
unpinned process (it measures the software floor, not two machines). Warm-ups are
discarded; medians are reported.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import RESULTS
from benchmarks.report import Machines, save_json
from tandem.errors import TandemError
from tandem.testbed.netns import (
    NetConfig,
    net_down,
    net_up,
    netns_unavailable_reason,
    side_argv,
)
from tandem.testbed.proxy import DelayProxy, ProxyConfig
from tandem.transport import loop as event_loop

BENCH_NET = "tandem-bench"
MESSAGE = bytes(16)


def _summary(samples_s: list[float]) -> dict:
    """Median, p10, p90, mean, stdev, min, max in milliseconds, and the count."""
    ms = sorted(sample * 1e3 for sample in samples_s)
    pick = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    return {
        "median_ms": statistics.median(ms),
        "p10_ms": pick(0.10),
        "p90_ms": pick(0.90),
        "mean_ms": statistics.fmean(ms),
        "stdev_ms": statistics.pstdev(ms),
        "min_ms": ms[0],
        "max_ms": ms[-1],
        "count": len(ms),
    }


# ---------------------------------------------------------------- (a) loopback latency


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += sock.recv(size - len(data))
    return data


def _raw_socket_rtts(count: int, warmup: int) -> list[float]:
    """The floor: both ends of a 127.0.0.1 TCP connection in one thread, blocking calls.

    Like the asyncio methods (client and server in one event loop) there is no thread or
    process switch, so what remains is the kernel's loopback TCP and four syscalls.
    """
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    samples = []
    with client, server:
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for index in range(warmup + count):
            start = time.perf_counter()
            client.sendall(MESSAGE)
            server.sendall(_recv_exactly(server, len(MESSAGE)))
            _recv_exactly(client, len(MESSAGE))
            if index >= warmup:
                samples.append(time.perf_counter() - start)
    return samples


async def _asyncio_frame_rtts(count: int, warmup: int) -> list[float]:
    """Length-prefixed frames echoed over asyncio streams (no tandem code)."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = struct.unpack(">I", await reader.readexactly(4))
                writer.write(struct.pack(">I", size) + await reader.readexactly(size))
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    frame = struct.pack(">I", len(MESSAGE)) + MESSAGE
    samples = []
    for index in range(warmup + count):
        start = time.perf_counter()
        writer.write(frame)
        await writer.drain()
        (size,) = struct.unpack(">I", await reader.readexactly(4))
        await reader.readexactly(size)
        if index >= warmup:
            samples.append(time.perf_counter() - start)
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    return samples


async def _tandem_ping_rtts(count: int, warmup: int, *, via_proxy: bool) -> list[float]:
    """Ping/Pong over a tandem.transport session (handshake done first), optionally proxied."""
    from tandem.transport import TransportConfig, connect, serve

    def config(role: str) -> TransportConfig:
        return TransportConfig(
            secret=b"bench-link",
            role=role,
            tokenizer_hash="bench",
            vocab_size=1,
            ping_interval=None,
            dead_peer_timeout=None,
        )

    async def handler(channel) -> None:
        async for _ in channel:  # Pings are answered by the channel itself
            pass

    server = await serve(handler, "127.0.0.1", 0, config=config("cloud"))
    proxy = None
    port = server.port
    if via_proxy:
        proxy = await DelayProxy(ProxyConfig(upstream_port=server.port)).start()
        port = proxy.port
    channel = await connect("127.0.0.1", port, config=config("device"))
    samples = []
    for index in range(warmup + count):
        start = time.perf_counter()
        await channel.ping(timeout=10)
        if index >= warmup:
            samples.append(time.perf_counter() - start)
    await channel.close()
    if proxy is not None:
        await proxy.close()
    await server.close()
    return samples


def measure_latency(count: int, warmup: int = 50, rounds: int = 5) -> dict:
    """(a): median/p90 round trip of a 16-byte message over loopback, four ways.

    The methods take turns in `rounds` rounds (count / rounds samples each, after their
    own warm-up), so a burst of load on this shared machine hits them all alike.
    """
    methods = {
        "raw socket": lambda n: _raw_socket_rtts(n, warmup),
        "asyncio frame": lambda n: event_loop.run(_asyncio_frame_rtts(n, warmup)),
        "tandem ping": lambda n: event_loop.run(_tandem_ping_rtts(n, warmup, via_proxy=False)),
        "tandem ping via proxy": lambda n: event_loop.run(
            _tandem_ping_rtts(n, warmup, via_proxy=True)
        ),
    }
    samples: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(rounds):
        for name, method in methods.items():
            samples[name] += method(max(1, count // rounds))
    return {name: _summary(found) for name, found in samples.items()}


# ---------------------------------------------------------------- (b), (c) emulated link


class _Link:
    """The emulated link under test: `tandem net` (namespaces or loopback) plus a probe server."""

    def __init__(self, mode: str, state_dir: Path, cpus: dict[str, list[int]]) -> None:
        self.mode = mode
        self.state_dir = state_dir
        self.cpus = {f"{side}_cpus": tuple(cores) for side, cores in cpus.items()}
        self.server: subprocess.Popen | None = None
        self.status = None
        if mode == "loopback":
            self.ports = {"service_port": _free_port(), "proxy_port": _free_port()}
        else:
            self.ports = {}

    def configure(self, **link) -> None:
        config = NetConfig(name=BENCH_NET, mode=self.mode, **self.ports, **self.cpus, **link)
        self.status = net_up(config)
        if self.server is None:
            ready = self.state_dir / f"{BENCH_NET}.probe.ready"
            ready.unlink(missing_ok=True)
            argv = [sys.executable, "-m", "tandem.testbed.probe"]
            argv += ["serve", "--listen", self.status.service, "--ready-file", str(ready)]
            argv = side_argv(self.status, "cloud", argv)
            self.server = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 20
            while not ready.exists():
                if self.server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("link bench: the probe server did not start")
                time.sleep(0.02)

    def measure(self, *, pings: int, upload_bytes: int = 0, download_bytes: int = 0) -> dict:
        argv = [sys.executable, "-m", "tandem.testbed.probe"]
        argv += ["measure", "--connect", self.status.connect, "--pings", str(pings)]
        argv += ["--upload-bytes", str(upload_bytes), "--download-bytes", str(download_bytes)]
        argv = side_argv(self.status, "device", argv)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"link bench: probe failed: {done.stderr.strip()[-300:]}")
        return json.loads(done.stdout)

    def close(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=10)
        (self.state_dir / f"{BENCH_NET}.probe.ready").unlink(missing_ok=True)
        net_down(BENCH_NET)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure_delay(link: _Link, delays_ms: list[float], jitters_ms: list[float], pings: int) -> list:
    """(b): delivered one-way delay (RTT / 2) for each configured (delay, jitter).

    Rows with jitter take 3x the pings: their spread is ~jitter / sqrt(6) per sample.
    """
    rows = []
    for jitter_ms in jitters_ms:
        for delay_ms in delays_ms:
            link.configure(delay_ms=delay_ms, jitter_ms=jitter_ms)
            found = link.measure(pings=pings * 3 if jitter_ms > 0 else pings)  # jitter: more
            one_way = _summary([rtt / 2 for rtt in found["rtt_s"]])
            rows.append({"delay_ms": delay_ms, "jitter_ms": jitter_ms, "one_way": one_way})
    return rows


def measure_rate(link: _Link, rates_mbit: list[float], seconds: float, delay_ms: float) -> list:
    """(c): delivered payload Mbit/s up and down for each configured rate."""
    rows = []
    for rate_mbit in rates_mbit:
        link.configure(delay_ms=delay_ms, rate_mbit=rate_mbit)
        nbytes = int(rate_mbit * 1e6 / 8 * seconds)
        found = link.measure(pings=3, upload_bytes=nbytes, download_bytes=nbytes)
        rows.append(
            {
                "rate_mbit": rate_mbit,
                "bytes": nbytes,
                "rtt_ms": found["rtt_median_s"] * 1e3,
                "upload_mbit": found["upload_mbit"],
                "download_mbit": found["download_mbit"],
            }
        )
    return rows


# ---------------------------------------------------------------- report


def _plot(result: dict, path: Path) -> None:
    from benchmarks.report import pyplot

    plt = pyplot()

    fig, (ax_a, ax_b, ax_c) = plt.subplots(1, 3, figsize=(16, 4.8))
    names = list(result["latency"])
    medians = [result["latency"][name]["median_ms"] * 1e3 for name in names]
    p90 = [result["latency"][name]["p90_ms"] * 1e3 for name in names]
    ax_a.bar(names, medians, color="tab:blue", label="median")
    ax_a.scatter(names, p90, color="black", marker="_", s=300, label="p90")
    ax_a.set_ylabel("round trip, µs (loopback, 16 B)")
    ax_a.set_title("(a) small-message round trip")
    ax_a.tick_params(axis="x", labelrotation=20)
    ax_a.legend()

    ax_b.axhline(0, color="gray", linestyle=":")
    for jitter_ms in sorted({row["jitter_ms"] for row in result["delay"]}):
        rows = [row for row in result["delay"] if row["jitter_ms"] == jitter_ms]
        x = [row["delay_ms"] for row in rows]
        error = [row["one_way"]["median_ms"] - row["delay_ms"] for row in rows]
        low = [row["one_way"]["median_ms"] - row["one_way"]["p10_ms"] for row in rows]
        high = [row["one_way"]["p90_ms"] - row["one_way"]["median_ms"] for row in rows]
        label = f"jitter +-{jitter_ms:g} ms (bars p10-p90)"
        ax_b.errorbar(x, error, yerr=[low, high], marker="o", capsize=3, label=label)
    ax_b.set_xlabel("configured one-way delay, ms")
    ax_b.set_ylabel("delivered - configured one-way delay, ms")
    ax_b.set_title(f"(b) delay error ({result['link_path']}, by {result['delay_path']})")
    ax_b.legend()

    rates = [row["rate_mbit"] for row in result["rate"]]
    ax_c.axhspan(0.9, 1.1, color="gray", alpha=0.15, label="+-10%")
    for key, marker in (("upload_mbit", "o"), ("download_mbit", "s")):
        ratio = [row[key] / row["rate_mbit"] for row in result["rate"]]
        ax_c.plot(rates, ratio, marker=marker, label=key.split("_")[0])
    ax_c.set_xscale("log")
    ax_c.set_xticks(rates, [f"{rate:g}" for rate in rates])
    ax_c.set_ylim(0.8, 1.2)
    ax_c.set_xlabel("configured rate, Mbit/s")
    ax_c.set_ylabel("delivered / configured payload rate")
    ax_c.set_title(f"(c) rate ({result['link_path']})")
    ax_c.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _print_tables(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    floor = result["latency"]["raw socket"]["median_ms"]
    table = Table(title="(a) 16-byte round trip over loopback")
    for column in ("method", "median µs", "p90 µs", "x raw socket"):
        table.add_column(column, justify="right")
    for name, row in result["latency"].items():
        table.add_row(
            name,
            f"{row['median_ms'] * 1e3:.1f}",
            f"{row['p90_ms'] * 1e3:.1f}",
            f"{row['median_ms'] / floor:.2f}",
        )
    console.print(table)

    table = Table(
        title=f"(b) one-way delay, {result['link_path']} (delay by {result['delay_path']})"
    )
    for column in ("configured ms", "jitter ms", "median", "mean", "p10", "p90", "median error"):
        table.add_column(column, justify="right")
    for row in result["delay"]:
        got = row["one_way"]
        error = got["median_ms"] - row["delay_ms"]
        table.add_row(
            f"{row['delay_ms']:g}",
            f"{row['jitter_ms']:g}",
            f"{got['median_ms']:.2f}",
            f"{got['mean_ms']:.2f}",
            f"{got['p10_ms']:.2f}",
            f"{got['p90_ms']:.2f}",
            f"{error:+.2f} ms",
        )
    console.print(table)

    table = Table(title=f"(c) payload rate, {result['link_path']}")
    for column in ("configured Mbit/s", "upload", "ratio", "download", "ratio"):
        table.add_column(column, justify="right")
    for row in result["rate"]:
        table.add_row(
            f"{row['rate_mbit']:g}",
            f"{row['upload_mbit']:.2f}",
            f"{row['upload_mbit'] / row['rate_mbit']:.3f}",
            f"{row['download_mbit']:.2f}",
            f"{row['download_mbit'] / row['rate_mbit']:.3f}",
        )
    console.print(table)


def run(
    out: Path = RESULTS,
    quick: bool = False,
    path: str = "auto",
    cpus: dict[str, list[int]] | None = None,
) -> dict:
    """Run (a), (b), (c); save `link.json` and `link.png` under `out`; return the result.

    `path`: "auto" (namespaces when root, else loopback), "netns" or "loopback". `cpus`: the
    cores of the probe's two ends (default `tandem.testbed.cpus.role_cpus()`).
    """
    from tandem.testbed.cpus import role_cpus
    from tandem.testbed.netns import state_dir

    machines = Machines(
        cpus=cpus or role_cpus(),
        isolation="processes for (b) and (c): probe server and client pinned from start",
        shared=["(a): both ends of the latency floor in this process (not pinned)"],
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if path not in ("auto", "netns", "loopback"):
        raise TandemError(f"--path must be auto, netns or loopback, got {path!r}")
    if path == "auto":
        path = "loopback" if netns_unavailable_reason() is not None else "netns"
    started = time.perf_counter()
    latency = measure_latency(count=300 if quick else 2000, warmup=50)
    state = state_dir()
    state.mkdir(parents=True, exist_ok=True)
    link = _Link(path, state, machines.cpus)
    try:
        delays = measure_delay(link, [0, 50, 100, 300], [0, 10], pings=5 if quick else 10)
        link_status = link.status
        rates = measure_rate(link, [10, 50, 100], seconds=0.75 if quick else 1.5, delay_ms=10)
    finally:
        link.close()
    result = {
        "benchmark": "link",
        "quick": quick,
        "link_path": link_status.mode,
        "delay_path": link_status.delay_path,
        "notes": list(link_status.notes),
        "delay_split": "configured delay is one-way per direction; RTT = 2 x delay",
        "message_bytes": len(MESSAGE),
        "latency": latency,
        "delay": delays,
        "rate": rates,
        "rate_link_delay_ms": 10,
        "seconds": time.perf_counter() - started,
    }
    save_json(out, "link", result, machines=machines)
    _plot(result, out / "link.png")
    _print_tables(result)
    return result
