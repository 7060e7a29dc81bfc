"""tandem: a device language model and a cloud language model generating text together.

Layers (arrows only point down): cli -> serve/bench -> protocols/baselines ->
sampling, codecs, models, retrieval, transport. See docs/layout.md.
"""

__version__ = "0.1.0"
