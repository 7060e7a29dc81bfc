"""Real network emulation: a "device" and a "cloud" network namespace joined by a veth pair.

Why one file: `net_up` and `net_down` must undo exactly what the other does (namespaces,
veth, qdiscs, the proxy); keeping the whole lifecycle together keeps that visible.

`net_up(config)` builds (or reconfigures, idempotently) this picture::

    namespace <name>-dev                      namespace <name>-cloud
    tdev0 10.203.0.1/30  <==== veth ====>  tcloud0 10.203.0.2/30
      egress: tbf (uplink rate)              egress: tbf (downlink rate)
                                             delay proxy  10.203.0.2:proxy_port
                                               -> cloud service 127.0.0.1:service_port

The device connects to `NetStatus.connect` (the proxy); the cloud service listens on
127.0.0.1:service_port inside the cloud namespace (bind loopback, so nothing bypasses the
proxy). Rate comes from the `tbf` qdisc on each veth end; delay, jitter and outages come
from the TCP delay proxy (`tandem.testbed.proxy`), because this kernel has no `netem`.
Where the kernel does have netem (detected on the veth itself), netem on both veth ends
gives the delay and jitter instead and the proxy only adds outages; `NetStatus.delay_path`
says which ("proxy" or "netem").

Words: *delay* is ONE-WAY and applies to each direction `delayed` names: "both" (the
default), so a round trip gains `2 * delay_ms` (like netem on both ends), or "down" (cloud ->
device only, like netem on the server's NIC as in the DRAGON paper's testbed: a round trip
gains `delay_ms`) or "up"; *jitter* is uniform +- jitter_ms per direction;
*rate* is the payload (TCP goodput) rate of each direction in Mbit/s (10**6 bits); the tbf
is set slightly higher (`WIRE_OVERHEAD`) so Ethernet/IP/TCP headers are not counted
against it. An *outage* (start_s, duration_s) counts from when the proxy started.

Compute: each side is also a machine with cores of its own (`tandem.testbed.cpus`). The
config names each side's cpu set (`device_cpus`, `cloud_cpus`; empty: `plan()`'s split, fixed
when the network comes up) and `side_argv` / `net_exec` start a command inside a side pinned
to its set, with OMP_NUM_THREADS = the set's size. The proxy is the wire, not a machine: it is
not pinned.

Without root or namespaces (or with `mode="loopback"`) the same proxy runs on 127.0.0.1,
with rate from its own token bucket, and `NetStatus.notes` says so. Only the project's own
namespace addresses (`LINK_SUBNET`) and loopback are ever used.

State lives in `state_dir()/<name>.json` ($TANDEM_HOME/net, else /run/tandem as root,
else ~/.cache/tandem/net): the mode, the config, the proxy pid. `net_down` kills the proxy
and every process still inside the two namespaces, deletes the namespaces (which removes
the veth pair and its qdiscs) and the state; it is safe to call at any time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from tandem.errors import TandemError
from tandem.testbed.cpus import pinned_argv, plan
from tandem.testbed.proxy import DELAYED, LINK_SUBNET, carries_delay

DEVICE_ADDRESS = str(LINK_SUBNET.network_address + 1)  # 10.203.0.1
CLOUD_ADDRESS = str(LINK_SUBNET.network_address + 2)  # 10.203.0.2
PREFIX_LEN = LINK_SUBNET.prefixlen
DEVICE_DEV, CLOUD_DEV = "tdev0", "tcloud0"
WIRE_OVERHEAD = 1514 / 1448  # Ethernet frame / TCP payload per full segment (MTU 1500, timestamps)
SIDES = ("device", "cloud")
# jitter as a fraction of the delay where a benchmark sets it from the delay: the DRAGON
# paper's delay / 5 (Sec. 7.3)
JITTER = 0.2


def jitter_fraction(jitter: float) -> float:
    """`jitter`, checked: a fraction of the delay in [0, 1] (a one-line TandemError if not)."""
    if not 0.0 <= jitter <= 1.0:
        raise TandemError(f"jitter must be a fraction of the delay in [0, 1], not {jitter:g}")
    return jitter


NAME_PATTERN = re.compile(r"^tandem(-[a-z0-9]+)*$")


@dataclass(frozen=True, kw_only=True)
class NetConfig:
    """The emulated link (each direction) and where things listen."""

    delay_ms: float = 0.0  # one-way, each direction `delayed` names: RTT = 2 * delay_ms (both)
    jitter_ms: float = 0.0  # uniform +- jitter_ms, each direction `delayed` names
    # which directions carry delay and jitter: "both"; "down" (cloud -> device only, like
    # netem on the server's NIC: the DRAGON paper's Fig. 6/7 setup, RTT = delay_ms); "up"
    delayed: Literal["both", "down", "up"] = "both"
    rate_mbit: float | None = None  # payload Mbit/s, each direction; None: unlimited
    outages: tuple[tuple[float, float], ...] = ()  # (start_s, duration_s) after the proxy starts
    service_port: int = 7400  # cloud service, 127.0.0.1 inside the cloud namespace
    proxy_port: int = 7401  # what the device connects to
    name: str = "tandem"  # namespaces <name>-dev and <name>-cloud
    mode: Literal["auto", "netns", "loopback"] = "auto"
    seed: int = 0
    device_cpus: tuple[int, ...] = ()  # the device's cores; () = its share of plan()
    cloud_cpus: tuple[int, ...] = ()  # the cloud's cores; () = its share of plan()

    def __post_init__(self) -> None:
        if not NAME_PATTERN.match(self.name) or len(self.name) > 40:
            raise TandemError(
                f"network name must look like 'tandem' or 'tandem-x1', got {self.name!r}"
            )
        if (
            self.delay_ms < 0
            or self.jitter_ms < 0
            or (self.rate_mbit is not None and self.rate_mbit <= 0)
        ):
            raise TandemError("delay and jitter must be >= 0 ms and rate > 0 Mbit/s")
        if self.delayed not in DELAYED:
            raise TandemError(f"delayed must be one of {', '.join(DELAYED)}, not {self.delayed!r}")
        if self.service_port == self.proxy_port:
            raise TandemError("service port and proxy port must differ")

    @property
    def added_rtt_ms(self) -> float:
        """What the delay adds to a round trip (jitter aside)."""
        return self.delay_ms * sum(carries_delay(self.delayed, d) for d in ("up", "down"))

    def cpus(self, side: str) -> list[int]:
        """The cores of `side` (its share of `plan()` when none were named)."""
        named = self.device_cpus if side == "device" else self.cloud_cpus
        return sorted(named) if named else plan()[side]


@dataclass(frozen=True, kw_only=True)
class NetStatus:
    """What is up. `connect` is where the device connects; `service` where the cloud listens."""

    up: bool
    name: str
    mode: str = "down"  # "netns" | "loopback" | "down"
    delay_path: str = ""  # "proxy" | "netem"
    config: NetConfig | None = None
    namespaces: dict[str, str] = field(default_factory=dict)  # side -> namespace
    connect: str = ""  # host:port, the proxy
    service: str = ""  # host:port, inside the cloud side
    proxy_pid: int | None = None
    proxy_alive: bool = False
    started_at: float | None = None  # wall clock (time.time()) when the proxy started
    notes: tuple[str, ...] = ()


# ---------------------------------------------------------------- pure helpers


def namespace_names(name: str) -> dict[str, str]:
    """{"device": "<name>-dev", "cloud": "<name>-cloud"}."""
    return {"device": f"{name}-dev", "cloud": f"{name}-cloud"}


def tbf_args(rate_mbit: float) -> list[str]:
    """tbf parameters for a payload rate: wire rate with header overhead, ~4 ms burst, 100 ms queue."""
    wire_bps = rate_mbit * 1e6 * WIRE_OVERHEAD
    burst = max(16384, int(wire_bps / 8 * 0.004))
    return ["tbf", "rate", f"{int(wire_bps)}bit", "burst", str(burst), "latency", "100ms"]


def qdisc_commands(
    dev: str, *, delay_ms: float, jitter_ms: float, rate_mbit: float | None, netem: bool
) -> list[list[str]]:
    """`tc` commands (after clearing the root qdisc) that shape egress of `dev`."""
    commands = []
    if netem and (delay_ms > 0 or jitter_ms > 0):
        delay = ["delay", f"{delay_ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms > 0 else [])
        commands.append(["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", *delay])
        if rate_mbit is not None:
            commands.append(
                [
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    "1:1",
                    "handle",
                    "10:",
                    *tbf_args(rate_mbit),
                ]
            )
    elif rate_mbit is not None:
        commands.append(["tc", "qdisc", "add", "dev", dev, "root", *tbf_args(rate_mbit)])
    return commands


def proxy_argv(
    config: NetConfig, *, listen_host: str, netem: bool, loopback: bool, ready_file: Path
) -> list[str]:
    """The proxy's command line (without any `ip netns exec` prefix)."""
    argv = [sys.executable, "-m", "tandem.testbed.proxy"]
    argv += [
        "--listen",
        f"{listen_host}:{config.proxy_port}",
        "--upstream",
        f"127.0.0.1:{config.service_port}",
    ]
    if not netem:
        argv += ["--delay-ms", str(config.delay_ms), "--jitter-ms", str(config.jitter_ms)]
        argv += ["--delayed", config.delayed]
    if loopback and config.rate_mbit is not None:
        argv += ["--rate-mbit", str(config.rate_mbit)]
    for start_s, duration_s in config.outages:
        argv += ["--outage", f"{start_s}:{duration_s}"]
    return argv + ["--seed", str(config.seed), "--ready-file", str(ready_file)]


# ---------------------------------------------------------------- system helpers


def state_dir() -> Path:
    """$TANDEM_HOME/net, else /run/tandem as root, else ~/.cache/tandem/net."""
    if os.environ.get("TANDEM_HOME"):
        return Path(os.environ["TANDEM_HOME"]) / "net"
    if os.geteuid() == 0:
        return Path("/run/tandem")
    return Path.home() / ".cache" / "tandem" / "net"


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise TandemError(
            f"{argv[0]} not found (install iproute2: apt-get install -y iproute2)"
        ) from None
    if check and done.returncode != 0:
        raise TandemError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}")
    return done


def _in_ns(namespace: str, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", "netns", "exec", namespace, *argv], check=check)


def namespace_exists(namespace: str) -> bool:
    return Path("/run/netns", namespace).exists()


def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be used here (not root, no `ip`), or None if they can."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 is not installed (apt-get install -y iproute2)"
    return None


def _alive(pid: int | None, marker: str = "tandem.testbed.proxy") -> bool:
    if not pid:
        return False
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _terminate(pids: list[int]) -> None:
    """SIGTERM, wait up to 2 s, then SIGKILL whatever is left."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 2.0
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
        time.sleep(0.02)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _zombie(pid: int) -> bool:
    """True if `pid` has exited but not been reaped (its parent's business, not ours)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def _start_proxy(argv: list[str], ready_file: Path, log_file: Path) -> int:
    """Start the proxy detached (setsid -f: not our child) and return its pid once it listens."""
    ready_file.unlink(missing_ok=True)
    paths = [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in paths if path))
    with open(log_file, "ab") as log:
        subprocess.run(
            ["setsid", "-f", *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            check=True,
        )
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        if ready_file.exists():
            ready = json.loads(ready_file.read_text())
            if "error" in ready:
                raise TandemError(f"{ready['error']} (log: {log_file})")
            return int(ready["pid"])
        time.sleep(0.02)
    tail = (
        log_file.read_text(errors="replace").strip().splitlines()[-1:] if log_file.exists() else []
    )
    raise TandemError(
        f"delay proxy did not start within 15 s ({tail[0] if tail else 'no output'}; log: {log_file})"
    )


# ---------------------------------------------------------------- public API


def _state_file(name: str) -> Path:
    return state_dir() / f"{name}.json"


def _read_state(name: str) -> dict | None:
    try:
        return json.loads(_state_file(name).read_text())
    except (OSError, ValueError):
        return None


def _build_namespaces(namespaces: dict[str, str]) -> None:
    device_ns, cloud_ns = namespaces["device"], namespaces["cloud"]
    for namespace in (device_ns, cloud_ns):
        if not namespace_exists(namespace):
            _run(["ip", "netns", "add", namespace])
        _in_ns(namespace, ["ip", "link", "set", "lo", "up"])
    if _in_ns(device_ns, ["ip", "link", "show", DEVICE_DEV], check=False).returncode != 0:
        _run(
            [
                "ip",
                "link",
                "add",
                DEVICE_DEV,
                "netns",
                device_ns,
                "type",
                "veth",
                "peer",
                "name",
                CLOUD_DEV,
                "netns",
                cloud_ns,
            ]
        )
    for namespace, dev, address in (
        (device_ns, DEVICE_DEV, DEVICE_ADDRESS),
        (cloud_ns, CLOUD_DEV, CLOUD_ADDRESS),
    ):
        _in_ns(namespace, ["ip", "addr", "replace", f"{address}/{PREFIX_LEN}", "dev", dev])
        _in_ns(namespace, ["ip", "link", "set", dev, "up"])


def _netem_works(namespace: str, dev: str) -> bool:
    """Try a netem qdisc on `dev`; True (and removed again) if the kernel has it."""
    _in_ns(namespace, ["tc", "qdisc", "del", "dev", dev, "root"], check=False)
    done = _in_ns(
        namespace, ["tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "0ms"], check=False
    )
    _in_ns(namespace, ["tc", "qdisc", "del", "dev", dev, "root"], check=False)
    return done.returncode == 0


def net_up(config: NetConfig) -> NetStatus:
    """Bring the emulated network up, or reconfigure it in place (idempotent)."""
    previous = _read_state(config.name)
    reason = "loopback requested" if config.mode == "loopback" else netns_unavailable_reason()
    if reason is not None and config.mode == "netns":
        raise TandemError(f"network namespaces unavailable: {reason}")
    mode = "loopback" if reason is not None else "netns"
    if previous is not None and previous.get("mode") != mode:
        net_down(config.name)
        previous = None
    if previous is not None:
        _terminate([previous["proxy_pid"]] if _alive(previous.get("proxy_pid")) else [])
    directory = state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    ready_file, log_file = directory / f"{config.name}.ready", directory / f"{config.name}.log"
    namespaces = namespace_names(config.name)
    notes: list[str] = []
    netem = False
    if mode == "netns":
        try:
            _build_namespaces(namespaces)
        except TandemError as exc:
            if config.mode == "netns":
                raise
            _remove_namespaces(namespaces)
            mode, reason = "loopback", f"namespaces failed ({exc})"
    if mode == "netns":
        netem = _netem_works(namespaces["device"], DEVICE_DEV)
        notes.append(
            "kernel netem: delay and jitter by netem"
            if netem
            else "kernel has no netem: delay and jitter by the proxy"
        )
        if config.rate_mbit is not None:
            notes.append(
                f"rate by tbf on both veth ends (wire rate x{WIRE_OVERHEAD:.3f} for headers)"
            )
        for side, dev in (("device", DEVICE_DEV), ("cloud", CLOUD_DEV)):
            _in_ns(namespaces[side], ["tc", "qdisc", "del", "dev", dev, "root"], check=False)
            delayed = carries_delay(config.delayed, "up" if side == "device" else "down")
            for command in qdisc_commands(
                dev,
                delay_ms=config.delay_ms if delayed else 0.0,
                jitter_ms=config.jitter_ms if delayed else 0.0,
                rate_mbit=config.rate_mbit,
                netem=netem,
            ):
                _in_ns(namespaces[side], command)
        argv = ["ip", "netns", "exec", namespaces["cloud"]]
        argv += proxy_argv(
            config, listen_host=CLOUD_ADDRESS, netem=netem, loopback=False, ready_file=ready_file
        )
    else:
        notes.append(
            f"{reason}: proxy on loopback 127.0.0.1 (delay, jitter, rate and outages by the proxy)"
        )
        argv = proxy_argv(
            config, listen_host="127.0.0.1", netem=False, loopback=True, ready_file=ready_file
        )
    started_at = time.time()
    pid = _start_proxy(argv, ready_file, log_file)
    fixed = {f"{side}_cpus": tuple(config.cpus(side)) for side in SIDES}  # the split of today
    state = {
        "name": config.name,
        "mode": mode,
        "delay_path": "netem" if netem else "proxy",
        "config": asdict(replace(config, **fixed)),
        "namespaces": namespaces if mode == "netns" else {},
        "proxy_pid": pid,
        "started_at": started_at,
        "notes": notes,
    }
    partial = _state_file(config.name).with_suffix(".partial")
    partial.write_text(json.dumps(state, indent=1))
    partial.replace(_state_file(config.name))
    return net_status(config.name)


def net_status(name: str = "tandem") -> NetStatus:
    """The emulated network as it is now (reads the state file and checks what it names)."""
    state = _read_state(name)
    if state is None:
        leftovers = [ns for ns in namespace_names(name).values() if namespace_exists(ns)]
        notes = (
            (f"leftover namespaces {', '.join(leftovers)}: run `tandem net down`",)
            if leftovers
            else ()
        )
        return NetStatus(up=False, name=name, notes=notes)
    raw = state["config"]
    config = NetConfig(
        **{
            **raw,
            "outages": tuple(tuple(window) for window in raw["outages"]),
            **{key: tuple(raw.get(key, ())) for key in ("device_cpus", "cloud_cpus")},
        }
    )
    netns = state["mode"] == "netns"
    namespaces = state["namespaces"]
    proxy_alive = _alive(state["proxy_pid"])
    namespaces_ok = all(namespace_exists(ns) for ns in namespaces.values())
    notes = tuple(state["notes"]) + (
        () if proxy_alive else ("proxy is not running: run `tandem net up` again",)
    )
    return NetStatus(
        up=proxy_alive and namespaces_ok,
        name=name,
        mode=state["mode"],
        delay_path=state["delay_path"],
        config=config,
        namespaces=namespaces,
        connect=f"{CLOUD_ADDRESS if netns else '127.0.0.1'}:{config.proxy_port}",
        service=f"127.0.0.1:{config.service_port}",
        proxy_pid=state["proxy_pid"],
        proxy_alive=proxy_alive,
        started_at=state["started_at"],
        notes=notes,
    )


def _remove_namespaces(namespaces: dict[str, str]) -> list[str]:
    removed = []
    for namespace in namespaces.values():
        if namespace_exists(namespace):
            pids = _run(["ip", "netns", "pids", namespace], check=False).stdout.split()
            _terminate([int(pid) for pid in pids if pid.isdigit()])
            _run(["ip", "netns", "del", namespace], check=False)
            removed.append(namespace)
    return removed


def net_down(name: str = "tandem") -> list[str]:
    """Remove everything `net_up(name=...)` made; returns what was removed (empty: nothing was up)."""
    NetConfig(name=name)  # validates the name
    removed = []
    state = _read_state(name)
    if state is not None and _alive(state.get("proxy_pid")):
        _terminate([state["proxy_pid"]])
        removed.append(f"proxy pid {state['proxy_pid']}")
    if netns_unavailable_reason() is None:
        removed += [f"namespace {ns}" for ns in _remove_namespaces(namespace_names(name))]
    for suffix in (".json", ".ready", ".ready.partial", ".partial", ".log"):
        (state_dir() / f"{name}{suffix}").unlink(missing_ok=True)
    return removed


def side_argv(status: NetStatus, side: str, command: list[str]) -> list[str]:
    """`command` run inside `side` of the network (its namespace; loopback: this host), pinned
    to the side's cores (`NetConfig.cpus`) through the `tandem.testbed.cpus` launcher."""
    if side not in SIDES:
        raise TandemError(f"side must be 'device' or 'cloud', got {side!r}")
    inside = [] if status.mode == "loopback" else ["ip", "netns", "exec", status.namespaces[side]]
    config = status.config or NetConfig(name=status.name)
    return pinned_argv(config.cpus(side), [*inside, *command])


def net_exec(side: str, command: list[str], name: str = "tandem") -> int:
    """Run `command` inside the device or cloud side, on that side's cores; returns its exit
    status.

    The command gets TANDEM_NET_CONNECT (where the device connects) and TANDEM_NET_SERVICE
    (where the cloud service should listen) in its environment, and OMP_NUM_THREADS = the
    number of cores it owns. In loopback mode both sides are this host, so the command runs
    here (still pinned).
    """
    if side not in SIDES:
        raise TandemError(f"side must be 'device' or 'cloud', got {side!r}")
    if not command:
        raise TandemError("no command given (tandem net exec device -- CMD ...)")
    status = net_status(name)
    if not status.up:
        raise TandemError(f"network {name!r} is not up; run `tandem net up` first")
    if shutil.which(command[0]) is None:
        raise TandemError(f"command not found: {command[0]}")
    env = dict(os.environ, TANDEM_NET_CONNECT=status.connect, TANDEM_NET_SERVICE=status.service)
    return subprocess.run(side_argv(status, side, command), env=env).returncode
