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
"""

from __future__ import annotations

import json
import time
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
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(model)))
    tmp.replace(path)
    return model


class AcceptanceTracker:
    """Moving-average acceptance rate per side (the first observation initialises it)."""

    def __init__(self, weight: float = 0.3):
        self.weight = weight
        self.rates: dict[str, float | None] = dict.fromkeys(SIDES)
        self.accepted = dict.fromkeys(SIDES, 0)
        self.seen = 0

    def observe(self, rates: dict[str, float], accepted: dict[str, bool]) -> None:
        """`rates`: this step's estimate per side (Eq. 5, or 0/1 when greedy)."""
        self.seen += 1
        for side in SIDES:
            self.accepted[side] += int(accepted[side])
            old = self.rates[side]
            new = float(rates[side])
            self.rates[side] = new if old is None else (1 - self.weight) * old + self.weight * new

    def alpha(self) -> dict[str, float]:
        return {side: (0.5 if rate is None else rate) for side, rate in self.rates.items()}

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
