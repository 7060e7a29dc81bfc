"""What the cloud tells its operator: metrics (Prometheus text over HTTP) and session logs.

Words used here:
- *record*: one session's summary, a flat dict: event (session_start / session_end /
  session_refused), session id, mode, tokens, drafts, accepted, bytes_up (device -> cloud),
  bytes_down, duration_s, reason (how a session ended, see below), refusal (the limit's
  name, or null), error.
- *end reason*: `completed` (the mode returned its result), `peer_lost` (the device's side
  of the channel failed first: it closed or reset the connection, said Bye, fell silent past
  the dead-peer timeout or sent broken frames; `error` says which), `error` (the mode
  raised), `ended_early` (the mode returned nothing, e.g. a bad start message).
- *observer*: what a spec session calls per verdict (`verdict(drafts, accepted, tokens)`), so
  tokens/s and acceptance move while sessions run, not only when they end.

`CloudMetrics.render(channels, ...)` refreshes the gauges that are computed on demand (open
sessions' RTT estimate, tokens/s over the last `window_s`, acceptance rate, session objects
still alive, tokens waiting in the batcher) and returns the text of `GET /metrics`. `serve_metrics` answers that one request on 127.0.0.1 (h11).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TextIO

from tandem.serve.metrics import CONTENT_TYPE, Metrics

log = logging.getLogger("tandem.cloud")

FAMILIES = (
    ("counter", "sessions_total", "Sessions admitted, by mode."),
    ("gauge", "sessions_open", "Sessions open now."),
    ("counter", "sessions_ended_total", "Sessions ended, by reason (completed, peer_lost, ...)."),
    ("gauge", "session_states", "Session objects (with their KV caches) still in memory."),
    ("gauge", "queued_tokens", "Verification tokens submitted to the batcher, not answered."),
    ("counter", "refusals_total", "Sessions refused, by the limit that refused them."),
    ("counter", "tokens_total", "Output tokens committed by the cloud."),
    ("gauge", "tokens_per_second", "Output tokens per second over the last window."),
    ("counter", "drafts_total", "Draft tokens verified."),
    ("counter", "drafts_accepted_total", "Draft tokens accepted."),
    ("gauge", "acceptance_rate", "Accepted / verified drafts since start."),
    ("counter", "bytes_up_total", "Wire bytes received from devices (finished sessions)."),
    ("counter", "bytes_down_total", "Wire bytes sent to devices (finished sessions)."),
    ("counter", "batches_total", "Verification forward passes, by batch size."),
    ("counter", "batch_tokens_total", "Block tokens in verification forward passes."),
    ("gauge", "batch_size_max", "Largest verification batch so far."),
    ("gauge", "rtt_seconds", "Mean smoothed RTT estimate of the open sessions."),
)


class CloudMetrics:
    """The cloud's metric families, updated from the event loop and the batcher thread."""

    def __init__(self, *, window_s: float = 10.0) -> None:
        self.metrics = Metrics(prefix="tandem_cloud")
        for kind, name, help_text in FAMILIES:
            getattr(self.metrics, kind)(name, help_text)
        self.window_s = window_s
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of recent verdicts
        self._lock = threading.Lock()

    # -- events -------------------------------------------------------------------------------

    def opened(self, mode: str, open_now: int) -> None:
        self.metrics.inc("sessions_total", mode=mode)
        self.metrics.set("sessions_open", open_now)

    def closed(self, record: dict, open_now: int) -> None:
        self.metrics.set("sessions_open", open_now)
        self.metrics.inc("sessions_ended_total", reason=record.get("reason", "completed"))
        self.metrics.inc("bytes_up_total", record.get("bytes_up", 0))
        self.metrics.inc("bytes_down_total", record.get("bytes_down", 0))
        if record.get("mode") != "spec":  # spec sessions count their tokens per verdict
            self._tokens(int(record.get("tokens") or 0))

    def refused(self, reason: str) -> None:
        self.metrics.inc("refusals_total", reason=reason)

    def verdict(self, drafts: int, accepted: int, tokens: int) -> None:
        self.metrics.inc("drafts_total", drafts)
        self.metrics.inc("drafts_accepted_total", accepted)
        self._tokens(tokens)

    def batch(self, size: int, tokens: int) -> None:
        self.metrics.inc("batches_total", size=size)
        self.metrics.inc("batch_tokens_total", tokens)
        if size > self.metrics.value("batch_size_max"):
            self.metrics.set("batch_size_max", size)

    def _tokens(self, n: int) -> None:
        self.metrics.inc("tokens_total", n)
        with self._lock:
            self._recent.append((time.monotonic(), n))

    # -- exposition ---------------------------------------------------------------------------

    def render(self, channels: Iterable = (), *, states: int = 0, queued_tokens: int = 0) -> str:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0][0] < now - self.window_s:
                self._recent.popleft()
            recent = sum(n for _, n in self._recent)
        self.metrics.set("tokens_per_second", recent / self.window_s)
        drafts = self.metrics.value("drafts_total")
        accepted = self.metrics.value("drafts_accepted_total")
        self.metrics.set("acceptance_rate", accepted / drafts if drafts else 0.0)
        rtts = [c.rtt for c in channels if getattr(c, "rtt", None) is not None]
        self.metrics.set("rtt_seconds", sum(rtts) / len(rtts) if rtts else 0.0)
        self.metrics.set("session_states", states)
        self.metrics.set("queued_tokens", queued_tokens)
        return self.metrics.render()


def session_logger(log_format: str, stream: TextIO | None = None) -> Callable[[dict], None]:
    """Where session records go: one JSON line each on `stream` (json), or a log line (text)."""
    if log_format not in ("text", "json"):
        raise ValueError(f"log format must be text or json, not {log_format!r}")

    def write_json(record: dict) -> None:
        import sys

        out = stream or sys.stderr
        out.write(json.dumps(record, separators=(",", ":")) + "\n")
        out.flush()

    def write_text(record: dict) -> None:
        fields = " ".join(f"{k}={v}" for k, v in record.items() if k != "event" and v is not None)
        log.info("%s %s", record.get("event"), fields)

    return write_json if log_format == "json" else write_text


async def serve_metrics(render: Callable[[], str], port: int) -> asyncio.Server:
    """A tiny HTTP/1.1 server on 127.0.0.1:port: GET /metrics -> Prometheus text, else 404."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import h11

        conn = h11.Connection(h11.SERVER)
        try:
            request = None
            while request is None:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await asyncio.wait_for(reader.read(65536), 10.0)
                    conn.receive_data(data)
                    if not data:
                        return
                elif isinstance(event, h11.Request):
                    request = event
                else:
                    return
            target = request.target.decode("latin-1").split("?", 1)[0]
            if request.method == b"GET" and target == "/metrics":
                status, body, ctype = 200, render().encode(), CONTENT_TYPE
            else:
                status, body, ctype = 404, b"not found; try GET /metrics\n", "text/plain"
            headers = [("content-type", ctype), ("content-length", str(len(body)))]
            headers.append(("connection", "close"))
            writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
            writer.write(conn.send(h11.Data(data=body)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
        except (TimeoutError, h11.RemoteProtocolError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(handle, "127.0.0.1", port)
