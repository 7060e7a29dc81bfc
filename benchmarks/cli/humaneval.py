"""`tandem bench humaneval`: generation modes side by side on HumanEval problems."""

from __future__ import annotations

from pathlib import Path

import typer

from benchmarks import RESULTS
from tandem.testbed.options import CLOUD_CPUS, DEVICE_CPUS, role_cpus


def humaneval(
    mode: list[str] = typer.Option(
        ["ar", "spec-sync", "spec-async", "local"],
        "--mode",
        help="Modes side by side (repeat): ar, local, spec-sync, spec-async, spec-sync-dense, "
        "sqs, c-sqs, sqs-async, spec-eager, spec-eager-branch (eager with branches), "
        "spec-adaptive (eager-branch + the adaptive controller); "
        "each exact mode but spec-adaptive also as <mode>-token (the cloud verifies one token "
        "per pass: bit for bit ar's output).",
    ),
    problems: str = typer.Option(
        "0-15", "--problems", help="Problem indices: all, 0-15 (the first 16), 0,3,10-12."
    ),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n", min=1),
    temperature: float = typer.Option(0.0, "--temperature", "-t", min=0.0, help="0 = greedy."),
    seed: int = typer.Option(0, "--seed"),
    draft_len: int = typer.Option(4, "--draft-len", min=1),
    rtt: float = typer.Option(0.0, "--rtt", min=0.0, help="Emulated round-trip time (ms)."),
    rate: float = typer.Option(100.0, "--rate", help="Link rate (Mbit/s), each way."),
    device_model: str = typer.Option("qwen2.5-coder-0.5b", "--device-model"),
    cloud_model: str = typer.Option("qwen2.5-coder-1.5b", "--cloud-model"),
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds per test program."),
    margins: bool = typer.Option(
        True, "--margins/--no-margins", help="Load the target to measure divergences' margins."
    ),
    device_cpus: str = DEVICE_CPUS,
    cloud_cpus: str = CLOUD_CPUS,
    name: str = typer.Option("humaneval", "--name", help="Result file name (no extension)."),
    out: Path = typer.Option(RESULTS, "--out", help="Folder for JSON and PNG."),
) -> None:
    """HumanEval pass@1, tok/s, acceptance, bytes/token and exactness vs cloud AR, per mode."""
    from benchmarks.humaneval import run

    run(
        out=out, name=name, problems=problems, modes=tuple(mode), max_new_tokens=max_new_tokens,
        temperature=temperature, seed=seed, draft_len=draft_len, rtt_ms=rtt, rate_mbit=rate,
        device_model=device_model, cloud_model=cloud_model, timeout_s=timeout, margins=margins,
        cores=role_cpus(device_cpus, cloud_cpus),
    )  # fmt: skip


def humaneval_sweep(
    files: list[Path] = typer.Argument(..., help="`tandem bench humaneval` result files."),
    name: str = typer.Option("humaneval_sweep", "--name", help="Result file name."),
    out: Path = typer.Option(RESULTS, "--out", help="Folder for JSON and PNG."),
    margins: bool = typer.Option(
        False,
        "--margins",
        help="Load the cloud model: the target's logit margins at every "
        "departure from cloud AR that a run did not measure (runs with --no-margins).",
    ),
) -> None:
    """One table over humaneval runs at several RTTs: ratios, adaptive vs the best fixed mode,
    the extended Eq. 9 prediction vs the measured decode rate, departures from cloud AR."""
    from benchmarks.humaneval_sweep import run

    run(files, out=out, name=name, margins=margins)


def humaneval_traces(
    problems: str = typer.Option("all", "--problems", help="Problem indices: all, 0-15, 0,3."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n", min=1),
    device_model: str = typer.Option("qwen2.5-coder-0.5b", "--device-model"),
    cloud_model: str = typer.Option("qwen2.5-coder-1.5b", "--cloud-model"),
    name: str = typer.Option("humaneval_traces", "--name", help="Result file name."),
    out: Path = typer.Option(RESULTS, "--out", help="Folder for JSON and PNG."),
) -> None:
    """The real pair's teacher-forced acceptance per problem (agreement, the target token's
    rank in the draft's law, the draft's confidence): what `spec-paper --traces` replays."""
    from benchmarks.humaneval_traces import run

    run(problems=problems, max_new_tokens=max_new_tokens, device_model=device_model,
        cloud_model=cloud_model, name=name, out=out)  # fmt: skip
