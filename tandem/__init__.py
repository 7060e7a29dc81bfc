"""tandem: a device language model and a cloud language model generating text together.

Layers (arrows only point down): cli -> serve -> protocols/baselines -> sampling, codecs,
models, retrieval, transport. See docs/layout.md. The benchmarks live outside the library,
in the top-level `benchmarks` package; nothing here imports them.
"""

__version__ = "0.1.0"
