"""The cloud server: many device sessions, each served by the mode its first message asks for.

Words used here:
- *mode*: one collaboration protocol the cloud can serve. Every session opens with the
  transport's typed `Start` message, whose `mode` names an entry of `MODES` (spec, ar,
  dragon, private-spec, rapid); the entry serves the session (`serve(channel, first,
  resources)`). A new protocol plugs in by adding an entry, its resources going into
  `CloudResources.extra` (DRAGON's side setup under "dragon", RAPID's long context under
  "long_context").
- *resources*: what the modes share: the target model, the verification batcher (spec mode:
  verifications of different sessions that are ready together run as one forward pass, see
  tandem.models.batching), the metrics, and anything mode-specific.
- *admission*: a new session is checked against `CloudLimits` when its first message arrives
  (tandem.serve.admission); a refused device gets an `Error` naming the limit.
- *record*: one JSON-able dict per session start / end / refusal (tandem.serve.cloud_metrics).

Model forward passes run in worker threads; the model's own lock serialises them, so sessions
share one model safely (one forward pass at a time). A session's state (its KV cache) lives in
its mode's session object only, so it is freed when the session ends (tested with weakrefs),
also when the device vanishes mid-session: its channel fails (end of stream, reset, or the
dead-peer timeout), the mode returns, and the end record says `reason: peer_lost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tandem.errors import TandemError
from tandem.models.base import CausalLM
from tandem.models.batching import VerifyBatcher
from tandem.serve.admission import CloudLimits, admit, context_tokens
from tandem.serve.cloud_metrics import CloudMetrics, serve_metrics
from tandem.transport import (
    STALLED_BYE,
    ChannelClosed,
    Error,
    Message,
    PeerSaidBye,
    Server,
    TransportConfig,
    control,
    serve,
)

log = logging.getLogger(__name__)


@dataclass
class CloudResources:
    lm: CausalLM  # the target model
    extra: dict = field(default_factory=dict)  # mode-specific resources (e.g. knowledge)
    reports: list = field(default_factory=list)  # (mode, result) of the last MAX_REPORTS sessions
    batcher: VerifyBatcher | None = None  # cross-session verification batching (spec mode)
    metrics: CloudMetrics | None = None
    live: weakref.WeakSet = field(default_factory=weakref.WeakSet)  # session objects alive


MAX_REPORTS = 1000


@dataclass(frozen=True)
class Mode:
    name: str  # the `Start.mode` that selects it
    serve: Callable[[object, Message, CloudResources], Awaitable[object]]
    # the device ends a session by closing the channel (its Bye), not by a message of the
    # mode's own (RAPID): a Bye is then a completed session, not a lost peer
    ends_with_bye: bool = False


async def _serve_spec(channel, first: Message, resources: CloudResources):
    from tandem.protocols.spec.cloud import serve_session

    return await serve_session(
        channel,
        resources.lm,
        first=first,
        batcher=resources.batcher,
        observer=resources.metrics,
        live=resources.live,
    )


async def _serve_ar(channel, first: Message, resources: CloudResources):
    from tandem.baselines.spec_baselines import serve_cloud_ar

    return await serve_cloud_ar(channel, resources.lm, first=first)


async def _serve_dragon(channel, first: Message, resources: CloudResources):
    from tandem.protocols.dragon import serve_cloud, wire

    side = resources.extra.get("dragon")  # a tandem.protocols.dragon.setup.SideSetup
    if side is None:
        with contextlib.suppress(ChannelClosed):
            await channel.send(wire.error_message("this cloud has no DRAGON corpus (--corpus)"))
        return None
    return await serve_cloud(
        channel, lm=resources.lm, knowledge=side.knowledge, profile=side.profile, first=first
    )


def _public_knowledge(resources: CloudResources):
    """The cloud's corpus (`tandem cloud serve --corpus`), or None."""
    side = resources.extra.get("dragon")  # a tandem.protocols.dragon.setup.SideSetup
    return resources.extra.get("knowledge") or (side.knowledge if side is not None else None)


async def _serve_private_spec(channel, first: Message, resources: CloudResources):
    from tandem.protocols.private_spec import serve_private_session
    from tandem.protocols.spec import wire

    knowledge = _public_knowledge(resources)
    if knowledge is None:
        with contextlib.suppress(ChannelClosed):
            await channel.send(wire.error_message("this cloud has no corpus (--corpus)"))
        return None
    return await serve_private_session(
        channel,
        resources.lm,
        knowledge,
        first=first,
        batcher=resources.batcher,
        observer=resources.metrics,
        live=resources.live,
    )


async def _serve_rapid(channel, first: Message, resources: CloudResources):
    from tandem.protocols.rapid.edge import cloud_session

    context = resources.extra.get("long_context")  # `tandem cloud serve --long-context FILE`
    if context is None:
        with contextlib.suppress(ChannelClosed):
            await channel.send(
                Error(code="rapid-open", message="this cloud has no long context (--long-context)")
            )
        return None
    return await cloud_session(channel, resources.lm, context, first=first)


MODES: dict[str, Mode] = {
    "spec": Mode("spec", _serve_spec),
    "ar": Mode("ar", _serve_ar),
    "dragon": Mode("dragon", _serve_dragon),
    "private-spec": Mode("private-spec", _serve_private_spec),
    "rapid": Mode("rapid", _serve_rapid, ends_with_bye=True),
}


class CloudServer:
    """Dispatches each session to the enabled mode its `Start` names, after admission control;
    keeps the open sessions, metrics and session records."""

    def __init__(
        self,
        resources: CloudResources,
        *,
        modes: list[str] | None = None,
        registry: dict[str, Mode] | None = None,
        limits: CloudLimits | None = None,
        on_record: Callable[[dict], None] | None = None,
    ) -> None:
        registry = MODES if registry is None else registry
        names = list(registry) if modes is None else modes
        unknown = [name for name in names if name not in registry]
        if unknown:
            raise TandemError(
                f"unknown mode {', '.join(unknown)}; choose from {', '.join(registry)}"
            )
        self.resources = resources
        self.modes = [registry[name] for name in names]
        self.limits = limits or CloudLimits()
        self.on_record = on_record
        self.open: dict[object, str] = {}  # channel -> session id, of the sessions being served
        self._ids = itertools.count(1)
        self._metrics_server: asyncio.Server | None = None

    async def handle(self, channel) -> None:
        started = time.monotonic()
        session = getattr(getattr(channel, "session", None), "session_id", "") or ""
        session = session or f"local-{next(self._ids)}"
        try:
            first = await channel.recv()
        except ChannelClosed:
            return
        wanted = control.start_mode(first)
        mode = next((m for m in self.modes if m.name == wanted), None)
        if mode is None:
            names = ", ".join(m.name for m in self.modes)
            with contextlib.suppress(ChannelClosed):
                await channel.send(Error(code="mode", message=f"this cloud serves only: {names}"))
            return
        batcher = self.resources.batcher
        refusal = admit(
            self.limits,
            open_sessions=len(self.open),
            queued_tokens=batcher.queued_tokens if batcher is not None else 0,
            context=context_tokens(first),
        )
        if refusal is not None:
            if self.resources.metrics is not None:
                self.resources.metrics.refused(refusal.reason)
            self._emit(_record("session_refused", session, mode.name, refusal=refusal.reason))
            with contextlib.suppress(ChannelClosed):
                await channel.send(Error(code="admission", message=refusal.message))
            return
        await self._serve(channel, first, mode, session, started)

    async def _serve(self, channel, first: Message, mode: Mode, session: str, started: float):
        self.open[channel] = session
        metrics = self.resources.metrics
        if metrics is not None:
            metrics.opened(mode.name, len(self.open))
        self._emit(
            _record(
                "session_start", session, mode.name, prompt_tokens=len(getattr(first, "tokens", ()))
            )
        )
        result, error = None, None
        try:
            result = await mode.serve(channel, first, self.resources)
            self.resources.reports.append((mode.name, result))
            del self.resources.reports[:-MAX_REPORTS]
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            del self.open[channel]
            failure = getattr(channel, "failure", None)
            if mode.ends_with_bye and isinstance(failure, PeerSaidBye):
                if failure.reason != STALLED_BYE:  # not a stalled peer: the mode's normal end
                    failure = None
            reason, error = end_reason(result, error, failure)
            stats = result if isinstance(result, dict) else {}
            record = _record(
                "session_end",
                session,
                mode.name,
                tokens=stats.get("tokens"),
                drafts=stats.get("drafts_verified"),
                accepted=stats.get("drafts_accepted"),
                bytes_up=channel.bytes_received,
                bytes_down=channel.bytes_sent,
                duration_s=round(time.monotonic() - started, 4),
                reason=reason,
                error=error,
            )
            if metrics is not None:
                metrics.closed(record, len(self.open))
            self._emit(record)

    def _emit(self, record: dict) -> None:
        if self.on_record is not None:
            self.on_record(record)

    def render_metrics(self) -> str:
        """The text of GET /metrics (empty metrics if the resources have none)."""
        metrics = self.resources.metrics or CloudMetrics()
        batcher = self.resources.batcher
        return metrics.render(
            list(self.open),
            states=len(self.resources.live),
            queued_tokens=batcher.queued_tokens if batcher is not None else 0,
        )

    async def start(
        self, host: str, port: int, *, transport: TransportConfig, metrics_port: int | None = None
    ) -> Server:
        """Listen on host:port (port 0: any free port, read `server.port`); with
        `metrics_port`, also serve GET /metrics on 127.0.0.1 (read `self.metrics_port`)."""
        try:
            if metrics_port is not None:
                self._metrics_server = await serve_metrics(self.render_metrics, metrics_port)
            return await serve(self.handle, host, port, config=transport)
        except OSError as exc:
            raise TandemError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None

    @property
    def metrics_port(self) -> int | None:
        server = self._metrics_server
        return None if server is None else server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop the metrics endpoint and the batcher (the transport server closes itself)."""
        if self._metrics_server is not None:
            self._metrics_server.close()
            await self._metrics_server.wait_closed()
            self._metrics_server = None
        if self.resources.batcher is not None:
            self.resources.batcher.close()


def end_reason(
    result: object, error: str | None, failure: Exception | None
) -> tuple[str, str | None]:
    """(reason, error text) of a finished session (reasons: tandem.serve.cloud_metrics). A
    failed channel comes first: a mode may return normally, or raise, once its device is gone."""
    if failure is not None:
        return "peer_lost", f"{type(failure).__name__}: {failure}"
    if error is not None:
        return "error", error
    if result is None:
        return "ended_early", "ended early"
    return "completed", None


def _record(event: str, session: str, mode: str, **fields) -> dict:
    return {"event": event, "session": session, "mode": mode, **fields}


def cloud_resources(
    lm: CausalLM, *, batching: bool = True, batch_window_ms: float = 2.0, max_sessions: int = 64
) -> CloudResources:
    """Resources with metrics and (unless `batching` is False) a verification batcher."""
    metrics = CloudMetrics()
    batcher = None
    if batching:
        batcher = VerifyBatcher(
            lm, window_ms=batch_window_ms, max_workers=max_sessions, on_batch=metrics.batch
        )
    return CloudResources(lm=lm, batcher=batcher, metrics=metrics)
