"""OneFlow compatibility of framing and messages; our wire codec against protobuf itself."""
import struct

import numpy as np
import pytest

from recordtool.format import ofrecord_pb2
from recordtool.format.ofrecord import FormatError, decode_ofrecord, encode_ofrecord, frame, iter_records


def test_framing_matches_hand_built_bytes():
    # OneFlow: int64 little-endian length, then OFRecord{feature: {"class/label": Int32List[3]}}
    enc = encode_ofrecord({"class/label": 3})
    got = b"".join(frame(enc))
    entry = b"\x0a\x0bclass/label" + b"\x12\x05" + b"\x22\x03" + b"\x0a\x01\x03"
    msg = b"\x0a" + bytes([len(entry)]) + entry
    assert got == struct.pack("<q", len(msg)) + msg
    assert got[:8] == len(msg).to_bytes(8, "little")


def test_encode_parses_with_protobuf_and_locates_payload():
    payload = bytes(range(256)) * 700  # > 128 KiB: multi-byte varint lengths
    feats = {"encoded": payload, "class/label": 917, "height": 375, "width": 500,
             "filename": "n01/ü.JPEG".encode(), "neg": -5, "big": 2**40, "f": [0.5, 1.5]}
    enc = encode_ofrecord(feats, locate="encoded")
    blob = b"".join(enc.parts)
    assert len(blob) == enc.size
    assert blob[enc.payload_offset:enc.payload_offset + len(payload)] == payload
    m = ofrecord_pb2.OFRecord()
    m.ParseFromString(blob)
    assert m.feature["encoded"].bytes_list.value == [payload]
    assert list(m.feature["class/label"].int32_list.value) == [917]
    assert list(m.feature["neg"].int32_list.value) == [-5]
    assert list(m.feature["big"].int64_list.value) == [2**40]
    assert list(m.feature["f"].float_list.value) == [0.5, 1.5]
    assert m.feature["filename"].bytes_list.value == ["n01/ü.JPEG".encode()]
    assert set(m.feature) == set(feats)
    # what protobuf itself writes for the same message has the same size (same encoding choices)
    assert m.ByteSize() == enc.size


def test_decode_reads_protobuf_serialized_records():
    rng = np.random.default_rng(1)
    for trial in range(20):
        m = ofrecord_pb2.OFRecord()
        img = rng.bytes(int(rng.integers(0, 3000)))
        m.feature["encoded"].bytes_list.value.append(img)
        lab = int(rng.integers(-3, 1000))
        m.feature["class/label"].int32_list.value.append(lab)
        m.feature["x"].int64_list.value.extend([1, -2, 2**50])
        m.feature["y"].float_list.value.extend([1.25])
        m.feature["z"].double_list.value.extend([2.5])
        blob = b"PAD" + m.SerializeToString()
        d = decode_ofrecord(blob, 3)
        a, b = d["encoded"][1][0]
        assert blob[a:b] == img
        assert d["class/label"][1] == [lab]
        assert d["x"][1] == [1, -2, 2**50]
        assert d["y"][1] == [1.25]


def test_decode_rejects_malformed():
    blob = b"".join(encode_ofrecord({"encoded": b"x" * 50}).parts)
    with pytest.raises(ValueError):
        decode_ofrecord(blob[:-10])
    with pytest.raises(ValueError):
        decode_ofrecord(b"\x0a\xff\xff\xff\xff\x0f")


def test_iter_records_names_shard_and_offset():
    rec = b"".join(frame(encode_ofrecord({"a": 1})))
    good = rec * 3
    assert [r.offset for r in iter_records(good, "s")] == [0, len(rec), 2 * len(rec)]
    with pytest.raises(FormatError, match=rf"part-9: offset {2 * len(rec)}: record of"):
        list(iter_records(good[:-1], "part-9"))
    with pytest.raises(FormatError, match=rf"offset {len(rec)}: 3 trailing bytes"):
        list(iter_records(rec + b"abc", "x"))
    with pytest.raises(FormatError, match="offset 0: record length 0 is not positive"):
        list(iter_records(struct.pack("<q", 0) + rec, "x"))
