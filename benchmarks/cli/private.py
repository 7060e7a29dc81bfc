"""`tandem bench private-spec`: private-RAG speculative decoding vs DRAGON and one-sided RAG."""

from __future__ import annotations

from pathlib import Path

import typer

from benchmarks import RESULTS
from tandem.testbed.options import CLOUD_CPUS, DEVICE_CPUS, role_cpus


def private_spec(
    method: list[str] = typer.Option(
        ["device-rag", "cloud-rag", "picospec", "dragon", "private-spec"],
        "--method",
        help="Methods side by side (repeat): device-rag, cloud-rag, picospec, dragon, "
        "private-spec.",
    ),
    questions: str = typer.Option("all", "--questions", help="Question indices: all, 0-15, 0,3."),
    rtt: list[float] = typer.Option([0.0, 100.0, 200.0], "--rtt", help="RTTs in ms (repeat)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", min=1),
    docs: int = typer.Option(3, "--docs", min=0, help="Chunks retrieved per side."),
    eta: float = typer.Option(None, "--eta", min=0.0, help="private-spec's eta [the mode's]."),
    latency_questions: int = typer.Option(
        None, "--latency-questions", min=1, help="Questions run at the RTTs after the first [all]."
    ),
    device_cpus: str = DEVICE_CPUS,
    cloud_cpus: str = CLOUD_CPUS,
    name: str = typer.Option("private_spec", "--name", help="Result file name (no extension)."),
    out: Path = typer.Option(RESULTS, "--out", help="Folder for JSON and PNG."),
) -> None:
    """Accuracy on both-knowledge questions and per-token latency at each RTT, per method."""
    from benchmarks.private_spec import run

    run(
        out=out, name=name, questions=questions, methods=tuple(method), rtts=tuple(rtt),
        max_new_tokens=max_new_tokens, docs=docs, eta=eta, latency_questions=latency_questions,
        cores=role_cpus(device_cpus, cloud_cpus),
    )  # fmt: skip
