"""`tandem bench spec`: edge-cloud speculative decoding, PicoSpec's and SQS-SD's experiments.

What runs (all in one process: device and cloud sessions joined by `memory_pair` through the
in-process link emulator, `LinkConfig(delay_ms = RTT / 2 each way, rate_mbit)`; each side's
model calls run on workers pinned to that side's cores, `tandem.testbed.pinned`, one engine
thread per core (`--device-cpus`, `--cloud-cpus`; device = core 0, cloud = core 1 on a 2-core
box), so drafting and verifying really overlap; the event loop, sampling, codecs and the link
emulator are not pinned):

1. PicoSpec Table 1/2: throughput, TTFT, TPOT, T_draft, T_verify, acceptance and bytes of
   cloud autoregressive decoding, vanilla (stop-and-wait, dense) SD, PicoSpec (async, fast
   verification, separate rejection), its ablations, and async K-SQS (an exact uplink), at
   each RTT, on a fixed set of coding prompts (HumanEval-style signatures, written here; no
   dataset is available offline), greedy decoding.
2. PicoSpec Table 4: PicoSpec at RTT 100 ms with draft lengths 3-6.
3. SQS-SD Fig. 2: `benchmarks.spec_sqs` (bits per draft token, measured vs formula, and
   resampling vs temperature per codec; latency modelled from measured times).
4. PicoSpec Eq. 9: predicted vs measured throughput of every speculative run.

Regimes (the device/cloud speed ratio decides everything, and this CPU inverts the paper's):
- "emulated" / "emulated-high": `benchmarks.spec_emulated.paper_pair()`, toy models whose
  forward passes sleep for PicoSpec's measured times (draft 24 ms/token, verify ~90 ms, cloud
  AR ~74 ms/token) with ~0.7 / ~0.93 greedy agreement (PicoSpec's Qwen / Llama acceptance):
  the paper's regime, free of this CPU's contention.
- "cpu": device Qwen2.5-Coder-0.5B, cloud Qwen2.5-Coder-1.5B, both fp32 on this CPU: the
  cloud is ~3x slower per token than the device (the paper's cloud is an A100).
- "fast-cloud": device 0.5B with int8 dynamic quantization (a typical on-device model), cloud
  the fp32 0.5B: the cloud verifies a block in about the time the device drafts it, the
  paper's regime (T_verify ~ T_draft), with the cloud model only as large as the device's.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
import warnings
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import RESULTS, spec_sqs
from benchmarks.report import Machines, new_figure, save_json, save_png
from tandem.protocols.spec import SpecConfig, run_pair, theory
from tandem.transport import LinkConfig, memory_pair
from tandem.transport import loop as event_loop

PROMPTS = (
    'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same backwards, ignoring case."""\n',
    'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number (fibonacci(0) == 0)."""\n',
    'def count_words(sentence: str) -> dict[str, int]:\n    """Count how often each word occurs in sentence."""\n',
    'def flatten(nested: list) -> list:\n    """Flatten an arbitrarily nested list of lists."""\n',
)
METHODS: dict[str, dict | None] = {
    "cloud-ar": None,
    "vanilla-sd": {"pipeline": "sync", "codec": "dense"},
    "picospec": {"pipeline": "async", "codec": "separate", "fast_verify": True},
    "w/o para-draft": {"pipeline": "sync", "codec": "separate"},
    "w/o fast-verify": {"pipeline": "async", "codec": "separate", "fast_verify": False},
    "w/o split-rej": {"pipeline": "async", "codec": "dense", "fast_verify": True},
    "async k-sqs": {"pipeline": "async", "codec": "k-sqs", "codec_params": {"k": 16}},
}
REGIMES = {
    "cpu": ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"),
    "fast-cloud": ("qwen2.5-coder-0.5b-int8", "qwen2.5-coder-0.5b"),
    "emulated": ("emulated-draft", "emulated-target"),  # PicoSpec's timings, sleeping
    "emulated-high": ("emulated-draft-high", "emulated-target-high"),  # same, alpha ~0.93
    "tiny": ("tiny-qwen2", "tiny-qwen2"),  # smoke tests only: same model, every draft accepted
}
SQS_TIMING_RTT_S = 0.05  # modelled link of the SQS sweep: 50 ms RTT, 1 Mbit/s uplink
SQS_UPLINK_MBIT = 1.0
SQS_BUDGET_BITS = 5000  # SQS-SD's B


ISOLATION = "threads: each side's model calls on workers pinned to its set (one process)"
SHARED = ["event loop, sampling, codecs and the in-process link emulator (not pinned)"]


def load_models(regime: str, cache: dict, cpus: dict[str, list[int]]):
    """(device, cloud) models of a regime, each pinned to its side's cores (`PinnedModel`;
    one instance per side even when both sides use the same model); kept in `cache` by
    (side, name)."""
    from tandem.models.registry import load_model
    from tandem.testbed.cpus import ROLES
    from tandem.testbed.pinned import PinnedModel

    def get(role: str, name: str):
        if (role, name) in cache:
            return cache[(role, name)]
        if name.startswith("emulated-"):  # both made at once (the draft mixes the target's law)
            from benchmarks.spec_emulated import paper_pair

            high = name.endswith("-high")
            pair = paper_pair(0.95 if high else 0.8, "-high" if high else "")
            for side, lm in zip(ROLES, pair, strict=True):
                cache[(side, lm.name)] = PinnedModel(lm, cpus[side], role=side)
            return cache[(role, name)]
        if name.endswith("-int8"):
            import torch

            lm = load_model(name.removesuffix("-int8"), progress=False, backend="hf")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.ao.quantization.quantize_dynamic(
                    lm.model.model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True
                )
            lm.name = name
        else:
            lm = load_model(name, progress=False, threads=len(cpus[role]))
        cache[(role, name)] = PinnedModel(lm, cpus[role], role=role)
        return cache[(role, name)]

    device_name, cloud_name = REGIMES[regime]
    return get("device", device_name), get("cloud", cloud_name)


async def run_method(method, *, device_lm, cloud_lm, prompt_ids, rtt_ms, config, rate_mbit):
    from tandem.baselines.spec_baselines import run_cloud_ar, serve_cloud_ar

    link = LinkConfig(delay_ms=rtt_ms / 2, rate_mbit=rate_mbit)
    if METHODS[method] is None:
        device_channel, cloud_channel = memory_pair(link=link)
        cloud = asyncio.create_task(serve_cloud_ar(cloud_channel, cloud_lm))
        report = await run_cloud_ar(device_channel, cloud_lm.tokenizer, prompt_ids, config)
        await asyncio.wait_for(cloud, 60)
        await cloud_channel.close()
        return report
    spec = SpecConfig(**{**config.to_json(), **METHODS[method]})
    report, _ = await run_pair(
        device_lm=device_lm, cloud_lm=cloud_lm, prompt_ids=prompt_ids, config=spec, link=link
    )
    return report


def aggregate(runs: list[dict]) -> dict:
    """Mean over prompts; throughput as total tokens / total time."""
    keys = [k for k, v in runs[0]["summary"].items() if isinstance(v, int | float)]
    agg = {k: statistics.fmean(r["summary"][k] for r in runs) for k in keys}
    tokens = sum(r["summary"]["tokens"] for r in runs)
    agg["throughput_tok_s"] = tokens / sum(r["total_s"] for r in runs)
    agg["tokens"] = tokens
    return agg


def predicted(row: dict, rate_mbit: float, gamma: int) -> dict | None:
    """PicoSpec Eq. 7 / 9 for one aggregated speculative row, from its own measurements."""
    method = METHODS[row["method"]]
    if method is None or not row["verdicts"]:
        return None
    alpha = min(row["acceptance_rate"], 0.999)
    bytes_per_verdict = (row["uplink_bytes_per_token"] + row["downlink_bytes_per_token"]) * (
        row["tokens"] / max(1.0, row["verdicts"] * row["n_runs"])
    )
    t_rtt = row["rtt_ms"] / 1e3 + 8 * bytes_per_verdict / (rate_mbit * 1e6)
    t_draft, t_verify = row["t_draft_ms"] / 1e3, row["t_verify_ms"] / 1e3
    if method["pipeline"] == "sync":
        rate = theory.sync_throughput(alpha, gamma, t_draft, t_rtt, t_verify)
        step = theory.sync_step_time(t_draft, t_rtt, t_verify)
        tokens_per_step = theory.expected_tokens(alpha, gamma, bonus=True)
    else:
        rate = theory.async_throughput(alpha, gamma, t_draft, t_rtt, t_verify)
        step = theory.async_step_time(alpha, gamma, t_draft, t_rtt, t_verify)
        tokens_per_step = theory.expected_tokens(alpha, gamma)
    measured = 1e3 / row["tpot_ms"] if row["tpot_ms"] else 0.0
    return {
        "regime": row["regime"],
        "method": row["method"],
        "rtt_ms": row["rtt_ms"],
        "alpha": alpha,
        "t_rtt_ms": 1e3 * t_rtt,
        "predicted_step_ms": 1e3 * step,
        "measured_step_ms": row["tpot_ms"] * tokens_per_step,
        "predicted_tok_s": rate,
        "measured_tok_s": measured,
    }


def run(
    *,
    out: Path = RESULTS,
    quick: bool = False,
    regimes: tuple[str, ...] = ("emulated", "emulated-high", "fast-cloud", "cpu"),
    rtts: tuple[float, ...] = (0, 50, 100, 200),
    methods: tuple[str, ...] = tuple(METHODS),
    num_prompts: int | None = None,
    max_new_tokens: int | None = None,
    draft_len: int = 4,
    rate_mbit: float = 100.0,
    sqs: bool = True,
    cpus: dict[str, list[int]] | None = None,
) -> dict:
    """Run every part (see the module docstring), save spec.json / spec.png, print tables.
    `cpus`: each side's cores (default `tandem.testbed.cpus.role_cpus()`)."""
    import torch

    from tandem.testbed.cpus import role_cpus

    torch.set_num_threads(1)
    console = Console()
    machines = Machines(cpus=cpus or role_cpus(), isolation=ISOLATION, shared=SHARED)
    prompts = PROMPTS[: num_prompts or (1 if quick else len(PROMPTS))]
    n = max_new_tokens or (12 if quick else 32)
    config = SpecConfig(temperature=0.0, max_new_tokens=n, stop_at_eos=False, draft_len=draft_len)
    models: dict = {}
    rows, runs, sqs_rows, lengths, sep_tv = [], [], [], [], []
    started = time.perf_counter()
    lengths_regime = next((r for r in ("emulated", "emulated-high") if r in regimes), regimes[0])
    sqs_regime = next((r for r in ("cpu", "fast-cloud", "tiny") if r in regimes), None)
    for regime in regimes:
        device_lm, cloud_lm = load_models(regime, models, machines.cpus)
        machines.observed[regime] = {"device": device_lm.observed(), "cloud": cloud_lm.observed()}
        prompt_ids = [device_lm.tokenizer.encode(p) for p in prompts]
        warm = SpecConfig(**{**config.to_json(), "max_new_tokens": 4})
        for method in ("cloud-ar", "picospec"):  # warm-up, discarded
            event_loop.run(_one(method, device_lm, cloud_lm, prompt_ids[0], 0, warm, rate_mbit))
        regime_runs: dict[tuple[str, float], list[dict]] = {}
        for rtt in rtts:  # methods side by side at each RTT
            for ids in prompt_ids:
                for method in methods:
                    report = event_loop.run(
                        _one(method, device_lm, cloud_lm, ids, rtt, config, rate_mbit)
                    )
                    record = {"regime": regime, "method": method, "rtt_ms": rtt, **_record(report)}
                    runs.append(record)
                    regime_runs.setdefault((method, rtt), []).append(record)
                    console.log(
                        f"{regime} {method:>15} rtt {rtt:>5.0f} ms: "
                        f"{record['summary']['throughput_tok_s']:.2f} tok/s"
                    )
        for (method, rtt), group in regime_runs.items():
            rows.append(
                {
                    "regime": regime,
                    "method": method,
                    "rtt_ms": rtt,
                    "n_runs": len(group),
                    **aggregate(group),
                }
            )
        if regime == lengths_regime:
            lengths = _draft_lengths(
                regime, device_lm, cloud_lm, prompt_ids, config, rate_mbit, console, quick
            )
        if sqs and regime == sqs_regime:
            sqs_rows = _sqs(device_lm, cloud_lm, prompt_ids, regime_runs, rtts, console, sep_tv)
        later = {name for r in regimes[regimes.index(regime) + 1 :] for name in REGIMES[r]}
        for key in [key for key in models if key[1] not in later]:  # free (1.5B: ~7 GB)
            models.pop(key).close()
        del device_lm, cloud_lm
        gc.collect()
    theory_rows = [p for r in rows if (p := predicted(r, rate_mbit, draft_len))]
    headline = _headline(rows, regimes, rtts)
    payload = {
        "setup": {
            "link": f"in-process LinkConfig emulator, delay RTT/2 each way, {rate_mbit} Mbit/s",
            "prompts": list(prompts),
            "max_new_tokens": n,
            "draft_len": draft_len,
            "temperature": 0.0,
            "regimes": {r: REGIMES[r] for r in regimes},
            "wall_s": time.perf_counter() - started,
        },
        "headline": headline,
        "table": rows,
        "draft_length": lengths,
        "sqs": sqs_rows,
        "sqs_tuned": spec_sqs.tuned(sqs_rows) if sqs_rows else None,
        "separate_tv": sep_tv,
        "theory": theory_rows,
        "runs": runs,
    }
    save_json(out, "spec", payload, machines=machines)
    _print(console, rows, lengths, sqs_rows, sep_tv, theory_rows, rtts, regimes, methods)
    for line in headline:
        console.print(line)
    _plot(out, rows, lengths, sqs_rows, theory_rows, regimes, methods)
    return payload


async def _one(method, device_lm, cloud_lm, ids, rtt, config, rate_mbit):
    return await run_method(
        method, device_lm=device_lm, cloud_lm=cloud_lm, prompt_ids=ids, rtt_ms=rtt,
        config=config, rate_mbit=rate_mbit,
    )  # fmt: skip


def _record(report) -> dict:
    return {
        "summary": report.summary(),
        "total_s": report.total_s,
        "tokens": report.tokens,
        "chunk_sizes": report.chunk_sizes,
        "cloud": {k: v for k, v in report.cloud.items() if k != "verify_s"},
    }


def _headline(rows, regimes, rtts) -> list[str]:
    """The issue's targets, measured: PicoSpec vs stop-and-wait, and its RTT retention."""
    lines = []
    for regime in regimes:
        by = {
            (r["method"], r["rtt_ms"]): r["throughput_tok_s"] for r in rows if r["regime"] == regime
        }
        for rtt in rtts:
            full = by.get(("picospec", rtt))
            if full is None:
                continue
            parts = [
                f"{full / by[(base, rtt)]:.2f}x {base}"
                for base in ("w/o para-draft", "vanilla-sd", "cloud-ar")
                if by.get((base, rtt))
            ]
            lines.append(f"{regime} RTT {rtt:.0f} ms: picospec = " + ", ".join(parts))
        if by.get(("picospec", rtts[0])) and by.get(("picospec", rtts[-1])):
            kept = by[("picospec", rtts[-1])] / by[("picospec", rtts[0])]
            lines.append(
                f"{regime}: picospec at RTT {rtts[-1]:.0f} ms keeps {kept:.0%} of RTT {rtts[0]:.0f} ms"
            )
    return lines


def _draft_lengths(regime, device_lm, cloud_lm, prompt_ids, config, rate_mbit, console, quick):
    rows = []
    for gamma in (3, 4, 5, 6):
        cfg = SpecConfig(**{**config.to_json(), "draft_len": gamma})
        group = []
        for ids in prompt_ids:
            report = event_loop.run(_one("picospec", device_lm, cloud_lm, ids, 100, cfg, rate_mbit))
            group.append({"summary": report.summary(), "total_s": report.total_s})
        rows.append({"regime": regime, "draft_len": gamma, "rtt_ms": 100, **aggregate(group)})
        console.log(
            f"{regime} picospec draft_len {gamma}: {rows[-1]['throughput_tok_s']:.2f} tok/s"
        )
    return rows


def _sqs(device_lm, cloud_lm, prompt_ids, regime_runs, rtts, console, separate_tv) -> list[dict]:
    """The SQS sweep on prompt + target greedy continuation (the cloud-AR outputs)."""
    ar_runs = regime_runs.get(("cloud-ar", rtts[0]), [])
    sequences = [(ids, run["tokens"]) for ids, run in zip(prompt_ids, ar_runs, strict=False)]
    if not sequences:
        return []
    spec_runs = [r for (m, _), group in regime_runs.items() if METHODS[m] for r in group]
    timing = spec_sqs.Timing(
        draft_token_s=statistics.fmean(r["summary"]["t_draft_token_ms"] for r in spec_runs) / 1e3,
        verify_s=statistics.fmean(r["summary"]["t_verify_ms"] for r in spec_runs) / 1e3,
        rtt_s=SQS_TIMING_RTT_S,
        uplink_mbit=SQS_UPLINK_MBIT,
    )
    console.log("SQS sweep: scoring contexts with both models")
    rows = spec_sqs.score_contexts(device_lm, cloud_lm, sequences)
    separate_tv.extend(spec_sqs.separate_tv(rows))
    return spec_sqs.sweep(rows, budget_bits=SQS_BUDGET_BITS, timing=timing)


def _print(console, rows, lengths, sqs_rows, sep_tv, theory_rows, rtts, regimes, methods):
    for regime in regimes:
        table = Table(title=f"PicoSpec Table 1/2 analogue, regime {regime} (tok/s; x cloud-AR)")
        table.add_column("method")
        for rtt in rtts:
            table.add_column(f"RTT {rtt:.0f} ms", justify="right")
        table.add_column("acc. len", justify="right")
        table.add_column("T_draft / T_verify ms", justify="right")
        table.add_column("up / down B/tok", justify="right")
        by = {(r["method"], r["rtt_ms"]): r for r in rows if r["regime"] == regime}
        for method in methods:
            cells = []
            for rtt in rtts:
                row, ar = by.get((method, rtt)), by.get(("cloud-ar", rtt))
                if row is None:
                    cells.append("-")
                    continue
                ratio = row["throughput_tok_s"] / ar["throughput_tok_s"] if ar else float("nan")
                cells.append(f"{row['throughput_tok_s']:.2f} ({ratio:.2f}x)")
            last = by.get((method, rtts[-1]))
            table.add_row(
                method,
                *cells,
                f"{last['accepted_len_incl_bonus']:.2f}" if last else "-",
                f"{last['t_draft_ms']:.0f} / {last['t_verify_ms']:.0f}" if last else "-",
                f"{last['uplink_bytes_per_token']:.0f} / {last['downlink_bytes_per_token']:.0f}"
                if last
                else "-",
            )
        console.print(table)
    if lengths:
        table = Table(title="PicoSpec Table 4 analogue: draft length (RTT 100 ms)")
        for col in (
            "draft len",
            "tok/s",
            "acc. len",
            "TTFT ms",
            "TPOT ms",
            "T_verify ms",
            "T_draft ms",
        ):
            table.add_column(col, justify="right")
        for r in lengths:
            table.add_row(
                str(r["draft_len"]), f"{r['throughput_tok_s']:.2f}", f"{r['accepted_len_incl_bonus']:.2f}",
                f"{r['ttft_ms']:.0f}", f"{r['tpot_ms']:.0f}", f"{r['t_verify_ms']:.0f}", f"{r['t_draft_ms']:.0f}",
            )  # fmt: skip
        console.print(table)
    if sqs_rows:
        table = Table(title="SQS-SD Fig. 2 analogue (B = 5000 bits)")
        for col in (
            "codec",
            "T",
            "bits/draft",
            "formula",
            "L/batch",
            "reject/pos",
            "resample/batch",
            "ms/token",
        ):
            table.add_column(col, justify="right")
        for r in sqs_rows:
            table.add_row(
                r["label"], f"{r['temperature']:.2f}", f"{r['bits_per_draft']:.0f}",
                f"{r['formula_bits_per_draft']:.0f}", f"{r['draft_tokens_per_batch']:.1f}",
                f"{r['rejection_per_position']:.3f}", f"{r['resampling_rate']:.2f}",
                f"{1e3 * r['latency_per_token_s']:.0f}",
            )  # fmt: skip
        console.print(table)
    if sep_tv:
        table = Table(title="Separate rejection: TV(emitted law, target law) vs downlink K")
        table.add_column("T", justify="right")
        ks = sorted({r["k"] for r in sep_tv})
        for k in ks:
            table.add_column(f"K={k}", justify="right")
        for temperature in sorted({r["temperature"] for r in sep_tv}):
            cells = {r["k"]: r["tv"] for r in sep_tv if r["temperature"] == temperature}
            table.add_row(f"{temperature:.2f}", *(f"{cells[k]:.4f}" for k in ks))
        console.print(table)
    if theory_rows:
        table = Table(title="PicoSpec Eq. 7/9: predicted vs measured")
        for col in (
            "regime",
            "method",
            "RTT",
            "alpha",
            "step pred ms",
            "step meas ms",
            "tok/s pred",
            "tok/s meas",
        ):
            table.add_column(col, justify="right")
        for r in theory_rows:
            table.add_row(
                r["regime"], r["method"], f"{r['rtt_ms']:.0f}", f"{r['alpha']:.2f}",
                f"{r['predicted_step_ms']:.0f}", f"{r['measured_step_ms']:.0f}",
                f"{r['predicted_tok_s']:.2f}", f"{r['measured_tok_s']:.2f}",
            )  # fmt: skip
        console.print(table)


def _plot(out, rows, lengths, sqs_rows, theory_rows, regimes, methods) -> None:
    ncols = max(4, len(regimes))
    fig, axes = new_figure(ncols=ncols, nrows=2, size=(5.0, 4.0))
    for i, ax in enumerate(axes[0]):
        if i >= len(regimes):
            ax.axis("off")
            continue
        regime = regimes[i]
        for method in methods:
            pts = sorted(
                (r["rtt_ms"], r["throughput_tok_s"])
                for r in rows
                if r["regime"] == regime and r["method"] == method
            )
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=method)
        ax.set(title=f"{regime}: throughput vs RTT", xlabel="RTT (ms)", ylabel="tokens/s")
        ax.legend(fontsize=7)
    for ax in axes[1][4:]:
        ax.axis("off")
    ax = axes[1][0]
    if lengths:
        ax.plot(
            [r["draft_len"] for r in lengths],
            [r["throughput_tok_s"] for r in lengths],
            marker="o",
            label="tok/s",
        )
        ax.plot(
            [r["draft_len"] for r in lengths],
            [r["accepted_len_incl_bonus"] for r in lengths],
            marker="s",
            label="accepted length",
        )
        regime = lengths[0]["regime"]
        ax.set(title=f"{regime}: PicoSpec vs draft length (RTT 100 ms)", xlabel="draft length")
        ax.legend(fontsize=7)
    if sqs_rows:
        ax = axes[1][1]
        for label in dict.fromkeys(r["label"] for r in sqs_rows):
            pts = [
                (r["temperature"], r["rejection_per_position"])
                for r in sqs_rows
                if r["label"] == label
            ]
            ax.plot(*zip(*pts, strict=True), marker="o", label=label)
        ax.set(
            title="SQS: rejection per position vs T", xlabel="temperature", ylabel="rejection prob."
        )
        ax.legend(fontsize=6)
        ax = axes[1][2]
        at = [r for r in sqs_rows if r["temperature"] == 1.0 and r["label"] != "dense"]
        xs = range(len(at))
        ax.bar([x - 0.2 for x in xs], [r["bits_per_draft"] for r in at], 0.4, label="measured")
        ax.bar(
            [x + 0.2 for x in xs], [r["formula_bits_per_draft"] for r in at], 0.4, label="formula"
        )
        ax.set_xticks(list(xs), [r["label"] for r in at], rotation=45, fontsize=6, ha="right")
        ax.set(title="SQS bits per draft token (T = 1)", ylabel="bits")
        ax.legend(fontsize=7)
    ax = axes[1][3]
    if theory_rows:
        xs = [r["predicted_tok_s"] for r in theory_rows]
        ys = [r["measured_tok_s"] for r in theory_rows]
        ax.scatter(xs, ys, s=12)
        top = max(xs + ys) * 1.1
        ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
        ax.set(title="PicoSpec Eq. 7/9", xlabel="predicted tok/s", ylabel="measured tok/s")
    save_png(fig, out, "spec")
