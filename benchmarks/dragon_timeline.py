"""The per-token timeline of the DRAGON runs of a benchmark, averaged per delay and side.

Words as in `tandem.protocols.dragon.profiler` (Timeline): *critical* = each inter-token gap
split into waiting for this side's own draft / for the peer / the rest (resolve); *work* =
busy time per phase (decode of the k rows, relevance, mixture, codec, wire, Algorithm 1,
scheduler, send, decoder idle, outbox wait), both in ms per output token after the first.
A run records the device's timeline and, since the bench sets `DragonConfig.timeline`, the
cloud's (`summary.peer_timeline`). `cpu`: the decoder thread's CPU time in the k-row decode
(per token) and the prefill, which the machine's other load hardly changes.
"""

from __future__ import annotations

import statistics

from tandem.protocols.dragon.profiler import CRITICAL, PHASES, STARTUP

SIDE_KEYS = {"device": "timeline", "cloud": "peer_timeline"}


def timeline_rows(runs: list[dict], delays, methods=("dragon",)) -> list[dict]:
    """One row per (method, delay, side) of the DRAGON `methods` that ran: mean ms/token of
    every critical part and busy phase over that method's runs at that delay, and their
    shares of the mean gap."""
    rows = []
    for method, delay in ((m, d) for m in methods for d in delays):
        chosen = [r for r in runs if r["method"] == method and r["delay_ms"] == delay]
        for side, key in SIDE_KEYS.items():
            found = [r["summary"].get(key) for r in chosen]
            found = [t for t in found if t and t.get("tokens", 0) > 1]
            if not found:
                continue
            gap = statistics.fmean(t["mean_gap_ms"] for t in found)
            critical = {
                p: statistics.fmean(t["critical_ms_per_token"][p] for t in found) for p in CRITICAL
            }
            work = {p: statistics.fmean(t["work_ms_per_token"][p] for t in found) for p in PHASES}
            cpu = {
                "decode_ms_per_token": statistics.fmean(
                    t["cpu_ms_per_token"]["decode"] for t in found
                ),
                "prefill_ms": statistics.fmean(t["startup_cpu_ms"]["prefill"] for t in found),
            }
            process = [t["cpu_ms_per_token"].get("process") for t in found]
            if all(p is not None for p in process):  # files before the process clock lack it
                cpu["process_ms_per_token"] = statistics.fmean(process)
            rows.append(
                {
                    "method": method, "delay_ms": delay, "side": side, "runs": len(found),
                    "mean_gap_ms": gap,
                    "ttft_ms": statistics.fmean(t["ttft_ms"]["gap_ms"] for t in found),
                    "critical_ms_per_token": critical, "work_ms_per_token": work, "cpu": cpu,
                    "startup_ms": {
                        p: statistics.fmean(t["startup_ms"][p] for t in found) for p in STARTUP
                    },
                    "critical_share": {p: v / gap for p, v in critical.items()} if gap else {},
                    "work_share": {p: v / gap for p, v in work.items()} if gap else {},
                }
            )  # fmt: skip
    return rows


def print_timeline(console, rows: list[dict]) -> None:
    from rich.table import Table

    if not rows:
        return
    table = Table(title="DRAGON per-token timeline (ms/token after the first; share of the gap)")
    for col in ("method", "delay", "side", "gap", *CRITICAL, *PHASES):
        table.add_column(col, justify="right")
    for row in rows:
        parts = {**row["critical_ms_per_token"], **row["work_ms_per_token"]}
        shares = {**row["critical_share"], **row["work_share"]}
        cells = [f"{parts[p]:.1f} ({shares.get(p, 0):.0%})" for p in (*CRITICAL, *PHASES)]
        table.add_row(
            row["method"], f"+{row['delay_ms']:.0f}", row["side"],
            f"{row['mean_gap_ms']:.1f}", *cells,
        )  # fmt: skip
    console.print(table)
