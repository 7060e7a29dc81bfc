"""What one side of a DRAGON session measured, for printing, JSON and benchmarks.

Words used here:
- *token time*: seconds from the session start until this side knew a target token
  (aggregated here, or received from the peer); per-token latency is their difference.
- *aggregation*: one run of Algorithm 1 on a pair of drafts (positions resolved after a
  fault, from the local law alone, are not aggregations).
- *resolution log*: for every position, which side resolved it and whether each side's draft
  was accepted: the record-and-replay acceptance trace a scheduling simulator needs.
- *decision log*: the aggregator's scheduler inputs and output after each aggregation it ran.
- *timeline*: where this side's time went per output token (`profiler.Timeline.summary()`);
  *peer timeline*: the cloud's, sent to the device when the settings ask for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tandem.protocols.dragon.config import DEVICE, SIDES
from tandem.protocols.report import Headline, from_times


@dataclass
class SideReport:
    role: str
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""  # "length" | "eos" | "aborted"
    degraded: bool = False  # the peer was lost; the rest came from the local law only
    degraded_reason: str = ""
    degraded_at: int | None = None  # first position resolved without the peer
    ready_s: float = 0.0  # retrieval + prefill on this side
    peer_ready_s: float | None = None
    token_times: list[float] = field(default_factory=list)
    resolutions: list[dict] = field(default_factory=list)
    # position, by, aggregated, accepted per side; rate_<side>: Eq. 5 rate (when aggregated)
    decisions: list[dict] = field(default_factory=list)
    switches: list[tuple[int, str]] = field(default_factory=list)  # (position, new aggregator)
    first_aggregator: str = DEVICE  # the side that aggregated position 0 (Scheduler.first)
    decode_times: dict[str, list[tuple[int, float]]] = field(
        default_factory=lambda: {side: [] for side in SIDES}
    )  # side -> (context, seconds) of every draft seen
    bytes_sent: int = 0
    bytes_received: int = 0
    probe_bytes: int = 0  # the one padding burst of the bandwidth probe (in bytes_sent)
    drafts_made: int = 0
    drafts_dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIDES, 0))
    branches_made: int = 0  # branch drafts this side made and sent (machine.py)
    branches_adopted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIDES, 0))
    mirrored: int = 0  # positions resolved before the aggregator's verdict (machine.py)
    decodes_cancelled: int = 0
    rollbacks: int = 0
    docs: list[tuple[str, float]] = field(default_factory=list)  # (doc id, retrieval score)
    put_back: list[str] = field(default_factory=list)  # chunks a joined row holds, not retrieved
    peer_docs: int | None = None  # how many documents the peer retrieved (ids stay there)
    kv_hits: int = 0
    rtt_s: float | None = None
    bandwidth_bps: float | None = None
    wall_s: float = 0.0
    timeline: dict | None = None  # this side's `profiler.Timeline.summary()`
    peer_timeline: dict | None = None  # the peer's, when `DragonConfig.timeline` asked for it

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def per_token_s(self) -> list[float]:
        return [float(x) for x in np.diff(self.token_times)] if len(self.token_times) > 1 else []

    @property
    def mean_per_token_s(self) -> float | None:
        gaps = self.per_token_s
        return float(np.mean(gaps)) if gaps else None

    def headline(self) -> Headline:
        sent, received = self.bytes_sent, self.bytes_received
        up, down = (sent, received) if self.role == DEVICE else (received, sent)
        return from_times(
            "dragon",
            self.tokens,
            self.token_times,
            self.finish_reason,
            uplink_bytes=up,
            downlink_bytes=down,
        )

    @property
    def aggregations(self) -> int:
        return sum(1 for r in self.resolutions if r["aggregated"])

    def accepted(self, side: str) -> int:
        return sum(1 for r in self.resolutions if r["aggregated"] and r[side])

    def acceptance_rate(self, side: str) -> float | None:
        return self.accepted(side) / self.aggregations if self.aggregations else None

    def aggregated_by(self, side: str) -> int:
        return sum(1 for r in self.resolutions if r["aggregated"] and r["by"] == side)

    def summary(self) -> dict:
        """JSON-friendly numbers (no token ids)."""
        return {
            "role": self.role,
            "new_tokens": len(self.tokens),
            "finish_reason": self.finish_reason,
            "degraded": self.degraded,
            "degraded_reason": self.degraded_reason,
            "degraded_at": self.degraded_at,
            "ready_s": self.ready_s,
            "ttft_s": self.ttft_s,
            "mean_per_token_s": self.mean_per_token_s,
            "per_token_s": self.per_token_s,
            "aggregations": self.aggregations,
            "aggregated_by": {side: self.aggregated_by(side) for side in SIDES},
            "acceptance_rate": {side: self.acceptance_rate(side) for side in SIDES},
            "first_aggregator": self.first_aggregator,
            "switches": [list(s) for s in self.switches],
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "probe_bytes": self.probe_bytes,
            "drafts_made": self.drafts_made,
            "drafts_dropped": self.drafts_dropped,
            "branches_made": self.branches_made,
            "branches_adopted": self.branches_adopted,
            "mirrored": self.mirrored,
            "decodes_cancelled": self.decodes_cancelled,
            "rollbacks": self.rollbacks,
            "docs": [list(d) for d in self.docs],
            "put_back": list(self.put_back),
            "peer_docs": self.peer_docs,
            "kv_hits": self.kv_hits,
            "rtt_s": self.rtt_s,
            "bandwidth_bps": self.bandwidth_bps,
            "wall_s": self.wall_s,
            "timeline": self.timeline,
            "peer_timeline": self.peer_timeline,
        }


def timeline_lines(summary: dict | None, title: str) -> list[str]:
    """A compact text view of a `profiler.Timeline.summary()`: ms per token and share of the
    mean inter-token gap, critical path first, then busy time per phase."""
    if not summary or not summary.get("tokens"):
        return [f"{title}: no timeline"]
    first = summary["ttft_ms"]

    def cells(values: dict, shares: dict) -> str:
        return "  ".join(
            f"{name} {ms:.1f}" + (f" ({shares[name]:.0%})" if shares.get(name) is not None else "")
            for name, ms in values.items()
        )

    return [
        f"{title}: {summary['tokens']} tokens, {summary['mean_gap_ms']:.1f} ms/token after the "
        f"first (TTFT {first['gap_ms']:.0f} ms: own {first['own_ms']:.0f}, peer "
        f"{first['peer_ms']:.0f}, resolve {first['resolve_ms']:.0f}; "
        + ", ".join(f"{k} {v:.0f}" for k, v in summary.get("startup_ms", {}).items())
        + ")",
        "  waiting for  " + cells(summary["critical_ms_per_token"], summary["critical_share"]),
        "  busy         " + cells(summary["work_ms_per_token"], summary["work_share"]),
        f"  cpu          decode {summary['cpu_ms_per_token']['decode']:.1f} ms/token, prefill "
        f"{summary['startup_cpu_ms']['prefill']:.0f} ms (the decoder thread's CPU time)"
        + process_cpu(summary),
    ]


def process_cpu(summary: dict) -> str:
    process = summary["cpu_ms_per_token"].get("process")
    if process is None:
        return ""
    decoding = summary["cpu_ms_per_token"].get("decode_in_window")
    rest = "" if decoding is None else f" ({process - decoding:.1f} of it beyond decoding)"
    return f"; every thread {process:.1f} ms/token{rest}"
