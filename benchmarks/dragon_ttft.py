"""`tandem bench dragon ttft`: DRAGON paper Fig. 7, time to first token vs extra latency.

Same testbed, corpora, questions and delays as `benchmarks.dragon_latency` (two processes
in the project's namespaces, each on its own cores with one engine thread per core, same model
both sides). Methods: DRCG/Text
(the cloud's document texts cross the network, the device prefills everything), DRCG/KV (the
KV cache of the cloud's documents crosses the network), DRAGON, CRCG/Device and CRCG/Cloud.
TTFT counts from the device's first action (retrieval, or the start message) to the first
token it knows, so it includes retrieval, document transfer, prefill and the first decode.
Runs generate 2 tokens (only the first is timed); a warm-up run per method is discarded, so
the document KV stores are warm (each side reuses its documents' precomputed KV, as DRAGON
does; a context-aggregation side reuses the KV of its own leading block of documents).
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import RESULTS
from benchmarks.dragon_latency import ISOLATION, LABELS, QUESTIONS, SHARED, mean_of, measure
from benchmarks.report import Machines, new_figure, save_json, save_png

METHODS = ("drcg-text", "drcg-kv", "dragon", "crcg-device", "crcg-cloud")


def run(
    *,
    out: Path = RESULTS,
    quick: bool = False,
    model: str = "qwen2.5-coder-0.5b",
    delays: tuple[float, ...] | None = None,
    questions: int | None = None,
    public: str = "stdlib",
    private: str | None = None,
    methods: tuple[str, ...] = METHODS,
    net_name: str = "tandem-dbench",
    cpus: dict[str, list[int]] | None = None,
    delayed: str = "both",
) -> dict:
    """Fig. 7: run, save dragon_ttft.json / .png, print a table. `cpus`: each side's cores
    (default `tandem.testbed.cpus.role_cpus()`); `delayed`: which directions carry the
    delay (`NetConfig.delayed`)."""
    from tandem.testbed.cpus import role_cpus

    console = Console()
    delays = delays or ((0.0, 100.0) if quick else (0.0, 100.0, 200.0, 300.0))
    chosen = QUESTIONS[: questions or (1 if quick else len(QUESTIONS))]
    started = time.perf_counter()
    machines = Machines(cpus=cpus or role_cpus(), isolation=ISOLATION, shared=SHARED)
    runs, network, _ = measure(
        model=model, public=public, private=private, net_name=net_name, methods=methods,
        delays=delays, questions=chosen, tokens=2, console=console, machines=machines,
        delayed=delayed,
    )  # fmt: skip
    rows = []
    for delay in delays:
        for method in methods:
            rows.append(
                {
                    "method": method, "delay_ms": delay,
                    "ttft_s": mean_of(runs, method, delay, "ttft_s"),
                    "transfer_bytes": mean_of(runs, method, delay, "transfer_bytes") or 0.0,
                    "transfer_s": mean_of(runs, method, delay, "transfer_s") or 0.0,
                }
            )  # fmt: skip
    headline = _targets(rows)
    payload = {
        "setup": {
            "model": model, "network": network, "delays_ms": list(delays),
            "jitter": "delay / 5, uniform, each delayed direction", "delayed": delayed,
            "questions": list(chosen),
            "docs_per_side": 2, "quick": quick,
            "ttft": "device's first action -> first token known at the device",
            "wall_s": time.perf_counter() - started,
        },
        "headline": headline,
        "table": rows,
        "runs": runs,
    }  # fmt: skip
    save_json(out, "dragon_ttft", payload, machines=machines)
    _print(console, rows, methods, delays)
    for line in headline:
        console.print(line)
    _plot(out, rows, methods)
    return payload


def _targets(rows: list[dict]) -> list[str]:
    lines = []
    for delay in sorted({r["delay_ms"] for r in rows}):
        at = {r["method"]: r for r in rows if r["delay_ms"] == delay}
        if "dragon" in at and "crcg-device" in at:
            ratio = at["dragon"]["ttft_s"] / at["crcg-device"]["ttft_s"]
            verdict = "met" if ratio <= 1.05 else "missed"
            parts = [
                f"+{delay:.0f} ms: DRAGON TTFT {ratio:.3f}x CRCG/Device (target <= 1.05x: {verdict})"
            ]
            for other in ("drcg-text", "drcg-kv"):
                if other in at:
                    parts.append(
                        f"{LABELS[other]} {at[other]['ttft_s'] / at['dragon']['ttft_s']:.1f}x DRAGON"
                    )
            lines.append("; ".join(parts))
    kv = [r["transfer_bytes"] for r in rows if r["method"] == "drcg-kv" and r["transfer_bytes"]]
    if kv:
        lines.append(f"DRCG/KV moves {max(kv) / 2**20:.1f} MiB of KV per question (2 documents)")
    return lines


def _print(console, rows, methods, delays) -> None:
    table = Table(title="DRAGON Fig. 7: time to first token (ms) vs extra one-way delay")
    table.add_column("method")
    for delay in delays:
        table.add_column(f"+{delay:.0f} ms", justify="right")
    table.add_column("bytes moved", justify="right")
    by = {(r["method"], r["delay_ms"]): r for r in rows}
    for method in methods:
        cells = [f"{1e3 * by[(method, d)]['ttft_s']:.0f}" for d in delays]
        moved = by[(method, delays[-1])]["transfer_bytes"] or 0
        table.add_row(LABELS[method], *cells, f"{moved:,.0f}")
    console.print(table)


def _plot(out: Path, rows, methods) -> None:
    fig, axes = new_figure()
    ax = axes[0][0]
    for method in methods:
        pts = [(r["delay_ms"], r["ttft_s"]) for r in rows if r["method"] == method and r["ttft_s"]]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=LABELS[method])
    ax.set(
        title="Time to first token (Fig. 7)",
        xlabel="extra network latency (ms, one-way)",
        ylabel="s",
    )
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    save_png(fig, out, "dragon_ttft")
