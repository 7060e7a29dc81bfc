"""The testbed: what stands for separate machines on one box.

- `cpus`: each emulated machine (device, cloud) on its own CPU cores, its engine's thread
  count equal to the cores it owns, and the machine state recorded with every figure.
"""
