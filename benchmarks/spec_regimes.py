"""`tandem bench spec-regimes`: where PicoSpec's pipeline pays, on the timing-emulated pair.

The issue's two speed targets depend on the regime more than on the code: "async >= 1.7x its
stop-and-wait at RTT >= 100 ms" and "throughput at RTT 200 ms >= 85% of RTT 0 when drafting
covers RTT + verify". This bench maps them over the two knobs that decide them, with the
protocol, link and timings otherwise fixed:

- *agreement*: how often the draft model's greedy token equals the target's. `mix` of
  `spec_emulated.paper_pair` (0.8 ~ PicoSpec's Qwen pair, 0.95 ~ its Llama pair, 1.0 = always);
  the table reports the measured acceptance rate next to it.
- *draft step*: 24 ms per token (PicoSpec's Jetson; a 4-token block takes 96 ms, less than
  RTT + T_verify at RTT >= 50 ms) or 100 ms (a slow device: a block takes 400 ms, which covers
  RTT 200 ms + T_verify ~90 ms: the condition of the second target).

Both sides are `SleepLM`s (forward passes sleep for the stated times; no CPU contention), in
one process over `memory_pair` with the in-process link emulator (delay RTT/2 each way,
100 Mbit/s); each side's model calls run on its own cores like `tandem bench spec`'s
(`--device-cpus`, `--cloud-cpus`; sleeping needs none, the protocol around it does). Methods, side by side at each setting: PicoSpec (async, fast verification,
separate rejection) and its stop-and-wait (sync, separate rejection), draft length 4, greedy.
Throughput = tokens / total time (TTFT included, as in `tandem bench spec`); `decode` =
tokens after the first / time after the first token. One warm-up run per setting, discarded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks import RESULTS
from benchmarks.report import Machines, new_figure, save_json, save_png
from benchmarks.spec import ISOLATION, PROMPTS, SHARED, aggregate, run_method
from benchmarks.spec_emulated import paper_pair
from tandem.protocols.spec import SpecConfig
from tandem.transport import loop as event_loop

PAIR = ("picospec", "w/o para-draft")  # async vs its own stop-and-wait (benchmarks.spec)


@dataclass(frozen=True)
class Setting:
    mix: float  # draft/target logit mix (agreement)
    draft_ms: float  # one draft step

    @property
    def label(self) -> str:
        return f"mix {self.mix:g}, draft {self.draft_ms:g} ms/token"


SETTINGS = (
    Setting(0.8, 24),
    Setting(0.95, 24),
    Setting(0.98, 24),
    Setting(1.0, 24),
    Setting(0.95, 100),
    Setting(1.0, 100),
)


def decode_rate(summary: dict, total_s: float) -> float:
    """Tokens after the first per second after the first token (TTFT excluded)."""
    tokens, ttft = summary["tokens"], summary["ttft_ms"] / 1e3
    return (tokens - 1) / max(1e-9, total_s - ttft)


def ratios(rows: list[dict], rtts: tuple[float, ...]) -> list[dict]:
    """Per setting: async / sync at each RTT, and async's RTT retention (last RTT / first)."""
    out = []
    for label in dict.fromkeys(r["setting"] for r in rows):
        by = {(r["method"], r["rtt_ms"]): r for r in rows if r["setting"] == label}
        entry = {"setting": label, "speedup": {}, "decode_speedup": {}}
        for rtt in rtts:
            fast, slow = by[(PAIR[0], rtt)], by[(PAIR[1], rtt)]
            entry["speedup"][rtt] = fast["throughput_tok_s"] / slow["throughput_tok_s"]
            entry["decode_speedup"][rtt] = fast["decode_tok_s"] / slow["decode_tok_s"]
        first, last = by[(PAIR[0], rtts[0])], by[(PAIR[0], rtts[-1])]
        entry["retention"] = last["throughput_tok_s"] / first["throughput_tok_s"]
        entry["decode_retention"] = last["decode_tok_s"] / first["decode_tok_s"]
        entry["acceptance_rate"] = first["acceptance_rate"]
        out.append(entry)
    return out


def run(
    *,
    out: Path = RESULTS,
    quick: bool = False,
    settings: tuple[Setting, ...] = SETTINGS,
    rtts: tuple[float, ...] = (0, 100, 200),
    num_prompts: int | None = None,
    max_new_tokens: int | None = None,
    rate_mbit: float = 100.0,
    cpus: dict[str, list[int]] | None = None,
) -> dict:
    """Run the map (module docstring); save spec_regimes.json / .png; print the tables.
    `cpus`: each side's cores (default `tandem.testbed.cpus.role_cpus()`)."""
    from tandem.testbed.cpus import role_cpus
    from tandem.testbed.pinned import pinned

    console = Console()
    machines = Machines(cpus=cpus or role_cpus(), isolation=ISOLATION, shared=SHARED)
    prompts = PROMPTS[: num_prompts or (1 if quick else 2)]
    n = max_new_tokens or (16 if quick else 96)
    config = SpecConfig(temperature=0.0, max_new_tokens=n, stop_at_eos=False, draft_len=4)
    warm = SpecConfig(**{**config.to_json(), "max_new_tokens": 4})
    rows, started = [], time.perf_counter()
    total = len(settings) * len(rtts) * len(prompts) * len(PAIR)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("spec regimes", total=total)
        for index, setting in enumerate(settings):
            pair = paper_pair(setting.mix, f"-map{index}", setting.draft_ms / 1e3)
            with pinned(dict(zip(("device", "cloud"), pair, strict=True)), machines.cpus,
                        machines.observed) as sides:  # fmt: skip
                ids = [sides["device"].tokenizer.encode(p) for p in prompts]
                models = {"device_lm": sides["device"], "cloud_lm": sides["cloud"],
                          "rate_mbit": rate_mbit}  # fmt: skip
                event_loop.run(
                    run_method(PAIR[0], prompt_ids=ids[0], rtt_ms=0, config=warm, **models)
                )
                for rtt in rtts:
                    for method in PAIR:
                        group = []
                        for prompt_ids in ids:
                            report = event_loop.run(
                                run_method(method, prompt_ids=prompt_ids, rtt_ms=rtt,
                                           config=config, **models)
                            )  # fmt: skip
                            group.append({"summary": report.summary(), "total_s": report.total_s})
                            progress.advance(bar)
                        row = aggregate(group)
                        row["decode_tok_s"] = sum(
                            decode_rate(g["summary"], g["total_s"]) for g in group
                        ) / len(group)
                        rows.append(
                            {"setting": setting.label, "mix": setting.mix,
                             "draft_ms": setting.draft_ms, "method": method, "rtt_ms": rtt, **row}
                        )  # fmt: skip
    summary = ratios(rows, rtts)
    payload = {
        "setup": {
            "pair": "benchmarks.spec_emulated.paper_pair: target 70 + 4n ms per pass, "
            "prefill 120 ms; draft `draft_ms` per token",
            "link": f"in-process LinkConfig emulator, delay RTT/2 each way, {rate_mbit} Mbit/s",
            "methods": {"async": PAIR[0], "stop-and-wait": PAIR[1]},
            "prompts": list(prompts),
            "max_new_tokens": n,
            "draft_len": 4,
            "wall_s": time.perf_counter() - started,
        },
        "summary": summary,
        "rows": rows,
    }
    save_json(out, "spec_regimes", payload, machines=machines)
    _print(console, summary, rows, rtts)
    _plot(out, summary, rtts)
    return payload


def _print(console, summary, rows, rtts) -> None:
    table = Table(title="PicoSpec async vs its stop-and-wait, by regime (tok/s, TTFT included)")
    table.add_column("setting")
    table.add_column("acceptance", justify="right")
    for rtt in rtts:
        table.add_column(f"RTT {rtt:.0f}: async / s&w", justify="right")
    table.add_column(f"async RTT {rtts[-1]:.0f} / {rtts[0]:.0f}", justify="right")
    by = {(r["setting"], r["method"], r["rtt_ms"]): r for r in rows}
    for entry in summary:
        label = entry["setting"]
        cells = [
            f"{by[(label, PAIR[0], rtt)]['throughput_tok_s']:.2f} / "
            f"{by[(label, PAIR[1], rtt)]['throughput_tok_s']:.2f} "
            f"({entry['speedup'][rtt]:.2f}x)"
            for rtt in rtts
        ]
        table.add_row(label, f"{entry['acceptance_rate']:.2f}", *cells, f"{entry['retention']:.0%}")
    console.print(table)


def _plot(out, summary, rtts) -> None:
    fig, grid = new_figure(ncols=2, size=(6.0, 4.0))
    axes = grid[0]
    for entry in summary:
        axes[0].plot(
            list(rtts), [entry["speedup"][r] for r in rtts], marker="o", label=entry["setting"]
        )
    axes[0].axhline(1.7, color="grey", linestyle="--", linewidth=0.8)
    axes[0].set(title="async / stop-and-wait", xlabel="RTT (ms)", ylabel="throughput ratio")
    axes[0].legend(fontsize=6)
    labels = [e["setting"] for e in summary]
    axes[1].barh(range(len(labels)), [e["retention"] for e in summary])
    axes[1].axvline(0.85, color="grey", linestyle="--", linewidth=0.8)
    axes[1].set_yticks(list(range(len(labels))), labels, fontsize=6)
    axes[1].set(title=f"async: RTT {rtts[-1]:.0f} ms / RTT {rtts[0]:.0f} ms", xlabel="ratio")
    save_png(fig, out, "spec_regimes")
