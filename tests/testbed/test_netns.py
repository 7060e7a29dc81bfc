"""`tandem net`: pure command building, the loopback fallback (always), and real namespaces.

The namespace tests need root and `ip netns`; they skip with the reason otherwise. Each
uses its own network name (tandem-t<pid>) and state dir, and the fixture calls `net_down`
even when the test fails, so nothing is left behind.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.errors import TandemError
from tandem.testbed.cpus import available, plan
from tandem.testbed.netns import (
    CLOUD_ADDRESS,
    WIRE_OVERHEAD,
    NetConfig,
    NetStatus,
    namespace_exists,
    namespace_names,
    net_down,
    net_exec,
    net_status,
    net_up,
    netns_unavailable_reason,
    proxy_argv,
    qdisc_commands,
    side_argv,
)

# ---------------------------------------------------------------- pure


def test_qdisc_commands_proxy_path_uses_tbf_only():
    assert qdisc_commands("tdev0", delay_ms=50, jitter_ms=5, rate_mbit=None, netem=False) == []
    (command,) = qdisc_commands("tdev0", delay_ms=50, jitter_ms=5, rate_mbit=20, netem=False)
    assert command[:6] == ["tc", "qdisc", "add", "dev", "tdev0", "root"]
    assert command[6:9] == ["tbf", "rate", f"{int(20e6 * WIRE_OVERHEAD)}bit"]


def test_qdisc_commands_netem_path_puts_tbf_under_netem():
    netem, tbf = qdisc_commands("tcloud0", delay_ms=50, jitter_ms=5, rate_mbit=20, netem=True)
    assert netem[-4:] == ["netem", "delay", "50ms", "5ms"] and "root" in netem
    assert tbf[5:9] == ["parent", "1:1", "handle", "10:"]
    (only,) = qdisc_commands("tcloud0", delay_ms=50, jitter_ms=0, rate_mbit=None, netem=True)
    assert only[-3:] == ["netem", "delay", "50ms"]


def test_proxy_argv_delay_and_rate_go_where_the_path_says(tmp_path):
    config = NetConfig(delay_ms=50, jitter_ms=5, rate_mbit=20, outages=((3.0, 1.0),))
    netns_proxy = proxy_argv(
        config, listen_host=CLOUD_ADDRESS, netem=False, loopback=False, ready_file=tmp_path / "r"
    )
    assert "--delay-ms" in netns_proxy and "--rate-mbit" not in netns_proxy  # tbf gives the rate
    assert netns_proxy[netns_proxy.index("--outage") + 1] == "3.0:1.0"
    netem_proxy = proxy_argv(
        config, listen_host=CLOUD_ADDRESS, netem=True, loopback=False, ready_file=tmp_path / "r"
    )
    assert "--delay-ms" not in netem_proxy  # netem gives the delay; the proxy only outages
    loop_proxy = proxy_argv(
        config, listen_host="127.0.0.1", netem=False, loopback=True, ready_file=tmp_path / "r"
    )
    assert loop_proxy[loop_proxy.index("--rate-mbit") + 1] == "20"
    assert loop_proxy[loop_proxy.index("--delayed") + 1] == "both"
    down = NetConfig(delay_ms=300, jitter_ms=60, delayed="down")
    down_proxy = proxy_argv(
        down, listen_host="127.0.0.1", netem=False, loopback=True, ready_file=tmp_path / "r"
    )
    assert down_proxy[down_proxy.index("--delayed") + 1] == "down"
    assert (down.added_rtt_ms, config.added_rtt_ms) == (300, 100)


def test_side_argv_pins_the_command_to_its_side_and_enters_its_namespace():
    config = NetConfig(name="tandem-x", device_cpus=(0,), cloud_cpus=(1, 2, 3))
    launcher = [sys.executable, "-m", "tandem.testbed.cpus", "--cpus"]
    loopback = NetStatus(up=True, name="tandem-x", mode="loopback", config=config)
    assert side_argv(loopback, "cloud", ["cmd", "-x"]) == [*launcher, "1-3", "--", "cmd", "-x"]
    netns = NetStatus(
        up=True, name="tandem-x", mode="netns", config=config,
        namespaces=namespace_names("tandem-x"),
    )  # fmt: skip
    assert side_argv(netns, "device", ["cmd"]) == [
        *launcher, "0", "--", "ip", "netns", "exec", "tandem-x-dev", "cmd",
    ]  # fmt: skip
    assert NetConfig(name="tandem-x").cpus("cloud") == plan()["cloud"]  # none named: the split
    with pytest.raises(TandemError, match="side must be"):
        side_argv(loopback, "edge", ["cmd"])


def test_config_validation():
    assert namespace_names("tandem") == {"device": "tandem-dev", "cloud": "tandem-cloud"}
    for bad in ("other", "tandem_x", "tandem-X", "tandem-"):
        with pytest.raises(TandemError):
            NetConfig(name=bad)
    with pytest.raises(TandemError):
        NetConfig(rate_mbit=0)
    with pytest.raises(TandemError):
        NetConfig(service_port=7400, proxy_port=7400)
    with pytest.raises(TandemError, match="delayed"):
        NetConfig(delayed="sideways")


# ---------------------------------------------------------------- helpers


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie awaiting its reaper does not count)."""
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_probe_server(prefix: list[str], listen: str, ready_file: Path) -> subprocess.Popen:
    argv = [*prefix, sys.executable, "-m", "tandem.testbed.probe", "serve"]
    argv += ["--listen", listen, "--ready-file", str(ready_file)]
    server = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while not ready_file.exists():
        assert server.poll() is None and time.monotonic() < deadline, "probe server did not start"
        time.sleep(0.02)
    return server


def _measure(prefix: list[str], connect: str, **amounts: int) -> dict:
    argv = [*prefix, sys.executable, "-m", "tandem.testbed.probe", "measure"]
    argv += ["--connect", connect, "--pings", "7"]
    for key, value in amounts.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def net_name(tmp_path, monkeypatch):
    """A private network name and state dir; everything is torn down even if the test fails."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    name = f"tandem-t{os.getpid()}"
    servers: list[subprocess.Popen] = []
    yield name, servers
    for server in servers:
        server.terminate()
        server.wait(timeout=10)
    net_down(name)
    assert not net_status(name).up
    assert not any(namespace_exists(ns) for ns in namespace_names(name).values())


# ---------------------------------------------------------------- loopback (always runs)


def test_loopback_network_up_measure_reconfigure_down(net_name, tmp_path):
    name, servers = net_name
    service_port, proxy_port = _free_port(), _free_port()
    config = NetConfig(
        name=name, mode="loopback", delay_ms=40, service_port=service_port, proxy_port=proxy_port
    )
    status = net_up(config)
    assert status.up and status.mode == "loopback" and status.connect == f"127.0.0.1:{proxy_port}"
    assert any("loopback" in note for note in status.notes)
    servers.append(_start_probe_server([], f"127.0.0.1:{service_port}", tmp_path / "probe.ready"))
    found = _measure([], status.connect)
    assert found["rtt_median_s"] == pytest.approx(0.080, rel=0.10)

    again = net_up(
        NetConfig(
            name=name,
            mode="loopback",
            delay_ms=20,
            service_port=service_port,
            proxy_port=proxy_port,
        )
    )
    assert again.proxy_pid != status.proxy_pid  # reconfigured in place
    assert not _running(status.proxy_pid)
    assert _measure([], again.connect)["rtt_median_s"] == pytest.approx(0.040, rel=0.10)
    check_env = "import os, sys; sys.exit(os.environ['TANDEM_NET_CONNECT'] != sys.argv[1])"
    assert net_exec("cloud", [sys.executable, "-c", check_env, again.connect], name) == 0

    removed = net_down(name)
    assert f"proxy pid {again.proxy_pid}" in removed
    assert net_down(name) == []  # idempotent
    with pytest.raises(TandemError, match="not up"):
        net_exec("device", ["true"], name)


_AFFINITY = (
    "import os, sys; sys.exit(sorted(os.sched_getaffinity(0)) != [int(sys.argv[1])]"
    " or os.environ['OMP_NUM_THREADS'] != '1')"
)


def test_exec_runs_each_side_on_its_cores_and_up_fixes_the_split(net_name):
    name, _ = net_name
    cores = available()
    if len(cores) < 2:
        pytest.skip("needs two cores")
    ports = {"service_port": _free_port(), "proxy_port": _free_port()}
    status = net_up(NetConfig(name=name, mode="loopback", **ports))
    assert (status.config.device_cpus, status.config.cloud_cpus) == tuple(
        tuple(cores) for cores in plan().values()
    )  # the default split, written down when the network came up
    swapped = {"device_cpus": (cores[1],), "cloud_cpus": (cores[0],)}
    status = net_up(NetConfig(name=name, mode="loopback", **ports, **swapped))
    assert net_status(name).config.device_cpus == (cores[1],)
    assert net_exec("device", [sys.executable, "-c", _AFFINITY, str(cores[1])], name) == 0
    assert net_exec("cloud", [sys.executable, "-c", _AFFINITY, str(cores[0])], name) == 0
    assert net_exec("cloud", [sys.executable, "-c", _AFFINITY, str(cores[1])], name) == 1
    with pytest.raises(TandemError, match="command not found"):
        net_exec("cloud", ["no-such-command-here"], name)


def test_taken_proxy_port_is_reported_at_once(net_name):
    name, _ = net_name
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(TandemError, match="cannot listen"):
            net_up(
                NetConfig(name=name, mode="loopback", proxy_port=port, service_port=_free_port())
            )
        assert time.monotonic() - started < 10


def test_without_root_auto_falls_back_to_loopback_and_netns_refuses(net_name, monkeypatch):
    name, _ = net_name
    monkeypatch.setattr("tandem.testbed.netns.os.geteuid", lambda: 1000)
    assert netns_unavailable_reason() == "not root"
    with pytest.raises(TandemError, match="namespaces unavailable: not root"):
        net_up(NetConfig(name=name, mode="netns"))
    status = net_up(NetConfig(name=name, service_port=_free_port(), proxy_port=_free_port()))
    assert status.up and status.mode == "loopback" and status.namespaces == {}
    assert any(note.startswith("not root") for note in status.notes)


# ---------------------------------------------------------------- real namespaces


def _needs_namespaces() -> None:
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")


@pytest.mark.netns
def test_namespaces_delay_and_rate(net_name, tmp_path):
    _needs_namespaces()
    name, servers = net_name
    status = net_up(NetConfig(name=name, mode="netns", delay_ms=50, rate_mbit=20))
    assert status.up and status.mode == "netns" and status.connect == f"{CLOUD_ADDRESS}:7401"
    device = ["ip", "netns", "exec", status.namespaces["device"]]
    cloud = ["ip", "netns", "exec", status.namespaces["cloud"]]
    servers.append(_start_probe_server(cloud, status.service, tmp_path / "probe.ready"))

    found = _measure(device, status.connect, upload_bytes=3_000_000, download_bytes=3_000_000)
    assert found["rtt_median_s"] == pytest.approx(0.100, rel=0.10)  # 2 x 50 ms one-way
    assert found["upload_mbit"] == pytest.approx(20, rel=0.10)
    assert found["download_mbit"] == pytest.approx(20, rel=0.10)

    # Reconfigure in place: same namespaces, the probe server keeps running.
    faster = net_up(NetConfig(name=name, mode="netns", delay_ms=25))
    assert faster.namespaces == status.namespaces and servers[0].poll() is None
    assert _measure(device, faster.connect)["rtt_median_s"] == pytest.approx(0.050, rel=0.10)


@pytest.mark.netns
def test_namespaces_are_isolated_and_down_removes_everything(net_name):
    _needs_namespaces()
    name, _ = net_name
    status = net_up(NetConfig(name=name, mode="netns"))
    assert net_up(NetConfig(name=name, mode="netns")).namespaces == status.namespaces  # idempotent
    device = ["ip", "netns", "exec", status.namespaces["device"]]
    routes = subprocess.run([*device, "ip", "route"], capture_output=True, text=True)
    assert "default" not in routes.stdout  # the device side reaches only the link
    assert net_exec("device", ["sh", "-c", "exit 7"], name) == 7
    for side in ("device", "cloud"):  # inside the namespace, on the side's cores
        core = status.config.cpus(side)
        if len(core) == 1:
            assert net_exec(side, [sys.executable, "-c", _AFFINITY, str(core[0])], name) == 0
    sleeper = subprocess.Popen(["ip", "netns", "exec", status.namespaces["cloud"], "sleep", "60"])
    removed = net_down(name)
    assert sleeper.wait(timeout=5) != 0  # processes left inside are ended
    assert {f"namespace {ns}" for ns in status.namespaces.values()} <= set(removed)
    assert not any(namespace_exists(ns) for ns in status.namespaces.values())
    assert not _running(status.proxy_pid)
