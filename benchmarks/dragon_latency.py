"""`tandem bench dragon latency`: DRAGON paper Fig. 6 (per-token latency vs extra network
latency) and Theorem 6.2 (predicted vs measured speedup over DRDG/TW).

Setup (`tandem.baselines.dragon.testbed`): device and cloud are two processes in the
project's network namespaces, each pinned to its own cores (`--device-cpus`, `--cloud-cpus`;
default device = core 0, cloud = core 1 on a 2-core box) with one engine thread per core
(the JSON's `machines`), the same model on both sides (the paper uses one model on both), the demo's corpora (device: examples/private-notes, cloud:
stdlib docstrings), top-2 documents per side, greedy, fixed output length (no EOS stop).
For each extra one-way delay d (jitter d / 5, the paper's; `--jitter` changes it) on each direction `delayed` names ("both": RTT
gains 2d; "down": cloud -> device only, RTT gains d, as the paper's netem on the server's NIC,
Sec. 7.3) every method
(all baselines: CRCG, DRCG, DRDG and DRAGON) runs on every question, side by side; one short
warm-up run per method is discarded. Each run records the 1-minute load average before it;
each DRAGON run both sides' per-token timelines (`benchmarks.dragon_timeline`), averaged
per delay in the JSON's `timeline`. Full size (the default): 16 questions x 64 new tokens at
+0/100/200/300 ms (`dragon_questions.QUESTIONS`).

Per-token latency: mean gap between consecutive tokens as the device learns them; for
DRDG/SW (the answer arrives whole) decoding time from the device's prefill to the answer,
per token (`BaselineReport.per_token_s`).

Theorem 6.2, per delay: l = the side that aggregated most positions in the DRAGON runs,
r = the other; c_dec = mean measured draft time per side (every draft carries it), rtt =
the DRAGON session's smoothed Ping RTT, alpha_r = accepted fraction of r's drafts.
Predicted S = `predicted_speedup(c_l, c_r, alpha_r, rtt)`; measured S = DRDG/TW per-token /
DRAGON per-token (means over questions).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks import RESULTS
from benchmarks.dragon_questions import QUESTIONS
from benchmarks.dragon_timeline import print_stalls, print_timeline, stall_rows, timeline_rows
from benchmarks.report import Machines, new_figure, save_json, save_png
from tandem.testbed.cpus import loadavg
from tandem.testbed.netns import JITTER

METHODS = ("crcg-device", "crcg-cloud", "drcg-text", "drcg-kv", "drdg-sw", "drdg-tw", "dragon")
# Not the paper's, run only when asked for: DRAGON with one decode row per side holding all its
# documents (DragonConfig.rows = "side"), the same with static relevance weights (the
# retrieval scores, as Fig. 5's perplexity bench weighs documents; no re-scoring while
# decoding), and that with branch drafts ("own", "peer"), mirrored resolution, or the
# aggregator fixed on one side (the paper's protocol: Fig. 8's fixed placements, live)
EXTRA_METHODS = (
    "dragon-side", "dragon-side-static", "dragon-side-static-own", "dragon-side-static-peer",
    "dragon-side-static-mirror", "dragon-side-static-device", "dragon-side-static-cloud",
    "crcg-device-contended",
)  # fmt: skip
# issue 14's per-token targets over CRCG/Device, by extra delay (ms); TTFT and the cut below
# DRDG/TW are checked at +0 and +300 in `targets`
TARGETS = {0.0: 1.10, 300.0: 1.20}
# A testbed control, not a method: CRCG/Device while the cloud's cores decode nonstop
# (`Testbed.contended`), i.e. with the memory-system contention DRAGON's device sees here and
# separate machines would not. No target is judged against it; it splits DRAGON's overhead.
CONTROL = "crcg-device-contended"
CONTROL_NOTE = (
    "CRCG/Device while a burner on the cloud's cores decodes the same model nonstop "
    "(runs[].burner: its steps and ms per step); the share of DRAGON's overhead that is the "
    "two sides sharing this box's memory system"
)
LABELS = {
    "crcg-device": "CRCG/Device", "crcg-cloud": "CRCG/Cloud", "drcg-text": "DRCG/Text",
    "drcg-kv": "DRCG/KV", "drdg-sw": "DRDG/SW", "drdg-tw": "DRDG/TW", "dragon": "DRAGON",
    "dragon-side": "DRAGON, 1 row/side (ours)",
    "dragon-side-static": "DRAGON, 1 row/side, static weights (ours)",
    "dragon-side-static-own": "DRAGON, 1 row/side, static, branch on own 2nd choice",
    "dragon-side-static-peer": "DRAGON, 1 row/side, static, branch on peer's token",
    "dragon-side-static-mirror": "DRAGON, 1 row/side, static, mirrored resolution",
    "dragon-side-static-device": "DRAGON, 1 row/side, static, aggregator on the device",
    "dragon-side-static-cloud": "DRAGON, 1 row/side, static, aggregator on the cloud",
    CONTROL: "CRCG/Device, cloud cores decoding (testbed control)",
}  # fmt: skip
# every DRAGON variant the bench runs: its DragonConfig fields beyond the bench's own
_STATIC = {"rows": "side", "scorer": "static"}  # one row per side, retrieval scores as weights
DRAGONS = {  # the variants measured before mirroring existed keep it off
    "dragon": {"mirror": False},
    "dragon-side": {"rows": "side", "mirror": False},
    "dragon-side-static": {**_STATIC, "mirror": False},
    "dragon-side-static-own": {**_STATIC, "branch": "own", "mirror": False},
    "dragon-side-static-peer": {**_STATIC, "branch": "peer", "mirror": False},
    "dragon-side-static-mirror": {**_STATIC, "mirror": True},
    "dragon-side-static-device": {**_STATIC, "mirror": False, "strategy": "device"},
    "dragon-side-static-cloud": {**_STATIC, "mirror": False, "strategy": "cloud"},
}


def prepare_indexes(model: str, public: str, private: str | None) -> tuple[Path, Path]:
    """Index folders of both corpora (built once and cached, like `tandem demo`)."""
    from tandem.models.registry import load_tokenizer
    from tandem.protocols.dragon.setup import ensure_index
    from tandem.serve.dragon_demo import default_private_corpus

    tokenizer = load_tokenizer(model)
    private = private or str(default_private_corpus())
    public_index = ensure_index(public, tokenizer=tokenizer, tokenizer_name=model)
    return public_index, ensure_index(private, tokenizer=tokenizer, tokenizer_name=model)


def bench_config(tokens: int, seed: int = 0, method: str = "dragon"):
    """Greedy, fixed length; DRAGON runs bring the cloud's timeline back to the device."""
    from tandem.protocols.dragon import DragonConfig

    return DragonConfig(
        max_new_tokens=tokens, temperature=0.0, seed=seed, stop_at_eos=False, timeline=True,
        **DRAGONS.get(method, {}),
    )  # fmt: skip


def _run(bed, method: str, question: str, tokens: int) -> dict:
    """One generation; every DRAGONS variant runs as the dragon method with its config."""
    if method == CONTROL:
        with bed.contended() as burner:
            record = bed.run("crcg-device", question, bench_config(tokens))
        return {**record, "method": method, "burner": burner}
    worker_method = "dragon" if method in DRAGONS else method
    record = bed.run(worker_method, question, bench_config(tokens, method=method))
    return {**record, "method": method}


def sweep(bed, *, methods, delays, questions, tokens: int, console: Console) -> list[dict]:
    """Every method on every question at every delay. Warm-up first, discarded: every method
    on every question for a few tokens, so each question's document KV is stored before any
    timed run (a cold store made the first delay's CRCG TTFT 3x its warm value)."""
    bed.set_delay(0.0)
    for question in questions:
        for method in methods:
            _run(bed, method, question, 3)
    runs = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("runs", total=len(delays) * len(questions) * len(methods))
        for delay in delays:
            bed.set_delay(delay)
            for number, question in enumerate(questions):
                for method in methods:
                    load = loadavg()[0]
                    record = _run(bed, method, question, tokens)
                    runs.append(
                        {"delay_ms": delay, "question": number, "load_1min": load, **record}
                    )
                    progress.advance(task)
    return runs


BUSY_NOTE = (
    "burners of the device's model decoded nonstop on the device's cores for the whole run "
    "(stats: each one's steps and ms per step): a busy device, every method's device side "
    "alike; a testbed variant, not the paper's machines"
)


def busy_line(busy: list[dict], runs: list[dict]) -> str:
    """The headline's first line for a busy device: how many burners, and how far apart the
    sides' draft times were in the DRAGON runs (median of each side's)."""
    times = {"device": [], "cloud": []}
    for run in runs:
        for side, pairs in run.get("decode_times", {}).items():
            times[side] += [seconds for _, seconds in pairs]
    line = f"a busy device ({len(busy)} burner(s) decoding on its cores): a testbed variant"
    if times["device"] and times["cloud"]:
        device, cloud = (statistics.median(times[s]) for s in ("device", "cloud"))
        line += (
            f"; median draft time device {1e3 * device:.1f} ms, cloud {1e3 * cloud:.1f} ms"
            f" ({device / cloud:.2f}x)"
        )
    return line


ISOLATION = "processes: device and cloud each pinned from start to their own set"
# what runs beside them on the same cores (its CPU lands on the machines' cores: ~0.5-0.9 ms a
# token, docs/network.md)
SHARED = ["the delay proxy (the wire, not pinned)"]


def measure(
    *, model, public, private, net_name, methods, delays, questions, tokens: int, console, machines,
    delayed: str = "both", jitter: float = JITTER, cloud_model: str | None = None,
    busy_device: int = 0,
) -> tuple[list[dict], dict, list[dict]]:  # fmt: skip
    """Build both sides' indexes, start the testbed on `machines.cpus` and `sweep`: (runs,
    network facts, what each busy-device burner decoded meanwhile); what each side saw of
    itself goes to `machines.observed`."""
    from tandem.baselines.dragon.testbed import Testbed

    public_index, private_index = prepare_indexes(model, public, private)
    indexes = {"public_index": public_index, "private_index": private_index}
    with Testbed(
        model=model, name=net_name, cpus=machines.cpus, delayed=delayed, jitter=jitter,
        cloud_model=cloud_model, busy_device=busy_device, **indexes,
    ) as bed:  # fmt: skip
        machines.observed = bed.observed
        network = {
            "mode": bed.status.mode,
            "delay_path": bed.status.delay_path,
            "notes": list(bed.status.notes),
        }
        runs = sweep(
            bed, methods=methods, delays=delays, questions=questions, tokens=tokens, console=console
        )
        busy = bed.busy_stats()
    return runs, network, busy


def mean_of(runs: list[dict], method: str, delay: float, key: str) -> float | None:
    values = [r.get(key) for r in runs if r["method"] == method and r["delay_ms"] == delay]
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def theorem_rows(runs: list[dict], delays, delayed: str = "both") -> list[dict]:
    from tandem.protocols.dragon.scheduler import (
        expected_latency,
        predicted_speedup,
        synchronized_latency,
    )

    rows = []
    for delay in delays:
        dragon = [r for r in runs if r["method"] == "dragon" and r["delay_ms"] == delay]
        tw = mean_of(runs, "drdg-tw", delay, "per_token_s")
        ours = mean_of(runs, "dragon", delay, "per_token_s")
        if not dragon or tw is None or ours is None:
            continue
        by = [res["by"] for r in dragon for res in r["resolutions"] if res["aggregated"]]
        local = max(("device", "cloud"), key=by.count)
        remote = "cloud" if local == "device" else "device"
        c_dec = {
            side: statistics.fmean(s for r in dragon for _, s in r["decode_times"][side])
            for side in ("device", "cloud")
        }
        alpha = statistics.fmean(
            res[remote] for r in dragon for res in r["resolutions"] if res["aggregated"]
        )
        rtts = [r["summary"]["rtt_s"] for r in dragon if r["summary"]["rtt_s"]]
        rtt = statistics.fmean(rtts) if rtts else _added_rtt_s(delay, delayed)
        predicted = predicted_speedup(c_dec[local], c_dec[remote], alpha, rtt)
        measured = tw / ours
        rows.append(
            {
                "delay_ms": delay, "aggregator": local, "c_dec_local_s": c_dec[local],
                "c_dec_remote_s": c_dec[remote], "alpha_remote": alpha, "rtt_s": rtt,
                "predicted_dragon_s": expected_latency(c_dec[local], c_dec[remote], alpha, rtt),
                "predicted_tw_s": synchronized_latency(c_dec["device"], c_dec["cloud"], rtt),
                "measured_dragon_s": ours, "measured_tw_s": tw,
                "predicted_speedup": predicted, "measured_speedup": measured,
                "relative_error": measured / predicted - 1,
            }
        )  # fmt: skip
    return rows


def _added_rtt_s(delay_ms: float, delayed: str) -> float:
    """What the configured delay adds to a round trip (the testbed's own rule)."""
    from tandem.testbed.netns import NetConfig

    return NetConfig(delay_ms=delay_ms, delayed=delayed).added_rtt_ms / 1e3


def _ratio(at: dict, method: str, base: str, key: str) -> float | None:
    if not (at.get(method, {}).get(key) and at.get(base, {}).get(key)):
        return None
    return at[method][key] / at[base][key]


def targets(rows: list[dict], theory: list[dict]) -> list[str]:
    """The issue's targets, each at the delay it names when the run has it: DRAGON vs
    CRCG/Device per token at +0 ms (<= 1.10x) and +300 ms (<= 1.20x), TTFT at +0 ms
    (<= 1.05x), the cut below DRDG/TW at +300 ms (>= 55%); Theorem 6.2 at every delay (within
    10%). Other delays get ratios without a verdict (below: the testbed control)."""
    first, last = min(r["delay_ms"] for r in rows), max(r["delay_ms"] for r in rows)
    at = {d: {r["method"]: r for r in rows if r["delay_ms"] == d} for d in (first, last, *TARGETS)}
    lines = []
    checks = (
        *(
            (delay, "per_token_s", "crcg-device", "per-token", bound)
            for delay, bound in TARGETS.items()
        ),
        (0.0, "ttft_s", "crcg-device", "TTFT", 1.05),
    )
    for name in DRAGONS:
        label = LABELS[name]
        for delay, key, base, what, bound in checks:
            ratio = _ratio(at[delay], name, base, key)
            if ratio is not None:
                verdict = "met" if ratio <= bound else "missed"  # 3 decimals: 1.103 is not 1.10
                lines.append(
                    f"+{delay:.0f} ms: {label} {what} {ratio:.3f}x CRCG/Device"
                    f" (target <= {bound:.2f}x: {verdict})"
                )
        for delay in sorted({first, last}):
            ratio = _ratio(at[delay], name, CONTROL, "per_token_s")
            if ratio is not None:  # what is left with the testbed's contention on both sides
                lines.append(
                    f"+{delay:.0f} ms: {label} per-token {ratio:.3f}x {LABELS[CONTROL]} (no target)"
                )
        ratio = _ratio(at[300.0], name, "drdg-tw", "per_token_s")
        if ratio is not None:
            lines.append(
                f"+300 ms: {label} per-token {1 - ratio:.1%} below DRDG/TW (target >= 55%)"
            )
    for row in theory:
        lines.append(
            f"+{row['delay_ms']:.0f} ms: speedup over DRDG/TW measured {row['measured_speedup']:.2f}x,"
            f" Theorem 6.2 {row['predicted_speedup']:.2f}x ({row['relative_error']:+.1%}, target +-10%)"
        )
    return lines


def run(
    *,
    out: Path = RESULTS,
    quick: bool = False,
    model: str = "qwen2.5-coder-0.5b",
    delays: tuple[float, ...] | None = None,
    tokens: int | None = None,
    questions: int | None = None,
    public: str = "stdlib",
    private: str | None = None,
    methods: tuple[str, ...] = METHODS,
    net_name: str = "tandem-dbench",
    cpus: dict[str, list[int]] | None = None,
    delayed: str = "both",
    jitter: float = JITTER,
    cloud_model: str | None = None,
    busy_device: int = 0,
) -> dict:
    """Fig. 6 + Theorem 6.2: run, save dragon_latency.json / .png, print a table. `cpus`:
    each side's cores (default `tandem.testbed.cpus.role_cpus()`); `delayed`: which
    directions carry the delay (`NetConfig.delayed`); `jitter`: as a fraction of the delay
    (the paper's 1/5; any other value makes the run a testbed control, said in the headline);
    `cloud_model`: the cloud's model (default `model`: the paper's one model on both sides);
    `busy_device`: burners of the device's model decoding nonstop on the device's cores for the
    whole run (`Testbed`: a busy device, every method's device side alike; a testbed variant,
    said in the headline)."""
    from tandem.testbed.cpus import role_cpus

    console = Console()
    delays = delays or ((0.0, 100.0) if quick else (0.0, 100.0, 200.0, 300.0))
    tokens = tokens or (8 if quick else 64)
    chosen = QUESTIONS[: questions or (1 if quick else len(QUESTIONS))]
    started = time.perf_counter()
    machines = Machines(cpus=cpus or role_cpus(), isolation=ISOLATION, shared=SHARED)
    runs, network, busy = measure(
        model=model, public=public, private=private, net_name=net_name, methods=methods,
        delays=delays, questions=chosen, tokens=tokens, console=console, machines=machines,
        delayed=delayed, jitter=jitter, cloud_model=cloud_model, busy_device=busy_device,
    )  # fmt: skip
    rows = [
        {
            "method": method, "delay_ms": delay,
            "per_token_s": mean_of(runs, method, delay, "per_token_s"),
            "ttft_s": mean_of(runs, method, delay, "ttft_s"),
        }
        for delay in delays for method in methods
    ]  # fmt: skip
    theory = theorem_rows(runs, delays, delayed)
    timeline = timeline_rows(runs, delays, [m for m in methods if m in DRAGONS])
    split = stall_rows(runs, rows, [m for m in methods if m in DRAGONS], "crcg-device")
    headline = targets(rows, theory)
    if jitter != JITTER:  # not the paper's network: the figures are a control, not its targets
        headline.insert(
            0, f"jitter {jitter:g} x delay, not the paper's {JITTER:g}: a testbed control"
        )
    if busy_device:  # not the paper's machines: a slower device, every method alike
        headline.insert(0, busy_line(busy, runs))
    payload = {
        "setup": {
            "model": model, "cloud_model": cloud_model or model,
            "both_sides_same_model": cloud_model in (None, model), "network": network,
            "busy_device": {"burners": busy_device, "model": model, "stats": busy,
                            "note": BUSY_NOTE} if busy_device else None,
            "jitter": f"delay x {jitter:g}, uniform, each delayed direction", "delayed": delayed,
            "jitter_fraction": jitter, "delays_ms": list(delays),
            "max_new_tokens": tokens, "questions": list(chosen), "docs_per_side": 2,
            "temperature": 0.0, "quick": quick, "wall_s": time.perf_counter() - started,
            "methods": list(methods), "load_1min_per_run": "runs[].load_1min",
            "dragon_variants": {m: DRAGONS[m] for m in methods if m in DRAGONS},
            "controls": {CONTROL: CONTROL_NOTE} if CONTROL in methods else {},
            "dragon_defaults": bench_config(tokens).to_json(),
            "per_token": "mean inter-token gap at the device; DRDG/SW: (answer - prefill) / n",
            "theorem": "S = Z_TW / Z_DRAGON; 1/S = 1 - a_r / (1 + c_r / rtt) if c_l <= c_r; "
            "1 - (1 - c_l / (c_r + rtt)) a_r if c_r < c_l <= c_r + rtt; else 1",
        },
        "headline": headline,
        "table": rows,
        "theorem_6_2": theory,
        "timeline": timeline,
        "stalls": split,
        "runs": runs,
    }  # fmt: skip
    save_json(out, "dragon_latency", payload, machines=machines)
    _print(console, rows, theory, methods, delays)
    print_timeline(console, timeline)
    print_stalls(console, split, LABELS)
    for line in headline:
        console.print(line)
    _plot(out, rows, theory, methods)
    return payload


def _print(console, rows, theory, methods, delays) -> None:
    table = Table(title="DRAGON Fig. 6: per-token latency (ms) vs extra one-way delay")
    table.add_column("method")
    for delay in delays:
        table.add_column(f"+{delay:.0f} ms", justify="right")
    by = {(r["method"], r["delay_ms"]): r["per_token_s"] for r in rows}
    for method in methods:
        cells = [f"{1e3 * by[(method, d)]:.1f}" if by.get((method, d)) else "-" for d in delays]
        table.add_row(LABELS[method], *cells)
    console.print(table)
    if theory:
        table = Table(title="Theorem 6.2: speedup of DRAGON over DRDG/TW")
        for col in (
            "delay",
            "aggr.",
            "c_l ms",
            "c_r ms",
            "alpha_r",
            "rtt ms",
            "pred.",
            "meas.",
            "err",
        ):
            table.add_column(col, justify="right")
        for r in theory:
            table.add_row(
                f"{r['delay_ms']:.0f}", r["aggregator"], f"{1e3 * r['c_dec_local_s']:.0f}",
                f"{1e3 * r['c_dec_remote_s']:.0f}", f"{r['alpha_remote']:.2f}",
                f"{1e3 * r['rtt_s']:.0f}", f"{r['predicted_speedup']:.2f}",
                f"{r['measured_speedup']:.2f}", f"{r['relative_error']:+.1%}",
            )  # fmt: skip
        console.print(table)


def _plot(out: Path, rows, theory, methods) -> None:
    fig, axes = new_figure(ncols=2)
    ax = axes[0][0]
    for method in methods:
        pts = [
            (r["delay_ms"], 1e3 * r["per_token_s"])
            for r in rows
            if r["method"] == method and r["per_token_s"]
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=LABELS[method])
    ax.set(
        title="Per-token latency (Fig. 6)",
        xlabel="extra network latency (ms, one-way)",
        ylabel="ms / token",
    )
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax = axes[0][1]
    if theory:
        xs = [r["delay_ms"] for r in theory]
        ax.plot(xs, [r["predicted_speedup"] for r in theory], marker="s", label="Theorem 6.2")
        ax.plot(xs, [r["measured_speedup"] for r in theory], marker="o", label="measured")
        ax.set(
            title="DRAGON speedup over DRDG/TW",
            xlabel="extra network latency (ms)",
            ylabel="speedup",
        )
        ax.legend(fontsize=7)
    else:  # not an empty frame: say what the panel needs
        ax.axis("off")
        ax.text(0.5, 0.5, "Theorem 6.2: run the dragon and drdg-tw methods", ha="center")
    save_png(fig, out, "dragon_latency")
