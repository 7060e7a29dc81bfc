"""Load tidepool's settings: defaults < /etc/tidepool/tidepool.toml < TIDEPOOL_* env vars."""

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

CONFIG_PATH = Path("/etc/tidepool/tidepool.toml")


@dataclass(frozen=True)
class Settings:
    db_path: Path = Path("/var/lib/tidepool/readings.db")
    poll_seconds: int = 30
    api_port: int = 8443
    flatline_hours: float = 2.0


def load_settings(path: Path = CONFIG_PATH) -> Settings:
    values = {}
    if path.exists():
        values.update(tomllib.loads(path.read_text())["tidepool"])
    for field in Settings.__dataclass_fields__:
        env = os.environ.get(f"TIDEPOOL_{field.upper()}")
        if env is not None:
            values[field] = env
    return Settings(**values)
