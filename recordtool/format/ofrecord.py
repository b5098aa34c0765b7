"""OFRecord framing and a hand-rolled protobuf codec for the few messages we write.

Why hand-rolled: pack must know where the JPEG bytes land *inside* the shard file, so the
reader can slice them from an mmap with no parse. protobuf's own serializer does not tell.
The bytes produced here are plain proto2 wire format (keys sorted, as protobuf's
deterministic mode does), parsed by `ofrecord_pb2.OFRecord` in the tests and by OneFlow.
"""
from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from ..errors import FormatError  # noqa: F401  (raised by iter_records; importable from here too)

LENGTH = struct.Struct("<q")  # OneFlow reads the length in host order; x86 = little-endian
LENGTH_SIZE = LENGTH.size

# protobuf wire types
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

# A record (OFRecord or TFRecord) shorter than this holds no image of any format we take with
# its key and label (a 1x1 PNG alone is 67 bytes): such records are counted per file while
# listing, not listed one by one, so millions of tiny records cost neither minutes nor gigabytes.
MIN_RECORD_BYTES = 64

# Feature.kind field numbers (proto/ofrecord.proto)
BYTES_LIST, FLOAT_LIST, DOUBLE_LIST, INT32_LIST, INT64_LIST = 1, 2, 3, 4, 5




_SMALL = [bytes((i,)) for i in range(128)]


def _varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL[n]
    if n < 0:
        n &= (1 << 64) - 1  # protobuf encodes negative int32/int64 as 10-byte two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(field: int, payload_len: int) -> bytes:
    return _varint((field << 3) | _LEN) + _varint(payload_len)


@dataclass
class Encoded:
    """A serialized OFRecord plus where one bytes feature's first value sits inside it."""

    parts: list  # bytes-like pieces; joined they are the message (avoids copying big payloads)
    size: int
    payload_offset: int  # offset of the located bytes value inside the message, or -1


_BYTES = (bytes, bytearray, memoryview)


def _feature_body(key: str, value) -> tuple[int, list]:
    """(kind, pieces of the XxxList message) for one feature value."""
    if isinstance(value, _BYTES):
        return BYTES_LIST, [_len_field(1, len(value)), value]
    if isinstance(value, int):
        value = (value,)
    elif isinstance(value, float):
        value = (value,)
    value = list(value)
    if value and all(isinstance(v, _BYTES) for v in value):
        out = []
        for v in value:
            out.append(_len_field(1, len(v)))
            out.append(v)
        return BYTES_LIST, out
    if all(isinstance(v, int) for v in value):
        kind = INT32_LIST if all(-(2**31) <= v < 2**31 for v in value) else INT64_LIST
        packed = b"".join(_varint(v) for v in value)
        return kind, ([_len_field(1, len(packed)), packed] if packed else [])
    if all(isinstance(v, (int, float)) for v in value):
        packed = struct.pack(f"<{len(value)}f", *value)
        return FLOAT_LIST, [_len_field(1, len(packed)), packed]
    raise TypeError(f"feature {key!r}: unsupported value {type(value[0]).__name__}")


@functools.lru_cache(maxsize=256)
def _key_part(key: str) -> bytes:
    kb = key.encode("utf-8")
    return _len_field(1, len(kb)) + kb


def encode_ofrecord(features: dict, locate: str | None = None) -> Encoded:
    """Serialize {key: value} to OFRecord wire bytes, keys sorted.

    Values: bytes-like → bytes_list of one value; list of bytes → bytes_list; int or list of
    int → int32_list (int64_list if a value does not fit); float or list of float → float_list.
    `locate` names a single-bytes feature whose payload offset is reported.
    """
    parts: list = []
    size = 0
    payload_offset = -1
    for key in sorted(features):
        kind, inner = _feature_body(key, features[key])
        inner_len = sum(map(len, inner))
        feature_hdr = _len_field(kind, inner_len)
        key_part = _key_part(key)
        feature_len = len(feature_hdr) + inner_len
        value_hdr = _len_field(2, feature_len)
        head = _len_field(1, len(key_part) + len(value_hdr) + feature_len) + key_part + value_hdr + feature_hdr
        if key == locate:
            if kind != BYTES_LIST or len(inner) != 2:
                raise TypeError(f"feature {key!r} to locate must be a single bytes value")
            payload_offset = size + len(head) + len(inner[0])
        parts.append(head)
        parts.extend(inner)
        size += len(head) + inner_len
    return Encoded(parts, size, payload_offset)


def frame(encoded: Encoded) -> list:
    """The pieces of one on-disk record: int64 LE length, then the message."""
    return [LENGTH.pack(encoded.size), *encoded.parts]


# ---------------------------------------------------------------- decoding (wire walker)

def _read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise ValueError("varint runs past the end")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _skip(buf, pos: int, end: int, wire: int) -> int:
    if wire == _VARINT:
        return _read_varint(buf, pos, end)[1]
    if wire == _I64:
        pos += 8
    elif wire == _I32:
        pos += 4
    elif wire == _LEN:
        n, pos = _read_varint(buf, pos, end)
        pos += n
    else:
        raise ValueError(f"unsupported wire type {wire}")
    if pos > end:
        raise ValueError("field runs past the end")
    return pos


def _fields(buf, pos: int, end: int):
    """Yield (field, wire, start, stop) for LEN fields and (field, wire, value, pos) for varints."""
    while pos < end:
        tag, pos = _read_varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if field == 0:
            raise ValueError("field number 0")
        if wire == _LEN:
            n, pos = _read_varint(buf, pos, end)
            if pos + n > end:
                raise ValueError("length-delimited field runs past the end")
            yield field, wire, pos, pos + n
            pos += n
        elif wire == _VARINT:
            v, pos = _read_varint(buf, pos, end)
            yield field, wire, v, pos
        else:
            pos = _skip(buf, pos, end, wire)


def _signed32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def _signed64(v: int) -> int:
    return v - (1 << 64) if v & (1 << 63) else v


def _decode_feature(buf, start: int, end: int):
    """Return (kind, values); bytes values come as (start, stop) spans into buf."""
    kind, values = None, []
    for field, wire, a, b in _fields(buf, start, end):
        if wire != _LEN:
            raise ValueError(f"Feature field {field} has wire type {wire}")
        kind, values = field, []  # oneof: the last one wins, as in protobuf
        if field == BYTES_LIST:
            for f2, w2, s, e in _fields(buf, a, b):
                if f2 == 1 and w2 == _LEN:
                    values.append((s, e))
        elif field in (INT32_LIST, INT64_LIST):
            conv = _signed32 if field == INT32_LIST else _signed64
            for f2, w2, s, e in _fields(buf, a, b):
                if f2 != 1:
                    continue
                if w2 == _LEN:  # packed
                    p = s
                    while p < e:
                        v, p = _read_varint(buf, p, e)
                        values.append(conv(v))
                elif w2 == _VARINT:
                    values.append(conv(s))
        elif field == FLOAT_LIST:
            for f2, w2, s, e in _fields(buf, a, b):
                if f2 == 1 and w2 == _LEN:
                    values.extend(struct.unpack_from(f"<{(e - s) // 4}f", buf, s))
        # double lists and unknown kinds: kept as kind only
    return kind, values


def decode_ofrecord(buf, start: int = 0, end: int | None = None) -> dict:
    """Walk one serialized OFRecord in buf[start:end] without copying payloads.

    Returns {key: (kind, values)}; bytes values are absolute (start, stop) spans into buf.
    Raises ValueError on malformed wire data.
    """
    end = len(buf) if end is None else end
    out = {}
    for field, wire, a, b in _fields(buf, start, end):
        if field != 1 or wire != _LEN:
            continue
        key, feat = None, (None, [])
        for f2, w2, s, e in _fields(buf, a, b):
            if f2 == 1 and w2 == _LEN:
                key = bytes(buf[s:e]).decode("utf-8")
            elif f2 == 2 and w2 == _LEN:
                feat = _decode_feature(buf, s, e)
        if key is None:
            key = ""
        out[key] = feat
    return out


@dataclass
class RawRecord:
    shard: str
    offset: int  # of the length prefix
    length: int  # of the message
    @property
    def data_offset(self) -> int:
        return self.offset + LENGTH_SIZE


def iter_records(buf, shard_name: str = "?"):
    """Yield RawRecord for every record of a part file mapped in buf; raise FormatError on bad framing."""
    pos, end = 0, len(buf)
    while pos < end:
        if end - pos < LENGTH_SIZE:
            raise FormatError(f"{shard_name}: offset {pos}: {end - pos} trailing bytes, "
                              f"too few for a length prefix (truncated shard?)")
        (n,) = LENGTH.unpack_from(buf, pos)
        if n <= 0:
            raise FormatError(f"{shard_name}: offset {pos}: record length {n} is not positive")
        if pos + LENGTH_SIZE + n > end:
            raise FormatError(f"{shard_name}: offset {pos}: record of {n} bytes runs past the end "
                              f"of the file ({end} bytes; truncated shard?)")
        yield RawRecord(shard_name, pos, n)
        pos += LENGTH_SIZE + n
