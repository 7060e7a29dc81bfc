"""`tandem demo --mode private-spec`: the private-RAG speculative mode on loopback, a cloud
process and this (device) process, each on its own cores.

The cloud child is `tandem cloud serve --mode private-spec --corpus stdlib` with the larger
model (public corpus: the standard library's docstrings), started through the pinning launcher
(`python -m tandem.testbed.cpus`, cloud cores); this process pins itself to the device cores,
loads the small model and the private notes, and streams the answer. Only the question, draft
tokens with their 64-bit SQS laws, and verdicts cross the link (docs/private-spec.md).
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tandem.errors import TandemError
from tandem.protocols.decoding import OnToken
from tandem.transport import loop as event_loop

CLOUD_MODEL = "qwen2.5-coder-1.5b"
DEVICE_MODEL = "qwen2.5-coder-0.5b"
READY_TIMEOUT_S = 900.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_private_demo(
    *,
    question: str,
    config,  # a SpecConfig (tandem.protocols.private_spec.private_config)
    private_corpus: Path,
    docs: int = 2,
    delay_ms: float = 0.0,
    on_token: OnToken | None = None,
    on_status: Callable[[str], None] = lambda _: None,
):
    """Start the cloud child, run the device here; returns the device's SpecReport."""
    from tandem.models.registry import load_model, load_tokenizer
    from tandem.protocols.dragon import Knowledge
    from tandem.protocols.dragon.setup import ensure_index
    from tandem.protocols.private_spec import run_private_device
    from tandem.serve.api.backends import probe_cloud
    from tandem.serve.dragon_demo import stop_child
    from tandem.testbed import cpus
    from tandem.transport import LinkConfig, TransportConfig, connect

    if not private_corpus.is_dir():
        raise TandemError(f"private corpus {private_corpus} not found (use --private DIR)")
    plan = cpus.plan()
    on_status("preparing indexes (built once, then cached)")
    tokenizer = load_tokenizer(DEVICE_MODEL, progress=False)
    ensure_index("stdlib", tokenizer=tokenizer, tokenizer_name=CLOUD_MODEL)
    index = ensure_index(str(private_corpus), tokenizer=tokenizer,
                         tokenizer_name=DEVICE_MODEL)  # fmt: skip
    secret = secrets.token_hex(16)
    port = _free_port()
    argv = [
        str(Path(sys.executable).parent / "tandem"), "cloud", "serve", "--mode", "private-spec",
        "--corpus", "stdlib", "--model", CLOUD_MODEL, "--docs", str(docs),
        "--listen", f"127.0.0.1:{port}", "--secret", secret,
        "--threads", str(len(plan["cloud"])),
    ]  # fmt: skip
    on_status(f"starting the cloud ({CLOUD_MODEL}, public corpus: stdlib) on cores {plan['cloud']}")
    log = Path(tempfile.mkdtemp(prefix="tandem-private-demo-")) / "cloud.log"
    with log.open("wb") as sink:
        child = subprocess.Popen(cpus.pinned_argv(plan["cloud"], argv), stdin=subprocess.DEVNULL,
                                 stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
    with cpus.restored():  # the caller's cores and threads, after
        try:
            # pinned before the model loads: llama.cpp takes one thread per core of the set it
            # sees then (loaded on both cores and pinned to one after, its two threads spun in an
            # OpenMP barrier on the one core and the demo stopped mid-answer)
            cpus.pin(plan["device"])
            device_lm = load_model(DEVICE_MODEL, progress=False)
            transport = TransportConfig.for_model(
                device_lm,
                role="device",
                secret=secret,
                link=LinkConfig(delay_ms=delay_ms) if delay_ms else None,
            )
            knowledge = Knowledge.from_index(index)
            on_status(f"device: {DEVICE_MODEL} with the private notes on cores {plan['device']}")
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not event_loop.run(probe_cloud("127.0.0.1", port, transport)):
                if child.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text(errors="replace")[-1500:]
                    raise TandemError(f"the cloud process did not start: {tail.strip()}")
                time.sleep(1.0)

            async def main():
                channel = await connect("127.0.0.1", port, config=transport)
                return await run_private_device(
                    channel, device_lm, knowledge, question, config, docs=docs, on_token=on_token
                )

            return event_loop.run(main())
        finally:
            stop_child(child)
            shutil.rmtree(log.parent, ignore_errors=True)  # a failure's message holds its tail
