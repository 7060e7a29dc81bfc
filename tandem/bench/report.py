"""Where benchmark results go and how they are written: JSON (raw numbers + environment) and a
PNG plot side by side under `bench/results/`."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def environment() -> dict[str, Any]:
    import torch

    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


def median_seconds(call: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of `repeats` calls after `warmup` discarded ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def save_json(out: Path, name: str, payload: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"environment": environment(), **payload}, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def new_figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6.0, 4.0)):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False
    )
    return fig, axes


def save_png(fig, out: Path, name: str) -> Path:
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
