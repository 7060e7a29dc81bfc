"""The cloud server: many device sessions, each served by the mode its first message asks for.

Words used here:
- *mode*: one collaboration protocol the cloud can serve. A `Mode` says how to recognise a
  session's first message (`matches`) and how to serve the session (`serve(channel, first,
  resources)`). `MODES` is the registry; a new protocol plugs in by adding an entry (DRAGON's
  `serve_cloud(channel, lm=..., knowledge=..., first=first)` and RAPID's cloud side fit as is,
  their resources going into `CloudResources.extra`).
- *resources*: what the modes share: the target model and anything mode-specific.

Model forward passes run in worker threads; the model's own lock serialises them, so sessions
share one model safely (one forward pass at a time).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tandem.errors import TandemError
from tandem.models.base import CausalLM
from tandem.transport import ChannelClosed, Error, Message, Server, TransportConfig, serve

log = logging.getLogger(__name__)


@dataclass
class CloudResources:
    lm: CausalLM  # the target model
    extra: dict = field(default_factory=dict)  # mode-specific resources (e.g. knowledge)
    reports: list = field(default_factory=list)  # (mode, result) of every finished session


@dataclass(frozen=True)
class Mode:
    name: str
    matches: Callable[[Message], bool]
    serve: Callable[[object, Message, CloudResources], Awaitable[object]]


def _spec_start_mode(msg: Message) -> str | None:
    from tandem.protocols.spec import wire

    if wire.control_kind(msg) != wire.START:
        return None
    try:
        return str(wire.control_body(msg).get("mode", "spec"))
    except ValueError:
        return None


async def _serve_spec(channel, first: Message, resources: CloudResources):
    from tandem.protocols.spec.cloud import serve_session

    return await serve_session(channel, resources.lm, first=first)


async def _serve_ar(channel, first: Message, resources: CloudResources):
    from tandem.baselines.spec_baselines import serve_cloud_ar

    return await serve_cloud_ar(channel, resources.lm, first=first)


def _is_dragon_start(msg: Message) -> bool:
    from tandem.protocols.dragon import wire

    return wire.control_kind(msg) == wire.START


async def _serve_dragon(channel, first: Message, resources: CloudResources):
    from tandem.protocols.dragon import serve_cloud, wire

    side = resources.extra.get("dragon")  # a tandem.serve.dragon_session.SideSetup
    if side is None:
        with contextlib.suppress(ChannelClosed):
            await channel.send(wire.error_message("this cloud has no DRAGON corpus (--corpus)"))
        return None
    return await serve_cloud(
        channel, lm=resources.lm, knowledge=side.knowledge, profile=side.profile, first=first
    )


MODES: dict[str, Mode] = {
    "spec": Mode("spec", lambda msg: _spec_start_mode(msg) == "spec", _serve_spec),
    "ar": Mode("ar", lambda msg: _spec_start_mode(msg) == "ar", _serve_ar),
    "dragon": Mode("dragon", _is_dragon_start, _serve_dragon),
}


class CloudServer:
    """Dispatches each session to the first enabled mode that recognises its first message."""

    def __init__(
        self,
        resources: CloudResources,
        *,
        modes: list[str] | None = None,
        registry: dict[str, Mode] | None = None,
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

    async def handle(self, channel) -> None:
        try:
            first = await channel.recv()
        except ChannelClosed:
            return
        for mode in self.modes:
            if mode.matches(first):
                result = await mode.serve(channel, first, self.resources)
                self.resources.reports.append((mode.name, result))
                return
        names = ", ".join(m.name for m in self.modes)
        with contextlib.suppress(ChannelClosed):
            await channel.send(Error(code="mode", message=f"this cloud serves only: {names}"))

    async def start(self, host: str, port: int, *, transport: TransportConfig) -> Server:
        """Listen on host:port (port 0: any free port, read `server.port`)."""
        try:
            return await serve(self.handle, host, port, config=transport)
        except OSError as exc:
            raise TandemError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def cloud_transport(lm: CausalLM, *, secret: bytes | str | None, **kwargs) -> TransportConfig:
    """The cloud's TransportConfig for a model (the handshake checks the tokenizer)."""
    return TransportConfig(
        secret=secret,
        role="cloud",
        tokenizer_hash=lm.tokenizer.fingerprint,
        vocab_size=lm.vocab_size,
        model_name=getattr(lm, "name", ""),
        **kwargs,
    )
