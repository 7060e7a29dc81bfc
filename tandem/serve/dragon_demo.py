"""`tandem demo`: a DRAGON cloud and device as two processes on loopback.

The cloud process (`python -m tandem.serve.dragon_session`) holds the public corpus (the
Python standard library's docstrings); this process is the device and holds the private
corpus (`examples/private-notes` by default). Both run the same model. The device streams
the answer and returns its `SideReport`; nothing but drafts, target tokens and control
messages crosses the loopback link.

Indexes are built on first run (progress bars, cached under `$TANDEM_HOME/indexes/`), so the
cloud child starts from a ready index; its log is kept in a temporary file and shown if it
fails. `kill_cloud_after=n` SIGKILLs the cloud after n tokens to show the fault behaviour.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tandem.errors import TandemError
from tandem.protocols.decoding import OnToken, after_tokens
from tandem.protocols.dragon.setup import ensure_index, load_side, set_threads
from tandem.serve.dragon_session import emulated_link, run_device_session
from tandem.testbed import cpus
from tandem.transport import loop as event_loop

DEFAULT_QUESTION = (
    "Write an async Python function fetch_with_retry(fetch) for our buoy requests that "
    "follows our retry policy, using asyncio.sleep and random.uniform for the jitter."
)
READY_TIMEOUT_S = 900.0


def default_private_corpus() -> Path:
    return Path(__file__).resolve().parents[2] / "examples" / "private-notes"


def _wait_ready(child: subprocess.Popen, ready: Path, log: Path) -> dict:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready.is_file():
            return json.loads(ready.read_text())
        if child.poll() is not None:
            raise TandemError(f"the cloud process exited ({child.returncode}): {_tail(log)}")
        time.sleep(0.2)
    raise TandemError(
        f"the cloud process was not ready after {READY_TIMEOUT_S:.0f} s: {_tail(log)}"
    )


def _tail(log: Path) -> str:
    """The log's end, for an error message (the log's folder is removed with the demo)."""
    return log.read_text(errors="replace")[-2000:].strip() if log.is_file() else ""


def stop_child(child: subprocess.Popen) -> None:
    """SIGTERM a demo's cloud child, SIGKILL after 15 s; nothing if it has ended."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def run_demo(
    *,
    question: str = DEFAULT_QUESTION,
    config,
    model: str = "qwen2.5-coder-0.5b",
    private_corpus: Path | None = None,
    public_corpus: str = "stdlib",
    delay_ms: float = 0.0,
    kill_cloud_after: int = 0,
    threads: int = 0,
    on_token: OnToken | None = None,
    on_status: Callable[[str], None] = lambda _: None,
):
    """Start the cloud child, run the device here; returns the device's `SideReport`."""
    from tandem.models.registry import load_tokenizer

    private_corpus = private_corpus or default_private_corpus()
    if not private_corpus.is_dir():
        raise TandemError(f"private corpus {private_corpus} not found (use --private DIR)")
    tokenizer = load_tokenizer(model)
    on_status("preparing indexes (built once, then cached)")
    public_index = ensure_index(public_corpus, tokenizer=tokenizer, tokenizer_name=model)
    ensure_index(str(private_corpus), tokenizer=tokenizer, tokenizer_name=model)
    with cpus.restored():  # the caller's cores and threads, after
        set_threads(threads, role="device")  # after indexing: device and cloud get their own cores
        workdir = Path(tempfile.mkdtemp(prefix="tandem-demo-"))
        ready, log = workdir / "cloud.json", workdir / "cloud.log"
        secret = secrets.token_hex(16)
        env = {**os.environ, "TANDEM_SECRET": secret}
        command = [
            sys.executable, "-m", "tandem.serve.dragon_session",
            "--corpus", str(public_index), "--model", model, "--listen", "127.0.0.1:0",
            "--ready-file", str(ready), "--docs", str(config.docs_per_side),
            "--threads", str(threads), "--role", "cloud", "--delay-ms", str(delay_ms),
        ]  # fmt: skip
        on_status("starting the cloud process (public corpus: stdlib docstrings)")
        with open(log, "wb") as log_file:
            child = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            on_status("loading the device side (private corpus) and profiling decode latency")
            setup = load_side(corpus=str(private_corpus), model=model, docs=config.docs_per_side)
            address = _wait_ready(child, ready, log)
            on_status(f"cloud ready on {address['host']}:{address['port']} (pid {address['pid']})")
            # a crash after `kill_cloud_after` tokens: the socket closes without a goodbye
            token_seen = after_tokens(on_token, kill_cloud_after, child.kill)

            return event_loop.run(
                run_device_session(
                    setup,
                    address["host"],
                    int(address["port"]),
                    question=question,
                    config=config,
                    on_token=token_seen,
                    link=emulated_link(delay_ms),
                    secret=secret.encode(),
                )
            )
        finally:
            stop_child(child)
            shutil.rmtree(workdir, ignore_errors=True)  # a failure's message holds the log's tail
