"""Runs generations one at a time in a worker thread, and accounts for them.

Words used here:
- *job*: one request's generation: prompt ids, params, stop strings, and a `sink` that
  receives ("delta", text) events from the worker thread as tokens are committed.
- *queue*: requests wait in a single-worker executor, in arrival order; one generation runs
  at a time per model (the model and its KV caches are not shared between generations).
- *outcome*: what a finished job returns: the text, token counts, finish reason, the
  backend's `GenResult` and timings; `tandem_info` turns it into the response's `tandem`
  object.

Metrics (prefix `tandem_device`) and the one log line per request live here too.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from tandem.serve.api.backends import Backend, GenParams, GenResult, StopGeneration
from tandem.serve.api.text import TextTracker
from tandem.serve.metrics import Metrics

log = logging.getLogger("tandem.serve.api")

Sink = Callable[[str], None]


@dataclass
class Job:
    prompt_ids: list[int]
    params: GenParams
    stops: list[str] = field(default_factory=list)
    sink: Sink | None = None  # called with each new text piece (worker thread)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    cancelled: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class Outcome:
    text: str
    completion_tokens: int
    finish_reason: str  # OpenAI's: "stop" | "length"
    result: GenResult
    queue_s: float
    ttft_s: float | None
    generate_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.generate_s if self.generate_s > 0 else 0.0


def new_metrics() -> Metrics:
    metrics = Metrics(prefix="tandem_device")
    for name, help in (
        ("requests_total", "HTTP generation requests, by mode and status."),
        ("tokens_total", "Completion tokens generated."),
        ("prompt_tokens_total", "Prompt tokens received."),
        ("bytes_up_total", "Bytes sent to the cloud."),
        ("bytes_down_total", "Bytes received from the cloud."),
        ("refusals_total", "Requests refused with a 4xx, by reason."),
        ("errors_total", "Generations that failed with a 5xx."),
        ("degraded_total", "Generations the device finished alone (cloud lost)."),
    ):
        metrics.counter(name, help)
    for name, help in (
        ("last_tokens_per_second", "Completion tokens per second of the last request."),
        ("acceptance_rate", "Acceptance rate of the last collaborative request."),
        ("rtt_seconds", "Round-trip time estimate to the cloud (last request)."),
        ("queue_depth", "Requests waiting for or running a generation."),
        ("cloud_reachable", "1 if the last probe opened a session with the cloud."),
    ):
        metrics.gauge(name, help)
    return metrics


def tandem_info(mode: str, outcome: Outcome) -> dict:
    """The `tandem` object of a response: mode, acceptance, bytes, degradation, timings."""
    result, info = outcome.result, dict(outcome.result.info)
    body = {
        "mode": mode,
        "degraded": result.degraded,
        "degraded_reason": result.degraded_reason or None,
        "degraded_at": result.degraded_at,
        "bytes_up": int(info.pop("bytes_up", 0)),
        "bytes_down": int(info.pop("bytes_down", 0)),
        "acceptance_rate": info.pop("acceptance_rate", None),
        "timings": {
            "queue_s": round(outcome.queue_s, 6),
            "ttft_s": None if outcome.ttft_s is None else round(outcome.ttft_s, 6),
            "generate_s": round(outcome.generate_s, 6),
            "tokens_per_s": round(outcome.tokens_per_s, 3),
        },
    }
    body.update(info)
    return body


def log_line(record: dict, fmt: str) -> str:
    """One request as a JSON object or as `key=value` pairs."""
    if fmt == "json":
        return json.dumps(record, sort_keys=False, default=str)
    return " ".join(f"{k}={json.dumps(v) if isinstance(v, str) and ' ' in v else v}"
                    for k, v in record.items())  # fmt: skip


class Engine:
    """One backend, one worker thread, metrics and request logs."""

    def __init__(self, backend: Backend, *, metrics: Metrics | None = None, log_format="text"):
        self.backend = backend
        self.metrics = metrics or new_metrics()
        self.log_format = log_format
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-gen")
        self._waiting = 0
        self._lock = threading.Lock()

    @property
    def mode(self) -> str:
        return self.backend.mode

    def submit(self, job: Job) -> Future:
        """Queue a job; the future gives its Outcome (or raises what the backend raised)."""
        with self._lock:
            self._waiting += 1
            self.metrics.set("queue_depth", self._waiting)
        return self._executor.submit(self._run, job)

    def _run(self, job: Job) -> Outcome:
        try:
            return self._generate(job)
        finally:
            with self._lock:
                self._waiting -= 1
                self.metrics.set("queue_depth", self._waiting)

    def _generate(self, job: Job) -> Outcome:
        tokenizer = self.backend.lm.tokenizer
        tracker = TextTracker(
            tokenizer, eos_id=tokenizer.eos_token_id, stops=job.stops, limit=job.params.max_tokens
        )
        start = time.perf_counter()
        first: list[float] = []

        def on_token(token: int) -> None:
            if job.cancelled.is_set():
                raise StopGeneration("the client left")
            if not first:
                first.append(time.perf_counter() - start)
            piece = tracker.push(token)
            if piece and job.sink is not None:
                job.sink(piece)
            if tracker.cut:  # a stop string: end now (eos and the budget end by themselves)
                raise StopGeneration("stop string")

        if job.cancelled.is_set():
            result = GenResult([], "stop")
        else:
            result = self.backend.generate(job.prompt_ids, job.params, on_token)
        rest = tracker.close(result.finish_reason)
        if rest and job.sink is not None:
            job.sink(rest)
        return Outcome(
            text=tracker.text,
            completion_tokens=len(tracker.tokens),
            finish_reason=tracker.finish,
            result=result,
            queue_s=start - job.queued_at,
            ttft_s=first[0] if first else None,
            generate_s=time.perf_counter() - start,
        )

    def account(self, job: Job, outcome: Outcome, *, endpoint: str, status: int = 200) -> None:
        """Metrics and the log line of a finished request."""
        m, mode, result = self.metrics, self.mode, outcome.result
        m.inc("requests_total", mode=mode, status=status)
        m.inc("tokens_total", outcome.completion_tokens, mode=mode)
        m.inc("prompt_tokens_total", len(job.prompt_ids), mode=mode)
        m.inc("bytes_up_total", result.info.get("bytes_up", 0), mode=mode)
        m.inc("bytes_down_total", result.info.get("bytes_down", 0), mode=mode)
        m.set("last_tokens_per_second", outcome.tokens_per_s, mode=mode)
        if result.info.get("acceptance_rate") is not None:
            rate = result.info["acceptance_rate"]
            m.set("acceptance_rate", rate if not isinstance(rate, dict) else _mean(rate), mode=mode)
        if result.info.get("rtt_s") is not None:
            m.set("rtt_seconds", result.info["rtt_s"])
        if result.degraded:
            m.inc("degraded_total", mode=mode)
        self.log(
            id=job.id, endpoint=endpoint, mode=mode, status=status,
            prompt_tokens=len(job.prompt_ids), completion_tokens=outcome.completion_tokens,
            finish=outcome.finish_reason, queue_s=round(outcome.queue_s, 4),
            ttft_s=None if outcome.ttft_s is None else round(outcome.ttft_s, 4),
            total_s=round(outcome.generate_s, 4), tok_s=round(outcome.tokens_per_s, 2),
            degraded=result.degraded, reason=result.degraded_reason or None,
        )  # fmt: skip

    def refuse(self, *, endpoint: str, status: int, reason: str, message: str) -> None:
        self.metrics.inc("refusals_total", reason=reason)
        self.metrics.inc("requests_total", mode=self.mode, status=status)
        self.log(endpoint=endpoint, mode=self.mode, status=status, error=message)

    def fail(self, *, endpoint: str, job: Job, message: str) -> None:
        self.metrics.inc("errors_total", mode=self.mode)
        self.metrics.inc("requests_total", mode=self.mode, status=500)
        self.log(id=job.id, endpoint=endpoint, mode=self.mode, status=500, error=message)

    def log(self, **record) -> None:
        log.info(log_line({"event": "request", **record}, self.log_format))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _mean(values: dict) -> float:
    known = [v for v in values.values() if v is not None]
    return sum(known) / len(known) if known else 0.0
