"""The profiler: what the scheduler needs to know, measured offline and in-band (paper Sec. 5.2).

Words used here:
- *latency model*: seconds per draft as a line in the context length t,
  `c_dec(t) = intercept + (num / den) t`. Offline, a least-squares fit on dummy documents
  (`profile_decode`, cached per model and batch). Online, the intercept stays frozen and the
  slope follows each measured draft: `num <- (1-rho) num + rho (c - intercept) t`,
  `den <- (1-rho) den + rho t^2` (the paper's update). Both sides send their offline fit at
  session start and piggyback every draft's timing, so both hold the same models.
- *link estimate*: RTT from in-band Ping/Pong (the channel's smoothed estimate), uplink
  bandwidth from one padding burst followed by a Ping (the Pong waits behind the burst).
  No external tools (the paper used ping/sockperf/iperf3).
- *acceptance tracker*: moving average per side of the expected acceptance rate (paper
  Eq. 5) when sampling, or of the observed 0/1 acceptance when greedy.
- *timeline* (issue 14): where one side's time goes per output token. *Work phases* are
  summed busy time (`PHASES`: the decoder thread's decode of the k document rows, its
  decodes for branch drafts (machine.py), relevance scoring, the local mixture, the codec; the event loop's wire (de)serialisation, Algorithm 1,
  the scheduler, the channel send; and the waits: the decoder idle for lack of room or of a
  resolution, a message queued in the outbox); `STARTUP` phases (retrieval, loading the
  documents' stored KV, the prefill of the rest) happen once. The *critical path* splits
  each gap between two target tokens into waiting for this side's own draft, waiting for
  the peer (its draft or its target token: network + the peer's compute) and the rest
  (aggregation, bookkeeping).
  The offline profile and the drafts' `decode_s` feed the scheduler; the timeline only
  reports, it never changes a decision.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tandem.protocols.dragon.config import SIDES


@dataclass
class LatencyModel:
    intercept: float = 0.0  # seconds
    num: float = 0.0  # k_a: weighted sum of (c - intercept) t
    den: float = 0.0  # k_b: weighted sum of t^2
    samples: int = 0

    @property
    def slope(self) -> float:
        return self.num / self.den if self.den > 0 else 0.0

    def predict(self, context: float) -> float:
        return max(self.intercept + self.slope * context, 0.0)

    def update(self, context: float, seconds: float, rho: float) -> None:
        if self.samples == 0 and self.den == 0:  # no offline fit: start from this sample
            self.num, self.den = (seconds - self.intercept) * context, float(context) ** 2
        else:
            self.num = (1 - rho) * self.num + rho * (seconds - self.intercept) * context
            self.den = (1 - rho) * self.den + rho * float(context) ** 2
        self.samples += 1

    def to_list(self) -> list[float]:
        return [self.intercept, self.num, self.den]

    @classmethod
    def from_list(cls, values: list[float] | None) -> LatencyModel:
        if not values:
            return cls()
        intercept, num, den = (float(v) for v in values)
        return cls(intercept=intercept, num=num, den=den)


def fit_latency(contexts: list[float], seconds: list[float]) -> LatencyModel:
    """Least-squares line through (context, seconds); den = mean t^2 so online updates blend."""
    t = np.asarray(contexts, dtype=np.float64)
    c = np.asarray(seconds, dtype=np.float64)
    if len(t) >= 2 and np.ptp(t) > 0:
        slope, intercept = np.polyfit(t, c, 1)
    else:
        slope, intercept = 0.0, float(c.mean()) if len(c) else 0.0
    slope, intercept = max(float(slope), 0.0), max(float(intercept), 0.0)
    den = float((t**2).mean()) if len(t) else 1.0
    return LatencyModel(intercept=intercept, num=slope * den, den=den)


def profile_decode(
    lm,
    *,
    batch: int,
    doc_tokens: int = 64,
    contexts: tuple[int, ...] = (96, 160, 224),
    steps: int = 3,
    seed: int = 0,
) -> LatencyModel:
    """Offline stage: decode `steps` tokens on `batch` rows of random dummy text at each
    context length (the first step of each is a warm-up) and fit the latency line."""
    generator = np.random.default_rng(seed)
    vocab = min(int(lm.tokenizer.vocab_size), int(lm.vocab_size))
    measured_t, measured_c = [], []
    for context in contexts:
        rows = generator.integers(0, vocab, size=(max(batch, 1), max(context, doc_tokens)))
        state = lm.prefill(rows.tolist())
        token = [int(generator.integers(0, vocab))]
        for step in range(steps + 1):
            began = time.perf_counter()
            lm.decode(state, token)
            elapsed = time.perf_counter() - began
            if step:
                measured_t.append(state.seq_len)
                measured_c.append(elapsed)
    return fit_latency(measured_t, measured_c)


def cached_profile(lm, *, batch: int, cache_dir: Path, **kwargs) -> LatencyModel:
    """`profile_decode`, cached as JSON per model fingerprint and batch size."""
    path = Path(cache_dir) / f"{lm.fingerprint[:24]}-batch{batch}.json"
    if path.is_file():
        try:
            return LatencyModel(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass  # unreadable: profile again
    model = profile_decode(lm, batch=batch, **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The device and the cloud of one testbed may profile the same model at once: each writes
    # its own temporary file (a shared name let one writer move the other's file away).
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(asdict(model)))
    os.replace(tmp, path)
    return model


class AcceptanceTracker:
    """Acceptance rate per side: Laplace's rule of succession, (1 + accepted) / (2 + seen),
    until a moving average of weight `weight` takes over (once 1 / (seen + 2) < weight).

    Until 2026-12-02 the first observation initialised the average. Greedy runs observe 0/1,
    so the first position set a side's rate to 0 or 1, and with the live weight 0.05 it took
    some 20 positions to come back; on replayed traces the scheduler acted on that early
    error and lost up to 3.9% to a fixed placement (docs/dragon-figures.md, "A pipelined
    latency model")."""

    def __init__(self, weight: float = 0.3):
        self.weight = weight
        self.rates: dict[str, float] = dict.fromkeys(SIDES, 0.5)  # Laplace's prior
        self.accepted = dict.fromkeys(SIDES, 0)
        self.seen = 0

    def observe(self, rates: dict[str, float], accepted: dict[str, bool]) -> None:
        """`rates`: this step's estimate per side (Eq. 5, or 0/1 when greedy)."""
        self.seen += 1
        step = max(self.weight, 1.0 / (self.seen + 2))
        for side in SIDES:
            self.accepted[side] += int(accepted[side])
            old = self.rates[side]
            self.rates[side] = old + step * (float(rates[side]) - old)

    def alpha(self) -> dict[str, float]:
        return dict(self.rates)

    def observed_rate(self, side: str) -> float:
        return self.accepted[side] / self.seen if self.seen else 0.0


class LinkEstimator:
    """RTT and uplink bandwidth, measured in-band on a channel."""

    def __init__(self, channel) -> None:
        self.channel = channel
        self.bandwidth_bps: float | None = None  # bytes per second, this side's uplink
        self.base_rtt: float | None = None

    @property
    def rtt(self) -> float:
        """Smoothed RTT in seconds (0 before any sample)."""
        return float(self.channel.rtt or self.base_rtt or 0.0)

    async def probe_bandwidth(self, pad_message, nbytes: int, timeout: float = 10.0) -> None:
        """Ping alone, then a burst of `nbytes` followed by a Ping: the extra wait is the burst's
        serialisation time. Leaves `bandwidth_bps` None when the burst is too fast to see."""
        self.base_rtt = await self.channel.ping(timeout)
        began = time.perf_counter()
        await self.channel.send(pad_message)
        loaded = await self.channel.ping(timeout)
        extra = (time.perf_counter() - began) - self.base_rtt
        extra = max(extra, loaded - self.base_rtt)
        if extra > 1e-3:
            self.bandwidth_bps = nbytes / extra

    def transfer_s(self, nbytes: float) -> float:
        return nbytes / self.bandwidth_bps if self.bandwidth_bps else 0.0

    def round_trip(self, up_bytes: float, down_bytes: float) -> float:
        """c_trans_here + c_trans_there: latency both ways plus both messages' serialisation
        (the peer's uplink is assumed as fast as ours)."""
        return self.rtt + self.transfer_s(up_bytes + down_bytes)


# busy phases, in display order: decoder thread, then event loop, then waits
PHASES = (
    "decode", "branch", "relevance", "law", "codec",
    "wire", "aggregate", "schedule", "send",
    "idle", "outbox",
)  # fmt: skip
CRITICAL = ("own", "peer", "resolve")  # the split of every inter-token gap
STARTUP = ("retrieve", "kv_load", "prefill")  # once per session, before the first draft
_THREAD_CLOCK = getattr(time, "pthread_getcpuclockid", None)  # another thread's CPU clock


class Timeline:
    """One side's per-token timeline: busy time per phase (any thread) and, per position, when
    its own draft was queued, when the peer's answer for it arrived and when it was resolved."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.totals: dict[str, float] = defaultdict(float)  # phase -> seconds
        self.cpu: dict[str, float] = defaultdict(float)  # phase -> thread CPU seconds
        self.own: dict[int, float] = {}  # position -> perf_counter when our draft was queued
        self.peer: dict[int, float] = {}  # position -> the peer's draft or target arrived
        self.commit: dict[int, float] = {}  # position -> resolved here
        # this process's CPU seconds at the first and the latest resolution: every thread's
        # work per output token (decode + the per-token Python), as `mean_gap_ms` counts it
        # (a side in its own process, as in the testbed; an in-process pair counts both sides)
        self.process_cpu: tuple[float, float] | None = None  # (first, latest)
        # decode CPU seconds done at the first and the latest resolution, the decode in flight
        # included: the share of `process_cpu`'s window that was decoding (the totals in `cpu`
        # also hold the drafts decoded before the first and after the last resolution)
        self.decode_cpu: tuple[float, float] | None = None  # (first, latest)
        # phase -> (the thread's CPU clock, its reading at the start): CPU work in flight
        self._running: dict[str, tuple[int, float]] = {}
        self.started = time.perf_counter()

    def add(self, phase: str, seconds: float, *, cpu: bool = False) -> None:
        """`cpu`: thread CPU seconds (decode, prefill), which other machines' load on the same
        core hardly changes, unlike wall time."""
        with self._lock:
            (self.cpu if cpu else self.totals)[phase] += seconds
            if cpu:
                self._running.pop(phase, None)

    def cpu_began(self, phase: str) -> float:
        """Called by the thread that starts CPU work of `phase`: until `add(phase, ...,
        cpu=True)` ends it, `cpu_now(phase)` counts the part done so far. Returns the thread's
        CPU time now, the start of what that `add` adds."""
        began = time.thread_time()
        if _THREAD_CLOCK is not None:  # absent: work in flight is not counted
            with self._lock:
                self._running[phase] = _THREAD_CLOCK(threading.get_ident()), began
        return began

    def cpu_now(self, phase: str) -> float:
        """CPU seconds of `phase` so far, the work in flight included."""
        with self._lock:  # the working thread is alive while its entry is in `_running`
            done = self.cpu.get(phase, 0.0)
            if phase in self._running:
                clock, began = self._running[phase]
                done += time.clock_gettime(clock) - began
            return done

    def since(self, phase: str, began: float) -> float:
        """Add the time since `began` to `phase`; returns now (to chain phases)."""
        now = time.perf_counter()
        self.add(phase, now - began)
        return now

    def mark(self, what: str, position: int) -> None:
        """`what`: "own" | "peer" | "commit"; a later mark for a position replaces the earlier
        one (a redraft after a rejection is the draft that counts)."""
        getattr(self, what)[position] = time.perf_counter()
        if what == "commit":
            now = time.process_time()
            self.process_cpu = (self.process_cpu or (now, now))[0], now
            decode = self.cpu_now("decode")
            self.decode_cpu = (self.decode_cpu or (decode, decode))[0], decode

    def critical(self) -> list[dict]:
        """Per resolved position: gap since the previous one (or since the start) in ms, split
        into own / peer / resolve."""
        rows, previous = [], self.started
        for position in sorted(self.commit):
            done = self.commit[position]
            own = min(max(self.own.get(position, previous) - previous, 0.0), done - previous)
            ready = max(previous, self.own.get(position, previous))
            peer = min(max(self.peer.get(position, ready) - ready, 0.0), done - previous - own)
            gap = done - previous
            rows.append(
                {"position": position, "gap_ms": 1e3 * gap, "own_ms": 1e3 * own,
                 "peer_ms": 1e3 * peer, "resolve_ms": 1e3 * (gap - own - peer)}
            )  # fmt: skip
            previous = done
        return rows

    def summary(self) -> dict:
        """JSON: mean ms per output token of every phase and its share of the mean gap between
        target tokens (the first token, TTFT, is split apart and left out of the means)."""
        cpu = dict(self.cpu)
        if self.process_cpu is not None and len(self.commit) > 1:
            first, last = self.process_cpu
            cpu["process_per_later_token"] = (last - first) / (len(self.commit) - 1)
            first, last = self.decode_cpu
            cpu["decode_per_later_token"] = (last - first) / (len(self.commit) - 1)
        return summarize(dict(self.totals), self.critical(), cpu)


def summarize(totals: dict[str, float], critical: list[dict], cpu: dict | None = None) -> dict:
    tokens = len(critical)
    process = (cpu or {}).get("process_per_later_token")
    in_window = (cpu or {}).get("decode_per_later_token")
    later = critical[1:]
    gap = float(np.mean([r["gap_ms"] for r in later])) if later else 0.0
    work = {phase: 1e3 * totals.get(phase, 0.0) / max(tokens, 1) for phase in PHASES}
    path = {
        part: float(np.mean([r[f"{part}_ms"] for r in later])) if later else 0.0
        for part in CRITICAL
    }
    return {
        "tokens": tokens,
        "ttft_ms": critical[0] if critical else None,
        "mean_gap_ms": gap,
        "work_ms_per_token": work,
        "work_share": {p: (v / gap if gap else None) for p, v in work.items()},
        "critical_ms_per_token": path,
        "critical_share": {p: (v / gap if gap else None) for p, v in path.items()},
        "startup_ms": {phase: 1e3 * totals.get(phase, 0.0) for phase in STARTUP},
        "cpu_ms_per_token": {
            "decode": 1e3 * (cpu or {}).get("decode", 0.0) / max(tokens, 1),
            # every thread of this side's process between the first and the last resolution
            "process": None if process is None else 1e3 * process,
            # the decoder's decode CPU in that same window: process - this = the rest's CPU
            "decode_in_window": None if in_window is None else 1e3 * in_window,
        },
        "startup_cpu_ms": {"prefill": 1e3 * (cpu or {}).get("prefill", 0.0)},
        "per_token": critical,
    }
