"""`tandem bench serve`: cloud throughput vs concurrent sessions, verification batching on/off
(benchmarks.serve_load). Registered in benchmarks/cli/__init__.py as `app.command("serve")(serve_load)`."""

from __future__ import annotations

from pathlib import Path

import typer

from benchmarks import RESULTS
from tandem.testbed.options import CLOUD_CPUS, DEVICE_CPUS, role_cpus


def serve_load(
    device_model: str = typer.Option("tiny-qwen2", "--device-model", help="Draft model."),
    cloud_model: str = typer.Option("tiny-qwen2-b", "--cloud-model", help="Target model."),
    sessions: list[int] = typer.Option(
        [1, 4, 16, 32], "--sessions", help="Concurrent sessions per point (repeat)."
    ),
    tokens: int = typer.Option(32, "--tokens", min=1, help="New tokens per session."),
    delay: float = typer.Option(5.0, "--delay", min=0.0, help="Emulated one-way delay (ms)."),
    batch_window_ms: float = typer.Option(2.0, "--batch-window-ms", min=0.0),
    pipeline: str = typer.Option("sync", "--pipeline", help="sync or async."),
    codec: str = typer.Option("dense", "--codec", help="Uplink codec (spec)."),
    device_cpus: str = DEVICE_CPUS,
    cloud_cpus: str = CLOUD_CPUS,
    repeats: int = typer.Option(3, "--repeats", min=1, help="Off/on alternations (medians)."),
    max_sessions: int = typer.Option(
        64, "--max-sessions", min=1, help="The cloud's admission limit (more are refused)."
    ),
    name: str = typer.Option("serve_load", "--name", help="Result file name (no suffix)."),
    out: Path = typer.Option(RESULTS, "--out", help="Folder for JSON and PNG."),
) -> None:
    """Throughput and latency of one cloud vs concurrent device sessions, batching on vs off."""
    from benchmarks.serve_load import run

    payload = run(
        device_model=device_model, cloud_model=cloud_model, sessions=sessions, tokens=tokens,
        delay_ms=delay, batch_window_ms=batch_window_ms, pipeline=pipeline, codec=codec,
        out=out, repeats=repeats, name=name, cpus=role_cpus(device_cpus, cloud_cpus),
        max_sessions=max_sessions,
    )  # fmt: skip
    for p in payload["points"]:
        typer.echo(
            f"{p['sessions']:>3} sessions  batching {'on ' if p['batching'] else 'off'}  "
            f"{p['total_tok_s']:7.1f} tok/s total  {p['per_session_tok_s']:6.2f} per session  "
            f"p50/p99 {p['latency_p50_s']:.2f}/{p['latency_p99_s']:.2f} s  "
            f"token p50/p99 {p['tpot_p50_ms']:.0f}/{p['tpot_p99_ms']:.0f} ms  "
            f"held {p['sessions_held']} refused {p['refused']}  "
            f"mean batch {p['mean_batch_size']:.1f}"
        )
    for c in payload["verify_capacity"]:
        typer.echo(
            f"cloud alone, {c['batch']:>3} verifications: separate {c['separate_tok_s']:8.1f} "
            f"tok/s, batched {c['batched_tok_s']:8.1f} tok/s ({c['speedup']:.2f}x)"
        )
