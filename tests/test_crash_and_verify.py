"""A killed pack never looks finished and a re-run is byte-identical; verify finds damage."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import recordtool
from recordtool.format.ofrecord import FormatError
from recordtool.format.scan import index_parts
from recordtool.pack import pack
from recordtool.verify import verify

import faults
from conftest import jpeg_bytes, write

PACK = [sys.executable, "-m", "recordtool.cli", "pack", "--shards", "3", "--seed", "5", "-q"]


def _tree(root):
    return {n: open(os.path.join(root, n), "rb").read() for n in sorted(os.listdir(root))}


@pytest.fixture
def reference(folder, tmp_path):
    ref = tmp_path / "ref"
    subprocess.run(PACK + [str(folder), str(ref)], check=True)
    return _tree(ref)


@pytest.mark.parametrize("fault", ["record:1", "record:9", "record:21", "publish:1", "publish:3",
                                   "publish:5", "published:1"])
def test_kill_at_any_moment_then_rerun(folder, tmp_path, reference, fault):
    out = tmp_path / "out"
    env = faults.env(fault)
    p = subprocess.run(PACK + [str(folder), str(out)], env=env)
    assert p.returncode == -signal.SIGKILL
    finished = (out / "manifest.json").exists()
    if finished:  # killed after the manifest was published: the dataset must be whole
        assert fault == "published:1" and verify(str(out)).ok
    else:
        with pytest.raises(FormatError, match="not a finished recordtool dataset"):
            recordtool.open(out)
        assert not verify(str(out)).ok
    p = subprocess.run(PACK + (["--overwrite"] if finished else []) + [str(folder), str(out)])
    assert p.returncode == 0
    assert _tree(out) == reference


def test_kill_by_timer_then_rerun(tmp_path):
    # a larger input, killed at several wall-clock moments without any hook
    src = tmp_path / "src"
    for i in range(300):
        write(str(src / f"c{i % 4}" / f"{i}.jpg"), jpeg_bytes(160, 120, seed=i))
    ref = tmp_path / "ref"
    subprocess.run(PACK + [str(src), str(ref)], check=True)
    expected = _tree(ref)
    for delay in (0.3, 0.6, 0.9):
        out = tmp_path / f"out{delay}"
        p = subprocess.Popen(PACK + [str(src), str(out)])
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if not (out / "manifest.json").exists():
            with pytest.raises(FormatError):
                recordtool.open(out)
        rerun = PACK + (["--overwrite"] if (out / "manifest.json").exists() else [])
        subprocess.run(rerun + [str(src), str(out)], check=True)
        assert _tree(out) == expected


@pytest.fixture
def packed(folder, tmp_path):
    out = tmp_path / "out"
    pack(str(folder), str(out), shards=2, progress=False)
    return out


def _first_error(out, **kw):
    res = verify(str(out), **kw)
    assert not res.ok
    return res.errors[0]


def test_verify_flipped_byte_names_shard(packed):
    p = packed / "part-00001"
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0xFF
    p.write_bytes(bytes(b))
    assert "part-00001" in _first_error(packed) and "CRC32C" in _first_error(packed)


def test_verify_truncated_shard_names_offset(packed):
    p = packed / "part-00000"
    b = p.read_bytes()
    p.write_bytes(b[:-100])
    err = _first_error(packed)
    assert "part-00000" in err and f"offset {len(b) - 100}" in err


def test_verify_broken_framing_names_offset(packed):
    ds = recordtool.open(packed)
    off = int(ds.index.offset[1])  # second record of shard 0
    ds.close()
    p = packed / "part-00000"
    b = bytearray(p.read_bytes())
    b[off:off + 8] = (10**12).to_bytes(8, "little")
    p.write_bytes(bytes(b))
    errs = verify(str(packed)).errors
    assert any(f"part-00000: offset {off}" in e for e in errs), errs


def test_verify_decode_finds_corrupt_image(packed):
    ds = recordtool.open(packed)
    i = int(ds.index.size_order[0])
    s, a, n = int(ds.index.shard[i]), int(ds.index.jpeg_offset[i]), int(ds.index.jpeg_length[i])
    ds.close()
    p = packed / f"part-{s:05d}"
    b = bytearray(p.read_bytes())
    import crc32c

    def damage(image):
        b[a:a + n] = image
        p.write_bytes(bytes(b))
        m = json.loads((packed / "manifest.json").read_text())
        # keep the CRC consistent so only the header or decode checks can notice
        m["shards"][s]["crc32c"] = f"{crc32c.crc32c(bytes(b)):08x}"
        (packed / "manifest.json").write_text(json.dumps(m))

    orig = bytes(b[a:a + n])
    damage(b"\xff\xd8" + bytes(n - 2))  # same length, broken header: the header check sees it
    assert f"part-{s:05d}" in _first_error(packed) and "not a JPEG" in _first_error(packed)
    sos = orig.find(b"\xff\xda")
    data = sos + 2 + int.from_bytes(orig[sos + 2:sos + 4], "big")
    damage(orig[:data] + bytes(n - 2 - data) + b"\xff\xd9")  # header intact, entropy data zeroed
    assert verify(str(packed)).ok
    err = _first_error(packed, decode=True)
    assert f"record {i}" in err and f"part-{s:05d}" in err


def test_verify_missing_shard_and_index(packed):
    os.remove(packed / "part-00001")
    assert "part-00001" in _first_error(packed)
    os.remove(packed / "index.rtx")
    assert "index.rtx" in _first_error(packed)


def test_reader_refuses_truncated_shard(packed):
    p = packed / "part-00000"
    p.write_bytes(p.read_bytes()[:-1])
    ds = recordtool.open(packed)
    with pytest.raises(FormatError, match="part-00000.*manifest says"):
        for i in range(len(ds)):
            ds[i]


def test_index_oneflow_style_parts(tmp_path, folder):
    """Part files written by protobuf itself (OneFlow's way: random key order, extra keys)."""
    from recordtool.format import ofrecord_pb2

    root = tmp_path / "of"
    os.makedirs(root)
    files = sorted(p for p in folder.rglob("*.JPEG"))
    expect = []
    for part in range(2):
        with open(root / f"part-{part:05d}", "wb") as f:
            for k, path in enumerate(files[part::2]):
                m = ofrecord_pb2.OFRecord()
                data = path.read_bytes()
                label = ["cat", "dog", "eel"].index(path.parent.name)
                m.feature["class/synset"].bytes_list.value.append(path.parent.name.encode())
                m.feature["filename"].bytes_list.value.append(path.name.encode())
                m.feature["encoded"].bytes_list.value.append(data)
                m.feature["class/label"].int32_list.value.append(label)
                blob = m.SerializeToString()
                f.write(len(blob).to_bytes(8, "little") + blob)
                expect.append((data, label))
    m = index_parts(str(root), progress=False)
    assert m["records"] == len(files) and m["classes"] == ["cat", "dog", "eel"]
    ds = recordtool.open(root)
    assert [(bytes(d), lab) for d, lab in (ds[i] for i in range(len(ds)))] == expect
    assert verify(str(root), decode=True).ok


def test_index_reports_bad_records(tmp_path, folder):
    from recordtool.format import ofrecord_pb2

    root = tmp_path / "of"
    os.makedirs(root)
    with open(root / "part-00000", "wb") as f:
        for payload in [jpeg_bytes(), b"not a jpeg", jpeg_bytes(seed=2)]:
            m = ofrecord_pb2.OFRecord()
            m.feature["encoded"].bytes_list.value.append(payload)
            m.feature["class/label"].int32_list.value.append(0)
            blob = m.SerializeToString()
            f.write(len(blob).to_bytes(8, "little") + blob)
    m = index_parts(str(root), progress=False)
    assert m["records"] == 2 and len(m["skipped"]) == 1
    assert "part-00000: offset" in m["skipped"][0]["reason"]
    assert verify(str(root)).ok
    with pytest.raises(FormatError, match="part-00000: offset"):
        index_parts(str(root), on_error="raise", progress=False)
    shutil.copy(root / "part-00000", root / "part-00001")
    with open(root / "part-00001", "ab") as f:
        f.write(b"\x01\x02")
    with pytest.raises(FormatError, match="part-00001: offset .*trailing bytes"):
        index_parts(str(root), progress=False)


def test_killed_planned_pack_resumes_only_unfinished_shards(folder, tmp_path, reference):
    """--shards: each finished part file is recorded; a re-run reuses those (same file, not
    rewritten) and redoes the rest, with the same bytes as an uninterrupted pack."""
    out = tmp_path / "out"
    env = faults.env("record@part-00001:2")
    p = subprocess.run(PACK + ["--workers", "1", str(folder), str(out)], env=env)  # shards one after another
    assert p.returncode == -signal.SIGKILL
    partial = out / ".partial"
    assert sorted(n for n in os.listdir(partial) if n.endswith(".done.json")) == ["part-00000.done.json"]
    assert json.loads((partial / "pack.json").read_text())["tool"] == "recordtool"
    inode = os.stat(partial / "part-00000").st_ino
    p = subprocess.run(PACK + [str(folder), str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "reused part-00000" in p.stderr and "reused 1 shards" in p.stdout
    assert _tree(out) == reference
    assert os.stat(out / "part-00000").st_ino == inode  # moved into place, never rewritten


def test_resume_needs_the_same_plan(folder, tmp_path):
    out = tmp_path / "out"
    env = faults.env("record@part-00001:1")
    assert subprocess.run(PACK + ["--workers", "1", str(folder), str(out)], env=env).returncode == -signal.SIGKILL
    # another seed is another plan: nothing is reused, and the result is that seed's pack
    s = pack(str(folder), str(out), shards=3, seed=6, progress=False)
    assert s.reused == []
    ref = pack(str(folder), str(tmp_path / "ref"), shards=3, seed=6, progress=False)
    assert _tree(out) == _tree(tmp_path / "ref") and ref.records == s.records


def test_damaged_finished_shard_is_redone(folder, tmp_path, reference):
    out = tmp_path / "out"
    env = faults.env("record@part-00002:1")
    assert subprocess.run(PACK + ["--workers", "1", str(folder), str(out)], env=env).returncode == -signal.SIGKILL
    part = out / ".partial" / "part-00001"
    part.write_bytes(part.read_bytes()[:-10])  # truncated after it was recorded as finished
    (out / ".partial" / "part-00000.done.json").write_text("{not json")
    p = subprocess.run(PACK + [str(folder), str(out)], capture_output=True, text=True)
    assert p.returncode == 0 and "reused" not in p.stdout
    assert _tree(out) == reference


def test_foreign_partial_is_never_deleted(folder, tmp_path):
    out = tmp_path / "out"
    write(str(out / ".partial" / "theirs.bin"), b"x")
    with pytest.raises(FileExistsError, match="not made by recordtool"):
        pack(str(folder), str(out), shards=2, progress=False)
    assert (out / ".partial" / "theirs.bin").read_bytes() == b"x"


def test_no_resume_starts_over(folder, tmp_path, reference):
    out = tmp_path / "out"
    env = faults.env("record@part-00002:1")
    assert subprocess.run(PACK + ["--workers", "1", str(folder), str(out)], env=env).returncode == -signal.SIGKILL
    before = os.stat(out / ".partial" / "part-00000").st_mtime_ns
    time.sleep(0.05)
    p = subprocess.run(PACK + ["--no-resume", str(folder), str(out)], capture_output=True, text=True)
    assert p.returncode == 0 and "reused" not in p.stdout + p.stderr
    assert _tree(out) == reference and os.stat(out / "part-00000").st_mtime_ns > before  # written again


def test_verify_names_a_record_whose_image_key_was_renamed(packed):
    """One changed byte in a feature key: the record still parses, verify names it (was KeyError)."""
    p = packed / "part-00000"
    b = p.read_bytes()
    k = b.index(b"encoded")
    p.write_bytes(b[:k] + b"encodex" + b[k + 7:])
    err = _first_error(packed)
    assert "part-00000: offset" in err and "'encoded'" in err


def test_manifest_skipped_entries_of_wrong_types_are_named(packed):
    m = json.loads((packed / "manifest.json").read_text())
    for entry in ({"shard": ["x"], "offset": 1}, {"shard": "part-00000", "offset": "1"}):
        m["skipped"] = [entry]
        (packed / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(FormatError, match=r"skipped\[0\]"):
            recordtool.open(str(packed))
        assert "skipped[0]" in _first_error(packed)


def test_index_rows_wrapping_past_2_64_are_caught(packed):
    """jpeg_offset + jpeg_length overflowing uint64 must not slip past the bounds check."""
    import numpy as np

    from recordtool.format import index as ix
    from recordtool.reader import check_rows

    ds = recordtool.open(str(packed))
    cols = {k: np.array(v) for k, v in ds.index.columns.items()}
    cols["jpeg_offset"][0], cols["jpeg_length"][0] = 2**64 - 2, 10
    with pytest.raises(FormatError, match="row 0: image bytes"):
        check_rows(ix.Index(cols), ds.shards, "index.rtx", len(ds.classes))


@pytest.mark.parametrize("side", [0, 65_501, 60_000_000, 2**31 - 1])
def test_index_rows_claiming_sides_no_jpeg_has_are_caught(packed, side):
    """The GPU decoders size their buffers from the index's sizes at warm-up, before a header is
    read: a row claiming a side past JPEG's (libjpeg-turbo's 65,500) is refused at open."""
    import numpy as np

    from recordtool.format import index as ix
    from recordtool.reader import check_rows

    ds = recordtool.open(str(packed))
    cols = {k: np.array(v) for k, v in ds.index.columns.items()}
    cols["height"][1] = side
    with pytest.raises(FormatError, match="row 1: size"):
        check_rows(ix.Index(cols), ds.shards, "index.rtx", len(ds.classes))
    cols["height"][1] = 65_500
    check_rows(ix.Index(cols), ds.shards, "index.rtx", len(ds.classes))


def test_index_header_length_is_bounded(packed):
    """A sparse index declaring a 400 MiB header is refused before anything is copied."""
    from recordtool.format import index as ix

    p = packed / "index.rtx"
    b = bytearray(p.read_bytes())
    b[8:12] = (400 << 20).to_bytes(4, "little")
    with open(p, "wb") as f:
        f.write(b)
        f.truncate(500 << 20)  # sparse: the header would fit in the file
    with pytest.raises(FormatError, match="more than the"):
        ix.read_index(str(p))


def test_index_leaves_out_images_over_max_pixels(packed):
    """`recordtool index` does not index what the decoders refuse: an image over max_pixels
    would fail on every epoch."""
    import shutil

    for name in ("manifest.json", "index.rtx", "pack_report.json"):
        if (packed / name).exists():
            os.remove(packed / name)
    shutil.rmtree(packed / ".partial", ignore_errors=True)
    m = index_parts(str(packed), max_pixels=40 * 30, progress=False)
    assert m["records"] < 21 and any("more than max_pixels" in s["reason"] for s in m["skipped"])
