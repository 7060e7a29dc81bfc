"""What one speculative generation measured, and the headline numbers derived from it.

Words used here:
- *verdict*: one VerifyResult. Its *tokens* are the accepted drafts plus the next token when
  there is one (recovered, resampled or bonus): "accepted length incl. bonus" averages those,
  "excl. bonus" averages the accepted drafts only (PicoSpec's and SQS-SD's conventions).
- *draft step*: one drafted token (one draft-model forward pass + codec work); T_draft is the
  mean step time times `draft_len`, the time to draft one block (PicoSpec Sec. 3.4).
- *T_verify*: the cloud's forward pass + verification time of one verdict (sent back in it).
- *network time* of a verdict: send-to-receive latency minus T_verify (RTT + serialization +
  any wait in the cloud's queue).
- *acceptance rate* alpha: accepted drafts / (accepted drafts + rejections), the maximum
  likelihood estimate of PicoSpec's per-token acceptance probability.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from tandem.protocols.report import Headline, from_times


@dataclass
class VerdictRecord:
    num_accepted: int
    has_next: bool
    rejected: bool
    verify_s: float
    latency_s: float  # request sent -> verdict received (device clock)


@dataclass
class SpecReport:
    """Everything the device measured in one generation (times in seconds)."""

    mode: str  # "spec", "private-spec", "ar" (cloud autoregressive) or "local" (device only)
    config: dict
    tokens: list[int]
    text: str
    total_s: float  # start message sent -> last token known
    token_times: list[float]  # when each output token became known (from the start)
    device_prefill_s: float = 0.0
    draft_steps: list[float] = field(default_factory=list)
    drafted: int = 0  # tokens drafted (including discarded ones)
    verdicts: list[VerdictRecord] = field(default_factory=list)
    uplink_bytes: int = 0
    downlink_bytes: int = 0
    payload_bits: int = 0  # codec payload bits of the drafts sent (uplink distributions)
    drafts_sent: int = 0
    chunk_sizes: list[int] = field(default_factory=list)  # drafts per request, in order
    cancelled_steps: int = 0  # draft steps preempted by a rejection (interrupt)
    truncated_chunks: int = 0  # partial blocks sent by latency-aware truncation
    branches: dict = field(default_factory=dict)  # eager branches: opened, sent, promoted
    branch_s: list[float] = field(default_factory=list)  # drafting each branch (all its steps)
    cloud: dict = field(default_factory=dict)  # the cloud's own measurements
    docs: list[str] = field(default_factory=list)  # private-spec: this side's retrieved chunks
    put_back: list[str] = field(default_factory=list)  # ... and those its prompt put back

    def summary(self) -> dict:
        """Headline numbers (times in ms, rates per second)."""
        n = len(self.tokens)
        ttft = self.token_times[0] if self.token_times else 0.0
        decode_s = self.total_s - ttft
        accepted = sum(v.num_accepted for v in self.verdicts)
        rejections = sum(v.rejected for v in self.verdicts)
        incl = [v.num_accepted + v.has_next for v in self.verdicts]
        gamma = self.config.get("draft_len", 0)
        step = _mean(self.draft_steps)
        return {
            "mode": self.mode,
            "tokens": n,
            "throughput_tok_s": n / self.total_s if self.total_s > 0 else 0.0,
            "ttft_ms": 1e3 * ttft,
            "tpot_ms": 1e3 * decode_s / (n - 1) if n > 1 else 0.0,
            "t_draft_ms": 1e3 * step * gamma,
            "t_draft_token_ms": 1e3 * step,
            "t_verify_ms": 1e3 * _mean([v.verify_s for v in self.verdicts]),
            "network_ms": 1e3 * _median([v.latency_s - v.verify_s for v in self.verdicts]),
            "verdicts": len(self.verdicts),
            "accepted_len_incl_bonus": _mean(incl),
            "accepted_len_excl_bonus": _mean([v.num_accepted for v in self.verdicts]),
            "acceptance_rate": accepted / (accepted + rejections) if accepted + rejections else 0.0,
            "resampling_rate": rejections / len(self.verdicts) if self.verdicts else 0.0,
            "drafted": self.drafted,
            "wasted_drafts": max(0, self.drafted - accepted),
            "cancelled_steps": self.cancelled_steps,
            "uplink_bytes_per_token": self.uplink_bytes / n if n else 0.0,
            "downlink_bytes_per_token": self.downlink_bytes / n if n else 0.0,
            "payload_bits_per_draft": self.payload_bits / self.drafts_sent
            if self.drafts_sent
            else 0.0,
            "device_prefill_ms": 1e3 * self.device_prefill_s,
            **({"branches": dict(self.branches)} if self.branches else {}),
        }

    def headline(self) -> Headline:
        """Tokens ended before the budget only at the end-of-sequence token."""
        budget = self.config.get("max_new_tokens")
        finish = "eos" if budget is not None and len(self.tokens) < budget else "length"
        return from_times(
            self.mode,
            self.tokens,
            self.token_times,
            finish,
            uplink_bytes=self.uplink_bytes,
            downlink_bytes=self.downlink_bytes,
        )

    def to_json(self) -> dict:
        data = asdict(self)
        data["summary"] = self.summary()
        return data


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


SUMMARY_ROWS = (
    ("throughput_tok_s", "throughput (tok/s)", "{:.2f}"),
    ("ttft_ms", "TTFT (ms)", "{:.0f}"),
    ("tpot_ms", "TPOT (ms)", "{:.0f}"),
    ("t_draft_ms", "T_draft per block (ms)", "{:.0f}"),
    ("t_verify_ms", "T_verify (ms)", "{:.0f}"),
    ("accepted_len_incl_bonus", "mean accepted length incl. bonus", "{:.2f}"),
    ("accepted_len_excl_bonus", "mean accepted length excl. bonus", "{:.2f}"),
    ("acceptance_rate", "acceptance rate", "{:.2f}"),
    ("uplink_bytes_per_token", "uplink bytes / token", "{:.0f}"),
    ("downlink_bytes_per_token", "downlink bytes / token", "{:.0f}"),
)


# the rows measured from verdicts: with none, there is nothing to show
VERDICT_KEYS = frozenset(
    {"t_verify_ms", "accepted_len_incl_bonus", "accepted_len_excl_bonus", "acceptance_rate"}
)


def summary_table(report: SpecReport):
    """A rich table of the headline numbers."""
    from rich.table import Table

    summary = report.summary()
    table = Table(title=f"tandem {report.mode}: {summary['tokens']} tokens")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, label, fmt in SUMMARY_ROWS:
        if not summary["verdicts"] and key in VERDICT_KEYS:
            table.add_row(label, "- (no draft verified)")  # not 0: nothing was measured
        else:
            table.add_row(label, fmt.format(summary[key]))
    if report.config.get("pipeline") == "eager" and "ar_tokens" in report.cloud:
        table.add_row("tokens the cloud decoded on its own", str(report.cloud["ar_tokens"]))
    return table
