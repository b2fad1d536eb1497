"""Read the metadata key/value section of a GGUF file, and nothing else.

Contract: `read_metadata(path)` returns `{key: value}` for every metadata pair of a GGUF v2/v3 file, in file
order, and stops before the tensor-info table: tensor data is never touched, so reading the context length or
the tokenizer of a 100 GB model costs only the size of its metadata. Values are Python `int`, `float`, `bool`,
`str`, or a `list` of those for GGUF arrays (nested arrays become nested lists). `read_header(path)` gives the
version and the tensor and key counts; `read_tensor_infos(path)` the tensor-info table after the metadata
(name, ggml type number, shape; still no tensor data). Every length and offset is bounds-checked against the file size; a
malformed file raises `GGUFError` naming the key it was reading.

Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv times
[string key, u32 value type, value]. A string is u64 byte length + UTF-8 bytes; an array is u32 item type,
u64 count, items. Type codes: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array,
10 u64, 11 i64, 12 f64.

This module knows nothing of tokenizers or models; it must not import anything outside the standard library.
"""

import mmap
import struct

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS_SUPPORTED = (2, 3)  # v1 used 32-bit counts and was superseded in 2023
MAX_KV_COUNT = 1 << 20  # far above any real model (a few hundred keys); guards against a corrupt count
MAX_STRING_BYTES = 1 << 28  # a chat template or token text is never near 256 MiB

TYPE_STRING = 8
TYPE_ARRAY = 9
# type code -> (struct format, size in bytes) for the fixed-size scalar types
_SCALAR_FORMATS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}


class GGUFError(ValueError):
    """The file is not a GGUF file we can read, or its metadata is malformed."""


class _Reader:
    """Cursor over the mapped file; every read is bounds-checked and names the key being read."""

    def __init__(self, buf):
        self.buf = buf
        self.pos = 0
        self.size = len(buf)
        self.key = "<header>"

    def take(self, n_bytes):
        end = self.pos + n_bytes
        if n_bytes < 0 or end > self.size:
            raise GGUFError(f"GGUF metadata truncated while reading {self.key!r} "
                            f"(need {n_bytes} bytes at offset {self.pos}, file has {self.size})")
        start = self.pos
        self.pos = end
        return start

    def scalar(self, type_code):
        fmt, size = _SCALAR_FORMATS[type_code]
        return struct.unpack_from(fmt, self.buf, self.take(size))[0]

    def string(self):
        n_bytes = self.scalar(10)
        if n_bytes > MAX_STRING_BYTES:
            raise GGUFError(f"GGUF string of {n_bytes} bytes in {self.key!r} exceeds the limit")
        start = self.take(n_bytes)
        try:
            return self.buf[start:start + n_bytes].decode("utf-8")
        except UnicodeDecodeError:
            # Some converters wrote token texts that are not valid UTF-8; keep them readable.
            return self.buf[start:start + n_bytes].decode("utf-8", errors="surrogateescape")

    def value(self, type_code):
        if type_code in _SCALAR_FORMATS:
            return self.scalar(type_code)
        if type_code == TYPE_STRING:
            return self.string()
        if type_code == TYPE_ARRAY:
            return self.array()
        raise GGUFError(f"unknown GGUF value type {type_code} for {self.key!r}")

    def array(self):
        item_type = self.scalar(4)
        count = self.scalar(10)
        if item_type in _SCALAR_FORMATS:
            fmt, size = _SCALAR_FORMATS[item_type]
            start = self.take(count * size)
            return list(struct.unpack_from("<%d%s" % (count, fmt[1]), self.buf, start))
        if item_type == TYPE_STRING:
            if count * 8 > self.size - self.pos:
                raise GGUFError(f"GGUF array count {count} in {self.key!r} exceeds the file")
            return self._string_array(count)
        if item_type == TYPE_ARRAY:
            return [self.array() for _ in range(count)]
        raise GGUFError(f"unknown GGUF array item type {item_type} for {self.key!r}")

    def _string_array(self, count):
        # Hot path for vocabularies (up to ~250K strings): unrolled bounds checks, one slice each.
        buf, pos, size = self.buf, self.pos, self.size
        unpack_len = struct.Struct("<Q").unpack_from
        out = []
        append = out.append
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.take(8)
            n_bytes = unpack_len(buf, pos)[0]
            pos += 8
            if n_bytes > MAX_STRING_BYTES or pos + n_bytes > size:
                self.pos = pos
                self.take(n_bytes)
            raw = buf[pos:pos + n_bytes]
            pos += n_bytes
            try:
                append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                append(raw.decode("utf-8", errors="surrogateescape"))
        self.pos = pos
        return out


def _open(path):
    """Map the file read-only; returns (file, mmap)."""
    f = open(path, "rb")
    try:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:  # empty file
        f.close()
        raise GGUFError(f"{path}: empty file, not GGUF") from None
    except BaseException:
        f.close()
        raise
    return f, mapped


def _header(reader, path):
    if reader.size < 24 or reader.buf[0:4] != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (bad magic)")
    reader.take(4)
    version = reader.scalar(4)
    if version not in GGUF_VERSIONS_SUPPORTED:
        raise GGUFError(f"{path}: GGUF version {version} is not supported "
                        f"(supported: {GGUF_VERSIONS_SUPPORTED})")
    n_tensors = reader.scalar(10)
    n_kv = reader.scalar(10)
    if n_kv > MAX_KV_COUNT:
        raise GGUFError(f"{path}: GGUF key count {n_kv} is implausible")
    return {"version": version, "n_tensors": n_tensors, "n_kv": n_kv}


def read_header(path):
    """Return {"version", "n_tensors", "n_kv"} of a GGUF file."""
    f, mapped = _open(path)
    try:
        return _header(_Reader(mapped), path)
    finally:
        mapped.close()
        f.close()


def read_metadata(path, keys=None):
    """Return the GGUF metadata as an ordered dict {key: value}.

    `keys`: optional collection of key names; when given, only those are decoded (the others are still
    walked, since GGUF has no index) and the result holds just the ones present.
    """
    f, mapped = _open(path)
    try:
        reader = _Reader(mapped)
        header = _header(reader, path)
        wanted = None if keys is None else frozenset(keys)
        out = {}
        for _ in range(header["n_kv"]):
            reader.key = "<key name>"
            key = reader.string()
            reader.key = key
            type_code = reader.scalar(4)
            if wanted is not None and key not in wanted:
                _skip(reader, type_code)
                continue
            out[key] = reader.value(type_code)
        return out
    finally:
        mapped.close()
        f.close()


def read_tensor_infos(path):
    """Return [(name, ggml type number, [ne0, ne1, ...])] of every tensor, in file order (GGUF: string name,
    u32 n_dims, u64 ne[n_dims], u32 type, u64 offset); the metadata is walked past, the data never read."""
    f, mapped = _open(path)
    try:
        reader = _Reader(mapped)
        header = _header(reader, path)
        for _ in range(header["n_kv"]):
            reader.key = "<key name>"
            reader.key = reader.string()
            _skip(reader, reader.scalar(4))
        out = []
        for _ in range(header["n_tensors"]):
            reader.key = "<tensor name>"
            name = reader.string()
            reader.key = name
            n_dims = reader.scalar(4)
            if n_dims > 4:
                raise GGUFError(f"{path}: tensor {name!r} has {n_dims} dimensions")
            ne = [reader.scalar(10) for _ in range(n_dims)]
            type_num = reader.scalar(4)
            reader.scalar(10)  # offset into the data section
            out.append((name, type_num, ne))
        return out
    finally:
        mapped.close()
        f.close()


def _skip(reader, type_code):
    """Advance past one value without decoding it."""
    if type_code in _SCALAR_FORMATS:
        reader.take(_SCALAR_FORMATS[type_code][1])
    elif type_code == TYPE_STRING:
        reader.take(reader.scalar(10))
    elif type_code == TYPE_ARRAY:
        item_type = reader.scalar(4)
        count = reader.scalar(10)
        if item_type in _SCALAR_FORMATS:
            reader.take(count * _SCALAR_FORMATS[item_type][1])
        else:
            for _ in range(count):
                _skip(reader, item_type)
    else:
        raise GGUFError(f"unknown GGUF value type {type_code} for {reader.key!r}")
