"""Shared by the cloud load and fault tests: a cloud on loopback, session settings, HTTP GET."""

from __future__ import annotations

import asyncio
import contextlib

from tandem.protocols.spec import SpecConfig
from tandem.serve.admission import CloudLimits
from tandem.serve.cloud import CloudServer, cloud_resources
from tandem.serve.device import run_generation
from tandem.transport import TransportConfig

SECRET = b"cloud-load-secret"
TEXTS = [
    "def add(a, b):", "import os\n", "x = [", "class Stack:\n", "# sort a list", "for i in",
    "while True:", "return ", "print(", "with open(", "try:\n", "lambda x:", "async def f",
    "from typing", "if __name__", "def fib(n):",
]  # fmt: skip


def session_config(i: int, *, max_new_tokens: int = 16) -> tuple[list[int], SpecConfig]:
    """Session i: its prompt and settings (pipelines, codecs, greedy and sampled, seeds vary)."""
    pipeline = "async" if i % 2 else "sync"
    codec = ("dense", "k-sqs", "separate", "dense")[i % 4]
    temperature = 0.0 if i % 3 == 0 else 0.9
    config = SpecConfig(
        pipeline=pipeline, codec=codec, temperature=temperature, seed=100 + i,
        max_new_tokens=max_new_tokens, stop_at_eos=False,
    )  # fmt: skip
    text = TEXTS[i % len(TEXTS)] + (" " * (i // len(TEXTS)))
    return list(text.encode()), config


class LoopbackCloud:
    """`async with LoopbackCloud(lm, ...) as cloud:` a CloudServer on 127.0.0.1:<any>."""

    def __init__(self, lm, *, batching=True, limits=None, on_record=None, metrics_port=None,
                 window_ms=2.0, **transport):  # fmt: skip
        self.lm = lm
        self.resources = cloud_resources(lm, batching=batching, batch_window_ms=window_ms)
        self.cloud = CloudServer(
            self.resources, limits=limits or CloudLimits(), on_record=on_record
        )
        self.metrics_port = metrics_port
        self.transport = transport
        self.server = None

    async def __aenter__(self) -> LoopbackCloud:
        config = TransportConfig.for_model(self.lm, role="cloud", secret=SECRET, **self.transport)
        self.server = await self.cloud.start(
            "127.0.0.1", 0, transport=config, metrics_port=self.metrics_port
        )
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.server.close()
        await self.cloud.close()

    @property
    def port(self) -> int:
        return self.server.port


async def generate(device_lm, port: int, prompt, config, **transport):
    return await run_generation(
        "spec", lm=device_lm, prompt_ids=prompt, config=config, port=port,
        transport=TransportConfig.for_model(device_lm, role="device", secret=SECRET, **transport),
    )  # fmt: skip


async def http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


def metric(text: str, series: str) -> float:
    """The value of one series line in Prometheus text (0 if absent)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0
