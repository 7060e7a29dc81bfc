"""Process metrics in the Prometheus text exposition format (version 0.0.4).

Words used here:
- *metric*: a named family, a `counter` (only goes up: tokens, bytes, refusals) or a `gauge`
  (goes up and down: open sessions, RTT estimate, acceptance rate).
- *labels*: key=value pairs that split one family into series (`mode="spec"`).

Thread-safe: decoder threads and the event loop both update it. No dependency beyond the
standard library; `render()` gives what a `/metrics` endpoint returns.

    metrics = Metrics(prefix="tandem_cloud")
    metrics.counter("tokens_total", "Target tokens generated.")
    metrics.inc("tokens_total", 5, mode="spec")
    text = metrics.render()
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
KINDS = ("counter", "gauge")

LabelKey = tuple[tuple[str, str], ...]


@dataclass
class _Family:
    name: str
    kind: str
    help: str
    series: dict[LabelKey, float] = field(default_factory=dict)


def _label_key(labels: dict[str, object]) -> LabelKey:
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if value != int(value) else str(int(value))


class Metrics:
    def __init__(self, prefix: str = "tandem") -> None:
        self.prefix = prefix
        self._families: dict[str, _Family] = {}
        self._lock = threading.Lock()

    def _declare(self, name: str, kind: str, help: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"metric kind {kind!r}: choose from {', '.join(KINDS)}")
        with self._lock:
            known = self._families.get(name)
            if known is not None and known.kind != kind:
                raise ValueError(f"metric {name} is already a {known.kind}")
            if known is None:
                self._families[name] = _Family(name, kind, help)

    def counter(self, name: str, help: str) -> None:
        self._declare(name, "counter", help)

    def gauge(self, name: str, help: str) -> None:
        self._declare(name, "gauge", help)

    def _family(self, name: str) -> _Family:
        try:
            return self._families[name]
        except KeyError:
            raise KeyError(f"metric {name} was not declared") from None

    def inc(self, name: str, value: float = 1.0, **labels: object) -> None:
        """Add `value` (>= 0 for counters) to one series."""
        family = self._family(name)
        if family.kind == "counter" and value < 0:
            raise ValueError(f"counter {name} cannot go down")
        key = _label_key(labels)
        with self._lock:
            family.series[key] = family.series.get(key, 0.0) + float(value)

    def set(self, name: str, value: float, **labels: object) -> None:
        """Set a gauge series."""
        family = self._family(name)
        if family.kind != "gauge":
            raise ValueError(f"{name} is a {family.kind}; only gauges can be set")
        with self._lock:
            family.series[_label_key(labels)] = float(value)

    def value(self, name: str, **labels: object) -> float:
        """One series' current value (0 if never touched)."""
        with self._lock:
            return self._family(name).series.get(_label_key(labels), 0.0)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for family in self._families.values():
                full = f"{self.prefix}_{family.name}" if self.prefix else family.name
                lines.append(f"# HELP {full} {_escape(family.help)}")
                lines.append(f"# TYPE {full} {family.kind}")
                for key, value in sorted(family.series.items()):
                    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in key)
                    series = f"{full}{{{labels}}}" if labels else full
                    lines.append(f"{series} {_format_value(value)}")
        return "\n".join(lines) + "\n"
