"""DRAGON paper Fig. 8: a record-and-replay simulator of Speculative Aggregation's pipeline,
comparing where the aggregator runs (Cloud, Device, Random, DRAGON's scheduler).

Words used here:
- *trace*: per position, whether each side's draft was accepted (`SideReport.resolutions` of
  a real run). Outcomes depend only on the position seeds, never on timing or on who
  aggregates (docs/dragon.md "What is exact"), so replaying them under another network or
  strategy is what the live system would have produced.
- *decode times*: seconds per draft of each side, drawn (bootstrap, seeded) from recorded
  `SideReport.decode_times`, times a per-side scale (`DecodeTimes`).
- *network*: RTT(t) = base + extra + amplitude sin(2 pi t / period + phase) + noise(t); a
  message takes RTT(t_send) / 2 + transfer_s, and each direction is FIFO (TCP: no overtaking).
  noise(t) is a seeded Gaussian per 100 ms bucket, so RTT is a pure function of t.

The model (paper Sec. 4.2 steps 1-5 and Sec. 5). The rules are not modelled but run: each side
is the live `tandem.protocols.dragon.machine.SideMachine` (draft queues, epochs, resolution,
`Scheduler.decide` fed what the live side knows: `LatencyModel` per side updated with every
draft seen, `AcceptanceTracker` with the Eq. 5 rates the recording holds, or the observed 0/1
outcomes for recordings without them or `recorded_rates=False`), with `ReplayRule` giving
the recorded outcome in place of Algorithm 1. Modelled, on virtual time, is only the I/O:
- each side's decoder drafts continuously, one draft per decode, at most `lookahead`
  unresolved own drafts ahead of the targets it knows (`worker.DraftWorker`);
- the link: the machines' messages with the delays above; the RTT the scheduler reads is an
  RFC 6298 smoothed RTT of in-band pings every `rtt_probe_s`;
- a side learns a resolution when it aggregates or when the target arrives (with `mirror`,
  the live default, also as soon as it holds both drafts: `SideMachine`'s mirroring, which
  makes the placement latency-neutral); a rejected side
  cancels its decode in flight at once (preemption), drops its queued drafts (epochs: stale
  drafts arriving later are dropped) and decodes the target to draft t+1 from there;
- switching: the old aggregator stops at once; the new one starts when the switch arrives
  (the switch cost is that one-way trip plus any wait for drafts); the last position never
  switches; Cloud starts on the cloud, every other strategy on the device;
- the output is on the device: token time = when the device knew the target; per-token
  latency = gaps between consecutive token times, the first from t = 0 (both sides ready,
  prefill excluded). Total time = the last token time.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from tandem.protocols.dragon.config import CLOUD, DEVICE, SIDES, DragonConfig, peer_of
from tandem.protocols.dragon.machine import (
    Committed,
    SendDraft,
    SendSwitch,
    SendTarget,
    SideMachine,
)
from tandem.protocols.dragon.profiler import LatencyModel, fit_latency
from tandem.protocols.dragon.queues import Draft
from tandem.protocols.dragon.scheduler import Scheduler
from tandem.transport.channel import RttEstimator

STRATEGIES = ("cloud", "device", "random", "dragon")
NOISE_BUCKET_S = 0.1


@dataclass(frozen=True)
class Trace:
    """Acceptance of each side's draft, per position, and (when recorded) the acceptance rate
    the live tracker learnt there (Eq. 5 of the two drafts' laws; 0/1 without it)."""

    accepted: dict[str, tuple[bool, ...]]
    rates: dict[str, tuple[float, ...]] | None = None

    def __len__(self) -> int:
        return len(self.accepted[DEVICE])


@dataclass(frozen=True, kw_only=True)
class Network:
    base_rtt_s: float = 0.002
    extra_s: float = 0.0
    amplitude_s: float | None = None  # None: extra / 5 (paper Sec. 7.4)
    period_s: float = 20 * math.pi
    phase: float = 0.0
    noise_s: float = 0.0  # standard deviation of the per-bucket Gaussian
    transfer_s: float = 0.0  # serialisation time of one message
    seed: int = 0

    def rtt(self, t: float) -> float:
        amplitude = self.extra_s / 5 if self.amplitude_s is None else self.amplitude_s
        wave = amplitude * math.sin(2 * math.pi * t / self.period_s + self.phase)
        noise = 0.0
        if self.noise_s > 0:
            bucket = int(math.floor(t / NOISE_BUCKET_S))
            noise = self.noise_s * float(
                np.random.default_rng([self.seed, bucket + 2**31]).normal()
            )
        return max(self.base_rtt_s + self.extra_s + wave + noise, 0.0)


@dataclass
class DecodeTimes:
    """Seconds per draft: bootstrap draws from recorded samples, times a per-side scale."""

    samples: dict[str, np.ndarray]  # side -> [n] seconds
    scale: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SIDES, 1.0))
    profile: dict[str, LatencyModel] | None = None  # the scheduler's offline fit

    @classmethod
    def constant(cls, device_s: float, cloud_s: float) -> DecodeTimes:
        return cls({DEVICE: np.array([device_s]), CLOUD: np.array([cloud_s])})

    def draw(self, side: str, rng: np.random.Generator) -> float:
        samples = self.samples[side]
        value = samples[0] if len(samples) == 1 else samples[rng.integers(len(samples))]
        return float(value) * self.scale[side]

    def offline(self, side: str, context: int) -> LatencyModel:
        if self.profile is not None:
            return LatencyModel(**vars(self.profile[side]))
        seconds = self.samples[side] * self.scale[side]
        return fit_latency([context] * len(seconds), list(seconds))


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    tokens: int = 100
    lookahead: int = DragonConfig.lookahead  # the live default (8 until 2026-11-26)
    acceptance_ema: float = DragonConfig.acceptance_ema
    slope_weight: float = 0.1
    rtt_probe_s: float = 0.5
    switch_margin_s: float = 0.0
    switch_horizon: int = DragonConfig.switch_horizon
    scheduler_model: str = DragonConfig.scheduler_model
    prompt_context: int = 128  # context length of a row before the first draft
    recorded_rates: bool = True  # the tracker learns the trace's Eq. 5 rates (if it has them)
    # the side that does not aggregate resolves as soon as it holds both drafts (the live
    # default, DragonConfig.mirror); off: the paper's protocol, where it waits for the verdict
    mirror: bool = False


@dataclass
class SimResult:
    strategy: str
    token_times: list[float]  # when the device knew each target token
    aggregated_by: dict[str, int]
    switches: int
    cancelled: int

    @property
    def per_token(self) -> list[float]:
        return list(np.diff([0.0, *self.token_times]))

    @property
    def total_s(self) -> float:
        return self.token_times[-1]


@dataclass(frozen=True)
class ReplayRule:
    """The recorded outcome instead of Algorithm 1: a side's draft for a position carries
    token TARGET if the trace accepted it, its own reject token otherwise, and the target is
    always TARGET (outcomes depend only on the position seeds: see the module docstring). The
    tracker learns the recorded rates when the trace has them and `use_rates`, else 0/1."""

    trace: Trace
    use_rates: bool = True

    TARGET = 0
    REJECTED = {DEVICE: 1, CLOUD: 2}

    def aggregate(self, device: Draft, cloud: Draft) -> int:
        return self.TARGET

    def rates(self, device: Draft, cloud: Draft, accepted: dict[str, bool]) -> dict[str, float]:
        if self.use_rates and self.trace.rates is not None:
            return {s: self.trace.rates[s][device.position] for s in SIDES}
        return {s: float(accepted[s]) for s in SIDES}

    def token(self, side: str, position: int) -> int:
        return self.TARGET if self.trace.accepted[side][position] else self.REJECTED[side]


@dataclass
class _Worker:
    """A side's decoder, emulated: what `worker.DraftWorker` does, on virtual time."""

    pending: int = 0  # own unresolved drafts in the queue
    epoch: int = 0
    busy: bool = False
    decode_id: int = 0
    rtt: RttEstimator = field(default_factory=RttEstimator)
    next_probe: float = 0.0


class Simulation:
    """One replay of a trace; `run()` returns the device's token times. Each side is the live
    `SideMachine` (the rules), fed on virtual time; only the decoder and the link are modelled."""

    def __init__(self, trace, decode, network, strategy, config, *, seed=0):
        assert len(trace) >= config.tokens, (len(trace), config.tokens)
        self.trace, self.decode, self.net, self.config = trace, decode, network, config
        self.strategy = strategy
        self.rng = np.random.default_rng(seed)
        self.now = 0.0
        self.workers = {s: _Worker() for s in SIDES}
        self.rule = ReplayRule(trace, use_rates=config.recorded_rates)
        self.machines = {
            s: SideMachine(
                s,
                rule=self.rule,
                scheduler=Scheduler(
                    strategy,
                    seed=seed,
                    margin=config.switch_margin_s,
                    horizon=config.switch_horizon,
                    mirrored=config.mirror,
                    model=config.scheduler_model,
                ),
                first_aggregator=CLOUD if strategy == CLOUD else DEVICE,
                max_new_tokens=config.tokens,
                latency={o: decode.offline(o, config.prompt_context) for o in SIDES},
                rtt=lambda s=s: self._rtt(s),
                acceptance_ema=config.acceptance_ema,
                slope_weight=config.slope_weight,
                mirror=config.mirror,
            )
            for s in SIDES
        }
        cloud = self.machines[CLOUD]  # its pick at READY reaches the device before any draft
        first = cloud.scheduler.first(cloud.estimates())
        for machine in self.machines.values():
            machine.place_first(first)
        self.first_aggregator = first
        self.events: list = []
        self.seq = 0
        self.fifo = dict.fromkeys(SIDES, 0.0)  # sender -> last arrival time at the peer
        self.token_times: list[float] = []
        self.aggregated_by = dict.fromkeys(SIDES, 0)
        self.switches = 0
        self.cancelled = 0

    # -- plumbing ------------------------------------------------------------------------------

    def _at(self, time: float, kind: str, *payload) -> None:
        heapq.heappush(self.events, (time, self.seq, kind, payload))
        self.seq += 1

    def _send(self, sender: str, kind: str, *payload) -> None:
        arrival = self.now + self.net.rtt(self.now) / 2 + self.net.transfer_s
        arrival = max(arrival, self.fifo[sender])
        self.fifo[sender] = arrival
        self._at(arrival, kind, peer_of(sender), *payload)

    def run(self) -> SimResult:
        for side in SIDES:
            self._start_draft(side)
        while self.events and len(self.token_times) < self.config.tokens:
            self.now, _, kind, payload = heapq.heappop(self.events)
            getattr(self, f"_on_{kind}")(*payload)
        assert len(self.token_times) == self.config.tokens, "simulation stalled"
        return SimResult(
            self.strategy, self.token_times, self.aggregated_by, self.switches, self.cancelled
        )

    def _apply(self, side: str, actions: list) -> None:
        """Carry out a machine's actions: the link and the decoder, on virtual time."""
        for action in actions:
            if isinstance(action, SendDraft):
                self._send(side, "draft_arrive", action.draft)
            elif isinstance(action, SendTarget):
                self._send(side, "target", action.position, action.token)
            elif isinstance(action, SendSwitch):
                self.switches += 1
                self._send(side, "switch", action.position, action.token, action.aggregator)
            elif isinstance(action, Committed):
                self._committed(side, action)

    # -- drafting ------------------------------------------------------------------------------

    def _start_draft(self, name: str) -> None:
        worker = self.workers[name]
        position = len(self.machines[name].committed) + worker.pending
        if worker.busy or position >= self.config.tokens or worker.pending >= self.config.lookahead:
            return
        worker.busy = True
        worker.decode_id += 1
        seconds = self.decode.draw(name, self.rng)
        at = self.now + seconds
        self._at(at, "draft_done", name, position, worker.epoch, worker.decode_id, seconds)

    def _on_draft_done(self, name, position, epoch, decode_id, seconds) -> None:
        worker, machine = self.workers[name], self.machines[name]
        if decode_id != worker.decode_id:
            return  # cancelled by a rejection
        worker.busy = False
        if epoch == worker.epoch and position == len(machine.committed) + worker.pending:
            worker.pending += 1
            draft = Draft(
                side=name, position=position, epoch=epoch,
                token=self.rule.token(name, position), dense=None,
                logweight=0.0, payload=b"", decode_s=seconds,
                context=self.config.prompt_context + position, created=self.now,
            )  # fmt: skip
            self._apply(name, machine.own_draft(draft))
        self._start_draft(name)

    def _on_draft_arrive(self, at, draft) -> None:
        self._apply(at, self.machines[at].peer_draft(draft))

    # -- resolution ----------------------------------------------------------------------------

    def _on_target(self, at, position, token) -> None:
        self._apply(at, self.machines[at].target(position, token))

    def _on_switch(self, at, position, token, aggregator) -> None:
        self._apply(at, self.machines[at].switch(position, token, aggregator))

    def _committed(self, name: str, c: Committed) -> None:
        worker = self.workers[name]
        if c.by == name and c.aggregated:
            self.aggregated_by[name] += 1
        if c.accepted[name]:
            worker.pending -= 1
        else:
            worker.pending, worker.epoch = 0, c.epoch
            self.cancelled += int(worker.busy)
            worker.busy = False
            worker.decode_id += 1  # the decode in flight (if any) is cancelled
        if name == DEVICE:
            self.token_times.append(self.now)
        self._start_draft(name)

    def _rtt(self, name: str) -> float:
        """What the live side would know: the smoothed RTT of the pings completed by now."""
        worker, probe = self.workers[name], self.config.rtt_probe_s
        if worker.rtt.srtt is None:  # the ping at session start
            worker.rtt.add(self.net.rtt(0.0))
            worker.next_probe = probe
        while probe > 0 and worker.next_probe + self.net.rtt(worker.next_probe) <= self.now:
            worker.rtt.add(self.net.rtt(worker.next_probe))
            worker.next_probe += probe
        return float(worker.rtt.srtt) + 2 * self.net.transfer_s


def simulate(trace, decode, network, strategy, config=SimConfig(), *, seed=0) -> SimResult:
    return Simulation(trace, decode, network, strategy, config, seed=seed).run()


def bootstrap_traces(
    recorded: list[Trace], *, count: int, tokens: int, block: int, seed: int
) -> list[Trace]:
    """`count` traces of `tokens` positions, each a concatenation of random blocks of
    `block` consecutive positions from the recorded traces (keeps short-range correlation)."""
    rng = np.random.default_rng(seed)
    usable = [t for t in recorded if len(t) >= block]
    assert usable, "no recorded trace is as long as one block"
    with_rates = all(t.rates is not None for t in usable)
    out = []
    for _ in range(count):
        parts = {s: [] for s in SIDES}
        rates = {s: [] for s in SIDES}
        while len(parts[DEVICE]) < tokens:
            trace = usable[rng.integers(len(usable))]
            start = int(rng.integers(len(trace) - block + 1))
            for s in SIDES:
                parts[s].extend(trace.accepted[s][start : start + block])
                if with_rates:
                    rates[s].extend(trace.rates[s][start : start + block])
        out.append(
            Trace(
                {s: tuple(parts[s][:tokens]) for s in SIDES},
                {s: tuple(rates[s][:tokens]) for s in SIDES} if with_rates else None,
            )
        )
    return out


def whole_traces(recorded: list[Trace], *, count: int, tokens: int) -> list[Trace]:
    """`count` traces: the recorded runs in turn, each cut to its first `tokens` positions (a
    run replayed again meets another network phase and other decode draws in `sweep`)."""
    short = min(len(t) for t in recorded)
    if tokens > short:
        raise ValueError(f"{tokens} tokens asked, the shortest recorded run has {short}")
    out = []
    for i in range(count):
        trace = recorded[i % len(recorded)]
        rates = None if trace.rates is None else {s: trace.rates[s][:tokens] for s in SIDES}
        out.append(Trace({s: trace.accepted[s][:tokens] for s in SIDES}, rates))
    return out


# -- recording traces (real runs) --------------------------------------------------------------

QUESTIONS = (
    "Write a retry helper for our buoy uploads that follows our retry policy, using asyncio.",
    "Read our sensor CSV files with the csv module and average the salinity per buoy.",
    "How should tidepool log to journald? Show a logging configuration with handlers.",
    "Parse ISO 8601 timestamps with datetime and store the readings as JSON lines.",
)


def record(
    *, model: str, cloud_model: str, tokens: int, temperature: float, questions=QUESTIONS, cpus=None
) -> dict:
    """Run DRAGON in memory (device: examples/private-notes, cloud: stdlib; two model
    instances, each side's model calls on its own cores: `cpus`, default
    `tandem.testbed.cpus.role_cpus()`) and keep each run's acceptance trace and both sides'
    decode timings, with the machines they were measured on."""
    from benchmarks.report import Machines
    from tandem.models.registry import load_model
    from tandem.testbed.cpus import role_cpus
    from tandem.testbed.pinned import pinned

    machines = Machines(
        cpus=cpus or role_cpus(),
        isolation="threads: each side's model calls on workers pinned to its set (one process)",
        shared=["event loop, aggregation, codecs and the in-memory link (not pinned)"],
    )
    names = {DEVICE: model, CLOUD: cloud_model}
    models = {side: load_model(names[side], threads=len(machines.cpus[side])) for side in SIDES}
    with pinned(models, machines.cpus, machines.observed) as sides:
        runs = _record_runs(sides[DEVICE], sides[CLOUD], tokens, temperature, questions)
    return {"model": model, "cloud_model": cloud_model, "temperature": temperature,
            "machines": machines.to_json(), "runs": runs}  # fmt: skip


def _record_runs(device_lm, cloud_lm, tokens: int, temperature: float, questions) -> list[dict]:
    from tandem.models.registry import load_tokenizer
    from tandem.protocols.dragon import DragonConfig, Knowledge, run_pair
    from tandem.protocols.dragon.setup import ensure_index
    from tandem.serve.dragon_demo import default_private_corpus
    from tandem.transport import loop as event_loop

    names = {DEVICE: str(default_private_corpus()), CLOUD: "stdlib"}
    indexer = "qwen2.5-coder-0.5b"  # the cached indexes (chunk text only; rows re-encode it)
    knowledge = {}
    for side, corpus in names.items():
        index = ensure_index(corpus, tokenizer=load_tokenizer(indexer), tokenizer_name=indexer)
        knowledge[side] = Knowledge.from_index(index)
    config = DragonConfig(
        max_new_tokens=tokens, temperature=temperature, stop_at_eos=False, rtt_probe_s=0.0
    )
    runs = []
    for question in questions:
        device, _ = event_loop.run(
            run_pair(device_lm=device_lm, cloud_lm=cloud_lm, device_knowledge=knowledge[DEVICE],
                     cloud_knowledge=knowledge[CLOUD], question=question, config=config)
        )  # fmt: skip
        decode_times = {s: [list(x) for x in device.decode_times[s]] for s in SIDES}
        runs.append(
            _recorded_run(question, device.resolutions, decode_times, device.mean_per_token_s)
        )
    return runs


def _recorded_run(question, resolutions, decode_times, mean_per_token_s, *, rates=True) -> dict:
    """One run of a recording: the acceptance of each side's draft at every position the side
    aggregated (the other side's log rows are left out), with Eq. 5's rates if `rates`."""
    rows = [r for r in resolutions if r["aggregated"]]
    run = {
        "question": question,
        "accepted": {s: [bool(r[s]) for r in rows] for s in SIDES},
        "decode_times": decode_times,
        "mean_per_token_s": mean_per_token_s,
    }
    if rates:
        run["rates"] = {s: [float(r[f"rate_{s}"]) for r in rows] for s in SIDES}
    return run


def recording_from_latency(result: dict) -> dict:
    """A recording from a `tandem bench dragon latency` result: the acceptance trace and decode
    timings of each question's run of its first DRAGON method (the live form: `tandem demo`'s
    settings), at the smallest delay the file has (a question's outcomes do not depend on the
    delay). Raises ValueError when the file holds no DRAGON run with resolutions."""
    runs = [r for r in result.get("runs", []) if r.get("resolutions")]
    dragon = [r for r in runs if str(r.get("method", "")).startswith("dragon")]
    if not dragon:
        raise ValueError("no DRAGON run with a resolution log in this latency result")
    method = dragon[0]["method"]
    delay = min(r["delay_ms"] for r in dragon if r["method"] == method)
    chosen = [r for r in dragon if r["method"] == method and r["delay_ms"] == delay]
    setup = result.get("setup", {})
    temperature = setup.get("temperature", 0.0)
    out = [  # greedy: no rates, the tracker learns the 0/1 outcomes (as the live one does)
        _recorded_run(r["question"], r["resolutions"], r["decode_times"], r.get("per_token_s"),
                      rates=temperature > 0)
        for r in chosen
    ]  # fmt: skip
    model = setup.get("model", "?")
    return {"model": model, "cloud_model": model, "temperature": temperature,
            "machines": result.get("machines"), "runs": out,
            "source": {"method": method, "delay_ms": delay}}  # fmt: skip


def load_recording(recording: dict, *, skip_first: int = 1) -> tuple[list[Trace], DecodeTimes]:
    """Traces and decode-time samples of a recording (each side's first `skip_first` drafts
    per run are dropped: warm-up)."""
    traces = [
        Trace(
            {s: tuple(r["accepted"][s]) for s in SIDES},
            {s: tuple(r["rates"][s]) for s in SIDES} if "rates" in r else None,
        )
        for r in recording["runs"]
    ]
    samples, profile = {}, {}
    for s in SIDES:
        pairs = [p for r in recording["runs"] for p in r["decode_times"][s][skip_first:]]
        samples[s] = np.array([seconds for _, seconds in pairs])
        profile[s] = fit_latency([c for c, _ in pairs], [x for _, x in pairs])
    return traces, DecodeTimes(samples, profile=profile)


# -- the experiment --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SchedConfig:
    traces: int = 50
    tokens: int = 100
    block: int = 10
    extras_s: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4)
    scenarios: tuple[tuple[str, float], ...] = (
        ("as measured", 1.0),
        ("cloud 10x faster", 0.1),
        ("cloud 3x faster", 1 / 3),
        ("cloud 2x faster", 0.5),
        ("device 2x faster", 2.0),
    )
    box_extra_s: float = 0.3
    acceptance_ema: float = DragonConfig.acceptance_ema  # the live default (0.3 until 2026-11-27)
    switch_margin_s: float = 0.0  # the live default (DragonConfig.switch_margin_s)
    switch_horizon: int = DragonConfig.switch_horizon  # the live default (0 until 2026-11-27)
    # the live default ("eq7", the paper's, until 2026-12-02)
    scheduler_model: str = DragonConfig.scheduler_model
    # replay each recorded run whole (cycled to `traces`, each time under another network
    # phase and decode draws) instead of block-bootstrapped mixes of all runs
    whole_runs: bool = False
    recorded_rates: bool = True  # False: the tracker learns 0/1 outcomes (older recordings)
    lookahead: int = DragonConfig.lookahead  # the live default (8 until 2026-11-26)
    mirror: bool = False  # the paper's protocol; True replays the live default (SimConfig)
    seed: int = 0

    @property
    def sim(self) -> SimConfig:
        return SimConfig(
            tokens=self.tokens,
            lookahead=self.lookahead,
            acceptance_ema=self.acceptance_ema,
            switch_margin_s=self.switch_margin_s,
            switch_horizon=self.switch_horizon,
            scheduler_model=self.scheduler_model,
            recorded_rates=self.recorded_rates,
            mirror=self.mirror,
        )


def noise_for(extra_s: float) -> float:
    return max(0.002, extra_s / 25)


def sweep(traces: list[Trace], decode: DecodeTimes, config: SchedConfig) -> dict:
    """Every strategy on every trace, scenario and extra latency (paired: same trace, decode
    draws, network phase and noise for every strategy)."""
    out = {}
    for name, cloud_scale in config.scenarios:
        scaled = DecodeTimes(decode.samples, scale={DEVICE: 1.0, CLOUD: cloud_scale}, profile=None)
        rows = {}
        for extra in config.extras_s:
            cell = {s: {"total_s": [], "per_token_s": [], "switches": []} for s in STRATEGIES}
            for i, trace in enumerate(traces):
                phase = float(np.random.default_rng([config.seed, i]).uniform(0, 2 * math.pi))
                net = Network(extra_s=extra, phase=phase, noise_s=noise_for(extra), seed=i)
                for strategy in STRATEGIES:
                    result = simulate(trace, scaled, net, strategy, config.sim,
                                      seed=config.seed * 1000 + i)  # fmt: skip
                    cell[strategy]["total_s"].append(result.total_s)
                    cell[strategy]["per_token_s"].extend(result.per_token)
                    cell[strategy]["switches"].append(result.switches)
            rows[f"{extra:g}"] = cell
        out[name] = rows
    return out


def summarize(raw: dict) -> dict:
    table = {}
    for scenario, rows in raw.items():
        table[scenario] = {}
        for extra, cell in rows.items():
            stats = {
                s: {
                    "total_mean_s": float(np.mean(v["total_s"])),
                    "total_std_s": float(np.std(v["total_s"])),
                    "per_token_mean_s": float(np.mean(v["per_token_s"])),
                    "per_token_std_s": float(np.std(v["per_token_s"])),
                    "per_token_p50_s": float(np.percentile(v["per_token_s"], 50)),
                    "per_token_p90_s": float(np.percentile(v["per_token_s"], 90)),
                    "switches_mean": float(np.mean(v["switches"])),
                }
                for s, v in cell.items()
            }
            fixed = min(stats[s]["total_mean_s"] for s in ("cloud", "device", "random"))
            stats["dragon_vs_best_other"] = stats["dragon"]["total_mean_s"] / fixed
            table[scenario][extra] = stats
    return table


def plot(raw: dict, table: dict, config: SchedConfig, out, name: str):
    from benchmarks.report import new_figure, save_png

    fig, axes = new_figure(ncols=2, nrows=len(raw), size=(5.5, 3.6))
    for row, scenario in enumerate(raw):
        left, right = axes[row][0], axes[row][1]
        extras = list(table[scenario])
        for strategy in STRATEGIES:
            means = [table[scenario][e][strategy]["total_mean_s"] for e in extras]
            stds = [table[scenario][e][strategy]["total_std_s"] for e in extras]
            xs = [1000 * float(e) for e in extras]
            left.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=strategy)
        left.set_xlabel("extra RTT (ms)")
        left.set_ylabel(f"time for {config.tokens} tokens (s)")
        left.set_title(f"{scenario}: mean ± std over {config.traces} traces", fontsize=9)
        left.legend(fontsize=8)
        box = min(config.extras_s, key=lambda e: abs(e - config.box_extra_s))
        cell = raw[scenario][f"{box:g}"]
        right.boxplot([cell[s]["per_token_s"] for s in STRATEGIES], showfliers=False)
        right.set_xticks(range(1, len(STRATEGIES) + 1), list(STRATEGIES))
        right.set_ylabel("per-token latency (s)")
        right.set_title(f"{scenario}, extra RTT {1000 * box:g} ms", fontsize=9)
    return save_png(fig, out, name)


def run(*, recording: dict, config: SchedConfig, out, name: str = "dragon_sched") -> dict:
    from rich.console import Console
    from rich.table import Table

    from benchmarks.report import save_json

    recorded, decode = load_recording(recording)
    if config.whole_runs:
        traces = whole_traces(recorded, count=config.traces, tokens=config.tokens)
        described = (f"{config.traces} x {config.tokens} positions: the {len(recorded)} "
                     "recorded runs replayed whole, in turn")  # fmt: skip
    else:
        traces = bootstrap_traces(recorded, count=config.traces, tokens=config.tokens,
                                  block=config.block, seed=config.seed)  # fmt: skip
        described = (f"{config.traces} x {config.tokens} positions, block bootstrap (blocks of "
                     f"{config.block}) of the recorded runs")  # fmt: skip
    raw = sweep(traces, decode, config)
    table = summarize(raw)
    rates = {s: float(np.mean([a for t in recorded for a in t.accepted[s]])) for s in SIDES}
    payload = {
        "figure": "DRAGON Fig. 8 (scheduling strategies, record-and-replay simulator)",
        "config": {**vars(config), "sim": vars(config.sim)},
        "recording": {
            "model": recording["model"],
            "cloud_model": recording["cloud_model"],
            "temperature": recording["temperature"],
            "runs": len(recorded),
            "positions": [len(t) for t in recorded],
            "acceptance_rate": rates,
            "scheduler_learns": "recorded Eq. 5 rates"
            if config.recorded_rates and all(t.rates is not None for t in recorded)
            else "0/1 outcomes",
            "decode_mean_s": {s: float(decode.samples[s].mean()) for s in SIDES},
            "decode_std_s": {s: float(decode.samples[s].std()) for s in SIDES},
            "machines": recording.get("machines"),  # where the decode times were measured
            "source": recording.get("source"),  # set when read from a latency result
        },  # fmt: skip
        "network": "RTT(t) = 2 ms + extra + extra/5 sin(2 pi t / (20 pi s) + phase) + N(0, "
        "max(2 ms, extra/25)) per 100 ms; one-way = RTT/2; phase uniform per trace",
        "traces": described,
        "summary": table,
        "paper": "Fig. 8: DRAGON matches or beats Cloud, Device, Random at every extra latency "
        "(0-400 ms), with gains growing with latency",
    }
    save_json(out, name, payload)
    plot(raw, table, config, out, name)
    console = Console()
    for scenario, rows in table.items():
        grid = Table("extra ms", *STRATEGIES, "dragon / best other", title=scenario)
        for extra, stats in rows.items():
            cells = [
                f"{stats[s]['total_mean_s']:.2f}±{stats[s]['total_std_s']:.2f}" for s in STRATEGIES
            ]
            grid.add_row(f"{1000 * float(extra):g}", *cells, f"{stats['dragon_vs_best_other']:.3f}")
        console.print(grid)
    return payload
