"""`tandem bench spec-net`: the real pair as two processes over the emulated network.

`tandem bench spec` runs both sides in one process over the in-process link emulator. This
bench runs them as the user would: `tandem cloud serve` (the target) inside the cloud side of
`tandem net` and `tandem device run` (the draft model) inside the device side, over TCP
through the project's delay proxy (network namespaces when root, else the same proxy on
loopback; `docs/network.md`). At each RTT (the proxy's one-way delay is RTT / 2 each way), for
each prompt, the methods run side by side: cloud autoregressive, stop-and-wait (sync) and
PicoSpec's async pipeline, both with separate rejection, greedy. The device's JSON report
(`--json`) gives the numbers: throughput = tokens / total time (TTFT included).

Each side runs on its own cores (`--device-cpus`, `--cloud-cpus`; default device = core 0,
cloud = core 1 on a 2-core box), pinned from its start (`tandem.testbed.netns.side_argv`),
with `--threads` = the cores it owns; the JSON's `machines` records the sets and the cloud
process's affinity as the kernel reports it. As in the `cpu` regime of `tandem bench spec`,
the cloud (1.5B) is ~3x slower per token than the device (0.5B).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import RESULTS
from benchmarks.report import Machines, new_figure, save_json, save_png
from benchmarks.spec import PROMPTS
from tandem.errors import TandemError
from tandem.testbed.netns import (
    NetConfig,
    net_down,
    net_up,
    netns_unavailable_reason,
    side_argv,
)

NET_NAME = "tandem-specb"
SECRET = "spec-net-bench"
METHODS = {
    "cloud-ar": ["--mode", "ar"],
    "stop-and-wait": ["--mode", "spec", "--pipeline", "sync", "--codec", "separate"],
    "picospec": ["--mode", "spec", "--pipeline", "async", "--codec", "separate"],
}
CONNECT_TIMEOUT_S = 300.0  # the cloud loads the 1.5B model before it listens


def tandem_argv(*args: str) -> list[str]:
    """The `tandem` console script of this interpreter's environment."""
    return [str(Path(sys.executable).parent / "tandem"), *args]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Net:
    """`tandem net` with the cloud service running inside it."""

    def __init__(self, mode: str, cloud_model: str, log: Path, cpus: dict[str, list[int]]):
        self.mode, self.cloud_model, self.log, self.cpus = mode, cloud_model, log, cpus
        self.ports = {} if mode == "netns" else {"service_port": _free_port(),
                                                  "proxy_port": _free_port()}  # fmt: skip
        self.status = None
        self.cloud: subprocess.Popen | None = None

    def configure(self, rtt_ms: float, rate_mbit: float) -> None:
        config = NetConfig(
            name=NET_NAME, mode=self.mode, delay_ms=rtt_ms / 2, rate_mbit=rate_mbit,
            device_cpus=tuple(self.cpus["device"]), cloud_cpus=tuple(self.cpus["cloud"]),
            **self.ports,
        )  # fmt: skip
        self.status = net_up(config)  # reconfigures in place; the cloud keeps running
        if self.cloud is None:
            argv = tandem_argv("cloud", "serve", "--threads", str(len(self.cpus["cloud"])))
            argv += ["--model", self.cloud_model, "--listen", self.status.service]
            argv += ["--secret", SECRET, "--mode", "spec", "--mode", "ar"]
            with self.log.open("ab") as sink:
                self.cloud = subprocess.Popen(
                    side_argv(self.status, "cloud", argv), stdin=subprocess.DEVNULL,
                    stdout=sink, stderr=sink,
                )  # fmt: skip

    def cloud_affinity(self) -> list[int]:
        """The cloud process's cpu set, as the kernel reports it."""
        return sorted(os.sched_getaffinity(self.cloud.pid))

    def device(self, method: str, prompt: str, n: int, device_model: str, out: Path) -> dict:
        """One `tandem device run`; retries while the cloud is still loading its model."""
        argv = tandem_argv("device", "run", *METHODS[method])
        argv += ["--threads", str(len(self.cpus["device"]))]
        argv += ["--cloud", self.status.connect, "--secret", SECRET, "--model", device_model]
        argv += ["-n", str(n), "--raw", "-p", prompt, "--json", str(out)]
        argv = side_argv(self.status, "device", argv)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
            if done.returncode == 0:
                return json.loads(out.read_text())
            waiting = "cannot connect" in done.stderr or "connection" in done.stderr
            if not waiting or time.monotonic() > deadline or self.cloud.poll() is not None:
                raise TandemError(f"spec-net bench: device run failed: {done.stderr[-400:]}")
            time.sleep(2.0)

    def close(self) -> None:
        if self.cloud is not None:
            self.cloud.terminate()
            try:
                self.cloud.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.cloud.kill()
        net_down(NET_NAME)


def run(
    *,
    out: Path = RESULTS,
    rtts: tuple[float, ...] = (0, 100, 200),
    num_prompts: int = 1,
    max_new_tokens: int = 32,
    rate_mbit: float = 100.0,
    device_model: str = "qwen2.5-coder-0.5b",
    cloud_model: str = "qwen2.5-coder-1.5b",
    path: str = "auto",
    cpus: dict[str, list[int]] | None = None,
) -> dict:
    """Run the bench (module docstring); save spec_net.json / .png. `cpus`: each side's cores
    (default `tandem.testbed.cpus.role_cpus()`)."""
    from tandem.testbed.cpus import role_cpus

    if path not in ("auto", "netns", "loopback"):
        raise TandemError(f"--path must be auto, netns or loopback, got {path!r}")
    mode = path if path != "auto" else ("loopback" if netns_unavailable_reason() else "netns")
    console = Console()
    prompts = PROMPTS[:num_prompts]
    machines = Machines(
        cpus=cpus or role_cpus(),
        isolation="processes: tandem cloud serve and each tandem device run pinned from start",
    )
    runs, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tandem-spec-net-") as tmp:
        net = _Net(mode, cloud_model, Path(tmp) / "cloud.log", machines.cpus)
        try:
            for rtt in rtts:
                net.configure(rtt, rate_mbit)
                if rtt == rtts[0]:  # warm-up (and wait for the cloud), discarded
                    net.device("picospec", prompts[0], 4, device_model, Path(tmp) / "w.json")
                    machines.observed["cloud"] = {"cpus": net.cloud_affinity()}
                for index, prompt in enumerate(prompts):
                    for method in METHODS:
                        report = net.device(
                            method, prompt, max_new_tokens, device_model, Path(tmp) / "r.json"
                        )
                        summary = report.get("summary") or {}
                        runs.append(_record(method, rtt, index, report, summary))
                        console.log(
                            f"{mode} RTT {rtt:.0f} ms {method:>13}: "
                            f"{runs[-1]['throughput_tok_s']:.2f} tok/s"
                        )
        finally:
            net.close()
    rows = _aggregate(runs)
    payload = {
        "setup": {
            "path": mode,
            "link": f"tandem net ({mode}): delay RTT/2 each way by the proxy, "
            f"{rate_mbit} Mbit/s each way",
            "device_model": device_model,
            "cloud_model": cloud_model,
            "prompts": list(prompts),
            "max_new_tokens": max_new_tokens,
            "draft_len": 4,
            "wall_s": time.perf_counter() - started,
        },
        "table": rows,
        "runs": runs,
    }
    save_json(out, "spec_net", payload, machines=machines)
    _print(console, rows, rtts)
    _plot(out, rows)
    return payload


def _record(method: str, rtt: float, prompt: int, report: dict, summary: dict) -> dict:
    tokens = len(report["tokens"])
    return {
        "method": method,
        "rtt_ms": rtt,
        "prompt": prompt,
        "tokens": tokens,
        "total_s": report["total_s"],
        "throughput_tok_s": tokens / report["total_s"],
        "acceptance_rate": summary.get("acceptance_rate"),
        "output": report["tokens"],
    }


def _aggregate(runs: list[dict]) -> list[dict]:
    rows = []
    for key in dict.fromkeys((r["method"], r["rtt_ms"]) for r in runs):
        group = [r for r in runs if (r["method"], r["rtt_ms"]) == key]
        tokens, seconds = sum(r["tokens"] for r in group), sum(r["total_s"] for r in group)
        rows.append({"method": key[0], "rtt_ms": key[1], "tokens": tokens, "total_s": seconds,
                     "throughput_tok_s": tokens / seconds})  # fmt: skip
    return rows


def _print(console: Console, rows: list[dict], rtts: tuple[float, ...]) -> None:
    table = Table(title="Real pair over tandem net (tok/s, TTFT included)")
    table.add_column("method")
    for rtt in rtts:
        table.add_column(f"RTT {rtt:.0f} ms", justify="right")
    by = {(r["method"], r["rtt_ms"]): r["throughput_tok_s"] for r in rows}
    for method in METHODS:
        table.add_row(method, *(f"{by[(method, rtt)]:.2f}" for rtt in rtts))
    console.print(table)


def _plot(out: Path, rows: list[dict]) -> None:
    fig, axes = new_figure()
    ax = axes[0][0]
    for method in METHODS:
        pts = sorted((r["rtt_ms"], r["throughput_tok_s"]) for r in rows if r["method"] == method)
        ax.plot(*zip(*pts, strict=True), marker="o", label=method)
    ax.set(title="real pair over tandem net", xlabel="RTT (ms)", ylabel="tokens/s")
    ax.legend(fontsize=7)
    save_png(fig, out, "spec_net")
