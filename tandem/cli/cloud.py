"""`tandem cloud serve`: the cloud side; serves device sessions until interrupted."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("serve")
def serve(
    mode: list[str] = typer.Option(
        ["spec", "ar"], "--mode", help="Modes to serve (repeat): spec, ar, dragon."
    ),
    corpus: str = typer.Option(
        None, "--corpus", help="DRAGON: this side's corpus (folder, index, 'stdlib'); adds dragon."
    ),
    docs: int = typer.Option(2, "--docs", help="DRAGON: documents per side (latency profile)."),
    model: str = typer.Option(
        "qwen2.5-coder-1.5b", "--model", "-m", help="Target model name or local HF directory."
    ),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(7700, help="Port to listen on (0: any free port)."),
    secret: str = typer.Option(
        None, "--secret", envvar="TANDEM_SECRET", help="Shared secret for HMAC auth."
    ),
    delay: float = typer.Option(
        0.0, "--delay", help="Emulated one-way delay (ms) on the cloud -> device direction."
    ),
    threads: int = typer.Option(1, "--threads", min=1, help="torch intra-op threads."),
) -> None:
    """Serve speculative decoding (and the cloud-AR baseline) to devices over TCP."""
    import asyncio

    import torch

    from tandem.models.registry import load_model
    from tandem.serve.cloud import CloudResources, CloudServer, cloud_transport
    from tandem.transport import LinkConfig

    torch.set_num_threads(threads)
    if corpus and "dragon" not in mode:
        mode = [*mode, "dragon"]
    server_check = CloudServer(CloudResources(lm=None), modes=mode)  # bad --mode: fail fast
    del server_check
    lm = load_model(model)
    transport = cloud_transport(
        lm, secret=secret, link=LinkConfig(delay_ms=delay) if delay else None
    )
    resources = CloudResources(lm=lm)
    if corpus:
        from tandem.serve.dragon_session import load_side

        resources.extra["dragon"] = load_side(corpus=corpus, model=model, docs=docs, lm=lm)
    cloud = CloudServer(resources, modes=mode)

    async def main() -> None:
        server = await cloud.start(host, port, transport=transport)
        typer.echo(
            f"tandem cloud: {model} serving {', '.join(mode)} on {server.host}:{server.port}"
        )
        try:
            await server.serve_forever()
        finally:
            await server.close()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        typer.echo("tandem cloud: stopped")
