"""The per-token timeline of the DRAGON runs of a benchmark, averaged per delay and side.

Words as in `tandem.protocols.dragon.profiler` (Timeline): *critical* = each inter-token gap
split into waiting for this side's own draft / for the peer / the rest (resolve); *work* =
busy time per phase (decode of the k rows, relevance, mixture, codec, wire, Algorithm 1,
scheduler, send, decoder idle, outbox wait), both in ms per output token after the first.
A run records the device's timeline and, since the bench sets `DragonConfig.timeline`, the
cloud's (`summary.peer_timeline`). `cpu`: the decoder thread's CPU time in the k-row decode
(per token) and the prefill, which the machine's other load hardly changes.

*Stalls* (`stalls`): at an extra delay, the gaps between two output tokens longer than
`STALL_FRACTION` of it, apart from the pace outside them, and where the two-chain model
(`cycles`) puts them from the verdicts a run recorded (docs/dragon.md "Stalls, counted").
"""

from __future__ import annotations

import statistics
from itertools import pairwise
from typing import Any

from tandem.protocols.dragon.profiler import CRITICAL, PHASES, STARTUP

SIDE_KEYS = {"device": "timeline", "cloud": "peer_timeline"}
# a gap between two output tokens longer than this share of the extra delay is a stall: the
# jitter alone (delay / 5 each way, in order) moves a gap by at most 2 x delay / 5 plus a decode
STALL_FRACTION = 0.75


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
            window = [t["cpu_ms_per_token"].get("decode_in_window") for t in found]
            if all(p is not None for p in process + window):  # since 2026-12-02
                cpu["beyond_decode_ms_per_token"] = statistics.fmean(
                    p - w for p, w in zip(process, window, strict=True)
                )
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


def cycles(resolutions: list[dict[str, Any]]) -> list[int]:
    """The positions after which the two-chain model puts a stall, from one answer's
    resolutions (which side's draft each target accepted). Each side drafts on its own chain,
    ahead of the targets. While the chains are level, a rejection of the device's draft costs
    nothing at once (the device hears of it with the cloud's draft, when it needed that draft
    anyway) but restarts the device's chain a delayed trip behind the cloud's; the next
    rejection of the cloud's draft then costs that trip (the cloud hears of it from the device's
    late draft, and its new draft travels the delay down), and the chains are level again.
    Derived for a delay on the cloud -> device direction only (the paper's setup); with both
    directions delayed a rejected side also hears of it late, and a stall lasts a round trip."""
    behind, out = False, []
    for resolution in sorted(resolutions, key=lambda r: r["position"]):
        if not behind and not resolution["device"]:
            behind = True
        elif behind and not resolution["cloud"]:
            out.append(int(resolution["position"]))
            behind = False
    return out


def stalls(
    runs: list[dict], method: str, delay: float, baseline_s: float | None = None
) -> dict[str, Any] | None:
    """At an extra delay: `method`'s gaps between output tokens split into stalls and the pace
    outside them (ms; with `baseline_s`, CRCG/Device's seconds a token in the same run, the pace
    as a ratio to it), and the stalls the model of `cycles` predicts (None where the runs have
    no resolutions), with how many of the measured stalls fall at those positions. None at +0
    ms or where the runs kept no token times."""
    runs = [
        run
        for run in runs
        if run.get("method") == method
        and float(run.get("delay_ms", -1)) == delay
        and len(run.get("token_times") or ()) > 1
    ]
    if delay <= 0 or not runs:
        return None
    limit = STALL_FRACTION * delay / 1e3
    gaps = late = 0
    total_s = late_s = 0.0
    predicted: int | None = 0
    at_cycles = 0
    for run in runs:
        spans = [b - a for a, b in pairwise(run["token_times"])]
        stalled = {i for i, span in enumerate(spans) if span > limit}
        gaps, late = gaps + len(spans), late + len(stalled)
        total_s += sum(spans)
        late_s += sum(spans[i] for i in stalled)
        if predicted is not None and run.get("resolutions"):
            model = cycles(run["resolutions"])
            predicted += len(model)
            at_cycles += len(stalled.intersection(model))
        else:
            predicted = None
    paced_ms = 1e3 * (total_s - late_s) / max(gaps - late, 1)
    return {
        "gaps": gaps,
        "stalls": late,
        "stall_ms_per_token": 1e3 * late_s / gaps,
        "paced_ms": paced_ms,
        "paced_ratio": paced_ms / (1e3 * baseline_s) if baseline_s else None,
        "cycles": predicted,
        "stalls_at_cycles": at_cycles if predicted is not None else None,
    }


def stall_rows(runs: list[dict], rows: list[dict], methods, baseline: str) -> list[dict]:
    """`stalls` of each DRAGON method at each extra delay of a latency run (`rows`: its table of
    mean seconds a token per method and delay), the pace against `baseline`'s."""
    base = {r["delay_ms"]: r["per_token_s"] for r in rows if r["method"] == baseline}
    out = []
    for method in methods:
        for delay in sorted({r["delay_ms"] for r in rows}):
            split = stalls(runs, method, delay, baseline_s=base.get(delay))
            if split is not None:
                out.append({"method": method, "delay_ms": delay, **split})
    return out


def print_stalls(console, rows: list[dict], labels: dict[str, str]) -> None:
    """One line per row of `stall_rows`: the stalls, the model's count, the pace outside them."""
    for row in rows:
        model = paced = ""
        if row["cycles"] is not None:
            model = f" (the two-chain model: {row['cycles']}, {row['stalls_at_cycles']} where"
            model += " it puts them)"
        if row["paced_ratio"] is not None:
            paced = f", {row['paced_ratio']:.3f}x CRCG/Device"
        console.print(
            f"+{row['delay_ms']:.0f} ms: {labels.get(row['method'], row['method'])}: "
            f"{row['stalls']} stalls{model}, {row['stall_ms_per_token']:.2f} ms a token; "
            f"outside them {row['paced_ms']:.2f} ms a token{paced}"
        )
