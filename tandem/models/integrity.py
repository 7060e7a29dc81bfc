"""Is a model file whole? Cheap structural checks that turn a truncated or foreign file into a
one-line reason instead of a deep traceback from llama.cpp, transformers or safetensors.

Words used here:
- *problem*: a short reason ("truncated: 20000000 of 491400064 bytes", "not a GGUF file"),
  or None when the file looks whole. A check never reads tensor data, only headers and sizes:
  it catches truncation and foreign files, not flipped bytes (the registry checks sha256 once,
  when it assembles a GGUF).
- *size list*: `{relative path: bytes}` of every file of a cache entry, recorded when the entry
  is made; a file that is missing or has another size later means the entry is damaged.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

GGUF_MAGIC = b"GGUF"
_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # type: bytes
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _Cursor:
    """Reads little-endian values from a buffer; past its end: struct.error."""

    def __init__(self, data) -> None:
        self.data, self.pos = data, 0

    def unpack(self, fmt: str):
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values[0] if len(values) == 1 else values

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise struct.error("past the end")
        self.pos += n

    def string(self) -> bytes:
        n = self.unpack("<Q")
        self.skip(n)
        return bytes(self.data[self.pos - n : self.pos])

    def value(self, vtype: int):
        """Read one value of GGUF type `vtype` (arrays and strings are skipped: None)."""
        if vtype in _GGUF_SCALARS:
            raw = self.data[self.pos : self.pos + _GGUF_SCALARS[vtype]]
            self.skip(_GGUF_SCALARS[vtype])
            return int.from_bytes(raw, "little")
        if vtype == _GGUF_STRING:
            self.string()
        elif vtype == _GGUF_ARRAY:
            item, n = self.unpack("<IQ")
            if item in _GGUF_SCALARS:
                self.skip(n * _GGUF_SCALARS[item])
            else:
                for _ in range(n):
                    self.value(item)
        else:
            raise ValueError(f"unknown metadata type {vtype}")
        return None


def gguf_problem(path: Path) -> str | None:
    """Why the GGUF file at `path` cannot be whole (bad magic, cut inside its header, or
    shorter than its tensors' data), or None."""
    from gguf import GGML_QUANT_SIZES

    size = Path(path).stat().st_size
    if size == 0:
        return "empty file"
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != GGUF_MAGIC:
            return "not a GGUF file"
        cursor = _Cursor(data)
        try:
            cursor.skip(4)
            version, n_tensors, n_kv = cursor.unpack("<IQQ")
            if version not in (2, 3):
                return f"unsupported GGUF version {version}"
            alignment = 32
            for _ in range(n_kv):
                key = cursor.string()
                value = cursor.value(cursor.unpack("<I"))
                if key == b"general.alignment" and value:
                    alignment = value
            end = 0
            for _ in range(n_tensors):
                cursor.string()
                dims = [cursor.unpack("<Q") for _ in range(cursor.unpack("<I"))]
                kind, offset = cursor.unpack("<IQ")
                block, block_bytes = GGML_QUANT_SIZES.get(kind, (1, 0))
                count = 1
                for dim in dims:
                    count *= dim
                end = max(end, offset + count // block * block_bytes)
        except struct.error:
            return "truncated inside its header"
        except ValueError as exc:
            return f"corrupt header ({exc})"
        start = -(-cursor.pos // alignment) * alignment
    if size < start + end:
        return f"truncated: {size} of {start + end} bytes"
    return None


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file at `path` cannot be whole (its header does not parse, or the
    file is shorter or longer than the tensors the header lists), or None."""
    size = Path(path).stat().st_size
    if size < 8:
        return f"truncated: {size} bytes"
    with open(path, "rb") as file:
        (n,) = struct.unpack("<Q", file.read(8))
        if 8 + n > size:
            return f"truncated inside its header ({size} bytes; the header alone is {8 + n})"
        try:
            header = json.loads(file.read(n))
            end = max(
                (int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"),
                default=0,
            )
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            return f"corrupt header ({exc})".splitlines()[0]
    if size != 8 + n + end:
        return f"truncated: {size} of {8 + n + end} bytes"
    return None


def folder_problem(folder: Path) -> str | None:
    """The first problem of a transformers folder's safetensors files (`file: reason`)."""
    for file in sorted(Path(folder).glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem is not None:
            return f"{file.name}: {problem}"
    return None


def size_list(folder: Path) -> dict[str, int]:
    """{relative path: bytes} of every file under `folder`."""
    folder = Path(folder)
    return {
        f.relative_to(folder).as_posix(): f.stat().st_size
        for f in sorted(folder.rglob("*"))
        if f.is_file()
    }


def sizes_problem(folder: Path, sizes: dict[str, int]) -> str | None:
    """The first file of `sizes` missing under `folder` or of another size (`file: reason`)."""
    for name, expected in sizes.items():
        file = Path(folder) / name
        if not file.is_file():
            return f"{name}: missing"
        if file.stat().st_size != expected:
            return f"{name}: {file.stat().st_size} bytes, expected {expected}"
    return None
