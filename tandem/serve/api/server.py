"""From `DeviceServeSettings` to a running HTTP server (uvicorn), in the foreground or in a
background thread (tests, notebooks).

Words used here:
- *listen*: HOST:PORT of the HTTP API (port 0: any free port; read `ServerThread.port`).
- *cloud*: HOST:PORT of the cloud's tandem transport (`tandem cloud serve`).
- The shared secret comes from `$TANDEM_SECRET` (or the `secret` argument), never a file.
- *API key*: what HTTP clients must send as `Authorization: Bearer KEY` (`--api-key` or
  `$TANDEM_API_KEY`, never a file); serving on a non-loopback address without one is refused.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
import threading
import time

from tandem.errors import TandemError
from tandem.serve.api.app import ApiLimits, create_app
from tandem.serve.api.backends import (
    Backend,
    CloudARBackend,
    GenParams,
    LocalBackend,
    SpecBackend,
    SpecSettings,
    device_pipeline,
)
from tandem.serve.api.engine import Engine
from tandem.serve.settings import DeviceServeSettings


def split_hostport(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise TandemError(f"{what}: expected HOST:PORT, got {value!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1 (a host name other than localhost: False)."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(listen: str, api_key: str | None) -> None:
    """Refuse to serve on a non-loopback address without an API key."""
    host, _ = split_hostport(listen, "--listen")
    if not api_key and not is_loopback(host):
        raise TandemError(
            f"--listen {listen} is reachable from other machines and no API key is set: pass "
            "--api-key KEY or set $TANDEM_API_KEY (clients send `Authorization: Bearer KEY`), "
            "or listen on 127.0.0.1"
        )


def device_transport_for(lm, settings: DeviceServeSettings, secret):
    """The TransportConfig of every session with the cloud (short timeouts: a dead cloud is
    noticed within seconds and the device carries on alone)."""
    from tandem.transport import LinkConfig, TransportConfig

    return TransportConfig.for_model(
        lm,
        role="device",
        secret=secret,
        link=LinkConfig(delay_ms=settings.delay) if settings.delay else None,
        connect_timeout=settings.connect_timeout,
        handshake_timeout=max(settings.connect_timeout, 2.0),
        ping_interval=1.0,
        dead_peer_timeout=5.0,
    )


def build_backend(settings: DeviceServeSettings, lm, *, secret=None) -> Backend:
    """The backend of `settings.mode` for a loaded device model."""
    if secret is None:
        secret = os.environ.get("TANDEM_SECRET") or None
    if settings.mode == "local":
        return LocalBackend(lm)
    host, port = split_hostport(settings.cloud, "--cloud")
    transport = device_transport_for(lm, settings, secret)
    if settings.mode == "spec":
        from tandem.protocols.spec.config import device_codec

        codec, codec_params = device_codec(settings.codec, settings.codec_params)
        spec = SpecSettings(
            pipeline=device_pipeline(settings.pipeline, codec), codec=codec,
            codec_params=codec_params,
            draft_len=settings.draft_len, bit_budget=settings.bit_budget,
            downlink_k=settings.downlink_k, fast_verify=settings.fast_verify,
            truncate_factor=settings.truncate_factor, verify_calls=settings.verify_calls,
            branch_below=settings.branch_below, branch_len=settings.branch_len,
        )  # fmt: skip
        backend = SpecBackend(lm, host=host, port=port, transport=transport, spec=spec)
        backend.config(GenParams(max_tokens=1))  # check the settings now, not per request
        return backend
    if settings.mode == "ar":
        return CloudARBackend(lm, host=host, port=port, transport=transport)
    if settings.mode == "dragon":
        from tandem.protocols.dragon.setup import load_side
        from tandem.serve.api.retrieval import DragonBackend

        if not settings.corpus:
            raise TandemError("--mode dragon needs --corpus (the device's private corpus)")
        setup = load_side(corpus=settings.corpus, model=settings.model, docs=settings.docs, lm=lm)
        return DragonBackend(
            setup, host=host, port=port, transport=transport, strategy=settings.strategy,
            docs=settings.docs,
        )  # fmt: skip
    if settings.mode == "private-spec":
        from tandem.serve.api.retrieval import PrivateSpecBackend

        return PrivateSpecBackend.build(settings, lm, host=host, port=port, transport=transport)
    from tandem.serve.api.retrieval import RapidBackend

    return RapidBackend(lm, host=host, port=port, transport=transport)


def build_app(settings: DeviceServeSettings, backend: Backend, *, api_key: str | None = None):
    """The FastAPI app (and its engine) serving `backend` under the settings' limits; with
    `api_key`, clients must send it as a bearer token."""
    names = tuple(dict.fromkeys(n for n in (settings.served_model_name, settings.model) if n))
    limits = ApiLimits(
        model_names=names,
        max_context=settings.max_context,
        max_tokens=settings.max_tokens,
        default_max_tokens=settings.default_max_tokens,
    )
    engine = Engine(backend, log_format=settings.log_format)
    cloud = None if settings.mode == "local" else settings.cloud
    return create_app(engine, limits, cloud=cloud, api_key=api_key)


def setup_logging(log_format: str) -> None:
    logger = logging.getLogger("tandem.serve.api")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        fmt = "%(message)s" if log_format == "json" else "%(asctime)s %(levelname)s %(message)s"
        handler.setFormatter(logging.Formatter(fmt))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _uvicorn_server(app, host: str, port: int):
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="off", access_log=False
    )
    return uvicorn.Server(config)


def serve_forever(
    settings: DeviceServeSettings, backend: Backend, *, api_key: str | None = None, on_ready=None
) -> None:
    """Serve until interrupted (uvicorn handles SIGINT / SIGTERM); a non-loopback `listen`
    needs an `api_key`."""
    check_exposure(settings.listen, api_key)
    host, port = split_hostport(settings.listen, "--listen")
    app = build_app(settings, backend, api_key=api_key)
    setup_logging(settings.log_format)
    server = _uvicorn_server(app, host, port)
    if on_ready is not None:
        threading.Thread(target=_announce, args=(server, on_ready), daemon=True).start()
    try:
        server.run()
    finally:
        app.state.engine.shutdown()


def _announce(server, on_ready) -> None:
    while not server.started:
        time.sleep(0.02)
    sock = server.servers[0].sockets[0].getsockname()
    on_ready(sock[0], sock[1])


class ServerThread:
    """uvicorn in a daemon thread on 127.0.0.1 (port 0 by default): `with ServerThread(app)`."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.server = _uvicorn_server(app, host, port)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="tandem-http")

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise TandemError("the HTTP server did not start")
            time.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.app.state.engine.shutdown()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
