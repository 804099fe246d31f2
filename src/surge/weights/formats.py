"""Sources of weights and the one layout entries have: what to copy where.

A source is a safetensors file, a directory of safetensors shards, or a numpy `.npz`.
`plan(source)` reads only headers and returns a `Plan`: the files to hash, the entry's
header bytes and, per tensor, a copy from the source into the entry (`Piece`; members
of a compressed .npz are `Inflate`s). Every entry is itself a safetensors file: an
8-byte header length, a JSON header padded with spaces so the data starts 64-byte
aligned, then the tensors back to back, largest item size first, so each tensor is
aligned to its dtype. `read_header(buffer)` parses an entry (or any safetensors bytes).
Malformed input raises `WeightSourceError` naming the file and what is wrong.
"""

from __future__ import annotations

import ast
import math
import mmap
import os
import struct
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

import msgspec

from surge.errors import WeightSourceError

__all__ = ["DTYPES", "HEADER_ALIGN", "Inflate", "Piece", "Plan", "SourceFile", "Tensor",
           "plan", "read_header"]

HEADER_ALIGN = 64  # the data of an entry starts at a multiple of this (cache lines, AVX-512)
# safetensors' own readers refuse headers over 100 MB; a few hundred tensors take ~50 KB.
MAX_HEADER_BYTES = 64 << 20
MAX_TENSORS = 1 << 20
MAX_FILES = 4096  # shards in one directory
# safetensors dtype -> (item size, numpy dtype or None where numpy has none)
DTYPES: dict[str, tuple[int, str | None]] = {
    "F64": (8, "<f8"), "F32": (4, "<f4"), "F16": (2, "<f2"), "BF16": (2, None),
    "I64": (8, "<i8"), "I32": (4, "<i4"), "I16": (2, "<i2"), "I8": (1, "|i1"),
    "U64": (8, "<u8"), "U32": (4, "<u4"), "U16": (2, "<u2"), "U8": (1, "|u1"),
    "BOOL": (1, "|b1"), "F8_E4M3": (1, None), "F8_E5M2": (1, None),
}
_FROM_NUMPY = {numpy: name for name, (_, numpy) in DTYPES.items() if numpy is not None}
_FROM_NUMPY.update({"<i1": "I8", "<u1": "U8", "<b1": "BOOL"})
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # 30 bytes


@dataclass(frozen=True)
class SourceFile:
    path: str
    name: str  # relative to the source (a file's own name when the source is one file)
    size: int


class Tensor(msgspec.Struct, frozen=True, array_like=True):
    """One tensor of an entry (a compact msgspec struct: the store sends an entry's table
    of them with every load, so a replica parses no header)."""

    name: str
    dtype: str  # a safetensors dtype (DTYPES)
    shape: tuple[int, ...]
    begin: int  # offsets relative to the start of the data
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Piece:
    """Copy `length` bytes at `offset` of `path` to `target` of the entry."""

    path: str
    offset: int
    target: int
    length: int


@dataclass(frozen=True)
class Inflate:
    """Decompress member `member` of the zip `path`, skip `skip` bytes (its .npy header),
    and write `length` bytes at `target` of the entry."""

    path: str
    member: str
    skip: int
    target: int
    length: int


@dataclass(frozen=True)
class Plan:
    kind: str  # "safetensors" | "npz"
    files: tuple[SourceFile, ...]  # all of it is hashed
    header: bytes  # the entry's first bytes: length, JSON, padding
    tensors: tuple[Tensor, ...]  # offsets relative to len(header)
    pieces: tuple[Piece, ...]
    inflates: tuple[Inflate, ...]
    metadata: dict[str, str]

    @property
    def nbytes(self) -> int:
        return len(self.header) + (self.tensors[-1].end if self.tensors else 0)


@dataclass(frozen=True)
class _Found:
    """A tensor where it lies in a source."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    path: str
    offset: int  # in `path`; for a compressed member: bytes to skip after inflating
    member: str | None = None  # set for a compressed .npz member


# -- entries (and safetensors files) ---------------------------------------------------


def _bad(where: str, what: str) -> WeightSourceError:
    return WeightSourceError(f"{where}: {what}")


class _Info(msgspec.Struct, forbid_unknown_fields=True):
    """One tensor's header entry, typed: msgspec checks its shape in C."""

    dtype: str
    shape: list[Annotated[int, msgspec.Meta(ge=0)]]
    data_offsets: tuple[Annotated[int, msgspec.Meta(ge=0)], Annotated[int, msgspec.Meta(ge=0)]]


_RAW_HEADER = msgspec.json.Decoder(dict[str, msgspec.Raw])
_INFO = msgspec.json.Decoder(_Info)
_METADATA = msgspec.json.Decoder(dict[str, str])


def _tensor(name: str, raw: msgspec.Raw, where: str) -> Tensor:
    try:
        info = _INFO.decode(raw)
    except msgspec.ValidationError as exc:
        raise _bad(where, f"tensor {name!r}: {exc} (want dtype, shape as a list of sizes, "
                   "data_offsets as [begin, end])") from None
    size = DTYPES.get(info.dtype)
    if size is None:
        raise _bad(where, f"tensor {name!r} has dtype {info.dtype!r}; known: "
                   f"{', '.join(DTYPES)}")
    begin, end = info.data_offsets
    if begin > end or end - begin != math.prod(info.shape) * size[0]:
        raise _bad(where, f"tensor {name!r}: data_offsets {list(info.data_offsets)} do not "
                   f"hold a {info.dtype} tensor of shape {info.shape}")
    return Tensor(name, info.dtype, tuple(info.shape), begin, end)


def read_header(data: bytes | memoryview | mmap.mmap, size: int,
                where: str) -> tuple[int, dict[str, str], list[Tensor]]:
    """(data start, metadata, tensors sorted by offset) of safetensors bytes `data`
    (at least the header) of a file of `size` bytes; checked against that size."""
    if size < 8 or len(data) < 8:
        raise _bad(where, f"{size} bytes is too short for a safetensors file")
    (length,) = struct.unpack_from("<Q", data, 0)
    if length > MAX_HEADER_BYTES or 8 + length > size:
        raise _bad(where, f"the header length {length:,} does not fit the file of {size:,} "
                   "bytes: not a safetensors file, or a truncated one")
    if len(data) < 8 + length:
        raise _bad(where, "the header is cut short")
    try:
        parsed = _RAW_HEADER.decode(data[8:8 + length])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _bad(where, f"the header is not a JSON object ({exc})") from None
    metadata: dict[str, str] = {}
    if "__metadata__" in parsed:
        try:
            metadata = _METADATA.decode(parsed.pop("__metadata__"))
        except msgspec.ValidationError:
            raise _bad(where, "__metadata__ must map strings to strings") from None
    if len(parsed) > MAX_TENSORS:
        raise _bad(where, f"{len(parsed):,} tensors; at most {MAX_TENSORS:,}")
    tensors = sorted((_tensor(name, raw, where) for name, raw in parsed.items()),
                     key=lambda t: (t.begin, t.end))
    start = 8 + length
    previous_end = 0
    for tensor in tensors:
        if tensor.begin < previous_end:
            raise _bad(where, f"tensor {tensor.name!r} overlaps the one before it")
        previous_end = tensor.end
    if start + previous_end > size:
        raise _bad(where, f"the tensors need {start + previous_end:,} bytes but the file has "
                   f"{size:,}: it is truncated")
    return start, metadata, tensors


def _layout(found: Sequence[_Found], metadata: Mapping[str, str]) -> tuple[bytes, list[Tensor]]:
    """The entry's header and its tensors: largest item size first, then by name."""
    ordered = sorted(found, key=lambda f: (-DTYPES[f.dtype][0], f.name))
    tensors, offset = [], 0
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    for item in ordered:
        tensors.append(Tensor(item.name, item.dtype, item.shape, offset, offset + item.nbytes))
        header[item.name] = {"dtype": item.dtype, "shape": list(item.shape),
                             "data_offsets": [offset, offset + item.nbytes]}
        offset += item.nbytes
    text = msgspec.json.encode(header)
    padded = -(-(8 + len(text)) // HEADER_ALIGN) * HEADER_ALIGN - 8
    return struct.pack("<Q", padded) + text + b" " * (padded - len(text)), tensors


# -- sources ---------------------------------------------------------------------------


def _read_prefix(path: str, size: int, where: str) -> bytes:
    try:
        with open(path, "rb") as file:
            head = file.read(8)
            if len(head) == 8:
                (length,) = struct.unpack("<Q", head)
                if length <= MAX_HEADER_BYTES:
                    head += file.read(min(length, max(0, size - 8)))
            return head
    except OSError as exc:
        raise _bad(where, f"cannot read it: {exc.strerror or exc}") from None


def _safetensors(file: SourceFile) -> tuple[list[_Found], dict[str, str]]:
    head = _read_prefix(file.path, file.size, file.path)
    start, metadata, tensors = read_header(head, file.size, file.path)
    return [_Found(t.name, t.dtype, t.shape, t.nbytes, file.path, start + t.begin)
            for t in tensors], metadata


def _npy_header(data: bytes, where: str) -> tuple[int, str, tuple[int, ...]]:
    """(header length, safetensors dtype, shape) of the .npy bytes `data` starts with."""
    if not data.startswith(_NPY_MAGIC) or len(data) < 10:
        raise _bad(where, "not a .npy array")
    major = data[6]
    if major == 1:
        (length,), offset = struct.unpack_from("<H", data, 8), 10
    elif major in (2, 3):
        (length,), offset = struct.unpack_from("<I", data, 8), 12
    else:
        raise _bad(where, f".npy format version {major} is unknown")
    try:
        info = ast.literal_eval(data[offset:offset + length].decode("latin1"))
    except (ValueError, SyntaxError, UnicodeDecodeError):
        raise _bad(where, "the .npy header is unreadable") from None
    if not isinstance(info, dict) or not {"descr", "fortran_order", "shape"} <= set(info):
        raise _bad(where, "the .npy header lacks descr, fortran_order or shape")
    descr = info["descr"]
    if descr not in _FROM_NUMPY:
        raise _bad(where, f"dtype {descr!r} cannot be shared (numbers in little-endian "
                   "order only, no objects or structures)")
    if info["fortran_order"]:
        raise _bad(where, "Fortran-ordered arrays are not supported: save it C-contiguous "
                   "(np.ascontiguousarray)")
    shape = info["shape"]
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _bad(where, f"shape {shape!r} is not a tuple of sizes")
    return offset + length, _FROM_NUMPY[descr], shape


def _npz(file: SourceFile) -> list[_Found]:
    found: list[_Found] = []
    try:
        with zipfile.ZipFile(file.path) as archive, open(file.path, "rb") as raw:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                name = info.filename[:-4]
                where = f"{file.path}: array {name!r}"
                with archive.open(info) as member:
                    head = member.read(4096)
                header_length, dtype, shape = _npy_header(head, where)
                nbytes = math.prod(shape) * DTYPES[dtype][0]
                if info.file_size != header_length + nbytes:
                    raise _bad(where, f"holds {info.file_size:,} bytes, not the "
                               f"{header_length + nbytes:,} its header says")
                if info.compress_type == zipfile.ZIP_STORED:
                    raw.seek(info.header_offset)
                    local = _ZIP_LOCAL_HEADER.unpack(raw.read(_ZIP_LOCAL_HEADER.size))
                    data = info.header_offset + _ZIP_LOCAL_HEADER.size + local[9] + local[10]
                    found.append(_Found(name, dtype, shape, nbytes, file.path,
                                        data + header_length))
                else:
                    found.append(_Found(name, dtype, shape, nbytes, file.path, header_length,
                                        info.filename))
    except (zipfile.BadZipFile, OSError, struct.error, EOFError) as exc:
        raise _bad(file.path, f"not a readable .npz archive ({exc})") from None
    if not found:
        raise _bad(file.path, "the archive holds no .npy arrays")
    return found


def _files(source: str) -> tuple[str, list[SourceFile]]:
    """(kind, files) of a source path."""
    try:
        info = os.stat(source)
    except FileNotFoundError:
        raise _bad(source, "no such file or directory") from None
    except OSError as exc:
        raise _bad(source, f"cannot read it: {exc.strerror or exc}") from None
    if os.path.isdir(source):
        try:
            names = sorted(n for n in os.listdir(source) if n.endswith(".safetensors"))
        except OSError as exc:
            raise _bad(source, f"cannot list it: {exc.strerror or exc}") from None
        if not names:
            raise _bad(source, "the directory holds no .safetensors files")
        if len(names) > MAX_FILES:
            raise _bad(source, f"{len(names):,} shards; at most {MAX_FILES:,}")
        files = [SourceFile(os.path.join(source, n), n, os.stat(os.path.join(source, n)).st_size)
                 for n in names]
        return "safetensors", files
    file = SourceFile(source, os.path.basename(source), info.st_size)
    if source.endswith(".npz"):
        return "npz", [file]
    return "safetensors", [file]


def plan(source: str) -> Plan:
    """What materialising `source` (an absolute path) copies where."""
    kind, files = _files(source)
    found: list[_Found] = []
    metadata: dict[str, str] = {}
    if kind == "npz":
        found = _npz(files[0])
    else:
        for file in files:
            in_file, meta = _safetensors(file)
            found += in_file
            metadata.update(meta)
    names = [f.name for f in found]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise _bad(source, f"tensor names appear twice: {', '.join(twice[:5])}")
    header, tensors = _layout(found, metadata)
    where = {f.name: f for f in found}
    base = len(header)
    pieces = tuple(sorted(
        (Piece(where[t.name].path, where[t.name].offset, base + t.begin, t.nbytes)
         for t in tensors if where[t.name].member is None and t.nbytes),
        key=lambda p: (p.path, p.offset)))
    inflates = tuple(Inflate(where[t.name].path, str(where[t.name].member),
                             where[t.name].offset, base + t.begin, t.nbytes)
                     for t in tensors if where[t.name].member is not None)
    return Plan(kind, tuple(files), header, tuple(tensors), pieces, inflates, metadata)
