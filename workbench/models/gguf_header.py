"""A bounded check of a GGUF file's header before any reader allocates for it.

`gguf.GGUFReader` (and transformers through it) trusts the counts and sizes a file declares: a
text file named `.gguf` ends in a deep `ValueError`, and a crafted 114-byte header can make it
allocate without bound. `read_header` walks the header with every count and length checked
against the bytes that remain in the file, so a file that declares more than it holds is refused
before anything is allocated for it, with the number it declared and the limit it broke.

Layout (GGUF v2 / v3, little-endian): magic "GGUF", version u32, tensor count u64, key-value
count u64; key-values (key string, type u32, value; strings are u64 length + bytes, arrays are
type u32 + count u64 + items); tensor infos (name string, n_dims u32, dims u64 x n_dims, ggml
type u32, offset u64); then tensor data at the next multiple of `general.alignment` (default 32).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES

from workbench.errors import WorkbenchError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class _Cursor:
    """Reads little-endian values from a file, refusing any read past its end."""

    def __init__(self, f, size: int, name: str):
        self.f, self.size, self.name = f, size, name

    @property
    def left(self) -> int:
        return self.size - self.f.tell()

    def take(self, n: int, what: str) -> bytes:
        if n > self.left:
            raise WorkbenchError(f"GGUF '{self.name}' needs {n} bytes for {what} at byte {self.f.tell()}, but the "
                                 f"file ({self.size} bytes) holds only {self.left} more; it is truncated or not GGUF")
        return self.f.read(n)

    def unpack(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str, least: int) -> int:
        """A u64 count of items of at least `least` bytes each, refused when they cannot fit in the file."""
        n = self.unpack("<Q", what)
        if n * least > self.left:
            raise WorkbenchError(f"GGUF '{self.name}' declares {n} {what}, more than its remaining {self.left} bytes "
                                 f"can hold (at least {least} bytes each); the file is corrupted or crafted")
        return n

    def string(self, what: str) -> bytes:
        return self.take(self.count(f"bytes of {what}", 1), what)

    def skip_value(self, vtype: int, what: str) -> None:
        if vtype in SCALARS:
            self.take(struct.calcsize(SCALARS[vtype]), what)
        elif vtype == STRING:
            self.string(what)
        elif vtype == ARRAY:
            item = self.unpack("<I", f"the item type of {what}")
            least = struct.calcsize(SCALARS[item]) if item in SCALARS else 8 if item == STRING else 12
            if item in SCALARS:  # a block of fixed-size items: one bounded skip
                self.take(self.count(f"items of {what}", least) * least, what)
            else:
                for _ in range(self.count(f"items of {what}", least)):
                    self.skip_value(item, what)
        else:
            raise WorkbenchError(f"GGUF '{self.name}': {what} has value type {vtype}; known types: 0-12")


def read_header(path: str | os.PathLike) -> dict:
    """Returns {"version", "architecture" (or None), "tensors"} after checking the whole header against the file.

    Raises:
        WorkbenchError: not a GGUF file, an unsupported version, or a count, length or tensor size
            that the file cannot hold (the message names what was declared and the limit).
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        cur = _Cursor(f, size, str(path))
        magic = f.read(4)
        if magic != MAGIC:
            raise WorkbenchError(f"model '{path}' is not a GGUF file: it starts with {magic!r}, a GGUF file with "
                                 f"{MAGIC!r}; give a GGUF file or a Hugging Face model directory")
        version = cur.unpack("<I", "the version")
        if version not in VERSIONS:
            raise WorkbenchError(f"GGUF '{path}' has version {version}; supported: {', '.join(map(str, VERSIONS))}")
        n_tensors = cur.unpack("<Q", "the tensor count")
        n_kv = cur.count("key-value pairs", 8 + 4 + 1)
        architecture, alignment = None, 32
        for _ in range(n_kv):
            key = cur.string("a key").decode("utf-8", "replace")
            vtype = cur.unpack("<I", f"the type of '{key}'")
            if key == "general.architecture" and vtype == STRING:
                architecture = cur.string(key).decode("utf-8", "replace")
            elif key == "general.alignment" and vtype == 4:
                alignment = cur.unpack("<I", key)
            else:
                cur.skip_value(vtype, f"'{key}'")
        if n_tensors * (8 + 4 + 4 + 8) > cur.left:
            raise WorkbenchError(f"GGUF '{path}' declares {n_tensors} tensors, more than its remaining {cur.left} "
                                 "bytes can describe; the file is corrupted or crafted")
        if not alignment or alignment & (alignment - 1):
            raise WorkbenchError(f"GGUF '{path}' declares general.alignment = {alignment}; it must be a power of two")
        infos = []
        for _ in range(n_tensors):
            name = cur.string("a tensor name").decode("utf-8", "replace")
            n_dims = cur.unpack("<I", f"the dimensions of '{name}'")
            if not 1 <= n_dims <= MAX_DIMS:
                raise WorkbenchError(f"GGUF '{path}': tensor '{name}' has {n_dims} dimensions; accepted: 1..{MAX_DIMS}")
            dims = [cur.unpack("<Q", f"the shape of '{name}'") for _ in range(n_dims)]
            ggml_type = cur.unpack("<I", f"the type of '{name}'")
            offset = cur.unpack("<Q", f"the offset of '{name}'")
            infos.append((name, dims, ggml_type, offset))
        data_start = -(-f.tell() // alignment) * alignment
    known = {int(k): v for k, v in GGML_QUANT_SIZES.items()}
    for name, dims, ggml_type, offset in infos:
        if ggml_type not in known:
            raise WorkbenchError(f"GGUF '{path}': tensor '{name}' has ggml type {ggml_type}, which gguf does not know")
        block, type_size = known[ggml_type]
        elements = 1
        for d in dims:
            elements *= d
        nbytes = elements // block * type_size
        if data_start + offset + nbytes > size:
            raise WorkbenchError(f"GGUF '{path}': tensor '{name}' of shape {dims} needs {nbytes} bytes at offset "
                                 f"{offset}, past the end of the file ({size} bytes); the file is truncated or crafted")
    return {"version": version, "architecture": architecture, "tensors": len(infos)}
