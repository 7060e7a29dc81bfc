"""`tandem rapid ...`: retrieval-augmented speculative decoding over a long context (RAPID).

`run` does it on one machine; `serve` (cloud: target + long context) and `device` (drafter +
retrieved context) split it over TCP; `tasks` writes the offline long-context task set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from tandem.errors import TandemError

app = typer.Typer(no_args_is_help=True)

MODE = typer.Option("exact", "--mode", help="exact: output ~ p_hat; paper: Eq. 10 residual.")
ETA = typer.Option(10.0, "--eta", help="Knowledge-transfer strength (paper: 5-20 self, 40-50 up).")
GAMMA = typer.Option(5, "--gamma", min=1, help="Draft tokens per round (paper: 10).")
TEMPERATURE = typer.Option(0.1, "--temperature", "-t", min=0.0, help="0 = greedy.")
MAX_NEW = typer.Option(64, "--max-new-tokens", "-n", min=1)
SEED = typer.Option(0, "--seed")
CHUNK = typer.Option(512, "--chunk-tokens", min=1, help="Chunk size of the long context.")
MIN_TOKENS = typer.Option(1024, "--min-tokens", min=1, help="Floor of the retrieval budget.")
COMPRESSION = typer.Option(24.0, "--compression", min=1.0, help="Budget >= |C| / this.")
THRESHOLD = typer.Option(0.3, "--threshold", help="Cosine similarity threshold.")
EMBEDDER = typer.Option("all-minilm-l6-v2", "--embedder", help="Embedder name or folder.")
SECRET = typer.Option(
    None, "--secret", help="Shared secret (default: $TANDEM_SECRET; none on loopback only)."
)


def _configs(
    mode, eta, gamma, temperature, max_new_tokens, seed, chunk, min_tokens, compression, threshold
):
    from tandem.protocols.rapid.config import RapidConfig, RetrievalConfig

    config = RapidConfig(
        mode=mode, eta=eta, gamma=gamma, temperature=temperature, max_new_tokens=max_new_tokens,
        seed=seed,
    )  # fmt: skip
    retrieval = RetrievalConfig(
        chunk_tokens=chunk, min_tokens=min_tokens, compression=compression, threshold=threshold
    )
    return config, retrieval


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TandemError(f"cannot read {path}: {exc}") from exc


def _secret(secret: str | None) -> bytes:
    return (secret or os.environ.get("TANDEM_SECRET", "")).encode()


def _print_rows(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for row in rows:
        console.rule(row["method"])
        console.print(row["text"], markup=False, highlight=False)
    table = Table("method", "tokens", "prefill s", "decode s", "tokens/s", "acceptance")
    for row in rows:
        acc = row.get("acceptance")
        table.add_row(
            row["method"], str(row["tokens"]), f"{row['prefill_s']:.2f}", f"{row['decode_s']:.2f}",
            f"{row['tokens_per_s']:.2f}", "-" if acc is None else f"{acc:.2f}",
        )  # fmt: skip
    console.print(table)
    first = rows[0]
    console.print(
        f"context {first.get('context_tokens', '?')} tokens, drafter reads "
        f"{first.get('retrieved_tokens', '?')} retrieved tokens"
    )


@app.command("run")
def run(
    context: Path = typer.Option(..., "--context", "-c", help="Long-context text file."),
    question: str = typer.Option(..., "--question", "-q"),
    target: str = typer.Option("qwen2.5-coder-0.5b", "--target", help="Long-context model."),
    drafter: str = typer.Option(
        "", "--drafter", help="RAG drafter model (default: the target: self-speculation)."
    ),
    compare: bool = typer.Option(False, "--compare", help="Also run SD and LC (same prefills)."),
    mode: str = MODE,
    eta: float = ETA,
    gamma: int = GAMMA,
    temperature: float = TEMPERATURE,
    max_new_tokens: int = MAX_NEW,
    seed: int = SEED,
    chunk_tokens: int = CHUNK,
    min_tokens: int = MIN_TOKENS,
    compression: float = COMPRESSION,
    threshold: float = THRESHOLD,
    embedder: str = EMBEDDER,
) -> None:
    """Answer a question about a long text with RAPID on this machine."""
    from tandem.models.registry import load_model
    from tandem.serve.rapid import run_local

    config, retrieval = _configs(
        mode, eta, gamma, temperature, max_new_tokens, seed, chunk_tokens, min_tokens,
        compression, threshold,
    )  # fmt: skip
    target_lm = load_model(target)
    drafter_lm = load_model(drafter) if drafter and drafter != target else target_lm
    rows = run_local(
        target_lm, drafter_lm, _read(context), question, config=config, retrieval=retrieval,
        embedder_name=embedder, compare=compare,
    )  # fmt: skip
    _print_rows(rows)


@app.command("serve")
def serve(
    context: Path = typer.Option(..., "--context", "-c", help="Long-context text file."),
    target: str = typer.Option("qwen2.5-coder-0.5b", "--target"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(7400, "--port"),
    listen: str = typer.Option(None, "--listen", help="HOST:PORT, instead of --host/--port."),
    secret: str = SECRET,
) -> None:
    """Cloud side: serve RAPID verification over a long context (until interrupted)."""
    from tandem.models.registry import load_model
    from tandem.serve.rapid import serve_cloud
    from tandem.testbed.proxy import parse_hostport

    if listen:
        host, port = parse_hostport(listen)
    text = _read(context)  # a bad path fails before the model loads
    serve_cloud(load_model(target), text, host=host, port=port, secret=_secret(secret))


@app.command("device")
def device(
    question: str = typer.Option(..., "--question", "-q"),
    retrieve_from: Path = typer.Option(
        ..., "--retrieve-from", help="The device's copy of the text to retrieve C^S from."
    ),
    connect: str = typer.Option("127.0.0.1:7400", "--connect", help="host:port of the cloud."),
    drafter: str = typer.Option("qwen2.5-coder-0.5b", "--drafter"),
    codec: str = typer.Option("top-k", "--codec", help="Draft-law codec on the uplink."),
    codec_k: int = typer.Option(64, "--codec-k", help="k of the top-k codec."),
    secret: str = SECRET,
    mode: str = MODE,
    eta: float = ETA,
    gamma: int = GAMMA,
    temperature: float = TEMPERATURE,
    max_new_tokens: int = MAX_NEW,
    seed: int = SEED,
    chunk_tokens: int = CHUNK,
    min_tokens: int = MIN_TOKENS,
    compression: float = COMPRESSION,
    threshold: float = THRESHOLD,
    embedder: str = EMBEDDER,
    fallback: bool = typer.Option(
        True,
        "--fallback/--no-fallback",
        help="If the cloud is unreachable or lost, the drafter finishes the answer alone.",
    ),  # fmt: skip
) -> None:
    """Device side: retrieve C^S locally and draft for the cloud's long-context target."""
    from tandem.models.registry import load_model
    from tandem.serve.rapid import run_device
    from tandem.testbed.proxy import parse_hostport

    host, port = parse_hostport(connect)
    config, retrieval = _configs(
        mode, eta, gamma, temperature, max_new_tokens, seed, chunk_tokens, min_tokens,
        compression, threshold,
    )  # fmt: skip
    row = run_device(
        load_model(drafter), _read(retrieve_from), question, host=host, port=port,
        secret=_secret(secret), config=config, retrieval=retrieval, embedder_name=embedder,
        codec=(codec, {"k": codec_k} if codec == "top-k" else {}), fallback=fallback,
    )  # fmt: skip
    _print_rows([row])
    if "degraded_reason" in row:
        typer.echo(f"fell back: {row['degraded_reason']}; the drafter finished the answer alone",
                   err=True)  # fmt: skip
    typer.echo(f"uplink {row['uplink_bytes']} B, downlink {row['downlink_bytes']} B")


@app.command("tasks")
def tasks(
    out: Path = typer.Option(Path("rapid_tasks.jsonl"), "--out", help="JSONL file to write."),
    context_tokens: int = typer.Option(2048, "--context-tokens", min=256),
    num: int = typer.Option(4, "--num", min=1, help="Tasks per kind."),
    model: str = typer.Option("qwen2.5-coder-0.5b", "--model", help="Whose tokenizer counts."),
) -> None:
    """Write the offline long-context task set (stdlib docs) as JSONL."""
    from dataclasses import asdict

    from tandem.models.registry import load_model
    from tandem.protocols.rapid.tasks import build_tasks

    built = build_tasks(load_model(model).tokenizer, context_tokens=context_tokens, num_tasks=num)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(asdict(t)) + "\n" for t in built), encoding="utf-8")
    typer.echo(f"wrote {len(built)} tasks to {out}")
