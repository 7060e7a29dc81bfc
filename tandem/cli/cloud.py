"""`tandem cloud serve`: the cloud side; serves many device sessions until interrupted.

Settings come from the defaults, then `--config FILE` (its `[cloud]` section, see
tandem.serve.settings), then the flags given on the command line; the secret only from
`--secret` / `$TANDEM_SECRET`.
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


def cloud_settings(config: Path | None, flags: dict[str, object]):
    """The file's `[cloud]` section (if any) with the flags given explicitly put over it."""
    from tandem.serve.settings import CloudServeSettings, load_settings, merge_flags

    base = load_settings(config).cloud if config else CloudServeSettings()
    given = {k: v for k, v in flags.items() if v is not None and v != []}
    return merge_flags(base, given)


@app.command("serve")
def serve(
    config: Path = typer.Option(None, "--config", help="TOML/YAML file; flags override it."),
    mode: list[str] = typer.Option(
        None,
        "--mode",
        help="Modes to serve (repeat): spec, ar, dragon, private-spec, rapid [spec, ar].",
    ),
    corpus: str = typer.Option(
        None,
        "--corpus",
        help="This side's corpus (folder, index, 'stdlib'); adds dragon and private-spec.",
    ),
    long_context: str = typer.Option(
        None, "--long-context", help="RAPID: the text file the target reads in full; adds rapid."
    ),
    docs: int = typer.Option(None, "--docs", help="DRAGON: documents per side [2]."),
    model: str = typer.Option(
        None, "--model", "-m", help="Target model name or local HF directory [qwen2.5-coder-1.5b]."
    ),
    host: str = typer.Option(None, help="Address to listen on [127.0.0.1]."),
    port: int = typer.Option(None, help="Port to listen on (0: any free port) [7700]."),
    listen: str = typer.Option(None, "--listen", help="HOST:PORT, instead of --host/--port."),
    secret: str = typer.Option(
        None, "--secret", envvar="TANDEM_SECRET", help="Shared secret for HMAC auth."
    ),
    delay: float = typer.Option(
        None, "--delay", help="Emulated one-way delay (ms) on the cloud -> device direction [0]."
    ),
    threads: int = typer.Option(
        None, "--threads", help="Engine threads, llama.cpp and torch (at most its cores) [1]."
    ),
    max_sessions: int = typer.Option(None, "--max-sessions", help="Sessions open at once [64]."),
    max_context: int = typer.Option(
        None, "--max-context", help="Prompt + generation tokens per session [32768]."
    ),
    max_queued_tokens: int = typer.Option(
        None, "--max-queued-tokens", help="Verification tokens queued before refusing [4096]."
    ),
    batch_window_ms: float = typer.Option(
        None, "--batch-window-ms", help="Wait for other sessions' verifications (ms) [2.0]."
    ),
    metrics_port: int = typer.Option(
        None, "--metrics-port", help="Serve GET /metrics on 127.0.0.1:PORT [off]."
    ),
    log_format: str = typer.Option(None, "--log-format", help="Session logs: text or json."),
) -> None:
    """Serve every collaboration mode to devices over TCP: speculative decoding and cloud AR;
    DRAGON and private-spec with --corpus; RAPID with --long-context."""
    flags = {k: v for k, v in locals().items() if k not in ("config", "secret", "listen")}
    if listen:
        from tandem.testbed.proxy import parse_hostport

        flags["host"], flags["port"] = parse_hostport(listen)
    import logging

    import torch

    from tandem.models.registry import load_model
    from tandem.serve.admission import CloudLimits
    from tandem.serve.cloud import CloudServer, cloud_resources
    from tandem.serve.cloud_metrics import session_logger
    from tandem.transport import LinkConfig, TransportConfig
    from tandem.transport import loop as event_loop

    s = cloud_settings(config, flags)
    modes = list(s.mode)
    if s.corpus:  # a corpus enables the retrieval modes
        modes += [m for m in ("dragon", "private-spec") if m not in modes]
    if s.long_context and "rapid" not in modes:
        modes.append("rapid")
    long_text = _read_long_context(s.long_context) if s.long_context else None
    CloudServer(cloud_resources(None, batching=False), modes=modes)  # bad --mode: fail fast
    if s.log_format == "text":  # tandem's own records; other libraries' warnings only (faiss's
        # loader logs each SIMD build it tries, "Could not load library with AVX512 support ...
        # ModuleNotFoundError", at INFO: no error, but it read like one at the top of the log)
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("tandem").setLevel(logging.INFO)
    torch.set_num_threads(s.threads)
    lm = load_model(s.model, backend=s.backend)
    link = LinkConfig(delay_ms=s.delay) if s.delay else None
    transport = TransportConfig.for_model(lm, role="cloud", secret=secret, link=link)
    resources = cloud_resources(lm, batch_window_ms=s.batch_window_ms, max_sessions=s.max_sessions)
    if s.corpus:
        from tandem.protocols.dragon.setup import load_side

        resources.extra["dragon"] = load_side(corpus=s.corpus, model=s.model, docs=s.docs, lm=lm)
    if long_text is not None:
        resources.extra["long_context"] = long_text
    limits = CloudLimits(
        max_sessions=s.max_sessions,
        max_context=s.max_context,
        max_queued_tokens=s.max_queued_tokens,
    )
    cloud = CloudServer(
        resources, modes=modes, limits=limits, on_record=session_logger(s.log_format)
    )

    async def main() -> None:
        server = await cloud.start(s.host, s.port, transport=transport, metrics_port=s.metrics_port)
        typer.echo(
            f"tandem cloud: {s.model} serving {', '.join(modes)} on {server.host}:{server.port}"
        )
        if cloud.metrics_port is not None:
            typer.echo(f"tandem cloud: metrics on http://127.0.0.1:{cloud.metrics_port}/metrics")
        try:
            await server.serve_forever()
        finally:
            await server.close()
            await cloud.close()

    try:
        event_loop.run(main())
    except KeyboardInterrupt:
        typer.echo("tandem cloud: stopped")


def _read_long_context(path: str) -> str:
    from tandem.errors import TandemError

    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TandemError(f"cannot read the long context {path}: {exc}") from None
