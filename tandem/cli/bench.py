"""`tandem bench ...`: each command runs one experiment from `tandem.bench` and saves JSON + PNG."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)

OUT = typer.Option(Path("bench/results"), "--out", help="Folder for the JSON and PNG results.")


@app.command("decode")
def decode(
    models: list[str] = typer.Option(
        ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"], "--model", help="Model name(s) or paths."
    ),
    contexts: list[int] = typer.Option(
        [32, 128, 256, 512, 1024], "--context", help="Context lengths (tokens) to profile."
    ),
    decode_tokens: int = typer.Option(8, help="Decode steps timed per context length."),
    repeats: int = typer.Option(2, help="Timed repeats per point (after one warm-up)."),
    out: Path = OUT,
) -> None:
    """Prefill and per-token decode latency vs context length (the profiler's input)."""
    from tandem.bench.decode import run

    run(models=models, contexts=contexts, decode_tokens=decode_tokens, repeats=repeats, out=out)


@app.command("codecs")
def codecs(out: Path = OUT) -> None:
    """Bytes per token, coding time and TV error of each distribution codec on real Qwen outputs."""
    from tandem.bench.codecs import run

    run(out=out)


@app.command("link")
def link(out: Path = OUT) -> None:
    """Round-trip latency vs a raw-socket floor, and delivered vs configured delay and rate."""
    from tandem.bench.link import run

    run(out=out)
