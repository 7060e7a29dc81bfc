"""`tandem bench humaneval`: every generation mode on HumanEval, the real pair over TCP.

What runs: the cloud is `tandem cloud serve` (the target model), started as `tandem bench
spec-net` starts it, behind the project's delay proxy on loopback (`tandem net` in loopback
mode, one-way delay RTT/2 each way; a network of its own, named after this process, so runs
and other benches do not tear each other's proxy down); this process is the device (the draft model) and runs each generation through the device runtime of `tandem
device run` (`tandem.serve.device.run_generation`). Device and cloud get one core set each
(`tandem.testbed.cpus.role_cpus`: on 2 cores, device = core 0, cloud = core 1): the cloud is
pinned from its start (`tandem.testbed.netns.side_argv`), this process before its model
loads. For each problem the
modes run side by side (same prompt, seed and budget); a warm-up problem goes first and is
discarded. Afterwards, untimed: each completion runs its tests in a subprocess
(`tandem.sandbox.execute`), exact modes are compared with `ar`, and the traces are computed.

Words used here:
- *mode*: a name in MODES; *exact mode*: a speculative one: at temperature 0 its output is
  the target's greedy output, so it must equal `ar` token for token, up to llama.cpp
  near-ties (its k-token verification and single-token decoding differ by up to ~0.5 logits);
  a `-token` mode verifies one token per pass (SpecConfig.verify_calls) and has no exception.
- *round*: one verdict of the cloud: the accepted drafts plus the next token (bonus or
  recovered) when one came; *accepted length* = their mean count (incl. bonus).
- *acceptance trace*: per problem and exact mode, the accepted drafts of every round in
  order, with its next-token and rejection flags and the drafts sent per request.
- *draft agreement*: per problem, for each of `ar`'s tokens, whether the draft model's greedy
  choice given the target's own prefix is that token (teacher-forced, one forward pass).
- *margin*: where an exact mode departs from `ar`, the target's single-call logit gap
  top-1 - top-2 (and `ar`'s token - the mode's token) on `ar`'s prefix.
Generation runs to the budget or end-of-sequence in every mode (no early stop at the stop
sequences), so every mode does the same work; tokens/s counts all generated tokens over the
total time of the generations (TTFT included).
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import RESULTS
from benchmarks import humaneval_tasks as tasks
from benchmarks.report import new_figure, save_json, save_png
from tandem import sandbox
from tandem.errors import TandemError
from tandem.transport import loop as event_loop

EAGER = {"pipeline": "eager", "codec": "k-sqs", "codec_params": {"k": 3}}
EAGER_BRANCH = {**EAGER, "branch_below": 0.5, "branch_len": 4}
# mode -> (device runtime mode, SpecConfig settings)
MODES: dict[str, tuple[str, dict]] = {
    "ar": ("ar", {}),  # cloud autoregressive, tokens streamed back
    "local": ("local", {}),  # the draft model alone
    "spec-sync": ("spec", {"pipeline": "sync", "codec": "separate"}),  # stop-and-wait
    "spec-async": ("spec", {"pipeline": "async", "codec": "separate"}),  # PicoSpec
    "spec-sync-dense": ("spec", {"pipeline": "sync", "codec": "dense"}),  # vanilla SD
    "sqs": ("spec", {"pipeline": "sync", "codec": "k-sqs", "codec_params": {"k": 3}}),  # SQS-SD
    "c-sqs": ("spec", {"pipeline": "sync", "codec": "c-sqs"}),
    "sqs-async": ("spec", {"pipeline": "async", "codec": "k-sqs", "codec_params": {"k": 3}}),
    # the cloud never idles (tandem.protocols.spec.eager), K-SQS K=3 uplink
    "spec-eager": ("spec", EAGER),
    # eager with branches on the draft model's second choice where it is unsure (eager.py)
    "spec-eager-branch": ("spec", EAGER_BRANCH),
    # eager with the adaptive controller (planner.Controller): each round it picks the draft
    # length, or no drafting (the cloud's AR stream alone), and each generation whether to
    # branch (eager-branch's settings); one controller for the whole run
    "spec-adaptive": ("spec", EAGER_BRANCH),
}
# each exact mode with the cloud verifying one token per pass (SpecConfig.verify_calls): the
# same output as "ar" bit for bit on llama.cpp, at the cost of the block's saving
MODES.update({
    f"{mode}-token": (runtime, {**settings, "verify_calls": "token"})
    for mode, (runtime, settings) in list(MODES.items())
    if runtime == "spec" and mode != "spec-adaptive"
})  # fmt: skip
WARMUP_TOKENS = 8
CLOUD_START_S = 300.0  # the cloud loads its model before it listens


def run(
    *,
    out: Path = RESULTS,
    name: str = "humaneval",
    problems: str = "0-15",
    modes: tuple[str, ...] = ("ar", "spec-sync", "spec-async", "local"),
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    draft_len: int = 4,
    rtt_ms: float = 0.0,
    rate_mbit: float = 100.0,
    device_model: str = "qwen2.5-coder-0.5b",
    cloud_model: str = "qwen2.5-coder-1.5b",
    timeout_s: float = sandbox.TIMEOUT_S,
    margins: bool = True,
    cores: dict[str, list[int]] | None = None,
) -> dict:
    """Run the bench (module docstring); save `<name>.json` / `.png` under `out`. `cores`: each
    side's cpu set (default `tandem.testbed.cpus.role_cpus()`)."""
    from benchmarks.report import Machines
    from tandem.protocols.spec.config import SpecConfig
    from tandem.testbed import cpus

    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise TandemError(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    dataset = tasks.load_problems()
    chosen = [dataset[i] for i in tasks.parse_selection(problems, len(dataset))]
    config = SpecConfig(temperature=temperature, seed=seed, max_new_tokens=max_new_tokens,
                        draft_len=draft_len)  # fmt: skip
    console = Console()
    machines = Machines(
        cpus=cores or cpus.role_cpus(),
        isolation="processes: tandem cloud serve pinned from its start; the device is this "
        "process, pinned before its model loads",
        shared=["the delay proxy (the wire, not pinned)",
                "the test programs, run after generation on the device's cores"],
    )  # fmt: skip
    started = time.perf_counter()
    with cpus.restored():  # the device pins this process while it generates
        lm, runs = _generate_all(chosen, modes, config, machines, rtt_ms, rate_mbit,
                                 device_model, cloud_model, console)  # fmt: skip
        wall_generation = time.perf_counter() - started
        after_generation = cpus.loadavg()
        ids = {p["task_id"]: lm.tokenizer.encode(p["prompt"]) for p in chosen}
        _execute(chosen, runs, lm.tokenizer, timeout_s, console)
        exactness = _exactness(runs, modes, temperature)
        if margins and exactness["divergences"]:
            _margins(exactness["divergences"], runs, ids, cloud_model, console)
        agreement = _agreement(lm, runs, ids) if "ar" in modes and temperature == 0 else {}
    table = _aggregate(runs, modes)
    payload = {
        "benchmark": "humaneval",
        "setup": {
            "problems": [p["task_id"] for p in chosen],
            "modes": {m: {"runtime": MODES[m][0], **MODES[m][1]} for m in modes},
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "seed": seed,
            "draft_len": draft_len,
            "rtt_ms": rtt_ms,
            "rate_mbit": rate_mbit,
            "link": f"loopback TCP through tandem net's delay proxy: {rtt_ms / 2:g} ms each "
            f"way, {rate_mbit:g} Mbit/s; the proxy itself is not pinned",
            "device_model": device_model,
            "cloud_model": cloud_model,
            "prompt": "the problem's prompt, raw (no chat template)",
            "stop_sequences": list(tasks.STOP_SEQUENCES),
            "execution": f"fresh python -I subprocess per program, timeout {timeout_s:g} s, "
            f"RLIMIT_AS {sandbox.MEMORY_MB} MiB; pass = exit status 0",
            "warmup": f"{chosen[0]['task_id']}, {WARMUP_TOKENS} tokens per mode, discarded",
            "load_average_after_generation": after_generation,
            "wall_s": {"generation": wall_generation, "total": time.perf_counter() - started},
        },  # fmt: skip
        "table": table,
        "exactness": exactness,
        "runs": runs,
        "draft_agreement_teacher_forced": agreement,
    }
    save_json(out, name, payload, machines=machines)
    _print(console, table, exactness, len(chosen))
    _plot(out, name, table, runs)
    return payload


def _generate_all(chosen, modes, config, machines, rtt_ms, rate_mbit, device_model, cloud_model,
                  console):  # fmt: skip
    """Start the cloud (if a mode needs it), pin both sides, run warm-up + every generation."""
    from benchmarks.spec_net import SECRET
    from tandem.models.registry import load_model
    from tandem.testbed import cpus
    from tandem.testbed.proxy import parse_hostport
    from tandem.transport import TransportConfig

    networked = any(MODES[m][0] != "local" for m in modes)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="tandem-humaneval-") as tmp:
        cloud = None
        try:
            host, port = "127.0.0.1", 0
            if networked:  # the proxy (unpinned), then the cloud (pinned)
                cloud = NetCloud(cloud_model, machines.cpus, rtt_ms, rate_mbit, Path(tmp))
                host, port = parse_hostport(cloud.status.connect)
            cpus.pin(machines.cpus["device"])  # this thread; those started later inherit it
            lm = load_model(device_model, progress=False)
            transport = TransportConfig.for_model(lm, role="device", secret=SECRET)
            if cloud is not None:
                cloud.wait_ready(host, port, transport)
            generate = _Generator(lm, host, port, transport, cloud, rtt_ms)
            warm = type(config)(**{**config.to_json(), "max_new_tokens": WARMUP_TOKENS})
            for mode in modes:
                generate(mode, chosen[0]["prompt"], warm)  # discarded
            for problem in chosen:
                for mode in modes:
                    report = generate(mode, problem["prompt"], config)
                    runs.append(_record(problem, mode, report))
                    if mode == "spec-adaptive":  # what the controller would pick next
                        plan = generate.controller.plan(("ar", "eager"))
                        runs[-1]["plan_after"] = {"method": plan.method, "gamma": plan.gamma,
                                                  "alpha": generate.controller.alpha_estimate}  # fmt: skip
                    console.log(f"{problem['task_id']:>13} {mode:>15}: {len(report.tokens)} "
                                f"tokens, {runs[-1]['tokens_per_s']:.2f} tok/s")  # fmt: skip
            machines.observed["device"] = cpus.machine_state(lm)
            if cloud is not None:
                machines.observed["cloud"] = {"cpus": sorted(os.sched_getaffinity(cloud.pid))}
        finally:
            if cloud is not None:
                cloud.close()
    return lm, runs


class NetCloud:
    """`tandem cloud serve` on the cloud side of a loopback `tandem net` of its own."""

    def __init__(self, model: str, cores: dict, rtt_ms: float, rate_mbit: float, tmp: Path,
                 modes: tuple[str, ...] = ("spec", "ar"), extra: tuple[str, ...] = ()):  # fmt: skip
        from benchmarks.spec_net import SECRET, tandem_argv
        from tandem.testbed.netns import NetConfig, net_up, side_argv

        self.name, self.log = f"tandem-humaneval-{os.getpid()}", tmp / "cloud.log"
        self.status = net_up(NetConfig(
            name=self.name, mode="loopback", delay_ms=rtt_ms / 2, rate_mbit=rate_mbit,
            device_cpus=tuple(cores["device"]), cloud_cpus=tuple(cores["cloud"]),
            service_port=_free_port(), proxy_port=_free_port(),
        ))  # fmt: skip
        argv = tandem_argv("cloud", "serve", "--threads", str(len(cores["cloud"])))
        argv += ["--model", model, "--listen", self.status.service, "--secret", SECRET, *extra]
        argv += [arg for mode in modes for arg in ("--mode", mode)]
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                side_argv(self.status, "cloud", argv),
                stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
            )  # fmt: skip
        self.pid = self.process.pid

    def wait_ready(self, host: str, port: int, transport) -> None:
        from tandem.serve.api.backends import probe_cloud

        deadline = time.monotonic() + CLOUD_START_S
        while not event_loop.run(probe_cloud(host, port, transport)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise TandemError(f"humaneval bench: the cloud did not start: {self.tail()}")
            time.sleep(1.0)

    def tail(self) -> str:
        alive = "running" if self.process.poll() is None else f"exit {self.process.returncode}"
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"(cloud process {alive}) {text[-600:]}"

    def close(self) -> None:
        from tandem.testbed.netns import net_down

        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        net_down(self.name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Generator:
    """One generation of a mode with the device runtime; returns its SpecReport."""

    def __init__(self, lm, host: str, port: int, transport, cloud: NetCloud | None,
                 rtt_ms: float = 0.0) -> None:  # fmt: skip
        self.lm, self.host, self.port, self.transport = lm, host, port, transport
        self.cloud, self.rtt_ms = cloud, rtt_ms
        self.tpot_s: dict[str, float] = {}  # last measured step of "ar" and "local"
        self.controller = None  # spec-adaptive's, made on its first use

    def __call__(self, mode: str, prompt: str, config):
        from tandem.serve.device import run_generation

        runtime, settings = MODES[mode]
        ids = self.lm.tokenizer.encode(prompt)
        cfg = type(config)(**{**config.to_json(), **settings})
        controller = self._controller() if mode == "spec-adaptive" else None
        try:
            report = event_loop.run(run_generation(
                runtime, lm=self.lm, prompt_ids=ids, config=cfg, host=self.host, port=self.port,
                transport=self.transport, controller=controller,
            ))  # fmt: skip
        except TandemError as exc:
            where = f"; {self.cloud.tail()}" if self.cloud is not None else ""
            raise TandemError(f"humaneval bench: {mode}: {exc}{where}") from None
        if mode in ("ar", "local") and (tpot := report.summary()["tpot_ms"]):
            self.tpot_s[mode] = tpot / 1e3
        return report

    def _controller(self):
        """The prior: the draft step = the device-only step, the target's AR step = the cloud AR
        stream's step (both measured by this run's warm-up when those modes run first, else
        guesses), a pass over n drafts = 0.4 t_ar + 0.6 t_ar n (CPU: a 5-token block costs 3-6
        AR steps), the configured RTT, alpha 0.8; it learns all of them as it runs."""
        from tandem.protocols.spec.planner import Controller, Costs

        if self.controller is None:
            t_ar = self.tpot_s.get("ar", 0.1)
            prior = Costs(t_draft=self.tpot_s.get("local", t_ar / 2), decode_base=0.4 * t_ar,
                          decode_per_token=0.6 * t_ar, rtt=self.rtt_ms / 1e3)  # fmt: skip
            self.controller = Controller(prior=prior, alpha=0.8)
        return self.controller


def _record(problem: dict, mode: str, report) -> dict:
    summary = report.summary()
    keep = ("ttft_ms", "tpot_ms", "accepted_len_incl_bonus", "acceptance_rate", "verdicts",
            "t_draft_token_ms", "t_verify_ms", "network_ms", "drafted", "wasted_drafts")  # fmt: skip
    record = {
        "problem": problem["task_id"],
        "mode": mode,
        "tokens": report.tokens,
        "total_s": report.total_s,
        "tokens_per_s": summary["throughput_tok_s"],
        "uplink_bytes": report.uplink_bytes,
        "downlink_bytes": report.downlink_bytes,
        **{k: summary[k] for k in keep},
    }
    if report.branches:
        record["branches"] = dict(report.branches)
    if report.verdicts:
        record["acceptance_trace"] = {
            "accepted": [v.num_accepted for v in report.verdicts],
            "has_next": [int(v.has_next) for v in report.verdicts],
            "rejected": [int(v.rejected) for v in report.verdicts],
            "chunk_sizes": list(report.chunk_sizes),
        }
    cloud = getattr(report, "cloud", None) or {}
    if cloud.get("verify_drafts"):  # the cloud's passes: (drafts, ms) each, and its AR steps
        record["cloud_passes"] = {
            "drafts": list(cloud["verify_drafts"]),
            "verify_ms": [1e3 * s for s in cloud["verify_s"]],
            "ar_step_ms": [1e3 * s for s in cloud.get("ar_step_s", [])],
        }
    return record


def _execute(chosen, runs, tokenizer, timeout_s, console) -> None:
    """Cut, run and score every completion (identical programs run once)."""
    by_id = {p["task_id"]: p for p in chosen}
    done: dict[tuple[str, str], sandbox.Execution] = {}
    for record in runs:
        completion = tasks.completion_text(record["tokens"], tokenizer)
        key = (record["problem"], completion)
        if key not in done:
            program = tasks.build_program(by_id[record["problem"]], completion)
            done[key] = sandbox.execute(program, timeout_s=timeout_s)
        record.update(completion=completion, passed=done[key].passed, status=done[key].status)
    console.log(f"executed {len(done)} distinct programs")


def _exactness(runs, modes, temperature) -> dict:
    """At temperature 0: each exact mode against `ar`, problem by problem."""
    exact = [m for m in modes if MODES[m][0] == "spec"]
    if temperature != 0 or "ar" not in modes or not exact:
        return {"checked": False, "divergences": [],
                "why": "needs temperature 0, mode ar and an exact mode"}  # fmt: skip
    ar = {r["problem"]: r for r in runs if r["mode"] == "ar"}
    per_mode, divergences = {}, []
    for mode in exact:
        rows = [r for r in runs if r["mode"] == mode]
        for r in rows:
            ref = ar[r["problem"]]["tokens"]
            first = next((i for i, (a, b) in enumerate(zip(r["tokens"], ref, strict=False))
                          if a != b), None)  # fmt: skip
            if first is None and len(r["tokens"]) != len(ref):
                first = min(len(r["tokens"]), len(ref))
            r["tokens_equal_ar"] = first is None
            r["completion_equal_ar"] = r["completion"] == ar[r["problem"]]["completion"]
            if first is not None:
                divergences.append({
                    "mode": mode, "problem": r["problem"], "position": first,
                    "ar_token": ref[first] if first < len(ref) else None,
                    "mode_token": r["tokens"][first] if first < len(r["tokens"]) else None,
                    "completion_equal": r["completion_equal_ar"],
                    "pass_equal": r["passed"] == ar[r["problem"]]["passed"],
                })  # fmt: skip
        per_mode[mode] = {
            "problems_differing_tokens": sum(not r["tokens_equal_ar"] for r in rows),
            "problems_differing_completion": sum(not r["completion_equal_ar"] for r in rows),
            "problems_differing_pass": sum(r["passed"] != ar[r["problem"]]["passed"] for r in rows),
            "pass_at_1_equal_ar": sum(r["passed"] for r in rows) == sum(
                x["passed"] for x in ar.values()),
        }  # fmt: skip
    return {"checked": True, "reference": "ar", "per_mode": per_mode, "divergences": divergences}


def _margins(divergences, runs, ids, cloud_model, console) -> None:
    """The target's logit margins where an exact mode departed from `ar` (model loaded here,
    after the cloud process has exited)."""
    from tandem.models.registry import load_model

    console.log(f"{len(divergences)} divergence(s) from ar: loading {cloud_model} for margins")
    target = load_model(cloud_model, progress=False)
    measure_margins(divergences, runs, ids, target)
    del target


def measure_margins(divergences, runs, ids, target) -> None:
    """Add each divergence's `target_top2_margin` and `target_ar_minus_mode_logit` (module
    docstring, *margin*); `ids`: problem -> prompt token ids; `target`: the loaded cloud model.
    Also used by humaneval-sweep on saved results."""
    ar = {r["problem"]: r["tokens"] for r in runs if r["mode"] == "ar"}
    for d in divergences:
        if d["ar_token"] is None or d["mode_token"] is None:
            continue  # one output ended (eos) where the other went on
        prefix = ids[d["problem"]] + ar[d["problem"]][: d["position"]]
        logits = target.prefill(prefix).logits[0]  # [vocab]
        top = logits.topk(2).values
        d["target_top2_margin"] = float(top[0] - top[1])
        d["target_ar_minus_mode_logit"] = float(logits[d["ar_token"]] - logits[d["mode_token"]])


def _agreement(lm, runs, ids) -> dict:
    """Per problem: does the draft model's greedy token, on ar's prefix, equal ar's token?"""
    from benchmarks.humaneval_traces import teacher_forced

    return {
        r["problem"]: teacher_forced(lm, ids[r["problem"]], r["tokens"])["agree"]
        for r in runs
        if r["mode"] == "ar" and r["tokens"]
    }


def _aggregate(runs, modes) -> list[dict]:
    rows = []
    for mode in modes:
        group = [r for r in runs if r["mode"] == mode]
        tokens, seconds = sum(len(r["tokens"]) for r in group), sum(r["total_s"] for r in group)
        rounds = [t for r in group if (t := r.get("acceptance_trace"))]
        n_rounds = sum(len(t["accepted"]) for t in rounds)
        accepted = sum(sum(t["accepted"]) for t in rounds)
        rejected = sum(sum(t["rejected"]) for t in rounds)
        row = {
            "mode": mode,
            "problems": len(group),
            "passed": sum(r["passed"] for r in group),
            "pass_at_1": sum(r["passed"] for r in group) / len(group),
            "tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds else 0.0,
            "ttft_ms_mean": statistics.fmean(r["ttft_ms"] for r in group),
            "ttft_ms_median": statistics.median(r["ttft_ms"] for r in group),
            "uplink_bytes_per_token": sum(r["uplink_bytes"] for r in group) / max(1, tokens),
            "downlink_bytes_per_token": sum(r["downlink_bytes"] for r in group) / max(1, tokens),
            "rounds": n_rounds,
            "accepted_len_incl_bonus": (accepted + sum(sum(t["has_next"]) for t in rounds))
            / n_rounds if n_rounds else None,
            "acceptance_rate": accepted / (accepted + rejected) if accepted + rejected else None,
            "t_draft_token_ms_mean": _mean_of(group, "t_draft_token_ms") if rounds else None,
            "t_verify_ms_mean": _mean_of(group, "t_verify_ms") if rounds else None,
        }  # fmt: skip
        rows.append(row)
    by = {r["mode"]: r["tokens_per_s"] for r in rows}
    for row in rows:
        for key, base in (("speedup_vs_cloud_ar", "ar"), ("speedup_vs_stop_and_wait", "spec-sync")):
            row[key] = row["tokens_per_s"] / by[base] if by.get(base) else None
    return rows


def _mean_of(group, key) -> float:
    return statistics.fmean(r[key] for r in group)


def _print(console, table_rows, exactness, n_problems) -> None:
    title = f"HumanEval, {n_problems} problems: tok/s incl. TTFT, x vs cloud AR and stop-and-wait"
    table = Table(title=title)
    for col in ("mode", "pass@1", "tok/s", "x AR", "x S&W", "acc len", "B/tok up/dn", "TTFT ms",
                "!=ar tok/pass"):  # fmt: skip
        table.add_column(col, justify="left" if col == "mode" else "right", no_wrap=col == "mode")
    per_mode = exactness.get("per_mode", {})

    def fmt(value, spec=".2f"):
        return "-" if value is None else format(value, spec)

    for r in table_rows:
        e = per_mode.get(r["mode"])
        table.add_row(
            r["mode"], f"{r['pass_at_1']:.3f}", f"{r['tokens_per_s']:.2f}",
            fmt(r["speedup_vs_cloud_ar"]), fmt(r["speedup_vs_stop_and_wait"]),
            fmt(r["accepted_len_incl_bonus"]),
            f"{r['uplink_bytes_per_token']:.0f}/{r['downlink_bytes_per_token']:.0f}",
            f"{r['ttft_ms_mean']:.0f}",
            f"{e['problems_differing_tokens']}/{e['problems_differing_pass']}" if e else "-",
        )  # fmt: skip
    console.print(table)
    for d in exactness.get("divergences", []):
        margin = d.get("target_top2_margin")
        console.print(
            f"{d['mode']} departs from ar on {d['problem']} at token {d['position']}"
            + (f" (target top-2 margin {margin:.3f})" if margin is not None else "")
            + ("; completion unchanged" if d["completion_equal"] else "; completion differs")
        )


def _plot(out, name, table_rows, runs) -> None:
    fig, axes = new_figure(ncols=3)
    modes = [r["mode"] for r in table_rows]
    axes[0][0].bar(modes, [r["tokens_per_s"] for r in table_rows])
    axes[0][0].set(title="throughput (TTFT included)", ylabel="tokens/s")
    axes[0][1].bar(modes, [r["pass_at_1"] for r in table_rows])
    axes[0][1].set(title="pass@1", ylim=(0, 1))
    ax = axes[0][2]
    for mode in modes:
        counts = [a for r in runs if r["mode"] == mode and "acceptance_trace" in r
                  for a in r["acceptance_trace"]["accepted"]]  # fmt: skip
        if counts:
            ax.hist(counts, bins=range(0, max(counts) + 2), alpha=0.5, label=mode, align="left")
    ax.set(title="accepted drafts per round", xlabel="accepted drafts", ylabel="rounds")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    for a in axes[0][:2]:
        a.tick_params(axis="x", labelrotation=30, labelsize=7)
    save_png(fig, out, name)
