"""`tandem net up|status|exec|down` through the CLI (loopback mode, so it runs anywhere)."""

from __future__ import annotations

import os
import socket
import sys

from typer.testing import CliRunner

from tandem.cli import app
from tandem.errors import TandemError
from tandem.testbed.netns import net_down


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_net_cli_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    name = f"tandem-c{os.getpid()}"
    runner = CliRunner()
    ports = ["--proxy-port", str(_free_port()), "--service-port", str(_free_port())]
    try:
        up = runner.invoke(
            app,
            ["net", "up", "--loopback", "--name", name, "--delay", "5", "--outage", "60:1", *ports],
        )
        assert up.exit_code == 0, up.output
        assert "up (loopback)" in up.output and "RTT 10 ms" in up.output
        assert "60s+1s" in up.output

        status = runner.invoke(app, ["net", "status", "--name", name])
        assert status.exit_code == 0 and "delay by  proxy" in status.output

        down_only = ["--delay", "5", "--delayed", "down", *ports]  # the paper's: the server's NIC
        again = runner.invoke(app, ["net", "up", "--loopback", "--name", name, *down_only])
        assert again.exit_code == 0, again.output
        assert "cloud -> device only (RTT 5 ms)" in again.output
        bad = runner.invoke(app, ["net", "up", "--loopback", "--name", name, "--delayed", "x"])
        assert "delayed must be one of" in str(bad.exception)  # main() prints it on one line

        code = "import sys; sys.exit(4)"
        ran = runner.invoke(
            app, ["net", "exec", "device", "--name", name, "--", sys.executable, "-c", code]
        )
        assert ran.exit_code == 4

        last = max(os.sched_getaffinity(0))  # both sides on the last core (device: not its default)
        cores = ["--device-cpus", str(last), "--cloud-cpus", str(last)]
        up = runner.invoke(app, ["net", "up", "--loopback", "--name", name, *ports, *cores])
        assert up.exit_code == 0 and f"cpus      device={last} cloud={last}" in up.output
        where = tmp_path / "where.txt"
        code = f"import os; open({str(where)!r}, 'w').write(str(sorted(os.sched_getaffinity(0))))"
        ran = runner.invoke(
            app, ["net", "exec", "device", "--name", name, "--", sys.executable, "-c", code]
        )
        assert ran.exit_code == 0 and where.read_text() == f"[{last}]"

        bad = runner.invoke(app, ["net", "up", "--name", name, "--outage", "soon"])
        assert isinstance(bad.exception, TandemError)  # main() prints it as one line

        down = runner.invoke(app, ["net", "down", "--name", name])
        assert down.exit_code == 0 and "proxy pid" in down.output
        again = runner.invoke(app, ["net", "down", "--name", name])
        assert "was not up" in again.output
        assert "down" in runner.invoke(app, ["net", "status", "--name", name]).output
    finally:
        net_down(name)
