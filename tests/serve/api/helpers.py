"""Shared by the HTTP API tests: a cloud in a background thread, greedy references, SSE."""

from __future__ import annotations

import asyncio
import json
import threading

from tandem.config import SamplingConfig
from tandem.protocols.local import generate
from tandem.serve.api.server import ServerThread, build_app, build_backend
from tandem.serve.cloud import CloudResources, CloudServer
from tandem.serve.settings import DeviceServeSettings
from tandem.transport import TransportConfig

SECRET = b"api-secret"


class CloudThread:
    """A CloudServer on 127.0.0.1 (port 0: any) with its own event loop in a daemon thread;
    `stop()` closes it (every session gets a Bye, as when the cloud process shuts down)."""

    def __init__(self, lm, *, port: int = 0, link=None, dragon=None) -> None:
        self.lm, self.link, self.dragon = lm, link, dragon  # dragon: a SideSetup
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = self._call(self._start(port))

    def _call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self, port: int):
        resources = CloudResources(lm=self.lm)
        if self.dragon is not None:
            resources.extra["dragon"] = self.dragon
        cloud = CloudServer(resources, modes=["spec", "ar", "dragon", "private-spec"])
        transport = TransportConfig.for_model(self.lm, role="cloud", secret=SECRET, link=self.link)
        return await cloud.start("127.0.0.1", port, transport=transport)

    @property
    def port(self) -> int:
        return self.server.port

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self._call(self.server.close(grace=1.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class RapidCloudThread:
    """A RAPID cloud (its target reads `context` in full) on 127.0.0.1 in a daemon thread."""

    def __init__(self, lm, context: str) -> None:
        from tandem.protocols.rapid.edge import cloud_handler
        from tandem.transport import serve

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        start = serve(cloud_handler(lm, context), "127.0.0.1", 0,
                      config=TransportConfig.for_model(lm, role="cloud", secret=SECRET))  # fmt: skip
        self.server = asyncio.run_coroutine_threadsafe(start, self.loop).result(30)
        self.port = self.server.port

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(grace=1.0), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def api(lm, *, backend=None, secret=SECRET, **settings) -> ServerThread:
    """A started HTTP API server for `lm` (settings: DeviceServeSettings fields)."""
    config = DeviceServeSettings(model=lm.name, **settings)
    backend = backend or build_backend(config, lm, secret=secret)
    return ServerThread(build_app(config, backend)).start()


def greedy_text(lm, prompt_ids: list[int], n: int) -> str:
    """What a greedy answer of at most n tokens reads as (an eos ends it, unshown)."""
    tokens = generate(lm, prompt_ids, SamplingConfig(temperature=0, max_new_tokens=n)).tokens
    return visible(lm, tokens)


def visible(lm, tokens: list[int]) -> str:
    eos = lm.tokenizer.eos_token_id
    if eos in tokens:
        tokens = tokens[: tokens.index(eos)]
    return lm.tokenizer.decode(tokens)


def greedy_tokens(lm, prompt_ids: list[int], n: int) -> list[int]:
    return generate(lm, prompt_ids, SamplingConfig(temperature=0, max_new_tokens=n)).tokens


def sse_events(lines) -> list[dict | str]:
    """The data of every server-sent event (JSON decoded; "[DONE]" kept as a string)."""
    events: list[dict | str] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events
