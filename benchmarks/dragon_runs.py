"""`tandem bench dragon runs`: many `tandem bench dragon latency` runs in one table.

Reads the result files (unchanged) and derives, per file and extra delay, one method's mean
per-token latency over CRCG/Device's in the same run (`ratio`, as the latency bench's own
headline computes it), with each run's load average; then, per network setup (`delayed`:
files made before the testbed had the switch delayed both directions) and delay, the spread
over the runs: count, min, median, max, and how many meet issue 14's targets (<= 1.10x at
+0 ms, <= 1.20x at +300 ms). At +0 ms no direction carries a delay, so every run counts there
whatever its `delayed` (shown as "-"). This is where the docs' "N runs, median M" figures come from.

At a delay, each row also splits the method's time into *stalls* (gaps between two output
tokens longer than `STALL_FRACTION` of the delay) and the *pace* outside them, and counts the
stalls the two-chain model (`dragon_timeline.cycles`) puts at the rejections the run recorded: the share of
the ratio that no per-token saving can remove (docs/dragon.md "Stalls, counted").
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.dragon_latency import TARGETS
from benchmarks.dragon_timeline import stalls
from benchmarks.report import new_figure, save_json, save_png
from tandem.errors import TandemError
from tandem.testbed.netns import JITTER

BASELINE = "crcg-device"
METHOD = "dragon-side-static-mirror"  # the benchmarked form (one row per side, mirrored)


def read(path: Path) -> dict[str, Any]:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TandemError(f"cannot read {path}: {exc}") from exc
    if not isinstance(payload, dict) or not isinstance(payload.get("table"), list):
        raise TandemError(f"{path} is not a `tandem bench dragon latency` result (no table)")
    return payload


def ratios(payload: dict[str, Any], method: str = METHOD) -> list[dict[str, Any]]:
    """Per extra delay at which the run has both `method` and CRCG/Device: their mean
    per-token latencies (ms), the ratio and the mean 1-minute load average at that delay."""
    table: dict[float, dict[str, float]] = {}
    for row in payload["table"]:
        table.setdefault(float(row["delay_ms"]), {})[row["method"]] = row["per_token_s"]
    loads: dict[float, list[float]] = {}
    for run in payload.get("runs", []):
        if run.get("load_1min") is not None:
            loads.setdefault(float(run["delay_ms"]), []).append(float(run["load_1min"]))
    rows = []
    for delay, methods in sorted(table.items()):
        if BASELINE not in methods or method not in methods:
            continue
        split = stalls(payload.get("runs", []), method, delay, baseline_s=methods[BASELINE])
        rows.append(
            {
                "delay_ms": delay,
                "crcg_device_ms": 1e3 * methods[BASELINE],
                "method_ms": 1e3 * methods[method],
                "ratio": methods[method] / methods[BASELINE],
                "load_1min": statistics.mean(loads[delay]) if loads.get(delay) else None,
                "stalls": split,
            }
        )
    return rows


def _network(setup: dict[str, Any]) -> str:
    """The network setting a run is grouped by: its delayed directions ("both" in files made
    before the switch), and its jitter where it is not the paper's delay / 5 (a control)."""
    delayed = setup.get("delayed") or "both"
    jitter = setup.get("jitter_fraction", JITTER)  # recorded since the switch; before: 1/5
    return delayed if jitter == JITTER else f"{delayed}, jitter {jitter:g}"


def describe(path: Path, payload: dict[str, Any], method: str = METHOD) -> dict[str, Any]:
    setup, environment = payload.get("setup", {}), payload.get("environment", {})
    return {
        "file": path.name,
        "time": environment.get("time"),
        "code": environment.get("code"),  # recorded since 2026-11-27
        "delayed": _network(setup),
        "questions": len(setup.get("questions", [])) or None,
        "new_tokens": setup.get("max_new_tokens"),
        "rows": ratios(payload, method),
    }


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (delayed, delay): the spread of the ratio over the runs that have it."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for run in runs:
        for row in run["rows"]:
            groups.setdefault((_setting(run, row), row["delay_ms"]), []).append(row)
    out = []
    for (delayed, delay), rows in sorted(groups.items()):
        values = [row["ratio"] for row in rows]
        paced = [row["stalls"]["paced_ratio"] for row in rows if row.get("stalls")]
        target = TARGETS.get(delay)
        out.append(
            {
                "delayed": delayed,
                "delay_ms": delay,
                "runs": len(values),
                "min": min(values),
                "median": statistics.median(values),
                "max": max(values),
                "target": target,
                "met": None if target is None else sum(v <= target for v in values),
                "paced_median": statistics.median(paced) if paced else None,
            }
        )
    return out


def _setting(run: dict[str, Any], row: dict[str, Any]) -> str:
    """Which directions were delayed; "-" without a delay, where the setting changes nothing."""
    return run["delayed"] if row["delay_ms"] > 0 else "-"


def _label(group: dict[str, Any]) -> str:
    if group["delayed"] == "-":
        return f"+{group['delay_ms']:g} (no delay)"
    return f"{group['delayed']} +{group['delay_ms']:g}"


def plot(runs: list[dict[str, Any]], summary: list[dict[str, Any]], method: str, out, name):
    fig, axes = new_figure(size=(7.0, 4.0))
    ax = axes[0][0]
    labels = [_label(s) for s in summary]
    for i, group in enumerate(summary):
        rows = [
            row
            for run in runs
            for row in run["rows"]
            if row["delay_ms"] == group["delay_ms"] and _setting(run, row) == group["delayed"]
        ]
        values = [row["ratio"] for row in rows]
        (dots,) = ax.plot([i] * len(values), values, "o", alpha=0.6)
        paced = [row["stalls"]["paced_ratio"] for row in rows if row.get("stalls")]
        if paced:  # the same runs outside their stalls, hollow, beside them
            ax.plot([i + 0.15] * len(paced), paced, "o", mfc="none", color=dots.get_color())
        ax.plot([i - 0.25, i + 0.25], [group["median"]] * 2, "k-")
        if group["target"] is not None:
            ax.plot([i - 0.35, i + 0.35], [group["target"]] * 2, "r--")
    ax.set_xticks(range(len(summary)), labels, fontsize=8)
    ax.set_xlabel("delayed directions, extra delay (ms)")
    ax.set_ylabel(f"{method} / CRCG/Device, per token")
    ax.set_title(
        "one dot a run (hollow, right: outside its stalls); black: median; "
        "red dashes: issue 14's target",
        fontsize=9,
    )
    return save_png(fig, out, name)


def run(files: list[Path], *, method: str = METHOD, out: Path, name: str) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    if not files:
        raise TandemError("give at least one `tandem bench dragon latency` result file")
    runs = [describe(path, read(path), method) for path in files]
    empty = [run["file"] for run in runs if not run["rows"]]
    if empty:
        raise TandemError(f"no {method} beside {BASELINE} in: {', '.join(empty)}")
    summary = summarize(runs)
    payload = {
        "derived_from": [str(path) for path in files],
        "method": method,
        "baseline": BASELINE,
        "targets": {f"+{d:g} ms": t for d, t in TARGETS.items()},
        "runs": runs,
        "summary": summary,
    }
    save_json(out, name, payload)
    plot(runs, summary, method, out, name)
    console = Console(width=max(Console().width, 110))
    grid = Table("file", "delayed", "delay ms", "CRCG/Device ms", "method ms", "ratio", "load",
                 "stalls (model, at them)", "stall ms a token", "pace outside stalls")  # fmt: skip
    for run in runs:
        for row in run["rows"]:
            load = "-" if row["load_1min"] is None else f"{row['load_1min']:.2f}"
            grid.add_row(
                run["file"], run["delayed"], f"{row['delay_ms']:g}", f"{row['crcg_device_ms']:.2f}",
                f"{row['method_ms']:.2f}", f"{row['ratio']:.3f}", load, *_stall_cells(row["stalls"]),
            )  # fmt: skip
    console.print(grid)
    for group in summary:
        met = "" if group["target"] is None else f", <= {group['target']:.2f}x in {group['met']}"
        paced = group["paced_median"]
        paced = "" if paced is None else f"; outside stalls median {paced:.3f}x"
        console.print(
            f"{_label(group)} ms: {group['runs']} runs, "
            f"{group['min']:.3f}-{group['max']:.3f}x, median {group['median']:.3f}x{met}{paced}"
        )
    return payload


def _stall_cells(split: dict[str, Any] | None) -> tuple[str, str, str]:
    if split is None:
        return "-", "-", "-"
    model = "-" if split["cycles"] is None else f"{split['cycles']}, {split['stalls_at_cycles']}"
    return (
        f"{split['stalls']} ({model})",
        f"{split['stall_ms_per_token']:.2f}",
        f"{split['paced_ms']:.2f} ms, {split['paced_ratio']:.3f}x",
    )
