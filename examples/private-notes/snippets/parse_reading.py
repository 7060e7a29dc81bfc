"""Parse one buoy CSV line `timestamp,sensor,value,unit` into a Reading."""

from dataclasses import dataclass
from datetime import datetime, timezone


@dataclass(frozen=True)
class Reading:
    buoy_id: str
    timestamp: datetime
    sensor: str
    value: float
    unit: str


def parse_reading(buoy_id: str, line: str) -> Reading:
    stamp, sensor, value, unit = line.strip().split(",")
    when = datetime.fromtimestamp(int(stamp), tz=timezone.utc)  # buoys send epoch seconds
    return Reading(buoy_id, when, sensor.lower(), float(value), unit)
