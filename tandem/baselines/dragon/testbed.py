"""DRAGON and its baselines as two processes joined by the project's emulated network.

    Testbed (this process: no model)
      net_up(NetConfig(name, delay, jitter = delay x JITTER, delayed))   namespaces <name>-dev / -cloud
      cloud process  (cloud namespace)   python -m tandem.baselines.dragon.cloud
                                         serves DRAGON + every baseline (public corpus)
      device worker  (device namespace)  python -m tandem.baselines.dragon.testbed
                                         private corpus; runs one method per request

The worker reads one JSON request per line on stdin (`{"method", "question", "config"}`)
and answers one line `@@ {...}` on stdout (tokens, token times, the method's summary; for
DRAGON also both sides' decode timings and the resolution log). Every request opens a new
connection, so `set_delay` (which restarts the delay proxy) can run between requests. Each
process runs on its own cores (`cpus`, default `tandem.testbed.cpus.plan()`: device = core 0,
cloud = core 1 on a 2-core box), pinned from its start (`netns.side_argv`), with as many
engine threads as it owns, and reports what it sees of itself (`observed`). Device-only runs
(CRCG/Device) happen in the device worker, on the device's set. Without root or iproute2 the
same proxy runs on loopback (`NetStatus.mode == "loopback"`, with the reason in `notes`).

A testbed control (`Testbed.contended`): two machines on one box still share its memory
system (L3 cache, DRAM bandwidth), so the device decodes slower while the cloud decodes too,
which separate machines would not. `contended()` runs a *burner* on the cloud's cores
(`burner.py`: the same model decoding greedily, nonstop, what the cloud does during DRAGON)
around a device-only run, so a benchmark can measure that share of DRAGON's overhead beside
the real baselines.

A busy device (`Testbed(busy_device=n)`, a testbed variant): n burners of the device's model
decode nonstop on the device's cores for the bed's whole life, so every method's device side
(DRAGON's, the baselines', CRCG/Device alike) gets its share of those cores: a device about
n + 1 times slower than the cloud with the same model, in real compute (the sides' decode costs
then differ as in Fig. 8's "2x" cases, which one core per side cannot otherwise give).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tandem.errors import TandemError
from tandem.testbed.netns import JITTER, jitter_fraction
from tandem.transport import loop as event_loop

MARK = "@@ "
READY_TIMEOUT_S = 900.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Testbed:
    """Context manager: network up, cloud and device processes started; all torn down."""

    def __init__(
        self,
        *,
        model: str,
        public_index: Path,
        private_index: Path,
        docs: int = 2,
        cpus: dict[str, list[int]] | None = None,
        name: str = "tandem-dbench",
        seed: int = 0,
        delayed: str = "both",
        jitter: float = JITTER,
        cloud_model: str | None = None,
        busy_device: int = 0,
    ):
        """`delayed`: the directions `set_delay` delays (`NetConfig.delayed`): "both", or
        "down" (cloud -> device only, the DRAGON paper's netem on the server's NIC); `jitter`:
        each delayed direction's jitter as a fraction of its delay (the paper's 1/5; 0: none,
        a testbed control); `cloud_model`: the cloud's model (default: `model`, both sides
        alike; it must share the device model's tokenizer); `busy_device`: burners decoding
        nonstop on the device's cores while the bed is up (module docstring; 0: none)."""
        jitter = jitter_fraction(jitter)
        if busy_device < 0:
            raise TandemError(f"dragon testbed: busy_device must be >= 0, not {busy_device}")
        from tandem.testbed.cpus import role_cpus

        self.model, self.docs = model, docs
        self.cloud_model = cloud_model or model
        self.cpus = cpus or role_cpus()
        self.public_index, self.private_index = public_index, private_index
        self.name, self.seed, self.delayed, self.jitter = name, seed, delayed, jitter
        self.procs: list[subprocess.Popen] = []
        self.status = None
        self.observed: dict[str, dict] = {}  # side -> machine_state() it reported
        self.burner: subprocess.Popen | None = None  # `contended()`'s decoder on the cloud cores
        self.busy_device = busy_device
        self.device_burners: list[subprocess.Popen] = []  # on from start to `busy_stats()`
        self.workdir: Path | None = None  # the cloud's ready file and log, made by `_start`

    # ---- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> Testbed:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _net(self, delay_ms: float):
        from tandem.testbed.netns import NetConfig, net_up, netns_unavailable_reason

        if not hasattr(self, "ports"):
            loopback = netns_unavailable_reason() is not None
            self.ports = (
                {"service_port": _free_port(), "proxy_port": _free_port()} if loopback else {}
            )
        config = NetConfig(
            name=self.name, delay_ms=delay_ms, jitter_ms=delay_ms * self.jitter,
            delayed=self.delayed, seed=self.seed,
            device_cpus=tuple(self.cpus["device"]), cloud_cpus=tuple(self.cpus["cloud"]),
            **self.ports,
        )  # fmt: skip
        return net_up(config)

    def _start(self) -> None:
        from tandem.testbed.netns import side_argv

        self.workdir = Path(tempfile.mkdtemp(prefix="tandem-dbench-"))
        self.status = self._net(0.0)
        env = {**os.environ, "TANDEM_SECRET": secrets.token_hex(16)}
        ready = self.workdir / "cloud.json"
        cloud = [sys.executable, "-m", "tandem.baselines.dragon.cloud"]
        cloud += ["--corpus", str(self.public_index), "--model", self.cloud_model]
        cloud += ["--listen", self.status.service, "--ready-file", str(ready)]
        cloud += ["--docs", str(self.docs), "--threads", str(len(self.cpus["cloud"]))]
        self.cloud_log = open(self.workdir / "cloud.log", "wb")  # noqa: SIM115 - closed in close()
        self.procs.append(
            subprocess.Popen(
                side_argv(self.status, "cloud", cloud),
                env=env,
                stdout=self.cloud_log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        )
        device = [sys.executable, "-m", "tandem.baselines.dragon.testbed"]
        device += ["--corpus", str(self.private_index), "--model", self.model]
        device += ["--connect", self.status.connect, "--docs", str(self.docs)]
        device += ["--threads", str(len(self.cpus["device"]))]
        self.worker = self._spawn_worker("device", device, env=env)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.is_file():
            if self.procs[0].poll() is not None or time.monotonic() > deadline:
                log = (self.workdir / "cloud.log").read_text(errors="replace")[-2000:]
                raise TandemError(f"dragon testbed: the cloud process did not start: {log}")
            time.sleep(0.2)
        self.observed["cloud"] = json.loads(ready.read_text()).get("machine", {})
        self.observed["device"] = self._read().get("machine", {})  # the worker's ready line
        self.device_burners = [self._burner("device", self.model) for _ in range(self.busy_device)]
        for burner in self.device_burners:
            self._burn(burner, "on")

    @contextlib.contextmanager
    def contended(self):
        """The cloud's cores decode nonstop (the burner) inside this block (module docstring).
        The burner starts once, decodes only between "on" and "off", and ends with the bed."""
        if self.burner is None:
            self.burner = self._burner("cloud", self.cloud_model)
        self._burn(self.burner, "on")
        stats: dict = {}
        try:
            yield stats
        finally:
            stats.update(self._burn(self.burner, "off"))

    def busy_stats(self) -> list[dict]:
        """Stop the busy device's burners (`busy_device`); each one's steps and ms per step
        since it started. Call once, after the last run."""
        return [self._burn(burner, "off") for burner in self.device_burners]

    def _burner(self, side: str, model: str) -> subprocess.Popen:
        """A burner (`burner.py`) of `model` on `side`'s cores, loaded, not yet decoding."""
        argv = [sys.executable, "-m", "tandem.baselines.dragon.burner"]
        argv += ["--model", model, "--threads", str(len(self.cpus[side]))]
        burner = self._spawn_worker(side, argv)
        _read_answer(burner, "burner")  # loaded
        return burner

    def _burn(self, burner: subprocess.Popen, command: str) -> dict:
        """A burner's answer: to "on" once decoding, to "off" once stopped, with the steps
        it decoded. A burner that failed is a TandemError naming the failure."""
        burner.stdin.write(command + "\n")
        burner.stdin.flush()
        answer = _read_answer(burner, "burner")
        if "error" in answer:
            raise TandemError(f"dragon testbed: the burner failed: {answer['error']}")
        return answer

    def _spawn_worker(self, side: str, argv: list[str], env=None) -> subprocess.Popen:
        """A process on `side`'s cores that reads requests on stdin and answers `MARK` lines
        on stdout (the device worker, the burner); closed with the bed."""
        from tandem.testbed.netns import side_argv

        proc = subprocess.Popen(
            side_argv(self.status, side, argv), env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, bufsize=1,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        from tandem.testbed.netns import net_down

        try:
            for proc in reversed(self.procs):
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            self.procs.clear()
            if hasattr(self, "cloud_log"):
                self.cloud_log.close()
        finally:
            try:
                net_down(self.name)
            finally:  # the cloud's ready file and log: a failure's message already holds its tail
                if self.workdir is not None:
                    shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- use -----------------------------------------------------------------------

    def set_delay(self, delay_ms: float) -> None:
        """One-way delay of each delayed direction, jitter `jitter` x delay (paper: 1/5)."""
        self.status = self._net(delay_ms)

    def run(self, method: str, question: str, config) -> dict:
        request = {"method": method, "question": question, "config": config.to_json()}
        self.worker.stdin.write(json.dumps(request) + "\n")
        self.worker.stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise TandemError(f"dragon testbed: {method} failed: {answer['error']}")
        return answer

    def _read(self) -> dict:
        return _read_answer(self.worker, "device worker")


def _read_answer(proc: subprocess.Popen, what: str) -> dict:
    """The next `MARK` line of a worker's stdout, as JSON."""
    while True:
        line = proc.stdout.readline()
        if not line:
            raise TandemError(f"dragon testbed: the {what} exited (see its stderr)")
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])


# ---- the device worker (runs in the device namespace) -------------------------------


def dragon_record(report) -> dict:
    return {
        "tokens": report.tokens,
        "token_times": report.token_times,
        "ttft_s": report.ttft_s,
        "per_token_s": report.mean_per_token_s,
        "summary": report.summary(),
        "decode_times": report.decode_times,
        "resolutions": report.resolutions,
    }


def baseline_record(report) -> dict:
    return {"tokens": report.tokens, "token_times": report.token_times, **report.summary()}


async def run_one(setup, host: str, port: int, request: dict) -> dict:
    from tandem.baselines.dragon.device import run_baseline_device, run_crcg_device
    from tandem.protocols.dragon import DragonConfig, connect_device
    from tandem.protocols.dragon.setup import transport_config
    from tandem.transport import connect

    method, question = request["method"], request["question"]
    config = DragonConfig.from_json(request["config"])
    transport = transport_config(setup.lm, role="device")
    common = {"lm": setup.lm, "knowledge": setup.knowledge, "question": question, "config": config}
    if method == "dragon":
        report = await connect_device(
            host, port, transport=transport, profile=setup.profile, **common
        )
        return {"method": method, **dragon_record(report)}
    if method == "crcg-device":
        return {
            "method": method,
            **baseline_record(await asyncio.to_thread(lambda: run_crcg_device(**common))),
        }
    channel = await connect(host, port, config=transport)
    return baseline_record(await run_baseline_device(method, channel, **common))


def worker_main(argv: list[str] | None = None) -> None:
    from tandem.protocols.dragon.setup import load_side, set_threads
    from tandem.testbed.cpus import machine_state
    from tandem.testbed.proxy import parse_hostport

    parser = argparse.ArgumentParser(prog="python -m tandem.baselines.dragon.testbed")
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--connect", required=True)
    parser.add_argument("--docs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    setup = load_side(corpus=args.corpus, model=args.model, docs=args.docs, progress=False)
    host, port = parse_hostport(args.connect)
    print(MARK + json.dumps({"ready": True, "machine": machine_state(setup.lm)}), flush=True)
    for line in sys.stdin:
        try:
            answer = event_loop.run(run_one(setup, host, port, json.loads(line)))
            rows = getattr(setup.lm, "rows_in_use", None)  # rows left behind slow later runs
            if rows is not None:
                answer["device_rows_in_use"] = rows()
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator, which raises
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(MARK + json.dumps(answer), flush=True)


if __name__ == "__main__":
    worker_main()
