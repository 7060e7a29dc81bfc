"""Where benchmark results go and how they are written: JSON (raw numbers + environment) and a
PNG plot side by side under `benchmarks/results/`.

Every JSON carries `environment` (this box: its processor model and vector instruction sets,
the llama.cpp build's kernels; this process's cpu set, torch threads and load average when
saved, and `code`: the git commit of the tandem that ran, and whether its tracked
files differed from it outside `benchmarks/results/`); a benchmark that runs a device and a
cloud also passes `Machines`, which adds `machines`: each side's cpu set and engine threads,
how the sides were kept apart, what each side saw of itself, and the load average before and
after the run.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.errors import TandemError
from tandem.testbed.cpus import cpu_info, loadavg, machine_state, overlap


def environment() -> dict[str, Any]:
    import torch

    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu": cpu_info(),
        "llama_cpp": llama_cpp_build(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "this_process": machine_state(),
        "code": code_version(),
    }


def llama_cpp_build() -> dict[str, str] | None:
    """llama-cpp-python's version, the kernels its build uses (llama.cpp's system info
    line, e.g. "AVX2 = 1 | ...") and the numerics mode of its models; None where it is not
    installed or does not load (a result is saved either way)."""
    try:
        import llama_cpp

        from tandem.models.llamacpp import default_numerics

        info = llama_cpp.llama_print_system_info()
    except (ImportError, OSError, AttributeError):
        return None
    return {
        "version": llama_cpp.__version__,
        "system_info": info.decode(errors="replace").strip(" |"),  # llama.cpp returns bytes
        # the models' default as this run saw it ($TANDEM_LLAMA_NUMERICS, passed on to workers)
        "numerics": default_numerics(),
    }


def code_version(root: Path | None = None) -> dict[str, Any]:
    """{"commit": the HEAD of the checkout `root` (default: the one this tandem was imported
    from), "dirty": whether its tracked files differ from HEAD outside benchmarks/results/
    (where the run itself writes)}; both None outside a git checkout or without git."""
    import tandem

    root = root or Path(tandem.__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


@dataclass(kw_only=True)
class Machines:
    """The emulated machines of one run. Make it when the run starts (the load average before
    is read then); `save_json(..., machines=)` adds the load average after."""

    cpus: dict[str, list[int]]  # role -> cpu set
    isolation: str  # how the sides were kept on their sets
    # role -> engine threads (default: the set's size)
    threads: dict[str, int] = field(default_factory=dict)
    observed: dict[str, dict] = field(default_factory=dict)  # role -> machine_state() it saw
    shared: list[str] = field(default_factory=list)  # what still runs on more than one set
    load_before: list[float] = field(default_factory=loadavg)

    def __post_init__(self) -> None:
        self.threads = {role: self.threads.get(role, len(c)) for role, c in self.cpus.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "threads": self.threads,
            "overlap": overlap(self.cpus),
            "isolation": self.isolation,
            "shared": self.shared,
            "observed": self.observed,
            "load_average": {"before": self.load_before, "after": loadavg()},
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


def save_json(
    out: Path, name: str, payload: dict[str, Any], *, machines: Machines | None = None
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    head: dict[str, Any] = {"environment": environment()}
    if machines is not None:
        head["machines"] = machines.to_json()
    tmp.write_text(json.dumps({**head, **payload}, indent=2) + "\n")
    os.replace(tmp, path)
    return _saved(path)


def _saved(path: Path) -> Path:
    """Every benchmark says where its files went (stderr; stdout keeps the figures). In a
    source checkout that is `benchmarks/results`, where a re-run replaces the published file."""
    print(f"saved {path}", file=sys.stderr, flush=True)
    return path


def pyplot():
    """matplotlib's pyplot on the Agg backend; matplotlib is optional (`tandem[bench]`), and
    every benchmark saves its JSON before it draws."""
    try:
        import matplotlib
    except ImportError:
        raise TandemError(
            "matplotlib is not installed, so no PNG was drawn (the JSON is saved): "
            "pip install 'tandem[bench]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def new_figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6.0, 4.0)):
    plt = pyplot()
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False
    )
    return fig, axes


def save_png(fig, out: Path, name: str) -> Path:
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return _saved(path)
