"""Running generated code: a fresh isolated `python -I` subprocess, never the caller's process.

`execute(program)` writes the program into a temporary folder and runs it there with an empty
environment, a wall-clock timeout (then the whole process group is killed), an address-space
limit (RLIMIT_AS), an output-size limit and no core dumps; *passed* = exit status 0. Used for
HumanEval's tests (`benchmarks.humaneval_tasks`) and RAPID's code tasks
(`tandem.protocols.rapid.tasks`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 10.0
MEMORY_MB = 1024  # RLIMIT_AS of a program
OUTPUT_BYTES = 1 << 20  # RLIMIT_FSIZE: a program printing forever is stopped here
# Sets the limits, then runs the program as __main__ (argv: launcher, program, bytes, bytes).
_LAUNCHER = (
    "import resource, runpy, sys\n"
    "memory, output = int(sys.argv[2]), int(sys.argv[3])\n"
    "resource.setrlimit(resource.RLIMIT_AS, (memory, memory))\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (output, output))\n"
    "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
    "sys.argv = sys.argv[1:2]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


@dataclass(frozen=True)
class Execution:
    status: str  # "passed" | "failed" | "timeout"
    returncode: int | None  # None after a timeout
    seconds: float
    output: str  # the last 2,000 characters of stdout + stderr

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def execute(program: str, *, timeout_s: float = TIMEOUT_S, memory_mb: int = MEMORY_MB) -> Execution:
    """Run `program` in a fresh isolated `python -I` in a temporary folder (see the module
    docstring); the whole process group is killed after `timeout_s`."""
    with tempfile.TemporaryDirectory(prefix="tandem-sandbox-") as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(program)
        argv = [sys.executable, "-I", "-c", _LAUNCHER, str(path)]
        argv += [str(memory_mb << 20), str(OUTPUT_BYTES)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        began = time.perf_counter()
        with open(Path(tmp) / "output.txt", "w+b") as sink:
            proc = subprocess.Popen(
                argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                code: int | None = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                _kill_group(proc)
            seconds = time.perf_counter() - began
            sink.seek(max(0, sink.seek(0, os.SEEK_END) - 4000))
            output = sink.read().decode(errors="replace")[-2000:]
    status = "timeout" if code is None else "passed" if code == 0 else "failed"
    return Execution(status, code, seconds, output)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the program and anything it started (its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
