"""`tandem net ...`: emulated network between a device and a cloud (namespaces + delay proxy).

Delay and jitter are ONE-WAY, per direction: `--delay 50` gives a 100 ms round trip.
Rate is the payload rate of each direction. Each side also owns cores (`--device-cpus`,
`--cloud-cpus`): `tandem net exec` runs a command pinned to its side's set. See
docs/network.md.
"""

from __future__ import annotations

from datetime import datetime

import typer

from tandem.testbed.options import CLOUD_CPUS, DEVICE_CPUS, role_cpus

app = typer.Typer(no_args_is_help=True)

NAME = typer.Option(
    "tandem", "--name", help="Network name: namespaces <name>-dev and <name>-cloud."
)


@app.command("up")
def up(
    delay: float = typer.Option(
        0.0, "--delay", help="One-way delay in ms, each --delayed direction (RTT = 2 x delay)."
    ),
    jitter: float = typer.Option(
        0.0, "--jitter", help="Uniform +- jitter in ms, each --delayed direction (never reorders)."
    ),
    delayed: str = typer.Option(
        "both",
        "--delayed",
        help="Directions with delay and jitter: both (RTT = 2 x delay), down (cloud -> device "
        "only, like netem on the server's NIC as in the DRAGON paper: RTT = delay) or up.",
    ),
    rate: float | None = typer.Option(
        None, "--rate", help="Payload rate in Mbit/s, each direction (default unlimited)."
    ),
    outage: list[str] = typer.Option(
        [], "--outage", help="START:DURATION seconds after up; data is held, not dropped."
    ),
    service_port: int = typer.Option(
        7400, help="Cloud service port (listen on 127.0.0.1 in the cloud side)."
    ),
    proxy_port: int = typer.Option(7401, help="Port the device connects to (the delay proxy)."),
    loopback: bool = typer.Option(
        False, "--loopback", help="Skip namespaces: run the proxy on 127.0.0.1."
    ),
    device_cpus: str = DEVICE_CPUS,
    cloud_cpus: str = CLOUD_CPUS,
    name: str = NAME,
) -> None:
    """Create (or reconfigure) the device and cloud namespaces, the delay proxy and each side's
    cores."""
    from tandem.testbed.netns import NetConfig, net_up
    from tandem.testbed.proxy import parse_outage

    sets = role_cpus(device_cpus, cloud_cpus)
    config = NetConfig(
        delay_ms=delay,
        jitter_ms=jitter,
        delayed=delayed,
        rate_mbit=rate,
        outages=tuple(parse_outage(text) for text in outage),
        service_port=service_port,
        proxy_port=proxy_port,
        mode="loopback" if loopback else "auto",
        name=name,
        device_cpus=tuple(sets["device"]),
        cloud_cpus=tuple(sets["cloud"]),
    )
    _print_status(net_up(config))


DIRECTIONS = {"both": "each way", "down": "cloud -> device only", "up": "device -> cloud only"}


@app.command("down")
def down(name: str = NAME) -> None:
    """Remove the namespaces, the proxy and every process left inside (safe to repeat)."""
    from tandem.testbed.netns import net_down

    removed = net_down(name)
    typer.echo("removed: " + ", ".join(removed) if removed else f"network {name!r} was not up")


@app.command("status")
def status(name: str = NAME) -> None:
    """Say what is up: mode, link settings, where to connect, which path gives the delay."""
    from tandem.testbed.netns import net_status

    _print_status(net_status(name))


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(
    side: str = typer.Argument(..., help="device or cloud"),
    command: list[str] = typer.Argument(..., help="The command (after --)."),
    name: str = NAME,
) -> None:
    """Run a command inside the device or cloud side, pinned to that side's cores:
    `tandem net exec cloud -- CMD ...`."""
    from tandem.testbed.netns import net_exec

    raise typer.Exit(net_exec(side, command, name))


def _print_status(status) -> None:
    from tandem.testbed.cpus import format_cpus

    if not status.up and status.config is None:
        typer.echo(f"network {status.name!r}: down")
    else:
        config = status.config
        rate = "unlimited" if config.rate_mbit is None else f"{config.rate_mbit:g} Mbit/s"
        typer.echo(f"network {status.name!r}: {'up' if status.up else 'BROKEN'} ({status.mode})")
        typer.echo(
            f"  link      delay {config.delay_ms:g} ms one-way, {DIRECTIONS[config.delayed]} (RTT"
            f" {config.added_rtt_ms:g} ms), jitter +-{config.jitter_ms:g} ms, rate {rate}"
        )
        if config.outages:
            windows = ", ".join(f"{start:g}s+{duration:g}s" for start, duration in config.outages)
            typer.echo(
                f"  outages   {windows} after {datetime.fromtimestamp(status.started_at):%H:%M:%S}"
            )
        typer.echo(f"  delay by  {status.delay_path}")
        if status.namespaces:
            typer.echo(
                f"  sides     device={status.namespaces['device']} cloud={status.namespaces['cloud']}"
            )
        typer.echo(
            f"  cpus      device={format_cpus(config.cpus('device'))} "
            f"cloud={format_cpus(config.cpus('cloud'))} (each side's engine: one thread per core)"
        )
        typer.echo(
            f"  device -> {status.connect} (proxy pid {status.proxy_pid}) -> cloud service {status.service}"
        )
    for note in status.notes:
        typer.echo(f"  note: {note}")
