"""`tandem bench serve`: one cloud serving many device sessions, verification batching on/off.

Method. One process, one event loop: a `CloudServer` on 127.0.0.1 (TCP loopback, real
handshake) and N device sessions (`run_generation("spec", ...)`) started together, each with
its own prompt and seed; an emulated one-way delay (`LinkConfig`, in-process emulator) on both
directions. For each concurrency N the two cloud variants are measured side by side, batching
off (each session's verification is its own forward pass) then on, alternated `repeats` times
(medians reported, raw totals kept) (`VerifyBatcher`, window
`batch_window_ms`), each after one discarded warm-up session on a fresh cloud. The device
models run in the same process as the cloud model, but every model call runs on its side's
cores (`tandem.testbed.pinned`; `--device-cpus`, `--cloud-cpus`, one engine thread per core):
all N devices share the device's set (drafting time is part of every number), the cloud has
its own; the event loop, sampling, codecs and the loopback sockets are not pinned.

Measures per (N, variant): total tokens/s = all sessions' tokens / wall time from the first
start to the last end; per-session tokens/s (mean of tokens / the session's own time);
session latency p50 / p95 / p99 (start to last token, seconds); time per output token p50 /
p95 / p99 (ms, from each session's token times); sessions held to the end and sessions the
cloud refused (its admission limit `max_sessions`, by reason); the cloud's verification
batches (count by size, mean size) and forward passes. Outputs are checked to be equal with
batching on and off.

Because the devices share the process (and the device model's lock), their drafting can be the
bottleneck, which hides what batching does for the cloud. So the cloud's verification capacity
is also measured on its own (`verify_capacity`): B single-row states (contexts of 48-80 tokens,
blocks of 5 tokens) verified as B separate forward passes vs one `run_batch` (stack, one pass,
split, crop: the copies included; a batch of one is the row's own pass, as in the batcher),
alternated, median of 2 x `repeats` timed rounds after two warm-up rounds, all on one of the
cloud's pinned workers.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

PROMPTS = [
    "def add(a, b):", "import os\n", "class Stack:\n", "# sort a list", "def fib(n):",
    "with open(", "for i in range(", "async def fetch(",
]  # fmt: skip


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def session_settings(i: int, tokenizer, *, tokens: int, pipeline: str, codec: str):
    from tandem.protocols.spec import SpecConfig

    prompt = tokenizer.encode(PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)))
    config = SpecConfig(
        pipeline=pipeline, codec=codec, temperature=0.0, seed=i, max_new_tokens=tokens,
        stop_at_eos=False,
    )  # fmt: skip
    return prompt, config


async def _run_point(device_lm, cloud_lm, *, sessions: int, batching: bool, settings: dict):
    """One cloud, one warm-up session, then `sessions` concurrent ones; their measurements."""
    from tandem.errors import TandemError
    from tandem.serve.admission import CloudLimits
    from tandem.serve.cloud import CloudServer, cloud_resources
    from tandem.serve.device import run_generation
    from tandem.transport import LinkConfig, TransportConfig

    link = LinkConfig(delay_ms=settings["delay_ms"]) if settings["delay_ms"] else None
    resources = cloud_resources(
        cloud_lm, batching=batching, batch_window_ms=settings["batch_window_ms"]
    )
    cloud = CloudServer(resources, limits=CloudLimits(max_sessions=settings["max_sessions"]))
    server = await cloud.start(
        "127.0.0.1",
        0,
        transport=TransportConfig.for_model(cloud_lm, role="cloud", secret=b"bench", link=link),
    )
    transport = TransportConfig.for_model(device_lm, role="device", secret=b"bench", link=link)
    kw = {
        "tokens": settings["tokens"],
        "pipeline": settings["pipeline"],
        "codec": settings["codec"],
    }

    async def one(i: int):
        prompt, config = session_settings(i, device_lm.tokenizer, **kw)
        return await run_generation(
            "spec", lm=device_lm, prompt_ids=prompt, config=config, port=server.port,
            transport=transport,
        )  # fmt: skip

    try:
        await one(10_000)  # warm-up, discarded
        if resources.batcher is not None:
            resources.batcher.batch_sizes.clear()
        passes_before = sum(len(r.get("verify_s", ())) for _, r in resources.reports if r)
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(one(i) for i in range(sessions)), return_exceptions=True)
        wall = time.perf_counter() - start
        passes = sum(len(r.get("verify_s", ())) for _, r in resources.reports if r) - passes_before
    finally:
        await server.close()
        await cloud.close()
    reports = [r for r in outcomes if not isinstance(r, BaseException)]
    refused = [r for r in outcomes if isinstance(r, TandemError) and "cloud error" in str(r)]
    failed = [r for r in outcomes if isinstance(r, BaseException) and r not in refused]
    if failed:
        raise failed[0]
    reasons: dict[str, int] = {}
    for exc in refused:
        reason = str(exc).split("cloud error: ", 1)[-1].split(":")[0]
        reasons[reason] = reasons.get(reason, 0) + 1
    tokens = [len(r.tokens) for r in reports]
    gaps = [
        1e3 * (b - a)
        for r in reports
        for a, b in zip(r.token_times, r.token_times[1:], strict=False)
    ]
    sizes = dict(resources.batcher.batch_sizes) if resources.batcher else {}
    batches = sum(sizes.values())
    return {
        "sessions": sessions,
        "batching": batching,
        "wall_s": wall,
        "tokens": sum(tokens),
        "total_tok_s": sum(tokens) / wall,
        "per_session_tok_s": statistics.mean(
            n / r.total_s for n, r in zip(tokens, reports, strict=True)
        )
        if reports
        else 0.0,
        "latency_p50_s": _percentile([r.total_s for r in reports], 0.5),
        "latency_p95_s": _percentile([r.total_s for r in reports], 0.95),
        "latency_p99_s": _percentile([r.total_s for r in reports], 0.99),
        "tpot_p50_ms": _percentile(gaps, 0.5),
        "tpot_p95_ms": _percentile(gaps, 0.95),
        "tpot_p99_ms": _percentile(gaps, 0.99),
        "sessions_held": len(reports),  # served to the end
        "refused": len(refused),  # turned away by the cloud's admission limits
        "refusal_reasons": reasons,
        "verify_passes": passes,  # per-session verifications (a batch counts once per session)
        "batches": batches,
        "batch_sizes": {str(k): v for k, v in sorted(sizes.items())},
        "mean_batch_size": (sum(k * v for k, v in sizes.items()) / batches) if batches else 1.0,
        "outputs": [r.tokens for r in reports],
    }


def run(
    *,
    device_model: str,
    cloud_model: str,
    sessions: list[int],
    tokens: int,
    delay_ms: float,
    batch_window_ms: float,
    pipeline: str,
    codec: str,
    out: Path,
    repeats: int = 1,
    name: str = "serve_load",
    cpus: dict[str, list[int]] | None = None,
    max_sessions: int = 64,
) -> dict[str, Any]:
    """Run the bench (module docstring); save NAME.json / .png. `cpus`: each side's cores
    (default `tandem.testbed.cpus.role_cpus()`)."""
    import torch

    from benchmarks.report import Machines, save_json
    from tandem.models.registry import load_model
    from tandem.testbed.cpus import role_cpus
    from tandem.testbed.pinned import pinned

    machines = Machines(
        cpus=cpus or role_cpus(),
        isolation="threads: each side's model calls on workers pinned to its set (one process)",
        shared=["event loop, sampling, codecs and loopback sockets of all sessions (not pinned)"],
    )
    torch.set_num_threads(min(map(len, machines.cpus.values())))  # the unpinned protocol work
    models = {
        role: load_model(name_, threads=len(machines.cpus[role]))
        for role, name_ in (("device", device_model), ("cloud", cloud_model))
    }
    settings = {
        "tokens": tokens, "delay_ms": delay_ms, "batch_window_ms": batch_window_ms,
        "pipeline": pipeline, "codec": codec, "max_sessions": max_sessions,
    }  # fmt: skip
    with pinned(models, machines.cpus, machines.observed) as sides:
        points, capacity = _measure(sides["device"], sides["cloud"], sessions, repeats, settings)
    payload = {
        "method": __doc__.split("Method.", 1)[1].split("Measures", 1)[0].strip(),
        "device_model": device_model,
        "cloud_model": cloud_model,
        "repeats": repeats,
        **settings,
        "points": points,
        "verify_capacity": capacity,
    }
    save_json(out, name, payload, machines=machines)
    plot(payload, out, name)
    return payload


def _measure(device_lm, cloud_lm, sessions: list[int], repeats: int, settings: dict):
    """(points, capacity): every concurrency with batching off and on, then the cloud alone."""
    from rich.progress import Progress

    from tandem.transport import loop as event_loop

    points = []
    with Progress() as progress:
        task = progress.add_task("serve load", total=2 * len(sessions) * repeats)
        for n in sessions:
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(repeats):
                for batching in (False, True):  # alternated, so drifting load hits both
                    progress.update(task, description=f"{n} sessions, batching {batching}")
                    runs[batching].append(
                        event_loop.run(
                            _run_point(
                                device_lm,
                                cloud_lm,
                                sessions=n,
                                batching=batching,
                                settings=settings,
                            )  # fmt: skip
                        )
                    )
                    progress.advance(task)
            off, on = _median_point(runs[False]), _median_point(runs[True])
            on["same_outputs_as_unbatched"] = all(
                r["outputs"] == runs[False][0]["outputs"] for r in runs[True] + runs[False]
            )
            on["speedup_total_tok_s"] = on["total_tok_s"] / off["total_tok_s"]
            points.extend([off, on])
    for point in points:
        point.pop("outputs")
    return points, cloud_lm.run(verify_capacity, sorted(set(sessions)), repeats=repeats)


def _separate_passes(lm, states: list, blocks: list[list[int]]) -> None:
    """One forward pass per state, each rolled back afterwards."""
    for state, ids in zip(states, blocks, strict=True):
        lm.decode(state, ids)
        lm.crop(state, state.seq_len - len(ids))


def verify_capacity(lm, sizes: list[int], *, block: int = 5, repeats: int = 3) -> list[dict]:
    """Verification tokens/s of the cloud model alone: B separate passes vs one batched pass."""
    from tandem.models.batching import run_batch

    rows = []
    for size in sizes:
        states = [lm.prefill(list(range(1, 49 + (i * 7) % 33))) for i in range(size)]
        blocks = [[(5 * i + j) % 200 + 1 for j in range(block)] for i in range(size)]

        start = time.perf_counter()
        _separate_passes(lm, states, blocks)  # sizes a round to ~0.25 s (tiny models: ~1 ms)
        inner = max(1, min(32, round(0.25 / (time.perf_counter() - start))))
        timings: dict[str, list[float]] = {"separate": [], "batched": []}
        for round_ in range(2 * repeats + 2):
            for method in ("separate", "batched"):
                start = time.perf_counter()
                for _ in range(inner):
                    if method == "batched" and size > 1:
                        run_batch(lm, states, blocks)  # works on copies: states stay as they are
                    else:  # the batcher runs a batch of one as the row's own pass
                        _separate_passes(lm, states, blocks)
                if round_ > 1:  # rounds 0 and 1 are the warm-up
                    timings[method].append((time.perf_counter() - start) / inner)
        sep, bat = statistics.median(timings["separate"]), statistics.median(timings["batched"])
        rows.append({
            "batch": size, "block": block,
            "separate_s": sep, "batched_s": bat,
            "separate_tok_s": size * block / sep, "batched_tok_s": size * block / bat,
            "speedup": sep / bat,
        })  # fmt: skip
    return rows


def _median_point(runs: list[dict]) -> dict:
    """The median of every number over repeats (batch counts and outputs from the first run);
    the raw per-repeat totals are kept under `repeats_total_tok_s`."""
    point = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float):
            point[key] = statistics.median(r[key] for r in runs)
    point["repeats_total_tok_s"] = [r["total_tok_s"] for r in runs]
    return point


def plot(payload: dict, out: Path, name: str) -> Path:
    from benchmarks.report import new_figure, save_png

    fig, axes = new_figure(ncols=4, size=(4.2, 3.6))
    panels = [
        ("total_tok_s", "total tokens/s"),
        ("per_session_tok_s", "tokens/s per session"),
        ("latency_p95_s", "session latency p95 (s)"),
    ]
    for ax, (key, label) in zip(axes[0][:3], panels, strict=True):
        for batching, style in ((False, "o--"), (True, "s-")):
            pts = [p for p in payload["points"] if p["batching"] is batching]
            ax.plot([p["sessions"] for p in pts], [p[key] for p in pts], style,
                    label="batching on" if batching else "batching off")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent sessions")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    cap, ax = payload["verify_capacity"], axes[0][3]
    ax.plot([c["batch"] for c in cap], [c["separate_tok_s"] for c in cap], "o--", label="separate")
    ax.plot([c["batch"] for c in cap], [c["batched_tok_s"] for c in cap], "s-", label="batched")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("verifications at once (cloud alone)")
    ax.set_ylabel("verified tokens/s")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.suptitle(
        f"{payload['device_model']} -> {payload['cloud_model']}, {payload['tokens']} tokens, "
        f"{payload['delay_ms']} ms one-way"
    )
    return save_png(fig, out, name)
