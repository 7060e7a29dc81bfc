"""`tandem bench dragon perplexity|scheduling`: DRAGON paper Fig. 5 and Fig. 8.

Plain functions with typer options; `benchmarks.cli` registers them on its `dragon` group.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from benchmarks import RESULTS
from tandem.errors import TandemError
from tandem.protocols.dragon.config import SCHEDULER_MODELS, DragonConfig
from tandem.testbed.options import CLOUD_CPUS, DEVICE_CPUS, role_cpus

OUT = typer.Option(RESULTS, "--out", help="Folder for the JSON and PNG results.")
TRACES_FILE = "dragon_sched.traces.json"


def perplexity(
    model: str = typer.Option("qwen2.5-coder-0.5b", "--model", help="Model name or path."),
    ks: list[int] = typer.Option([0, 1, 2, 4, 8], "--k", help="Documents per side (repeat)."),
    passages: int = typer.Option(12, "--passages", min=1, help="Held-out stdlib windows."),
    prefix_tokens: int = typer.Option(64, "--prefix-tokens", min=1, help="Query / prefix."),
    scored_tokens: int = typer.Option(32, "--scored-tokens", min=2, help="Scored continuation."),
    doc_tokens: int = typer.Option(64, "--doc-tokens", min=1, help="Tokens per document."),
    split: str = typer.Option("rank", "--split", help="rank (paper Sec. 7.2) or module."),
    quick: bool = typer.Option(False, "--quick", help="3 passages, k in 0,1,2 (~1 min)."),
    out: Path = OUT,
    name: str = typer.Option("dragon_quality", "--name", help="Result file name (no suffix)."),
) -> None:
    """Fig. 5: perplexity vs retrieved documents per side (no retrieval, CRCG, DRCG, DRAGON,
    and DRAGON with one row per side)."""
    import torch

    from benchmarks.dragon_quality import SPLITS, QualityConfig, run

    if split not in SPLITS:
        raise TandemError(f"--split must be one of {', '.join(SPLITS)}")
    if any(k < 0 for k in ks):
        raise TandemError("--k values must be >= 0")
    torch.set_num_threads(1)
    ks = sorted({0, *ks})
    if quick:
        passages, ks = min(passages, 3), [k for k in ks if k <= 2] or [0, 1]
    config = QualityConfig(
        ks=tuple(ks), passages=passages, prefix_tokens=prefix_tokens,
        scored_tokens=scored_tokens, doc_tokens=doc_tokens, split=split,
    )  # fmt: skip
    run(model=model, out=out, config=config, name=name)


def scheduling(
    recording: Path = typer.Option(
        None,
        "--recording",
        help=f"Recorded traces (default: OUT/{TRACES_FILE} if present), or a `tandem bench "
        "dragon latency` result (its first DRAGON method's runs at its smallest delay).",
    ),
    record_new: bool = typer.Option(False, "--record", help="Record new traces first."),
    model: str = typer.Option("qwen2.5-coder-0.5b", "--model", help="Device model."),
    cloud_model: str = typer.Option("", "--cloud-model", help="Cloud model (default: --model)."),
    record_tokens: int = typer.Option(64, "--record-tokens", min=8, help="Tokens per run."),
    temperature: float = typer.Option(0.7, "--temperature", min=0.0, help="0 = greedy."),
    traces: int = typer.Option(50, "--traces", min=1, help="Bootstrapped traces."),
    tokens: int = typer.Option(
        None,
        "--tokens",
        min=1,
        help="Tokens per simulated generation (default: 100, or the shortest run with "
        "--whole-runs).",
    ),
    whole_runs: bool = typer.Option(
        False,
        "--whole-runs",
        help="Replay each recorded run whole, in turn (the paper's replay of acceptance "
        "sequences), instead of block-bootstrapped mixes of all runs.",
    ),
    scheduler_model: str = typer.Option(
        DragonConfig.scheduler_model,
        "--scheduler-model",
        help=f"Scheduler's latency per placement: {' or '.join(SCHEDULER_MODELS)} (the paper's "
        "Eq. 7).",
    ),
    acceptance_ema: float = typer.Option(
        DragonConfig.acceptance_ema,
        "--acceptance-ema",
        min=0.01,
        max=1.0,
        help="Scheduler's acceptance smoothing.",
    ),
    switch_margin: float = typer.Option(
        0.0, "--switch-margin", min=0.0, help="Scheduler: switch only when better by this (s)."
    ),
    switch_horizon: int = typer.Option(
        DragonConfig.switch_horizon,
        "--switch-horizon",
        min=0,
        help="Scheduler: a switch repays its one-way trip within this many tokens "
        "(0: the paper's rule).",
    ),
    zero_one_rates: bool = typer.Option(
        False, "--zero-one-rates", help="Scheduler learns 0/1 outcomes, not recorded Eq. 5 rates."
    ),
    lookahead: int = typer.Option(
        0, "--lookahead", min=0, help="Drafts a side keeps ahead (0: DragonConfig's default)."
    ),
    mirror: bool = typer.Option(
        False,
        "--mirror",
        help="Replay the live default: the side that does not aggregate resolves once it holds "
        "both drafts (off: the paper's protocol, it waits for the aggregator's verdict).",
    ),
    seed: int = typer.Option(
        0,
        "--seed",
        min=0,
        help="Bootstrap, jitter and decode-time draws (0: the committed runs; another seed "
        "replays other traces from the same recording).",
    ),
    name: str = typer.Option("dragon_sched", "--name", help="Result file name (no suffix)."),
    quick: bool = typer.Option(False, "--quick", help="Tiny models, 10 traces (~1 min)."),
    device_cpus: str = DEVICE_CPUS,
    cloud_cpus: str = CLOUD_CPUS,
    out: Path = OUT,
) -> None:
    """Fig. 8: Cloud / Device / Random / DRAGON scheduling, replayed under a jittery RTT (the
    recording runs each side's model on its own cores)."""
    import torch

    from benchmarks.dragon_sched import QUESTIONS, SchedConfig, record, run

    if scheduler_model not in SCHEDULER_MODELS:
        raise TandemError(f"--scheduler-model must be one of {', '.join(SCHEDULER_MODELS)}")
    torch.set_num_threads(1)
    lookahead = lookahead or DragonConfig.lookahead
    config = SchedConfig(
        traces=traces, tokens=tokens or 100, acceptance_ema=acceptance_ema,
        switch_margin_s=switch_margin, switch_horizon=switch_horizon,
        scheduler_model=scheduler_model, whole_runs=whole_runs,
        recorded_rates=not zero_one_rates, lookahead=lookahead, mirror=mirror, seed=seed,
    )  # fmt: skip
    questions = QUESTIONS
    if quick:
        model, cloud_model = "tiny-qwen2", "tiny-qwen2-b"
        record_new, record_tokens, questions = True, 32, QUESTIONS[:2]
        config = dataclasses.replace(
            config, traces=min(traces, 10), tokens=min(config.tokens, 50), extras_s=(0.0, 0.2)
        )
    path = recording or out / TRACES_FILE
    if recording is not None and not record_new and not recording.is_file():
        raise TandemError(f"no recording at {recording} (--record records new traces)")
    cpus = role_cpus(device_cpus, cloud_cpus)
    if record_new or not path.is_file():
        data = record(
            model=model, cloud_model=cloud_model or model, tokens=record_tokens,
            temperature=temperature, questions=questions, cpus=cpus,
        )  # fmt: skip
        if not quick:  # a quick run never replaces recorded real traces
            out.mkdir(parents=True, exist_ok=True)
            (out / TRACES_FILE).write_text(json.dumps(data) + "\n")
    else:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise TandemError(f"cannot read the recording {path}: {exc}") from exc
        data = _as_recording(data, path)
    lengths = [len(r["accepted"]["device"]) for r in data["runs"]]
    if whole_runs:
        if tokens is not None and tokens > min(lengths):
            raise TandemError(
                f"--tokens {tokens} is longer than the shortest recorded run ({min(lengths)} "
                "positions); --whole-runs replays runs as they are"
            )
        config = dataclasses.replace(config, tokens=tokens or min(lengths))
    elif max(lengths) < config.block:
        raise TandemError(f"every recorded run is shorter than {config.block} positions")
    run(recording=data, config=config, out=out, name=name)


def _as_recording(data, path: Path) -> dict:
    """A recording as `record` writes it, or one made from a latency bench result; the file
    it came from is kept in its `source`."""
    from benchmarks.dragon_sched import recording_from_latency

    runs = data.get("runs") if isinstance(data, dict) else None
    if not runs:
        raise TandemError(f"{path} holds no runs: not a recording or a latency result")
    if "accepted" not in runs[0]:
        try:
            data = recording_from_latency(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise TandemError(
                f"{path}: not a recording, nor a usable latency result ({exc})"
            ) from exc
    return {**data, "source": {**(data.get("source") or {}), "file": str(path)}}
