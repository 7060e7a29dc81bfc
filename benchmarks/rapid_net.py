"""`tandem bench rapid-net`: RAPID split between device and cloud, over the emulated link.

`tandem bench rapid` runs RAPID on one machine. Here the RAG drafter (with C^S) is the device
and the long-context target (with C) is the cloud, over `tandem.protocols.rapid.edge`: one
VerifyRequest / VerifyResult round trip per drafted block (gamma drafts, top-k 64 draft laws
up). The two sides run in one process, joined by `memory_pair` through the in-process link
emulator (delay RTT/2 each way, `rate_mbit` each way); each side has its own instance of the
same Qwen2.5-Coder-0.5B weights (self-speculation) whose calls run on that side's cores
(`tandem.testbed.pinned`: `--device-cpus`, `--cloud-cpus`, one engine thread per core). The
event loop, sampling, codecs and the link emulator are not pinned (the JSON's `machines`).

Methods, side by side at each RTT, on the `quote` tasks of the offline long-context set
(`tandem.protocols.rapid.tasks`, long answers):
  rapid-edge   device drafts on C^S, cloud verifies on C (exact mode, eta, T = 0.1)
  lc-cloud     the cloud generates on C and streams every token (the device sends the prompt;
               `tandem.baselines.spec_baselines` cloud AR): what a device without a model gets
Once, as references without a network, on the device's cores: `rapid-local` (both in one
engine) and `lc-local`.
Decode throughput = tokens after the first / time after the first token (TTFT excluded, as the
paper's speedup); e2e = tokens / total time. A short warm-up generation first, discarded.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import RESULTS
from benchmarks.report import Machines, new_figure, save_json, save_png
from tandem.errors import TandemError
from tandem.transport import LinkConfig, memory_pair
from tandem.transport import loop as event_loop

ISOLATION = "threads: each side's model calls on workers pinned to its set (one process)"
SHARED = ["event loop, sampling, codecs and the in-process link emulator (not pinned)"]


async def _edge(device_lm, cloud_lm, task, retrieved: str, config, link: LinkConfig):
    from tandem.protocols.rapid.edge import cloud_session, device_generate

    device_channel, cloud_channel = memory_pair(link=link)
    cloud = asyncio.create_task(cloud_session(cloud_channel, cloud_lm, task.context))
    try:
        return await device_generate(device_channel, device_lm, retrieved, task.question, config)
    finally:
        await device_channel.close()
        await asyncio.wait_for(cloud, 60)
        await cloud_channel.close()


def _lc_cloud(device_lm, cloud_lm, prompt_ids: list[int], config, rtt_ms: float, rate_mbit):
    """The cloud generates on C and streams every token: `tandem bench spec`'s cloud AR."""
    from benchmarks.spec import run_method
    from tandem.protocols.spec import SpecConfig

    spec = SpecConfig(
        temperature=config.temperature,
        max_new_tokens=config.max_new_tokens,
        seed=config.seed,
        stop_at_eos=config.stop_at_eos,
    )
    return run_method(
        "cloud-ar", device_lm=device_lm, cloud_lm=cloud_lm, prompt_ids=prompt_ids, rtt_ms=rtt_ms,
        config=spec, rate_mbit=rate_mbit,
    )  # fmt: skip


def edge_row(method: str, rtt: float, task, result) -> dict:
    """A row from a `RapidResult` (rapid-edge, rapid-local, lc-local)."""
    tokens = len(result.tokens)
    return {
        "method": method, "rtt_ms": rtt, "task": task.task_id, "tokens": tokens,
        "quality": task.score(result.text), "ttft_s": result.prefill_s,
        "decode_s": result.decode_s, "total_s": result.prefill_s + result.decode_s,
        "acceptance": result.accepted / result.drafted if result.drafted else None,
        "uplink_bytes": result.extra.get("uplink_bytes"),
        "downlink_bytes": result.extra.get("downlink_bytes"),
    }  # fmt: skip


def ar_row(rtt: float, task, report) -> dict:
    """A row from the cloud-AR baseline's `SpecReport`."""
    summary = report.summary()
    ttft = summary["ttft_ms"] / 1e3
    return {
        "method": "lc-cloud", "rtt_ms": rtt, "task": task.task_id, "tokens": len(report.tokens),
        "quality": task.score(report.text), "ttft_s": ttft, "decode_s": report.total_s - ttft,
        "total_s": report.total_s, "acceptance": None,
        "uplink_bytes": report.uplink_bytes, "downlink_bytes": report.downlink_bytes,
    }  # fmt: skip


def aggregate(rows: list[dict]) -> list[dict]:
    """Per (method, RTT): decode and e2e throughput over all its tasks, mean quality."""
    out = []
    for key in dict.fromkeys((r["method"], r["rtt_ms"]) for r in rows):
        group = [r for r in rows if (r["method"], r["rtt_ms"]) == key]
        tokens = sum(r["tokens"] for r in group)
        accepted = [r["acceptance"] for r in group if r["acceptance"] is not None]
        out.append(
            {"method": key[0], "rtt_ms": key[1], "tasks": len(group), "tokens": tokens,
             "decode_tok_s": sum(r["tokens"] - 1 for r in group) / sum(r["decode_s"] for r in group),
             "e2e_tok_s": tokens / sum(r["total_s"] for r in group),
             "ttft_s": sum(r["ttft_s"] for r in group) / len(group),
             "quality": sum(r["quality"] for r in group) / len(group),
             "acceptance": sum(accepted) / len(accepted) if accepted else None}
        )  # fmt: skip
    return out


def run(
    *,
    out: Path = RESULTS,
    rtts: tuple[float, ...] = (0, 100, 200),
    context_tokens: int = 1024,
    num_tasks: int = 2,
    max_new_tokens: int = 32,
    gamma: int = 5,
    eta: float = 10.0,
    rate_mbit: float = 100.0,
    model: str = "qwen2.5-coder-0.5b",
    cpus: dict[str, list[int]] | None = None,
) -> dict:
    """Run the bench (module docstring); save rapid_net.json / .png. `cpus`: each side's cores
    (default `tandem.testbed.cpus.role_cpus()`)."""
    import torch

    from tandem.models.registry import load_model
    from tandem.testbed.cpus import role_cpus
    from tandem.testbed.pinned import pinned

    torch.set_num_threads(1)
    machines = Machines(cpus=cpus or role_cpus(), isolation=ISOLATION, shared=SHARED)
    models = {
        role: load_model(model, progress=False, threads=len(cores))
        for role, cores in machines.cpus.items()
    }
    with pinned(models, machines.cpus, machines.observed) as sides:
        payload = _measure(
            sides["device"], sides["cloud"], rtts=rtts, context_tokens=context_tokens,
            num_tasks=num_tasks, max_new_tokens=max_new_tokens, gamma=gamma, eta=eta,
            rate_mbit=rate_mbit, model=model,
        )  # fmt: skip
    save_json(out, "rapid_net", payload, machines=machines)
    _print(Console(), payload["table"])
    _plot(out, payload["table"])
    return payload


def _measure(
    device_lm, cloud_lm, *, rtts, context_tokens, num_tasks, max_new_tokens, gamma, eta,
    rate_mbit, model,
) -> dict:  # fmt: skip
    """Every method on every task at every RTT: the payload of rapid_net.json."""
    from tandem.baselines.rapid_baselines import lc
    from tandem.protocols.rapid.config import RapidConfig, RetrievalConfig
    from tandem.protocols.rapid.engine import rapid
    from tandem.protocols.rapid.prompts import drafter_prompt, target_prompt
    from tandem.protocols.rapid.retrieval import retrieve
    from tandem.protocols.rapid.states import Prefilled
    from tandem.protocols.rapid.tasks import build_tasks
    from tandem.retrieval.embedder import load_embedder

    console = Console()
    lm = device_lm  # the tokenizer, and the engine of the local references
    embedder = load_embedder("all-minilm-l6-v2")
    retrieval = RetrievalConfig(chunk_tokens=256, min_tokens=512)  # as `tandem bench rapid`
    config = RapidConfig(gamma=gamma, eta=eta, temperature=0.1, max_new_tokens=max_new_tokens)
    tasks = build_tasks(
        lm.tokenizer, context_tokens=context_tokens, num_tasks=num_tasks, kinds=("quote",)
    )
    if not tasks:
        raise TandemError(f"no quote task fits a {context_tokens}-token context; ask for more")
    rows, started = [], time.perf_counter()
    warm = RapidConfig(gamma=gamma, eta=eta, temperature=0.1, max_new_tokens=3)
    for index, task in enumerate(tasks):
        retrieved = retrieve(task.context, task.question, lm.tokenizer, embedder, retrieval).text
        target_ids = target_prompt(lm.tokenizer, task.context, task.question)
        if index == 0:  # warm-up, discarded
            event_loop.run(_edge(device_lm, cloud_lm, task, retrieved, warm, LinkConfig()))
        target = Prefilled(lm, target_ids)
        drafter = Prefilled(lm, drafter_prompt(lm.tokenizer, retrieved, task.question))
        for method, result in (("rapid-local", rapid(target, drafter, config)),
                               ("lc-local", lc(target, config))):  # fmt: skip
            rows.append(edge_row(method, -1.0, task, result))
        for rtt in rtts:
            link = LinkConfig(delay_ms=rtt / 2, rate_mbit=rate_mbit)
            edge = _edge(device_lm, cloud_lm, task, retrieved, config, link)
            rows.append(edge_row("rapid-edge", rtt, task, event_loop.run(edge)))
            lc_cloud = _lc_cloud(device_lm, cloud_lm, target_ids, config, rtt, rate_mbit)
            rows.append(ar_row(rtt, task, event_loop.run(lc_cloud)))
            console.log(
                f"{task.task_id} RTT {rtt:.0f} ms: rapid-edge "
                f"{rows[-2]['tokens'] / rows[-2]['total_s']:.2f} tok/s, lc-cloud "
                f"{rows[-1]['tokens'] / rows[-1]['total_s']:.2f} tok/s (e2e)"
            )
    return {
        "setup": {
            "model": model, "context_tokens": context_tokens, "tasks": [t.task_id for t in tasks],
            "gamma": gamma, "eta": eta, "temperature": 0.1, "mode": "exact",
            "max_new_tokens": max_new_tokens, "codec": "top-k 64",
            "link": f"in-process LinkConfig emulator, delay RTT/2 each way, {rate_mbit} Mbit/s",
            "wall_s": time.perf_counter() - started,
        },
        "table": aggregate(rows),
        "rows": rows,
    }  # fmt: skip


def _print(console: Console, table_rows: list[dict]) -> None:
    table = Table(title="RAPID edge-cloud over the emulated link (RTT -1 = local, no network)")
    for column in ("method", "RTT ms", "decode tok/s", "e2e tok/s", "TTFT s", "quality", "acc."):
        table.add_column(column, justify="right")
    for r in table_rows:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        table.add_row(r["method"], f"{r['rtt_ms']:.0f}", f"{r['decode_tok_s']:.2f}",
                      f"{r['e2e_tok_s']:.2f}", f"{r['ttft_s']:.1f}", f"{r['quality']:.2f}", acc)  # fmt: skip
    console.print(table)


def _plot(out: Path, table_rows: list[dict]) -> None:
    fig, axes = new_figure()
    ax = axes[0][0]
    for method in ("rapid-edge", "lc-cloud"):
        pts = sorted((r["rtt_ms"], r["decode_tok_s"]) for r in table_rows if r["method"] == method)
        ax.plot(*zip(*pts, strict=True), marker="o", label=method)
    for method, style in (("rapid-local", ":"), ("lc-local", "--")):
        local = [r["decode_tok_s"] for r in table_rows if r["method"] == method]
        if local:
            ax.axhline(local[0], linestyle=style, color="grey", label=f"{method} (no network)")
    ax.set(title="RAPID split over the link", xlabel="RTT (ms)", ylabel="decode tokens/s")
    ax.legend(fontsize=7)
    save_png(fig, out, "rapid_net")
