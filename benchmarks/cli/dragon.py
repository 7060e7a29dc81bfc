"""`tandem bench dragon ...`: DRAGON's network figures (Fig. 6 + Theorem 6.2, Fig. 7), and a
table over many latency runs."""

from __future__ import annotations

from pathlib import Path

import typer

from benchmarks import RESULTS
from tandem.testbed.netns import JITTER
from tandem.testbed.options import CLOUD_CPUS, DEVICE_CPUS, role_cpus

app = typer.Typer(no_args_is_help=True)

OUT = typer.Option(RESULTS, "--out", help="Folder for the JSON and PNG results.")
QUICK = typer.Option(False, "--quick", help="Tiny scale: 2 delays, 1 question, 8 tokens.")
MODEL = typer.Option("qwen2.5-coder-0.5b", "--model", help="Model of both sides.")
DELAYS = typer.Option(None, "--delay", help="Extra one-way delays in ms (repeatable).")
DELAYED = typer.Option(
    "both",
    "--delayed",
    help="Directions the delay and jitter apply to: both (RTT gains 2 x delay), down (cloud "
    "-> device only, RTT gains 1 x delay: the paper's netem on the server's NIC, Sec. 7.3) or up.",
)
PUBLIC = typer.Option("stdlib", "--public", help="Cloud corpus: stdlib, a folder or an index.")
PRIVATE = typer.Option(None, "--private", help="Device corpus (default examples/private-notes).")


@app.command("latency")
def latency(
    quick: bool = QUICK,
    model: str = MODEL,
    delays: list[float] = DELAYS,
    tokens: int = typer.Option(0, "--tokens", help="New tokens per run (0: 64, quick 8)."),
    questions: int = typer.Option(0, "--questions", help="How many questions (0: all)."),
    methods: list[str] = typer.Option(
        None,
        "--method",
        help="Methods (repeat; default all but the dragon-side ones): crcg-device, crcg-cloud, "
        "drcg-text, drcg-kv, drdg-sw, drdg-tw, dragon, dragon-side (ours: one row per side), "
        "dragon-side-static (ours: one row per side, retrieval scores as weights), "
        "dragon-side-static-own / -peer (the same with branch drafts after its own second "
        "choice / after the peer's token), dragon-side-static-mirror (the same, both sides "
        "resolving), dragon-side-static-device / -cloud (the aggregator fixed on that side); "
        "crcg-device-contended (a testbed control: CRCG/Device while the cloud's "
        "cores decode nonstop).",
    ),  # fmt: skip
    public: str = PUBLIC,
    private: str = PRIVATE,
    delayed: str = DELAYED,
    jitter: float = typer.Option(
        JITTER,
        "--jitter",
        help="Jitter of each delayed direction as a fraction of its delay (the paper's 0.2; "
        "another value, such as 0, makes the run a testbed control).",
    ),
    cloud_model: str = typer.Option(
        "",
        "--cloud-model",
        help="The cloud's model (default: --model on both sides, as in the paper); it must "
        "share the device model's tokenizer.",
    ),
    busy_device: int = typer.Option(
        0,
        "--busy-device",
        min=0,
        help="Burners of the device's model decoding nonstop on the device's cores for the "
        "whole run (0: none): a busy device, about n + 1 times slower than the cloud, every "
        "method alike (a testbed variant, not the paper's machines).",
    ),
    device_cpus: str = DEVICE_CPUS,
    cloud_cpus: str = CLOUD_CPUS,
    out: Path = OUT,
) -> None:
    """Per-token latency vs network latency (Fig. 6) and Theorem 6.2, device and cloud as
    processes in the emulated network, each on its own cores."""
    from benchmarks.dragon_latency import EXTRA_METHODS, METHODS, run
    from tandem.errors import TandemError
    from tandem.testbed.netns import jitter_fraction

    known = METHODS + EXTRA_METHODS
    unknown = sorted(set(methods or ()) - set(known))
    if unknown:
        raise TandemError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    run(
        out=out, quick=quick, model=model, delays=tuple(delays or ()) or None, tokens=tokens or None,
        questions=questions or None, public=public, private=private,
        methods=tuple(m for m in known if m in methods) if methods else METHODS,
        cpus=role_cpus(device_cpus, cloud_cpus), delayed=_delayed(delayed),
        jitter=jitter_fraction(jitter), cloud_model=cloud_model or None, busy_device=busy_device,
    )  # fmt: skip


@app.command("ttft")
def ttft(
    quick: bool = QUICK,
    model: str = MODEL,
    delays: list[float] = DELAYS,
    questions: int = typer.Option(0, "--questions", help="How many questions (0: all)."),
    public: str = PUBLIC,
    private: str = PRIVATE,
    delayed: str = DELAYED,
    device_cpus: str = DEVICE_CPUS,
    cloud_cpus: str = CLOUD_CPUS,
    out: Path = OUT,
) -> None:
    """Time to first token vs network latency (Fig. 7), with the DRCG document transfers."""
    from benchmarks.dragon_ttft import run

    run(
        out=out, quick=quick, model=model, delays=tuple(delays or ()) or None,
        questions=questions or None, public=public, private=private,
        cpus=role_cpus(device_cpus, cloud_cpus), delayed=_delayed(delayed),
    )  # fmt: skip


@app.command("runs")
def runs(
    files: list[Path] = typer.Argument(..., help="`tandem bench dragon latency` result files."),
    method: str = typer.Option(
        "dragon-side-static-mirror", "--method", help="The method compared with CRCG/Device."
    ),
    name: str = typer.Option("dragon_runs", "--name", help="Result file name (no suffix)."),
    out: Path = OUT,
) -> None:
    """One table over many latency runs: each run's per-token ratio to CRCG/Device at every
    delay, and per network setup and delay the spread (min, median, max, targets met); at a
    delay also its stalls (and where the two-chain model puts them) and the pace outside them."""
    from benchmarks.dragon_runs import run

    run(files, method=method, out=out, name=name)


def _delayed(delayed: str) -> str:
    """`--delayed`, checked by the testbed's own config before anything starts (a one-line
    error, no traceback)."""
    from tandem.testbed.netns import NetConfig

    return NetConfig(delayed=delayed).delayed
