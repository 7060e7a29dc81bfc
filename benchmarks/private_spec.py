"""`tandem bench private-spec`: private-RAG speculative decoding against DRAGON and the
one-sided methods, on questions that need both private and public knowledge.

What runs: for each RTT, the cloud is `tandem cloud serve --corpus stdlib` (the 1.5B target and
the public corpus) on its own core, behind the project's delay proxy on a loopback `tandem
net` of its own (RTT/2 each way; `benchmarks.humaneval.NetCloud`); this process is the device
(the 0.5B and the private notes) on the other core. Per question the methods run side by side,
greedy, same budget; a warm-up question goes first and is discarded.

Methods (`METHODS`):
- *device-rag*: the device model alone on its private chunks (no network);
- *cloud-rag*: the cloud model alone on its public chunks, tokens streamed down (the chunks
  are retrieved here from the same stdlib index and the cloud's AR mode decodes that prompt:
  the cloud retrieving by itself would send the same prompt);
- *picospec*: PicoSpec's async pipeline without private retrieval: the device drafts from the
  question alone, the cloud verifies with its public chunks, eta = 0 (exact: the cloud-rag
  answer, at speculative speed);
- *dragon*: DRAGON (device: private chunks on the 0.5B; cloud: public chunks on the cloud's
  model; per-token aggregation);
- *private-spec*: this project's mode (tandem.protocols.private_spec), eta = `eta`.
Accuracy: `benchmarks.private_tasks.score` (a private and a public key in the answer) over
every question at the first RTT (greedy answers do not depend on the link); at the other RTTs
the first `latency_questions` run, for latency.
Latency: per token = (last token time - first token time) / (tokens - 1) from the device's
clock, TTFT separately, totals over all questions (TTFT included) as tokens/s.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import RESULTS, private_tasks
from benchmarks.report import new_figure, save_json, save_png
from tandem.errors import TandemError
from tandem.transport import loop as event_loop

METHODS = ("device-rag", "cloud-rag", "picospec", "dragon", "private-spec")
DEVICE_MODEL = "qwen2.5-coder-0.5b"
CLOUD_MODEL = "qwen2.5-coder-1.5b"
PRIVATE_CORPUS = Path(__file__).resolve().parents[1] / "examples" / "private-notes"
WARMUP_TOKENS = 6


def run(
    *,
    out: Path = RESULTS,
    name: str = "private_spec",
    questions: str = "all",
    methods: tuple[str, ...] = METHODS,
    rtts: tuple[float, ...] = (0.0, 100.0, 200.0),
    max_new_tokens: int = 64,
    docs: int = 3,
    eta: float | None = None,
    latency_questions: int | None = None,
    cores: dict[str, list[int]] | None = None,
) -> dict:
    """Run the bench (module docstring); save `<name>.json` / `.png` under `out`."""
    from benchmarks.humaneval_tasks import parse_selection
    from benchmarks.report import Machines
    from tandem.protocols.private_spec import ETA
    from tandem.testbed import cpus

    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise TandemError(f"unknown method(s) {', '.join(unknown)}; choose from {METHODS}")
    tasks = [private_tasks.TASKS[i] for i in parse_selection(questions, len(private_tasks.TASKS))]
    eta = ETA if eta is None else eta
    console = Console()
    machines = Machines(
        cpus=cores or cpus.role_cpus(),
        isolation="processes: tandem cloud serve pinned from its start; the device is this "
        "process, pinned before its model loads",
        shared=["the delay proxy (the wire, not pinned)"],
    )
    started = time.perf_counter()
    records: list[dict] = []
    with cpus.restored():  # the device is this process, pinned while it runs
        cpus.pin(machines.cpus["device"])
        device = _Device(docs, eta, max_new_tokens)
        for number, rtt in enumerate(rtts):  # accuracy: all at the first RTT; then latency
            subset = tasks if number == 0 or not latency_questions else tasks[:latency_questions]
            records += _one_rtt(device, subset, methods, rtt, machines, console)
        machines.observed["device"] = cpus.machine_state(device.lm)
    table = _aggregate(records, methods, rtts)
    payload = {
        "benchmark": "private_spec",
        "setup": {
            "questions": len(tasks),
            "latency_questions": latency_questions or len(tasks),
            "methods": list(methods),
            "rtts_ms": list(rtts),
            "max_new_tokens": max_new_tokens,
            "temperature": 0.0,
            "docs_per_side": docs,
            "eta": eta,
            "codec": "k-sqs k=3 ell=100 (64 bits per draft token), async pipeline",
            "device_model": DEVICE_MODEL,
            "cloud_model": CLOUD_MODEL,
            "private_corpus": "examples/private-notes",
            "public_corpus": "stdlib",
            "link": "loopback TCP through tandem net's delay proxy, RTT/2 each way",
            "scoring": "correct = a private key and a public key in the answer (private_tasks)",
            "warmup": f"question 0, {WARMUP_TOKENS} tokens per method, discarded at each RTT",
            "wall_s": time.perf_counter() - started,
        },
        "methods": table,
        "runs": records,
    }
    save_json(out, name, payload, machines=machines)
    _print(console, table)
    _plot(out, name, table, rtts)
    return payload


class _Device:
    """The device: its model, both corpora's retrievers (the public one only to build the
    cloud-rag prompt) and one function per method."""

    def __init__(self, docs: int, eta: float, max_new_tokens: int) -> None:
        from tandem.models.registry import load_model
        from tandem.protocols.dragon import Knowledge
        from tandem.protocols.dragon.setup import ensure_index, load_side

        self.docs, self.eta, self.max_new_tokens = docs, eta, max_new_tokens
        self.lm = load_model(DEVICE_MODEL, progress=False)
        self.side = load_side(corpus=str(PRIVATE_CORPUS), model=DEVICE_MODEL, docs=docs,
                              lm=self.lm, progress=False)  # fmt: skip
        public = ensure_index("stdlib", tokenizer=self.lm.tokenizer, tokenizer_name=CLOUD_MODEL,
                              progress=False)  # fmt: skip
        self.public = Knowledge.from_index(public)
        self.host, self.port, self.transport = "127.0.0.1", 0, None

    def connect_to(self, host: str, port: int) -> None:
        from benchmarks.spec_net import SECRET
        from tandem.transport import TransportConfig

        self.host, self.port = host, port
        self.transport = TransportConfig.for_model(self.lm, role="device", secret=SECRET)

    def generate(self, method: str, question: str, max_new_tokens: int) -> tuple[list[int], list]:
        """(tokens, the time of each token since the call) of one method."""
        times: list[float] = []
        start = time.perf_counter()

        def on_token(_token: int) -> None:
            times.append(time.perf_counter() - start)

        tokens = event_loop.run(self._run(method, question, max_new_tokens, on_token))
        return tokens, times

    async def _run(self, method, question, max_new_tokens, on_token) -> list[int]:
        from tandem.baselines.spec_baselines import run_cloud_ar, run_device_only
        from tandem.protocols.dragon import DragonConfig, Knowledge, connect_device
        from tandem.protocols.private_spec import private_config, rag_prompt, run_private_device
        from tandem.protocols.spec.config import SpecConfig
        from tandem.transport import connect

        tokenizer = self.lm.tokenizer
        plain = SpecConfig(temperature=0.0, max_new_tokens=max_new_tokens)
        if method == "device-rag":
            ids = rag_prompt(
                tokenizer, self.side.knowledge.context(question, self.docs)[1], question
            )
            return run_device_only(self.lm, ids, plain, on_token=on_token).tokens
        if method == "dragon":
            config = DragonConfig(max_new_tokens=max_new_tokens, docs_per_side=self.docs)
            report = await connect_device(
                self.host, self.port, transport=self.transport, lm=self.lm,
                knowledge=self.side.knowledge, question=question, config=config,
                profile=self.side.profile, on_token=on_token,
            )  # fmt: skip
            return list(report.tokens)
        channel = await connect(self.host, self.port, config=self.transport)
        if method == "cloud-rag":
            ids = rag_prompt(tokenizer, self.public.context(question, self.docs)[1], question)
            report = await run_cloud_ar(channel, tokenizer, ids, plain, on_token=on_token)
            return report.tokens
        eta = self.eta if method == "private-spec" else 0.0
        knowledge = self.side.knowledge if method == "private-spec" else Knowledge()
        config = private_config(temperature=0.0, max_new_tokens=max_new_tokens, eta=eta)
        report = await run_private_device(channel, self.lm, knowledge, question, config,
                                          docs=self.docs, on_token=on_token)  # fmt: skip
        return report.tokens


def _one_rtt(device: _Device, tasks, methods, rtt: float, machines, console) -> list[dict]:
    from benchmarks.humaneval import NetCloud
    from tandem.testbed import cpus
    from tandem.testbed.proxy import parse_hostport

    records = []
    with tempfile.TemporaryDirectory(prefix="tandem-private-spec-") as tmp:
        cloud = NetCloud(CLOUD_MODEL, machines.cpus, rtt, 1000.0, Path(tmp),
                         modes=("private-spec", "ar", "dragon"),
                         extra=("--corpus", "stdlib", "--docs", str(device.docs)))  # fmt: skip
        try:
            host, port = parse_hostport(cloud.status.connect)
            device.connect_to(host, port)
            cloud.wait_ready(host, port, device.transport)
            for method in methods:  # warm-up, discarded
                device.generate(method, tasks[0].question, WARMUP_TOKENS)
            load_before = cpus.loadavg()
            for number, task in enumerate(tasks):
                for method in methods:
                    tokens, times, retried = _generate(device, cloud, method, task, rtt, console)
                    records.append(_record(device, number, task, method, rtt, tokens, times))
                    records[-1]["retried"] = retried
                    r = records[-1]
                    console.log(f"rtt {rtt:>4g} q{number:<2} {method:>12}: {len(tokens)} tok, "
                                f"{r['ms_per_token']:.0f} ms/tok, correct={r['correct']}")  # fmt: skip
            records_load = {"load_before": load_before, "load_after": cpus.loadavg()}
            for record in records:
                record.update(records_load)
        finally:
            cloud.close()
    return records


def _generate(device, cloud, method, task, rtt, console):
    """One generation; a lost connection is retried once (noted in the record), then fatal."""
    retried = False
    while True:
        try:
            tokens, times = device.generate(method, task.question, device.max_new_tokens)
            return tokens, times, retried
        except TandemError as exc:
            msg = f"{method} at RTT {rtt:g}: {exc}; {cloud.tail()}"
            if retried:
                raise TandemError(msg) from None
            console.log(f"[yellow]retrying once: {msg}")
            retried = True


def _record(device, number, task, method, rtt, tokens, times) -> dict:
    text = device.lm.tokenizer.decode(tokens)
    score = private_tasks.score(task, text)
    n = len(times)
    per_token = (times[-1] - times[0]) / (n - 1) if n > 1 else float("nan")
    return {
        "question": number, "method": method, "rtt_ms": rtt, "tokens": len(tokens),
        "text": text, "ttft_s": times[0] if times else float("nan"),
        "total_s": times[-1] if times else float("nan"), "ms_per_token": 1e3 * per_token,
        "private": score.private, "public": score.public, "correct": score.correct,
    }  # fmt: skip


def _aggregate(records: list[dict], methods, rtts) -> list[dict]:
    """One record per method: accuracy (answers do not depend on the RTT at temperature 0;
    the first RTT's are scored) and, per RTT, latency and its ratio to device-rag."""
    table = []
    first = rtts[0]
    for method in methods:
        scored = [r for r in records if r["method"] == method and r["rtt_ms"] == first]
        row = {
            "method": method,
            "accuracy": statistics.fmean(r["correct"] for r in scored),
            "private_hit": statistics.fmean(r["private"] for r in scored),
            "public_hit": statistics.fmean(r["public"] for r in scored),
            "questions": len(scored),
            "by_rtt": {},
        }
        for rtt in rtts:
            group = [r for r in records if r["method"] == method and r["rtt_ms"] == rtt]
            tokens = sum(r["tokens"] for r in group)
            timed = [r for r in group if r["tokens"] > 1]  # one token has no inter-token time
            gaps = sum(r["tokens"] - 1 for r in timed)
            row["by_rtt"][str(rtt)] = {
                "ms_per_token_mean": statistics.fmean(r["ms_per_token"] for r in timed)
                if timed
                else float("nan"),
                "ms_per_token_pooled": 1e3 * sum(r["total_s"] - r["ttft_s"] for r in timed) / gaps
                if gaps
                else float("nan"),
                "ttft_s_mean": statistics.fmean(r["ttft_s"] for r in group),
                "tokens_per_s": tokens / sum(r["total_s"] for r in group),
                "tokens": tokens,
            }
        table.append(row)
    base = next((row for row in table if row["method"] == "device-rag"), None)
    for row in table:
        for rtt, cell in row["by_rtt"].items():
            if base is not None:
                ref = base["by_rtt"][rtt]["ms_per_token_mean"]
                cell["latency_vs_device_rag"] = cell["ms_per_token_mean"] / ref
    return table


def _print(console, table) -> None:
    rtts = list(table[0]["by_rtt"])
    view = Table(title="private-spec bench (accuracy; ms/token per RTT, x device-rag)")
    for column in ["method", "accuracy", "private", "public", *[f"{r} ms" for r in rtts]]:
        view.add_column(column, justify="right")
    for row in table:
        cells = [f"{c['ms_per_token_mean']:.0f} ({c.get('latency_vs_device_rag', 0):.2f}x)"
                 for c in row["by_rtt"].values()]  # fmt: skip
        view.add_row(row["method"], f"{row['accuracy']:.2f}", f"{row['private_hit']:.2f}",
                     f"{row['public_hit']:.2f}", *cells)  # fmt: skip
    console.print(view)


def _plot(out, name, table, rtts) -> None:
    fig, axes = new_figure(ncols=2)
    left, right = axes[0]
    names = [row["method"] for row in table]
    left.bar(names, [row["accuracy"] for row in table], color="tab:blue")
    left.set_ylabel("accuracy (private and public fact)")
    left.set_ylim(0, 1)
    left.tick_params(axis="x", rotation=30)
    for row in table:
        right.plot(list(rtts), [row["by_rtt"][str(r)]["ms_per_token_mean"] for r in rtts],
                   marker="o", label=row["method"])  # fmt: skip
    right.set_xlabel("RTT (ms)")
    right.set_ylabel("ms per token (after the first)")
    right.legend(fontsize=8)
    save_png(fig, out, name)
