"""`tandem demo`: DRAGON (or `--mode private-spec`) on loopback, a cloud and a device process,
streaming an answer.

The cloud retrieves from the Python standard library's docstrings, the device from a private
folder of notes; the answer needs both. Afterwards: per-token latency, acceptance rates,
aggregator switches and bytes on the wire. `--mode private-spec`: the device's 0.5B drafts
with the private notes, the cloud's 1.5B verifies with the public docs (docs/private-spec.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

# What `tandem demo` and `tandem device run --mode dragon` run unless told otherwise: one decode
# row per side holding its documents, weighted by their retrieval scores, the configuration
# measured at a median 1.08x device-only decoding per token over twelve runs (docs/dragon.md,
# "A leaner codec, and twelve runs of it"). The paper's form, one row per document re-weighted as the answer
# grows, is `--rows documents --scorer embedding` (the library's DragonConfig default), about
# 3x slower here: each extra row costs 1.5 decodes on this CPU.
ROWS_HELP = "documents (a row per document: the paper's form) or side (one row per side) [side]."
SCORER_HELP = "Relevance: static (the retrieval scores), bm25 or embedding (re-scored) [static]."
CLI_ROWS, CLI_SCORER = "side", "static"


def demo(
    mode: str = typer.Option(
        "dragon", "--mode", help="dragon (same model both sides) or private-spec (0.5B + 1.5B)."
    ),
    eta: float = typer.Option(
        None, "--eta", min=0.0, help="private-spec: pull of the private draft on the cloud [10]."
    ),
    question: str = typer.Option(
        None, "--question", "-q", help="What to ask (default: a question needing both corpora)."
    ),
    max_new_tokens: int = typer.Option(
        512, "--max-new-tokens", "-n", min=1, help="Cap; the answer ends at the end-of-turn token."
    ),
    strategy: str = typer.Option(
        "dragon", help="Aggregator placement: dragon, device, cloud or random."
    ),
    temperature: float = typer.Option(0.0, "--temperature", "-t", min=0.0, help="0 = greedy."),
    seed: int = typer.Option(0),
    docs: int = typer.Option(2, help="Documents each side retrieves from its own corpus."),
    rows: str = typer.Option(CLI_ROWS, "--rows", help=ROWS_HELP),
    scorer: str = typer.Option(CLI_SCORER, "--scorer", help=SCORER_HELP),
    model: str = typer.Option("qwen2.5-coder-0.5b", "--model", "-m", help="Model on both sides."),
    private: Path = typer.Option(
        None, help="Private corpus folder (default: examples/private-notes)."
    ),
    delay_ms: float = typer.Option(
        0.0, min=0.0, help="Emulated one-way delay each way (jitter 1/5 of it)."
    ),
    kill_cloud_after: int = typer.Option(
        0, min=0, help="Kill the cloud process after N tokens (fault demo)."
    ),
    threads: int = typer.Option(
        0, min=0, help="Threads per process (0: device and cloud each pinned to half the cores)."
    ),
    json_out: Path = typer.Option(None, "--json", help="Also write the measurements here."),
) -> None:
    """Run DRAGON with the real model on both sides of a loopback link and explain what happened."""
    from rich.console import Console

    from tandem.errors import TandemError

    if mode == "private-spec":
        return _private_spec_demo(question, eta, max_new_tokens, temperature, seed, docs,
                                  private, delay_ms, json_out)  # fmt: skip
    if mode != "dragon":
        raise TandemError(f"unknown demo mode {mode!r}; choose dragon or private-spec")

    from tandem.models.registry import load_tokenizer
    from tandem.protocols.decoding import text_stream
    from tandem.protocols.dragon import DragonConfig
    from tandem.serve.dragon_demo import DEFAULT_QUESTION, run_demo

    console = Console(stderr=True)
    config = DragonConfig(
        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
        docs_per_side=docs, strategy=strategy, rows=rows, scorer=scorer,
    )  # fmt: skip
    question = question or DEFAULT_QUESTION
    console.print(f"[bold]question[/bold]: {question}")
    console.print(f"[dim]{describe(config)}[/dim]")
    tokenizer = load_tokenizer(model)
    show = text_stream(tokenizer, eos=tokenizer.eos_token_id)
    report = run_demo(
        question=question,
        config=config,
        model=model,
        private_corpus=private,
        delay_ms=delay_ms,
        kill_cloud_after=kill_cloud_after,
        threads=threads,
        on_token=show,
        on_status=lambda text: console.print(f"[dim]{text}[/dim]"),
    )
    print()
    print_report(report, Console())
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report.summary(), indent=2) + "\n")


def describe(config) -> str:
    """One line: which form of DRAGON runs (rows, relevance weights)."""
    rows = "one row per side" if config.rows == "side" else "one row per document (the paper's)"
    weights = (
        "static relevance weights" if config.scorer == "static" else f"{config.scorer} re-scoring"
    )
    return f"DRAGON: {rows}, {weights}; --rows / --scorer choose another form"


def print_report(report, console) -> None:
    from rich.table import Table

    from tandem.protocols.dragon.knowledge import listed

    def ms(value) -> str:
        return "-" if value is None else f"{value * 1000:.0f} ms"

    gaps = sorted(report.per_token_s)
    table = Table(title="DRAGON session (device view)", show_header=False)
    table.add_row("new tokens", f"{len(report.tokens)} ({report.finish_reason})")
    table.add_row("time to first token", ms(report.ttft_s))
    if gaps:
        p50, p90 = gaps[len(gaps) // 2], gaps[min(len(gaps) - 1, int(0.9 * len(gaps)))]
        table.add_row(
            "per-token latency", f"mean {ms(report.mean_per_token_s)}, p50 {ms(p50)}, p90 {ms(p90)}"
        )
    table.add_row(
        "aggregations",
        f"{report.aggregations} (device {report.aggregated_by('device')}, cloud {report.aggregated_by('cloud')})",
    )
    for side in ("device", "cloud"):
        rate = report.acceptance_rate(side)
        table.add_row(
            f"{side} drafts accepted",
            "-" if rate is None else f"{report.accepted(side)} ({rate:.0%})",
        )
    switches = ", ".join(f"@{pos}->{side}" for pos, side in report.switches)
    table.add_row(
        "aggregator switches", f"{len(report.switches)}: {switches}" if switches else "none"
    )
    table.add_row(
        "rollbacks / cancelled decodes", f"{report.rollbacks} / {report.decodes_cancelled}"
    )
    table.add_row("bytes sent / received", f"{report.bytes_sent:,} / {report.bytes_received:,}")
    if report.tokens:
        per_token = (report.bytes_sent - report.probe_bytes) / len(report.tokens)
        table.add_row(
            "bytes sent per token",
            f"{per_token:.0f} (plus a {report.probe_bytes:,}-byte bandwidth probe)",
        )
    table.add_row("rtt (in-band)", ms(report.rtt_s))
    docs = listed([doc for doc, _ in report.docs], report.put_back) or "none"
    table.add_row("documents", f"device: {docs}; cloud: {report.peer_docs} (stay in the cloud)")
    table.add_row("prefill (device / cloud)", f"{ms(report.ready_s)} / {ms(report.peer_ready_s)}")
    if report.degraded:
        table.add_row(
            "[yellow]degraded[/yellow]",
            f"at token {report.degraded_at}: {report.degraded_reason}; finished with the device's own law",
        )
    console.print(table)


def run_dragon_device(
    *,
    corpus: str | None,
    model: str,
    host: str,
    port: int,
    secret: str | None,
    delay: float,
    question: str,
    strategy: str,
    docs: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    threads: int,
    json_out: Path | None,
    timeline: bool = False,
    rows: str = CLI_ROWS,
    scorer: str = CLI_SCORER,
) -> None:
    """`tandem device run --mode dragon`: the device side against a running DRAGON cloud;
    `timeline`: print where each side's time went per token (both sides' timelines are in
    the JSON either way when asked)."""
    from rich.console import Console

    from tandem.errors import TandemError
    from tandem.protocols.decoding import text_stream
    from tandem.protocols.dragon import DragonConfig
    from tandem.protocols.dragon.setup import load_side, set_threads
    from tandem.serve.dragon_session import emulated_link, run_device_session
    from tandem.transport import loop as event_loop

    if not corpus:
        raise TandemError("--mode dragon needs --corpus (the device's private corpus)")
    config = DragonConfig(
        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
        docs_per_side=docs, strategy=strategy, timeline=timeline, rows=rows, scorer=scorer,
    )  # fmt: skip
    set_threads(threads)
    setup = load_side(corpus=corpus, model=model, docs=docs)
    show = text_stream(setup.lm.tokenizer, eos=setup.lm.tokenizer.eos_token_id)

    report = event_loop.run(
        run_device_session(
            setup,
            host,
            port,
            question=question,
            config=config,
            on_token=show,
            link=emulated_link(delay),
            secret=secret.encode() if secret else None,
        )
    )
    print()
    console = Console(stderr=True)
    print_report(report, console)
    if timeline:
        from tandem.protocols.dragon.report import timeline_lines

        for title, summary in (("device", report.timeline), ("cloud", report.peer_timeline)):
            for line in timeline_lines(summary, f"{title} timeline"):
                console.print(line, highlight=False)
    if json_out is not None:
        json_out.write_text(json.dumps(report.summary(), indent=2) + "\n")


def _private_spec_demo(question, eta, max_new_tokens, temperature, seed, docs, private, delay_ms,
                       json_out) -> None:  # fmt: skip
    from rich.console import Console

    from tandem.models.registry import load_tokenizer
    from tandem.protocols.decoding import text_stream
    from tandem.protocols.private_spec import private_config, sources
    from tandem.protocols.spec.stats import summary_table
    from tandem.serve.dragon_demo import DEFAULT_QUESTION, default_private_corpus
    from tandem.serve.private_demo import run_private_demo

    console = Console(stderr=True)
    config = private_config(
        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
        **({} if eta is None else {"eta": eta}),
    )  # fmt: skip
    question = question or DEFAULT_QUESTION
    console.print(f"[bold]question[/bold]: {question}")
    tokenizer = load_tokenizer("qwen2.5-coder-0.5b")
    show = text_stream(tokenizer, eos=tokenizer.eos_token_id)

    report = run_private_demo(
        question=question, config=config, private_corpus=private or default_private_corpus(),
        docs=docs, delay_ms=delay_ms, on_token=show,
        on_status=lambda text: console.print(f"[dim]{text}[/dim]"),
    )  # fmt: skip
    print()
    Console().print(summary_table(report))
    Console().print(
        f"{sources(report)}\n"
        f"uplink payload: {report.payload_bits / max(1, report.drafts_sent):.0f} bits per draft"
    )
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
