"""A GGUF file's header: its metadata and its tensor table, the tensors memory-mapped.

gguf-py's `GGUFReader` builds numpy objects for every metadata item, which for a 262k-token
vocabulary means ~16 s and ~600 MB before the first weight is touched. `GGUFFile` reads the
same header in one pass (the format: magic, version, counts, key/value pairs, tensor infos,
aligned data; https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) and keeps:
- `metadata`: every scalar (strings decoded) and every array of at most `MAX_ARRAY` items as a
  list; longer arrays (the tokenizer's tokens, scores, merges) are skipped: the tokenizer is
  built by transformers from the file (runner.gguf_config);
- `tensors`: per name its type, its ggml shape and its data as a numpy view on one read-only
  memory map (no copy, nothing read until used), laid out as GGUFReader lays it out: F32 / F16
  as such, every other type as uint8 rows of blocks (..., ne0 / block size * block bytes).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAX_ARRAY = 4096  # longer metadata arrays are skipped (tokenizer vocabularies)
MetaValue = int | float | bool | str | list[int | float | bool | str]

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
_SCALARS = {  # GGUF value type -> struct format
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
_PLAIN = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor of the file."""

    name: str
    type: GGMLQuantizationType
    ne: tuple[int, ...]  # ggml's shape, innermost first: a weight is (in features, out features)
    data: npt.NDArray[np.generic]  # read-only view, shape reversed(ne) (blocks: last dim bytes)

    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor's shape in torch / numpy order (reversed ne)."""
        return tuple(reversed(self.ne))


class _Cursor:
    """Reads little-endian values from a buffer, advancing an offset."""

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.at = 0

    def scalar(self, fmt: str) -> int | float | bool:
        (value,) = struct.unpack_from(fmt, self.buffer, self.at)
        self.at += struct.calcsize(fmt)
        out: int | float | bool = value
        return out

    def u32(self) -> int:
        return int(self.scalar("<I"))

    def u64(self) -> int:
        return int(self.scalar("<Q"))

    def string(self) -> str:
        n = self.u64()
        text = bytes(self.buffer[self.at : self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return text

    def skip_string(self) -> None:
        n = self.u64()
        self.at += n

    def value(self, kind: int) -> MetaValue | None:
        """The value of GGUF type `kind` (None for a skipped long array)."""
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array()
        return self.scalar(_SCALARS[kind])

    def array(self) -> list[int | float | bool | str] | None:
        kind, count = self.u32(), self.u64()
        if count > MAX_ARRAY:
            if kind == _STRING:
                for _ in range(count):
                    self.skip_string()
            else:
                self.at += count * struct.calcsize(_SCALARS[kind])
            return None
        items = [self.value(kind) for _ in range(count)]
        return [i for i in items if i is not None and not isinstance(i, list)]


class GGUFFile:
    """The header of a `.gguf` file; tensors are views on its memory map."""

    def release_pages(self) -> None:
        """Drop the map's pages from this process' resident set (MADV_DONTNEED on a read-only
        file map: the views stay valid, the next access reads the page cache again). A loaded
        model calls it once it has repacked the blocks it keeps, so only the embedding rows
        that requests gather come back."""
        self._map.madvise(mmap.MADV_DONTNEED)

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as handle:
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        cursor = _Cursor(self._map)
        if bytes(self._map[:4]) != _MAGIC:
            raise ValueError(f"not a GGUF file: {path}")
        cursor.at = 4
        version = cursor.u32()
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported: {path}")
        n_tensors, n_kv = cursor.u64(), cursor.u64()
        self.metadata: dict[str, MetaValue] = {}
        for _ in range(n_kv):
            key = cursor.string()
            value = cursor.value(cursor.u32())
            if value is not None:
                self.metadata[key] = value
        infos = [self._tensor_info(cursor) for _ in range(n_tensors)]
        alignment = int(self.metadata.get("general.alignment", 32))  # type: ignore[arg-type]
        start = -(-cursor.at // alignment) * alignment
        whole = np.frombuffer(self._map, dtype=np.uint8)  # the file, read-only, no copy
        self.tensors = {
            name: _tensor(name, kind, ne, whole, start + offset) for name, kind, ne, offset in infos
        }

    @staticmethod
    def _tensor_info(cursor: _Cursor) -> tuple[str, GGMLQuantizationType, tuple[int, ...], int]:
        name = cursor.string()
        ne = tuple(cursor.u64() for _ in range(cursor.u32()))
        return name, GGMLQuantizationType(cursor.u32()), ne, cursor.u64()

    @property
    def architecture(self) -> str:
        """`general.architecture` ("llama", "qwen3", "gemma3", ...)."""
        return str(self.metadata["general.architecture"])


def _tensor(
    name: str,
    kind: GGMLQuantizationType,
    ne: tuple[int, ...],
    whole: npt.NDArray[np.uint8],
    start: int,
) -> GGUFTensor:
    block_size, block_bytes = GGML_QUANT_SIZES[kind]
    rows = tuple(reversed(ne[1:]))
    if kind in _PLAIN:
        dtype = np.dtype(_PLAIN[kind])
        count = int(np.prod(ne))
        data = whole[start : start + count * dtype.itemsize].view(dtype).reshape(*rows, ne[0])
        return GGUFTensor(name, kind, ne, data)
    row_bytes = ne[0] // block_size * block_bytes
    size = int(np.prod(rows, dtype=np.int64)) * row_bytes
    return GGUFTensor(name, kind, ne, whole[start : start + size].reshape(*rows, row_bytes))
