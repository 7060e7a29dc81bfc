"""`tandem bench spec-paper`: every exact method on PicoSpec's hardware, EMULATED, driven by
the acceptance traces recorded on HumanEval (benchmarks/spec_paper.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from benchmarks import RESULTS


def spec_paper(
    rtt: list[float] = typer.Option([100, 200], "--rtt", help="Round-trip times (ms)."),
    sweep: list[float] = typer.Option(
        [0.7, 0.75, 0.8], "--sweep", help="Agreement of the random traces run beside HumanEval's."
    ),
    problems: int = typer.Option(
        None, "--problems", min=1, help="Recorded HumanEval traces to use (default all)."
    ),
    sweep_problems: int = typer.Option(
        4, "--sweep-problems", min=1, help="Random traces per agreement of --sweep."
    ),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n", min=1),
    humaneval: Path = typer.Option(
        RESULTS / "humaneval.json", "--traces", help="tandem bench humaneval's JSON."
    ),
    band: str = typer.Option(
        None,
        "--band",
        help="Only the recorded problems whose agreement lies in LO-HI (e.g. 0.7-0.8): real "
        "traces at that agreement, beside the random ones.",
    ),
    ranked: bool = typer.Option(
        False,
        "--ranked",
        help="Traces with the real pair's ranks (needs --traces from humaneval-traces): where "
        "the draft disagrees, the target's token keeps its real rank in the draft's order, so "
        "branches can hold it; the sweep's traces ('ranked-P') resample the file's positions.",
    ),
    method: list[str] = typer.Option(
        None,
        "--method",
        help="Methods to run (repeat; default all): cloud-ar, stop-and-wait, picospec, eager, "
        "eager-branch, adaptive.",
    ),
    name: str = typer.Option("spec_paper", "--name", help="Result file name (no extension)."),
    out: Path = typer.Option(RESULTS, "--out", help="Folder for JSON and PNG."),
) -> None:
    """Cloud AR, stop-and-wait, PicoSpec, eager and the adaptive controller side by side."""
    from benchmarks.spec_paper import METHODS, parse_band, run
    from tandem.errors import TandemError

    unknown = sorted(set(method or ()) - set(METHODS))
    if unknown:
        raise TandemError(f"--method {', '.join(unknown)}: choose from {', '.join(METHODS)}")
    run(
        ranked=ranked,
        methods=tuple(m for m in METHODS if m in method) if method else METHODS,
        out=out,
        band=parse_band(band),
        humaneval=humaneval,
        rtts=tuple(rtt),
        sweep=tuple(sweep),
        problems=problems,
        sweep_problems=sweep_problems,
        max_new_tokens=max_new_tokens,
        name=name,
    )
