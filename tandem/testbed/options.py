"""The compute knob as command-line options, shared by `tandem net up` and the benchmarks that
run a device and a cloud: `--device-cpus 0 --cloud-cpus 1` (default:
`tandem.testbed.cpus.plan()`, the cores this process may use split in two, first half to the
device). Here rather than in `tandem.cli` so that the benchmarks' CLI (which `tandem.cli`
loads by entry point) can use them without importing `tandem.cli` back."""

from __future__ import annotations

import typer

DEVICE_CPUS = typer.Option(
    "",
    "--device-cpus",
    help="Cores of the device, e.g. 0 or 0-1 (default: the first half of the cores).",
)
CLOUD_CPUS = typer.Option(
    "",
    "--cloud-cpus",
    help="Cores of the cloud, e.g. 1 or 2-3 (default: the second half of the cores).",
)


def role_cpus(device: str, cloud: str) -> dict[str, list[int]]:
    """{"device": [...], "cloud": [...]} from the two flags (see `tandem.testbed.cpus`)."""
    from tandem.testbed.cpus import role_cpus as resolve

    return resolve(device, cloud)
