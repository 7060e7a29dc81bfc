"""`tandem index build|add|query|info`: build and search retrieval indexes (tandem.retrieval)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True)
err = Console(stderr=True)


def _warn_skip(path: str, reason: str) -> None:
    """One line per skipped file (never wrapped; a path is printed as it is, not as markup)."""
    from rich.markup import escape

    err.print(f"[yellow]skipped[/yellow] {escape(path)}: {reason}", highlight=False, soft_wrap=True)


def _print_report(report, verb: str) -> None:
    m = report.manifest
    print(
        f"{verb} {report.path}: {m.documents} documents, {m.chunks} chunks, {m.tokens} tokens; "
        f"embedded {report.embedded}, reused {report.reused}, skipped {len(report.skipped)} files; "
        f"{report.seconds:.1f} s, {report.bytes / 1e6:.2f} MB ({m.index_kind}, {m.embedder})"
    )


@app.command("build")
def build(
    sources: list[str] = typer.Argument(
        ..., help="Folders, .jsonl files ({id,text,meta}) or 'stdlib'."
    ),
    out: Path = typer.Option(..., "--out", help="Index folder to write (replaced atomically)."),
    chunk_tokens: int = typer.Option(64, help="Tokens per chunk (DRAGON 64, RAPID 512)."),
    overlap: int = typer.Option(0, help="Tokens repeated between consecutive chunks."),
    tokenizer: str = typer.Option("qwen2.5-coder-0.5b", help="Model whose tokenizer cuts chunks."),
    embedder: str = typer.Option(
        "all-minilm-l6-v2", help="all-minilm-l6-v2, hashing-<dim> or a folder."
    ),
    index: str = typer.Option("flat", "--index", help="flat (exact) or hnsw (approximate)."),
    replace: bool = typer.Option(
        False,
        "--replace",
        help="Overwrite an index at --out built with another embedder or tokenizer "
        "(refused without this flag).",
    ),
) -> None:
    """Read, chunk, embed and index SOURCES; unchanged chunks of an existing index are reused."""
    from tandem.retrieval.chunking import ChunkParams
    from tandem.retrieval.embedder import load_embedder
    from tandem.retrieval.index import build_index, load_tokenizer

    params = ChunkParams(chunk_tokens=chunk_tokens, overlap=overlap)
    report = build_index(
        sources,
        out,
        tokenizer=load_tokenizer(tokenizer),
        tokenizer_name=tokenizer,
        embedder=load_embedder(embedder),
        params=params,
        kind=index,
        progress=True,
        on_skip=_warn_skip,
        replace=replace,
    )
    _print_report(report, "built")


@app.command("add")
def add(
    path: Path = typer.Argument(..., help="An existing index folder."),
    sources: list[str] = typer.Argument(..., help="Folders, .jsonl files or 'stdlib' to add."),
) -> None:
    """Add documents to an index (same embedder and tokenizer); documents with a known id are replaced."""
    from tandem.retrieval.index import add_to_index

    _print_report(add_to_index(path, sources, progress=True, on_skip=_warn_skip), "updated")


@app.command("query")
def query(
    path: Path = typer.Argument(..., help="An index folder."),
    text: str = typer.Argument(..., help="The query."),
    k: int = typer.Option(5, "-k", help="How many chunks to return."),
    width: int = typer.Option(240, help="Characters of each chunk to print."),
) -> None:
    """Print the k chunks most similar to TEXT."""
    import time

    from tandem.retrieval.index import open_index

    retriever = open_index(path)
    began = time.perf_counter()
    hits = retriever.search(text, k)
    elapsed = time.perf_counter() - began
    table = Table("#", "score", "chars", "text", show_lines=True)
    table.columns[3].overflow = "fold"
    for rank, (chunk, score) in enumerate(hits, start=1):
        snippet = " ".join(chunk.text.split())
        snippet = snippet if len(snippet) <= width else snippet[: width - 1] + "…"
        table.add_row(
            str(rank),
            f"{score:.3f}",
            f"{chunk.start}-{chunk.end}",
            f"[bold]{chunk.doc_id}[/bold]\n{snippet}",
        )
    Console().print(table)
    err.print(
        f"{len(hits)} hits in {elapsed * 1e3:.1f} ms (embed + search) from {len(retriever)} chunks"
    )


@app.command("info")
def info(path: Path = typer.Argument(..., help="An index folder.")) -> None:
    """Print an index's manifest."""
    from dataclasses import asdict

    from tandem.retrieval.docstore import DocStore
    from tandem.retrieval.index import (
        DOCSTORE_FILE,
        NO_LEADS,
        folder_bytes,
        read_manifest,
        rebuild_hint,
    )

    manifest = read_manifest(path)
    for key, value in asdict(manifest).items():
        print(f"{key}: {value}")
    print(f"bytes: {folder_bytes(path)}")
    rebuild = rebuild_hint(path, manifest)
    store = DocStore(path / DOCSTORE_FILE, hint=rebuild)
    try:
        leads = "stored" if store.has_leads else f"not stored: {NO_LEADS}; {rebuild}"
        print(f"chunk leads: {leads}")
    finally:
        store.close()
