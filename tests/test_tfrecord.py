"""Pack from TFRecords written by TensorFlow itself (tests/fixtures/tfrecord, no TF needed here)."""
import hashlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import recordtool
from recordtool.format import ofrecord_pb2
from recordtool.format.jpeg import probe
from recordtool.errors import PackError
from recordtool.pack import pack
from recordtool.pack.transcode import Transcode, prepare
from recordtool.sources.ofrecord import OFRecordSource
from recordtool.errors import TFRecordError
from recordtool.sources.tfrecord import PRESETS, TFRecordSource, frame_record, masked_crc
from recordtool.verify import verify

from conftest import jpeg_bytes, write

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "tfrecord")
EXPECTED = json.load(open(os.path.join(FIX, "expected.json")))
SLIM = dict(PRESETS["tf-slim"])
CONVERTED = {"n01443537_4.JPEG", "n01443537_7.JPEG"}  # the PNG payload and the CMYK JPEG


def fx(name):
    return os.path.join(FIX, name)


def records_by_name(out):
    ds = recordtool.open(out)
    got = {}
    for i in range(len(ds)):
        m = ofrecord_pb2.OFRecord()
        m.ParseFromString(ds.record(i))
        got[m.feature["filename"].bytes_list.value[0].decode()] = (bytes(ds[i][0]), ds[i][1])
    return ds, got


def test_masked_crc_matches_tensorflow_files():
    raw = open(fx("slim-00000-of-00002"), "rb").read()
    assert int.from_bytes(raw[8:12], "little") == masked_crc(raw[:8])
    n = int.from_bytes(raw[:8], "little")
    assert int.from_bytes(raw[12 + n:16 + n], "little") == masked_crc(raw[12:12 + n])
    assert frame_record(raw[12:12 + n]) == raw[:16 + n]


def check_slim(out, files):
    ds, got = records_by_name(out)
    expect = {f: (lab, h) for name in files for f, lab, h in EXPECTED[name]}
    assert set(got) == set(expect)
    for f, (data, label) in got.items():
        assert label == expect[f][0]  # 1-based in the file, 0-based here
        if f in CONVERTED:
            assert Image.open(io.BytesIO(data)).mode == "RGB" and probe(data).decodable_as_is
        else:
            assert hashlib.sha256(data).hexdigest() == expect[f][1]  # bytes unchanged
    assert ds.classes == ["n01440764", "n01443537", "n01484850"]
    assert ds.manifest["class_text"][1] == "goldfish, Carassius auratus"
    assert ds.manifest["source"]["keys"]["label_offset"] == -1
    assert verify(str(out), decode=True).ok
    return ds


def test_tf_slim_parts_by_glob(tmp_path):
    src = TFRecordSource([fx("slim-*-of-00002")], SLIM, tmpdir=str(tmp_path))
    s = pack(src, str(tmp_path / "out"), shards=2, progress=False)
    assert (s.records, len(s.skipped), {os.path.basename(f.split(":")[0]) for f, _ in s.converted}) == \
        (12, 0, {"slim-00000-of-00002", "slim-00001-of-00002"})
    check_slim(tmp_path / "out", ["slim-00000-of-00002", "slim-00001-of-00002"])


@pytest.mark.parametrize("name", ["slim.gz", "slim.zz"])
def test_compressed(tmp_path, name):
    pack(TFRecordSource([fx(name)], SLIM), str(tmp_path / "out"), progress=False)
    check_slim(tmp_path / "out", [name])


def test_tfds_layout(tmp_path):
    pack(TFRecordSource([fx("tfds.tfrecord")], dict(PRESETS["tfds"])), str(tmp_path / "out"), progress=False)
    ds, got = records_by_name(tmp_path / "out")
    assert {f: (lab, hashlib.sha256(d).hexdigest()) for f, (d, lab) in got.items()} == \
        {f: (lab, h) for f, lab, h in EXPECTED["tfds.tfrecord"]}
    assert ds.classes == ["0", "1"]


def test_flipped_data_byte_skips_that_record_only(tmp_path):
    off = EXPECTED["_offsets_slim-00000"]
    s = pack(TFRecordSource([fx("bad-data-byte"), fx("slim-00001-of-00002")], SLIM), str(tmp_path / "o"),
             progress=False)
    assert s.records == 11
    (where, why), = s.skipped
    assert where == f"{fx('bad-data-byte')}: offset {off[2]}" and "data CRC mismatch" in why


def test_flipped_length_byte_ends_that_file_and_goes_on(tmp_path):
    off = EXPECTED["_offsets_slim-00000"]
    s = pack(TFRecordSource([fx("bad-length-byte"), fx("slim-00001-of-00002")], SLIM), str(tmp_path / "o"),
             progress=False)
    assert s.records == 3 + 6  # records 0-2 of the bad file, all of the next one
    (where, why), = s.skipped
    assert where == f"{fx('bad-length-byte')}: offset {off[3]}" and "length CRC" in why


def test_truncated_tail(tmp_path):
    off = EXPECTED["_offsets_slim-00000"]
    s = pack(TFRecordSource([fx("truncated")], SLIM), str(tmp_path / "o"), progress=False)
    assert s.records == 5
    assert s.skipped[0][0] == f"{fx('truncated')}: offset {off[5]}" and "truncated" in s.skipped[0][1]


def test_truncated_gzip_keeps_what_came_before(tmp_path):
    s = pack(TFRecordSource([fx("truncated.gz")], SLIM), str(tmp_path / "o"), progress=False)
    assert 0 < s.records < 12
    assert any("gzip stream truncated" in why for _, why in s.skipped)


def test_strict_stops_with_file_and_offset(tmp_path):
    off = EXPECTED["_offsets_slim-00000"]
    with pytest.raises(TFRecordError, match=rf"bad-data-byte: offset {off[2]}: data CRC"):
        TFRecordSource([fx("bad-data-byte")], SLIM, on_error="raise")


def test_explicit_keys_and_bad_label(tmp_path):
    keys = {"image": "image/encoded", "label": "image/class/label", "label_offset": -2, "filename": None}
    s = pack(TFRecordSource([fx("slim-00000-of-00002")], keys), str(tmp_path / "o"), progress=False)
    # labels 1..3 minus 2: label-1 records are rejected with a reason, the rest kept
    assert s.records == 4 and len(s.skipped) == 2 and all("negative" in w for _, w in s.skipped)
    with pytest.raises(PackError, match="all skipped"):
        pack(TFRecordSource([fx("tfds.tfrecord")], {"image": "nope", "label": "label"}),
             str(tmp_path / "o2"), progress=False)


def test_cli_tfrecord(tmp_path):
    p = subprocess.run([sys.executable, "-m", "recordtool.cli", "pack", "--from", "tfrecord", "--keys", "tf-slim",
                        fx("slim-0000[01]-of-00002"), str(tmp_path / "o"), "-q"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "packed 12 records" in p.stdout
    p = subprocess.run([sys.executable, "-m", "recordtool.cli", "pack", "--from", "tfrecord", fx("tfds.tfrecord"),
                        str(tmp_path / "o2")], capture_output=True, text=True)
    assert p.returncode != 0 and "--keys" in p.stderr


def test_reshard_ofrecord(tmp_path, folder):
    a = tmp_path / "a"
    pack(str(folder), str(a), shards=3, progress=False)
    s = pack(OFRecordSource(str(a)), str(tmp_path / "b"), shards=5, seed=1, progress=False)
    ds_a, ds_b = recordtool.open(a), recordtool.open(tmp_path / "b")
    assert s.records == len(ds_a) and len(ds_b.shards) == 5 and ds_b.classes == ds_a.classes
    key = lambda ds: sorted((bytes(ds[i][0]), ds[i][1]) for i in range(len(ds)))  # noqa: E731
    assert key(ds_a) == key(ds_b)
    assert verify(str(tmp_path / "b")).ok


# ---------------------------------------------------------------- transcoding

def test_max_side_shrinks_with_dct_scaling(tmp_path):
    big = jpeg_bytes(1000, 600, seed=3)
    p = prepare(big, transcode=Transcode(max_side=240, quality=90))
    assert (p.info.width, p.info.height) == (240, 144) and "shrunk" in p.converted
    full = Image.open(io.BytesIO(big)).convert("RGB").resize((240, 144), Image.BILINEAR)
    ref = np.asarray(full, float)
    plain = io.BytesIO()
    full.save(plain, "JPEG", quality=90)  # what a decode → resize → encode converter gives

    def psnr(data):
        got = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), float)
        return 10 * np.log10(255**2 / ((got - ref) ** 2).mean())

    assert psnr(p.data) > psnr(plain.getvalue()) - 3  # DCT-domain scaling costs little beyond re-encoding
    small = jpeg_bytes(200, 100, seed=4)
    assert prepare(small, transcode=Transcode(max_side=240)).data == small  # not touched


def test_hw_friendly(tmp_path):
    prog = jpeg_bytes(64, 48, progressive=True)
    p = prepare(prog, transcode=Transcode(hw_friendly=True))
    assert not p.info.progressive and p.info.chroma == 2 and "progressive" in p.converted
    assert prepare(prog).data == prog  # off by default
    base = jpeg_bytes(64, 48, subsampling=0)
    assert prepare(base, transcode=Transcode(hw_friendly=True)).data == base  # 4:4:4 baseline is fine


def test_transcode_options_through_pack(tmp_path):
    src = tmp_path / "src"
    write(str(src / "a" / "big.jpg"), jpeg_bytes(900, 300, seed=1))
    write(str(src / "a" / "prog.jpg"), jpeg_bytes(90, 30, seed=2, progressive=True))
    write(str(src / "a" / "ok.jpg"), jpeg_bytes(90, 30, seed=3))
    s = pack(str(src), str(tmp_path / "o"), transcode=Transcode(max_side=300, quality=85, hw_friendly=True),
             progress=False)
    assert {f for f, _ in s.converted} == {"a/big.jpg", "a/prog.jpg"}
    ds = recordtool.open(tmp_path / "o")
    assert max(ds.index.width) == 300 and not ds.index.progressive.any()
    assert ds.manifest["pack"]["max_side"] == 300 and ds.manifest["pack"]["quality"] == 85


def test_process_engine_learns_class_names_from_its_workers(tmp_path):
    """The process engine loads records in worker processes; the class names they meet (tf-slim
    synsets) come back to the driver: the same manifest and bytes as the thread engine."""
    from conftest import tree

    from recordtool.pack.transcode import Transcode

    t = Transcode(max_side=64)
    a = pack(TFRecordSource([fx("slim-*-of-00002")], SLIM), str(tmp_path / "threads"), progress=False, transcode=t)
    b = pack(TFRecordSource([fx("slim-*-of-00002")], SLIM), str(tmp_path / "procs"), progress=False, transcode=t,
             engine="process", workers=2)
    assert b.engine == "process" and a.records == b.records
    assert tree(tmp_path / "threads") == tree(tmp_path / "procs")
    assert not all(c.isdigit() for c in recordtool.open(str(tmp_path / "procs")).classes)
