"""Adversarial suite: hostile JPEGs, datasets, folders and TFRecords never crash, hang, escape
the dataset, cost unbounded memory or time, or delete anything of the user's.

Where a crash, a hang or a memory blow-up is what is tested, the case runs in a subprocess
with a timeout and an address-space cap (RLIMIT_AS): a signal death, a timeout or a
MemoryError there fails the test instead of taking the test run down with it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hostile_data as hd
import faults
from conftest import jpeg_bytes, write

HERE = os.path.dirname(os.path.abspath(__file__))
native = pytest.mark.skipif(not __import__("recordtool.decode", fromlist=["x"]).native_available(),
                            reason="native decoder not built")

_PRELUDE = """
import os, resource, sys
sys.path.insert(0, {tests!r})
def vm_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) // 1024
def cap(extra_mb):
    '''Address space: what the process maps now + extra_mb.'''
    lim = (vm_mb() + extra_mb) << 20
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
"""


def isolated(code: str, timeout: float = 60, cwd=None) -> str:
    """Run code in a fresh interpreter; it must exit 0 within timeout (no signal, no hang).
    Returns its stdout. The code calls cap(MB) itself once its imports are done."""
    src = _PRELUDE.format(tests=HERE) + textwrap.dedent(code)
    p = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}"
    return p.stdout


# ------------------------------------------------------------------ hostile JPEGs, native decoder

@native
def test_native_refuses_bad_output_sizes_itself():
    # called directly (below the Python check): a clear ValueError, never SIGSEGV / SIGABRT
    out = isolated("""
        import numpy as np
        from recordtool import _native
        from recordtool.decode import decode_crop_resize
        from conftest import jpeg_bytes
        d = jpeg_bytes(64, 48)
        win = np.array([[0, 0, 48, 64]], float)
        for shape in [(1, 0, 224, 3), (1, 224, 0, 3), (1, 16385, 1, 3), (1, 1, 16385, 3)]:
            try:
                _native.decode_crop_resize([d], win, np.zeros(shape, np.uint8), 1, 1 << 26)
                print("accepted", shape)
            except ValueError as e:
                print("refused", shape, e)
        for size in [(0, 224), (224, 0), (2**31, 1), (-5, 10)]:
            try:
                decode_crop_resize([d], win, size=size)
                print("accepted", size)
            except ValueError as e:
                print("refused", size)
        for args in [((0, 0, 64, 48), 0, 10), ((0, 0, 64, 48), 10, 0), ((0, 0, 65, 48), 8, 8), ((5, 0, 5, 48), 8, 8)]:
            try:
                _native.resample(np.zeros((48, 64, 3), np.uint8), list(args[0]), args[1], args[2])
                print("accepted", args)
            except ValueError:
                print("refused", args)
    """)
    assert "accepted" not in out, out
    assert out.count("refused") == 12


@native
def test_native_allocation_failure_is_one_images_error():
    # std::bad_alloc (or libjpeg's out-of-memory) on a pool thread: that image fails, the
    # process and the other images carry on
    out = isolated("""
        import numpy as np
        import hostile_data as hd
        from recordtool import _native
        from conftest import jpeg_bytes
        big, small = hd.big_baseline(6000, 6000), jpeg_bytes(64, 48)
        o = np.zeros((2, 8, 8, 3), np.uint8)
        _native.decode_crop_resize([small, small], np.array([[0, 0, 48, 64]] * 2, float), o, 2, 1 << 26)
        cap(60)  # the region buffer of a full-size decode needs 108 MB
        f = _native.decode_crop_resize([big, small], np.array([[0, 0, 6000, 6000], [0, 0, 48, 64]], float), o,
                                       2, 1 << 26, 8)
        print(f)
        print("second image ok", bool(o[1].any()))
    """, timeout=60)
    assert "memory" in out.lower() and "(0, " in out and "(1, " not in out.split("\n")[0]
    assert "second image ok True" in out


@native
@pytest.mark.parametrize("case", ["bomb", "scans"])
def test_small_hostile_jpeg_costs_bounded_memory_and_time(case):
    # a 245-byte file declaring 8192x8192 (400 MB of coefficients), a 20 KB file with 2,000
    # empty scans (18 s before): refused before the cost, under a 150 MB cap and a 20 s limit
    out = isolated(f"""
        import time
        import numpy as np
        import hostile_data as hd
        from recordtool.decode import decode_crop_resize
        data = hd.bomb_progressive() if {case!r} == "bomb" else hd.many_scans(2000)
        errors = []
        decode_crop_resize([hd.bomb_progressive(16, 16)] * 2, np.array([[0, 0, 8, 8]] * 2), size=(64, 64),
                           threads=2, on_error="skip")  # pool threads started before the cap
        cap(150)
        t = time.perf_counter()
        decode_crop_resize([data] * 4, np.array([[0, 0, 500, 500]] * 4), size=(64, 64), threads=2,
                           on_error="skip", fallback=True, errors=errors)
        print(round(time.perf_counter() - t, 3), errors[0][1])
    """, timeout=20)
    secs, why = out.split(" ", 1)
    assert float(secs) < 2.0, out
    assert ("coefficient buffer" in why) if case == "bomb" else ("scans" in why), why


@native
def test_native_refusals_match_the_python_rule():
    # the native decoder and recordtool.format.jpeg.decode_refusal (its reference; pack and
    # verify use it) refuse exactly the same files
    from recordtool.decode import decode_crop_resize
    from recordtool.format.jpeg import decode_refusal, probe

    cases = [hd.bomb_progressive(), hd.bomb_progressive(600, 600), hd.bomb_progressive(2000, 1000),
             hd.many_scans(2000), hd.many_scans(99), hd.many_scans(100), hd.many_scans(101),
             jpeg_bytes(64, 48, progressive=True), jpeg_bytes(300, 200)]
    for data in cases:
        info = probe(data)
        errors = []
        decode_crop_resize([data], np.array([[0, 0, 1, 1]]), size=(8, 8), on_error="skip", errors=errors)
        why = decode_refusal(info, len(data))
        native_refused = bool(errors) and ("scans" in errors[0][1] or "coefficient" in errors[0][1])
        assert native_refused == (why is not None), (info, why, errors)


@native
def test_corrupt_data_warnings_are_failures_like_verify():
    import warnings

    from recordtool.codec import turbojpeg
    from recordtool.decode import decode_crop_resize

    data = hd.corrupt_entropy(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(Warning):  # the reference decoder (verify --decode) warns
            turbojpeg().decode(data)
    errors = []
    out = decode_crop_resize([data], np.array([[0, 0, 64, 64]]), size=(16, 16), on_error="skip", errors=errors)
    assert errors and "Corrupt JPEG data" in errors[0][1] and not out.any()


@native
def test_window_at_the_right_edge_is_reported_as_outside():
    from recordtool.decode import DecodeError, decode_crop_resize

    data = jpeg_bytes(64, 48)
    for win in ([0, 64, 10, 1e-7], [48, 0, 1e-7, 10]):
        with pytest.raises(DecodeError, match="outside the 64x48 image"):
            decode_crop_resize([data], np.array([win]), size=(8, 8))
    out = decode_crop_resize([data], np.array([[0, 63.5, 48, 0.5]]), size=(8, 8))  # last half pixel: fine
    assert out.shape == (1, 8, 8, 3)


def test_python_decode_path_refuses_the_same(monkeypatch):
    from recordtool.decode import cpu

    monkeypatch.setattr(cpu, "_native", None)
    monkeypatch.setattr(cpu, "_IMPORT_ERROR", "test", raising=False)
    monkeypatch.setattr(cpu, "_python_decoder", True)
    errors = []
    cpu.decode_crop_resize([hd.bomb_progressive(), hd.many_scans(2000), hd.corrupt_entropy(1), jpeg_bytes()],
                           np.array([[0, 0, 8, 8]] * 4), size=(8, 8), on_error="skip", errors=errors)
    reasons = dict(errors)
    assert set(reasons) == {0, 1, 2}
    assert "coefficient" in reasons[0] and "scans" in reasons[1] and "Corrupt JPEG" in reasons[2]


# ------------------------------------------------------------------ OUT: nothing of the user's is deleted

def _cli(*args, timeout=120, check=False, **kw):
    p = subprocess.run([sys.executable, "-m", "recordtool.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, **kw)
    assert p.returncode >= 0, f"killed by signal {-p.returncode}: {p.stderr[-2000:]}"
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def _snapshot(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for fn in filenames:
            p = os.path.join(dirpath, fn)
            out[os.path.relpath(p, root)] = open(p, "rb").read() if not os.path.islink(p) else os.readlink(p)
    return out


@pytest.fixture
def small_folder(tmp_path):
    root = tmp_path / "src"
    for c in range(3):
        for i in range(4):
            write(str(root / f"c{c}" / f"{i}.jpg"), jpeg_bytes(40 + 4 * i, 32, seed=10 * c + i))
    return root


@pytest.fixture
def packed_small(small_folder, tmp_path):
    from recordtool.pack import pack

    out = tmp_path / "ds"
    pack(str(small_folder), str(out), shards=2, progress=False)
    return out


def test_reshard_in_place_never_unlinks_the_source(packed_small):
    from recordtool.verify import verify

    before = _snapshot(packed_small)
    p = _cli("pack", "--from", "ofrecord", packed_small, packed_small, "--overwrite", "--strict", "--max-pixels",
             "1000", "-q")
    assert p.returncode != 0 and "source" in p.stderr
    p = _cli("pack", "--from", "ofrecord", packed_small, packed_small, "--overwrite", "-q")
    assert p.returncode != 0 and "new directory" in p.stderr
    assert _snapshot(packed_small) == before and verify(str(packed_small)).ok


def test_foreign_manifest_and_parts_are_never_deleted(small_folder, tmp_path):
    out = tmp_path / "out"
    user = {"manifest.json": b'{"my": "own manifest"}', "index.rtx": b"my index", "part-00000": b"my data",
            "part-00001": b"more"}
    for name, data in user.items():
        write(str(out / name), data)
    for extra in ([], ["--overwrite"]):
        p = _cli("pack", small_folder, out, "-q", *extra)
        assert p.returncode != 0 and "not a recordtool manifest" in p.stderr, p.stderr
    assert _snapshot(out) == user


def test_foreign_partial_is_never_deleted(small_folder, tmp_path):
    out = tmp_path / "out"
    write(str(out / ".partial" / "thesis.tex"), b"years of work")
    write(str(out / "part-00007"), b"mine")
    for extra in ([], ["--overwrite"]):
        p = _cli("pack", small_folder, out, "-q", *extra)
        assert p.returncode != 0 and ".partial" in p.stderr and "not made by recordtool" in p.stderr
    assert _snapshot(out) == {".partial/thesis.tex": b"years of work", "part-00007": b"mine"}


def test_overwrite_removes_exactly_what_the_manifest_lists(packed_small, small_folder):
    from recordtool.format import manifest as mf
    from recordtool.verify import verify

    listed = {s["name"] for s in mf.load(str(packed_small))["shards"]}
    write(str(packed_small / "NOTES.txt"), b"keep me")
    write(str(packed_small / "part-00042"), b"not ours")  # a name pack would write, not listed
    p = _cli("pack", small_folder, packed_small, "--overwrite", "-q")
    assert p.returncode != 0 and "part-00042" in p.stderr and "did not write" in p.stderr
    assert listed <= set(os.listdir(packed_small))  # refused before removing anything
    os.unlink(packed_small / "part-00042")
    _cli("pack", small_folder, packed_small, "--overwrite", "--shards", "1", "-q", check=True)
    assert (packed_small / "NOTES.txt").read_bytes() == b"keep me" and verify(str(packed_small)).ok
    assert not (packed_small / "part-00001").exists()  # the old dataset's second shard went


def test_killed_mid_publish_leftovers_are_recognised_as_ours(small_folder, tmp_path):
    # the marker's publishing list makes the parts a killed commit moved into OUT ours
    out = tmp_path / "out"
    env = faults.env("publish:2")
    p = subprocess.run([sys.executable, "-m", "recordtool.cli", "pack", small_folder, out, "--shards", "2", "-q"],
                       env=env, capture_output=True)
    assert p.returncode < 0 and (out / "part-00000").exists() and not (out / "manifest.json").exists()
    _cli("pack", small_folder, out, "--shards", "2", "-q", check=True)


def test_second_pack_into_the_same_out_fails_at_once(small_folder, tmp_path):
    from recordtool.errors import OutputExists
    from recordtool.format.claim import lock_output
    from recordtool.pack import pack

    out = tmp_path / "out"
    out.mkdir()
    fd = lock_output(str(out))  # as a running pack holds it
    try:
        with pytest.raises(OutputExists, match="another recordtool pack"):
            pack(str(small_folder), str(out), progress=False)
    finally:
        os.close(fd)
    pack(str(small_folder), str(out), progress=False)


def test_out_inside_src_or_src_inside_out_is_refused(small_folder, tmp_path):
    from recordtool.errors import OutputExists
    from recordtool.pack import pack

    with pytest.raises(OutputExists, match="inside the source"):
        pack(str(small_folder), str(small_folder / "packed"), progress=False)
    with pytest.raises(OutputExists, match="holds the source"):
        pack(str(small_folder), str(tmp_path), progress=False)
    assert not (small_folder / "packed").exists()


def test_a_link_to_out_inside_src_is_not_packed(small_folder, tmp_path):
    from recordtool.pack import pack

    out = tmp_path / "out"
    first = pack(str(small_folder), str(out), progress=False)
    os.symlink(out, small_folder / "c1" / "link-to-out")
    os.symlink(out, small_folder / "zz-out")  # as a class folder
    second = pack(str(small_folder), str(out), overwrite=True, progress=False)
    assert second.records == first.records
    assert {"c1/link-to-out", "zz-out"} <= {f for f, _ in second.skipped}


def test_index_temp_files_never_follow_a_planted_link(packed_small, tmp_path):
    from recordtool.format.scan import index_parts
    from recordtool.verify import verify

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    for name in ("index.rtx.tmp", "manifest.json.tmp"):
        os.symlink(victim, packed_small / name)
    index_parts(str(packed_small), progress=False)
    assert victim.read_bytes() == b"precious"
    assert verify(str(packed_small)).ok and not (packed_small / "index.rtx.tmp").exists()


# ------------------------------------------------------------------ hostile source folders

def test_symlink_loops_pack_each_image_once(small_folder, tmp_path):
    os.symlink("..", small_folder / "c0" / "up")  # loop through the root
    os.symlink(".", small_folder / "c1" / "self")  # loop on itself
    os.symlink("../c2", small_folder / "c1" / "again")  # a second way into c2
    out = tmp_path / "out"
    isolated(f"""
        cap(1500)
        from recordtool.pack import pack
        s = pack({str(small_folder)!r}, {str(out)!r}, progress=False, workers=2)
        print(s.records)
        assert s.records == 12, s.records
        why = dict(s.skipped)
        assert "c0/up" in why and "c1/self" in why and "c1/again" in why, why
    """, timeout=60)


def test_huge_sparse_image_is_refused_unread(small_folder, tmp_path):
    with open(small_folder / "c0" / "huge.JPEG", "wb") as f:
        f.truncate(5 << 30)  # 5 GiB, sparse: reading it would cost 5 GiB per worker
    out = tmp_path / "out"
    isolated(f"""
        cap(600)
        from recordtool.pack import pack
        s = pack({str(small_folder)!r}, {str(out)!r}, progress=False, workers=4)
        why = dict(s.skipped)["c0/huge.JPEG"]
        assert s.records == 12 and "more than" in why, why
    """, timeout=60)


def test_fifo_in_source_is_skipped_not_waited_on(small_folder, tmp_path):
    os.mkfifo(small_folder / "c0" / "pipe.jpg")
    os.symlink(small_folder / "c0" / "pipe.jpg", small_folder / "c1" / "link.jpg")
    out = tmp_path / "out"
    isolated(f"""
        from recordtool.pack import pack
        s = pack({str(small_folder)!r}, {str(out)!r}, progress=False)
        why = dict(s.skipped)
        assert s.records == 12 and "c0/pipe.jpg" in why and "c1/link.jpg" in why, why
    """, timeout=30)


def test_non_utf8_names_pack_and_are_reported(tmp_path):
    from recordtool.format import manifest as mf
    from recordtool.verify import verify

    src = os.fsencode(tmp_path / "src")
    for cls, fn in ((b"caf\xe9", b"x\xff.jpg"), (b"plain", b"ok.jpg"), (b"plain", b"bad\xfe.txt")):
        os.makedirs(os.path.join(src, cls), exist_ok=True)
        with open(os.path.join(src, cls, fn), "wb") as f:
            f.write(jpeg_bytes(32, 32))
    os.makedirs(os.path.join(src, b"empty\xfa"))
    out = tmp_path / "out"
    p = _cli("pack", os.fsdecode(src), out, "-q", check=True)
    assert "skipped" in p.stderr and "warning" in p.stderr
    m = mf.load(str(out))
    assert m["classes"][1:] == ["empty?", "plain"] and m["classes"][0].startswith("caf")
    report = json.loads((out / "pack_report.json").read_bytes().decode("utf-8"))
    assert any(r["file"].startswith("plain/bad") for r in report["skipped"])
    assert verify(str(out)).ok
    import recordtool

    ds = recordtool.open(str(out))
    names = {bytes(ds.record(i)) for i in range(len(ds))}
    assert any(b"caf\xe9/x\xff.jpg" in r for r in names)  # the record keeps the name's bytes


# ------------------------------------------------------------------ hostile TFRecords and OFRecord parts

def test_gzip_bomb_is_bounded_and_leaves_no_scratch(tmp_path):
    # 1 GiB of zeros after one real record: inflation stops at the limit, the record before it
    # is kept, and the scratch folder beside OUT is gone afterwards (also after a failure)
    rec = hd.tfrecord([hd.example(jpeg_bytes(32, 32), 1)])
    bomb = tmp_path / "in" / "bomb.tfrecord.gz"
    bomb.parent.mkdir()
    hd.gzip_bomb(str(bomb), 1 << 30, head=rec)
    assert bomb.stat().st_size < 8 << 20
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    p = _cli("pack", "--from", "tfrecord", "--keys", "tfds", bomb, out, "-q", timeout=120)
    assert p.returncode == 0 and "inflates past" in p.stderr, p.stderr
    assert os.listdir(work) == ["out"]  # no scratch left beside OUT
    assert json.loads((out / "manifest.json").read_text())["records"] == 1
    p = _cli("pack", "--from", "tfrecord", "--keys", "tfds", "--strict", bomb, work / "out2", "-q", timeout=120)
    assert p.returncode == 1 and "inflates past" in p.stderr
    assert os.listdir(work) == ["out"]


def test_random_bytes_are_not_called_a_zlib_stream(tmp_path):
    from recordtool.errors import TFRecordError
    from recordtool.sources.tfrecord import TFRecordSource

    f = tmp_path / "x.tfrecord"
    f.write_bytes(np.random.default_rng(0).bytes(5000))
    with pytest.raises(TFRecordError, match="not a TFRecord file") as e:
        TFRecordSource([str(f)], {"image": "image", "label": "label"}, tmpdir=str(tmp_path))
    assert "zlib" not in str(e.value).split("not a TFRecord")[0]
    assert os.listdir(tmp_path) == ["x.tfrecord"]  # scratch folder removed after the failure


def test_millions_of_tiny_records_cost_seconds_and_one_report_line(tmp_path):
    # 2M empty TFRecord records and 2M one-byte OFRecord records (the 4M/8M at half
    # size to keep the suite quick): bounded time and memory, one report entry per file
    from recordtool.format.ofrecord import LENGTH

    tf = tmp_path / "empty.tfrecord"
    tf.write_bytes(hd.tfrecord([b""]) * 2_000_000 + hd.tfrecord([hd.example(jpeg_bytes(32, 32), 0)]))
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part-00000").write_bytes((LENGTH.pack(1) + b"\x00") * 2_000_000
                                       + hd.ofrecord_part([(jpeg_bytes(32, 32), 0)]))
    isolated(f"""
        import time
        cap(1200)
        from recordtool.sources.tfrecord import TFRecordSource
        from recordtool.sources.ofrecord import OFRecordSource
        from recordtool.format.scan import index_parts
        t = time.perf_counter()
        s = TFRecordSource([{str(tf)!r}], {{"image": "image", "label": "label"}}, tmpdir={str(tmp_path)!r})
        assert len(s.items) == 1 and len(s.skipped) == 1 and "2000000 record(s)" in s.skipped[0][1], s.skipped
        s.close()
        o = OFRecordSource({str(parts)!r})
        assert len(o.items) == 1 and len(o.skipped) == 1 and "2000000 record(s)" in o.skipped[0][1], o.skipped
        o.close()
        m = index_parts({str(parts)!r}, progress=False)
        assert m["records"] == 1 and len(m["skipped"]) == 1 and m["skipped"][0]["records"] == 2000000
        print(time.perf_counter() - t)
    """, timeout=90)
    from recordtool.verify import verify

    assert verify(str(parts)).ok  # the aggregate entry covers the left-out records


def test_huge_labels_are_refused_not_stored_as_class_names(tmp_path):
    from recordtool.format.scan import index_parts
    from recordtool.pack import pack
    from recordtool.sources.ofrecord import OFRecordSource
    from recordtool.sources.tfrecord import TFRecordSource

    img = jpeg_bytes(32, 32)
    tf = tmp_path / "l.tfrecord"
    tf.write_bytes(hd.tfrecord([hd.example(img, 10**7), hd.example(img, 2**31 - 1), hd.example(img, 3)]))
    s = pack(TFRecordSource([str(tf)], {"image": "image", "label": "label"}), str(tmp_path / "a"), progress=False)
    assert s.records == 1 and all("max_classes" in why for _, why in s.skipped)
    assert (tmp_path / "a" / "manifest.json").stat().st_size < 10_000
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part-00000").write_bytes(hd.ofrecord_part([(img, 10**7), (img, 2)]))
    src = OFRecordSource(str(parts), max_classes=1000)
    assert len(src.items) == 1 and "max_classes" in src.skipped[0][1]
    src.close()
    m = index_parts(str(parts), progress=False, max_classes=1000)
    assert m["records"] == 1 and len(m["classes"]) == 3


# ------------------------------------------------------------------ hostile dataset directories

def _rewrite_manifest(root, fn):
    m = json.loads((root / "manifest.json").read_text())
    fn(m)
    (root / "manifest.json").write_text(json.dumps(m))


def _rewrite_index(root, fn):
    """Rewrite index.rtx columns with fn(columns) and fix the manifest's checksum."""
    import crc32c

    from recordtool.format import index as ix

    cols = {k: np.array(v) for k, v in ix.read_index(str(root / "index.rtx")).columns.items()}
    fn(cols)
    blob = ix.encode_index(ix.Index(cols))
    os.unlink(root / "index.rtx")
    (root / "index.rtx").write_bytes(blob)

    def fix(m):
        m["index"].update(bytes=len(blob), crc32c=f"{crc32c.crc32c(blob):08x}")
        m["records"] = len(cols["offset"])
    _rewrite_manifest(root, fix)


BAD_DATASETS = {
    "shard_past_count": lambda d: _rewrite_index(d, lambda c: c["shard"].__setitem__(0, 7)),
    "label_past_classes": lambda d: _rewrite_index(d, lambda c: c["label"].__setitem__(0, 3)),
    "negative_label": lambda d: _rewrite_index(d, lambda c: c["label"].__setitem__(0, -4)),
    "unknown_chroma": lambda d: _rewrite_index(d, lambda c: c["chroma"].__setitem__(0, 9)),
    "wrong_width": lambda d: _rewrite_index(d, lambda c: c["width"].__setitem__(0, c["width"][0] + 1)),
    "wrong_chroma": lambda d: _rewrite_index(d, lambda c: c["chroma"].__setitem__(0, (c["chroma"][0] + 1) % 3)),
    "wrong_progressive": lambda d: _rewrite_index(d, lambda c: c["progressive"].__setitem__(0, 1 - c["progressive"][0])),
    "size_order_out_of_range": lambda d: _rewrite_index(d, lambda c: c["size_order"].__setitem__(0, 10**6)),
    "duplicate_shard": lambda d: _rewrite_manifest(d, lambda m: m["shards"].__setitem__(1, dict(m["shards"][0]))),
    "shard_outside": lambda d: _rewrite_manifest(d, lambda m: m["shards"][0].__setitem__("name", "../x")),
    "absolute_index": lambda d: _rewrite_manifest(d, lambda m: m["index"].__setitem__("file", "/etc/passwd")),
    "records_as_string": lambda d: _rewrite_manifest(d, lambda m: m.__setitem__("records", str(m["records"]))),
    "classes_as_dict": lambda d: _rewrite_manifest(d, lambda m: m.__setitem__("classes", {"a": 1})),
    "empty_index": lambda d: _rewrite_index(d, lambda c: [c.__setitem__(k, v[:0]) for k, v in list(c.items())])
    or _rewrite_manifest(d, lambda m: [s.__setitem__("records", 0) for s in m["shards"]] and None),
}


@pytest.mark.parametrize("case", sorted(BAD_DATASETS))
def test_inconsistent_datasets_fail_verify_and_open_with_a_named_error(packed_small, case):
    import recordtool
    from recordtool.errors import RecordtoolError
    from recordtool.inspect import summarize
    from recordtool.verify import verify

    BAD_DATASETS[case](packed_small)
    res = verify(str(packed_small))
    assert not res.ok, case
    if case in ("wrong_width", "wrong_chroma", "wrong_progressive"):
        assert "JPEG header says" in res.errors[0]
        return  # consistent in itself: only a shard read can tell
    if case == "empty_index":
        assert "no record" in " ".join(res.errors)
        return
    for fn in (recordtool.open, summarize):
        with pytest.raises(RecordtoolError):
            fn(str(packed_small))


@pytest.mark.parametrize("what", ["shard", "manifest", "index", "part"])
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_special_files_never_hang_or_crash(packed_small, tmp_path, what, kind):
    target = {"shard": "part-00000", "manifest": "manifest.json", "index": "index.rtx", "part": "part-00001"}[what]
    os.unlink(packed_small / target)
    if kind == "fifo":
        os.mkfifo(packed_small / target)
    else:
        os.mkdir(packed_small / target)
    out = isolated(f"""
        import recordtool
        from recordtool.errors import RecordtoolError
        from recordtool.verify import verify
        from recordtool.inspect import summarize
        from recordtool.format.scan import index_parts
        root = {str(packed_small)!r}
        print("verify", verify(root).errors[:1])
        for name, fn in [("open", lambda: [recordtool.open(root)[i] for i in range(12)]), ("inspect", lambda: summarize(root)),
                         ("index", lambda: index_parts(root, progress=False))]:
            try:
                fn()
                print(name, "ok")
            except (RecordtoolError, OSError) as e:
                print(name, type(e).__name__, e)
    """, timeout=30)
    assert "verify []" not in out, out
    assert ("FIFO" in out) if kind == "fifo" else ("directory" in out or "Is a directory" in out), out


def test_shard_truncated_while_mapped_is_sigbus_and_size_checked_before(packed_small):
    # documented (README, Security): mmap cannot turn lost pages into an exception; a shard
    # damaged before it is mapped is a named error
    import signal

    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", f"""
import os, recordtool
ds = recordtool.open({str(packed_small)!r})
data, _ = ds[0]
path = os.path.join(ds.root, ds.shards[int(ds.index.shard[0])]["name"])
os.truncate(path, 0)
print(bytes(data[:4]))
"""], capture_output=True, text=True, timeout=30)
    assert p.returncode == -signal.SIGBUS and "Bus error" in p.stderr
    import recordtool
    from recordtool.errors import FormatError

    ds = recordtool.open(str(packed_small))
    with pytest.raises(FormatError, match="0 bytes, manifest says"):
        [ds[i] for i in range(len(ds))]


@native
def test_fused_normalize_path_refuses_hostile_jpegs_too():
    # the Loader's CPU path (decode + mirror + normalize in one native pass, Pillow retry)
    from recordtool.decode.cpu import decode_crop_resize_normalize

    bufs = [hd.bomb_progressive(), hd.many_scans(2000), hd.corrupt_entropy(2), jpeg_bytes(64, 48)]
    errors = []
    out = decode_crop_resize_normalize(bufs, np.array([[0, 0, 8, 8]] * 4), size=(16, 16), on_error="skip",
                                       fallback=True, errors=errors, threads=2)
    reasons = dict(errors)
    assert {0, 1} <= set(reasons) and 3 not in reasons and out.shape == (4, 3, 16, 16)
    assert "coefficient" in reasons[0] and "scans" in reasons[1] and "Pillow" not in reasons[0] + reasons[1]
    with pytest.raises(ValueError):
        decode_crop_resize_normalize(bufs[3:], np.array([[0, 0, 8, 8]]), size=(0, 16))


def test_a_failing_commit_leaves_nothing_behind(small_folder, tmp_path, monkeypatch):
    # (an image over 4 GiB used to be written in full, then fail the commit with OverflowError
    # and leave .partial: such images are now refused from their size, and any commit failure
    # before the manifest is published aborts)
    from recordtool.format import index as ix
    from recordtool.pack import pack

    def boom(index):
        raise OverflowError("offset does not fit")

    monkeypatch.setattr(ix, "encode_index", boom)
    out = tmp_path / "out"
    with pytest.raises(OverflowError):
        pack(str(small_folder), str(out), progress=False)
    assert sorted(os.listdir(out)) == [".recordtool.lock"]


def test_a_partial_link_is_never_followed(small_folder, tmp_path):
    # .partial as a symlink to a folder holding a (copied) marker of ours: still not ours
    elsewhere = tmp_path / "elsewhere"
    write(str(elsewhere / "pack.json"), b'{"tool": "recordtool", "publishing": []}')
    write(str(elsewhere / "data.bin"), b"keep")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(elsewhere, out / ".partial")
    p = _cli("pack", small_folder, out, "-q")
    assert p.returncode != 0 and "not made by recordtool" in p.stderr
    assert (elsewhere / "data.bin").read_bytes() == b"keep"


def test_index_leaves_out_jpegs_the_decoders_refuse(tmp_path):
    from recordtool.format.scan import index_parts

    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part-00000").write_bytes(hd.ofrecord_part([(hd.bomb_progressive(), 0), (hd.many_scans(2000), 1),
                                                         (jpeg_bytes(32, 32), 1)]))
    m = index_parts(str(parts), progress=False)
    assert m["records"] == 1 and len(m["skipped"]) == 2
    assert "coefficient" in m["skipped"][0]["reason"] and "scans" in m["skipped"][1]["reason"]


# ------------------------------------------------------------------ crafted frame headers: one rule with the decoders

_REFUSED_FRAMES = {
    "two SOF markers": lambda: hd.two_frames(120, 80, 1200, 800),
    "duplicate component id": lambda: hd.duplicate_component_id(),
    "4x4 sampling factors": lambda: hd.sampling(((4, 4), (1, 1), (1, 1))),
    "4x4 sampling, every component": lambda: hd.sampling(((4, 4), (4, 4), (4, 4))),
    "sampling factor 5": lambda: hd.sampling(((5, 1), (1, 1), (1, 1))),
}


def _decoders_refuse(data) -> list:
    """The decoders that refuse data: the native one, PyTurboJPEG (verify --decode) and Pillow."""
    import io
    import warnings

    from PIL import Image

    from recordtool.codec import turbojpeg
    from recordtool.decode import decode_crop_resize

    refused = []
    errors = []
    decode_crop_resize([data], np.array([[0, 0, 8, 8]]), size=(8, 8), on_error="skip", errors=errors)
    if errors:
        refused.append("native")
    for name, dec in (("turbojpeg", lambda: turbojpeg().decode(data)),
                      ("pillow", lambda: Image.open(io.BytesIO(data)).load())):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dec()
        except OSError:
            refused.append(name)
    return refused


@native
@pytest.mark.parametrize("case", sorted(_REFUSED_FRAMES))
def test_frames_the_decoders_refuse_are_never_packed_or_indexed(case, tmp_path):
    # a second SOF declaring 1200x800 on a 120x80 file, a repeated component id, 4x4 sampling
    # factors: packed as good before (indexed from the wrong SOF), refused at decode, so the
    # Loader raised mid-epoch. The header reader now applies libjpeg-turbo's rules.
    from recordtool.format.jpeg import BadJPEG, probe
    from recordtool.format.scan import index_parts
    from recordtool.pack import pack
    from recordtool.verify import verify

    data = _REFUSED_FRAMES[case]()
    assert _decoders_refuse(data) == ["native", "turbojpeg", "pillow"]
    with pytest.raises(BadJPEG, match="offset"):
        probe(data)
    src = tmp_path / "src"
    write(str(src / "a" / "bad.jpg"), data)
    write(str(src / "a" / "good.jpg"), jpeg_bytes(40, 30))
    s = pack(str(src), str(tmp_path / "ds"), progress=False)
    assert s.records == 1 and len(s.skipped) == 1 and "bad.jpg" in s.skipped[0][0], s.skipped
    assert verify(str(tmp_path / "ds"), decode=True).ok
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part-00000").write_bytes(hd.ofrecord_part([(data, 0), (jpeg_bytes(32, 32), 1)]))
    m = index_parts(str(parts), progress=False)
    assert m["records"] == 1 and "offset" in m["skipped"][0]["reason"]


@native
def test_headers_the_decoders_take_are_still_packed():
    # libjpeg resolves a repeated component id when the scan header repeats it too, and takes
    # an MCU of exactly 10 blocks (4x2 luma; the crafted file's data is 4:4:4's, so only its
    # first blocks decode clean): the header reader must not refuse them
    from recordtool.decode import decode_crop_resize
    from recordtool.format.jpeg import decode_refusal, probe

    for data in (hd.duplicate_component_id(in_scan=True), hd.sampling(((4, 2), (1, 1), (1, 1))),
                 hd._jpeg(120, 80, progressive=True), hd._jpeg(120, 80, subsampling=1)):
        info = probe(data)
        assert decode_refusal(info, len(data)) is None
        errors = []
        decode_crop_resize([data], np.array([[0, 0, 8, 8]]), size=(8, 8), on_error="skip", errors=errors)
        assert not errors, errors


def test_probe_reads_every_scan_header():
    # a scan header after the first one naming a component the frame lacks, or a second frame
    # header between scans: libjpeg refuses them when it reads on (progressive files: at
    # jpeg_start_decompress), so the probe reads every scan header, not only the first
    from recordtool.format.jpeg import BadJPEG, probe

    prog = hd._jpeg(64, 48, progressive=True)
    scans = [k for k in range(len(prog)) if prog[k:k + 2] == b"\xff\xda"]
    assert len(scans) > 2
    bad = bytearray(prog)
    bad[scans[-1] + 5] = 77  # the last scan's component id
    with pytest.raises(BadJPEG, match="component id 77"):
        probe(bytes(bad))
    a, b = hd._frame_at(prog)
    with pytest.raises(BadJPEG, match="second frame header"):
        probe(prog[:scans[-1]] + prog[a:b] + prog[scans[-1]:])
    assert probe(prog).scans == len(scans)


# ------------------------------------------------------------------ one rule of what is decodable

def test_one_decodable_rule_refuses_a_tiny_baseline_file_declaring_8192_squared(tmp_path):
    # 375 bytes declaring 8192x8192 (1M blocks, at least 128 KB of data in any complete file):
    # verify --decode rejected it (libjpeg warns), but the Loader's Pillow retry decoded it at
    # 767 MB RSS. Now the one rule (format.jpeg.decode_refusal) refuses it everywhere, before
    # any decoder starts, here under a 400 MB cap.
    from recordtool.decode.gpu.decoder import _refused
    from recordtool.format.scan import index_parts
    from recordtool.errors import Rejected
    from recordtool.pack.transcode import prepare

    data = hd.tiny_baseline_declaring(8192, 8192)
    with pytest.raises(Rejected, match="at least a bit each"):
        prepare(data)
    assert _refused(data)  # the GPU decoder routes it to the CPU path, which refuses it
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part-00000").write_bytes(hd.ofrecord_part([(data, 0), (jpeg_bytes(32, 32), 1)]))
    m = index_parts(str(parts), progress=False)
    assert m["records"] == 1 and "at least a bit each" in m["skipped"][0]["reason"]
    out = isolated("""
        import numpy as np
        import hostile_data as hd
        from recordtool.decode import cpu
        data = hd.tiny_baseline_declaring(8192, 8192)
        cpu.decode_crop_resize_normalize([data] * 2, np.array([[0, 0, 500, 500]] * 2), size=(16, 16), threads=2,
                                         on_error="skip", fallback=True)  # pool threads started
        cap(400)
        for native in (True, False):  # the Loader's fused path with its Pillow retry; the Python path
            if not native:
                cpu._native, cpu._python_decoder = None, True
            errors = []
            cpu.decode_crop_resize_normalize([data], np.array([[0, 0, 8192, 8192]]), size=(16, 16), threads=1,
                                             on_error="skip", fallback=True, errors=errors)
            print(errors[0][1] if errors else "decoded")
    """, timeout=60)
    lines = out.strip().splitlines()
    assert len(lines) == 2 and all("at least a bit each" in ln and "Pillow" not in ln for ln in lines), out


@native
def test_native_refuses_tiny_files_declaring_large_frames_like_the_python_rule():
    from recordtool.decode import decode_crop_resize
    from recordtool.format.jpeg import decode_refusal, probe

    for w, h in ((8192, 8192), (2000, 2000), (1500, 1500), (1400, 1400), (64, 64)):
        data = hd.tiny_baseline_declaring(w, h)
        errors = []
        decode_crop_resize([data], np.array([[0, 0, 8, 8]]), size=(8, 8), on_error="skip", errors=errors)
        why = decode_refusal(probe(data), len(data))
        native_refused = bool(errors) and "at least a bit each" in errors[0][1]
        assert native_refused == (why is not None), (w, h, why, errors)
        assert (why is not None) == (-(-w // 8) * -(-h // 8) > (4 << 20) // 128), (w, h, why)  # COEF_FLOOR


@native
def test_thread_start_failure_under_a_memory_cap_is_a_named_error():
    # std::thread's std::system_error when no stack can be mapped: a plain RuntimeError before;
    # now ThreadStartError (a RecordtoolError), the threads that call started are stopped, and a
    # later call on the same pool decodes
    out = isolated("""
        import numpy as np
        from conftest import jpeg_bytes
        from recordtool.decode import decode_crop_resize
        from recordtool.errors import RecordtoolError, ThreadStartError
        d = jpeg_bytes(64, 48)
        win = np.array([[0, 0, 48, 64]] * 64, float)
        decode_crop_resize([d], win[:1], size=(8, 8), threads=1)
        cap(40)  # room for a few 8 MiB thread stacks, not 64
        try:
            decode_crop_resize([d] * 64, win, size=(8, 8), threads=64, pool=7)
            print("started all")
        except ThreadStartError as e:
            print("named", isinstance(e, RecordtoolError), e)
        print("still decodes", bool(decode_crop_resize([d] * 2, win[:2], size=(8, 8), threads=2, pool=7).any()))
    """, timeout=60)
    assert "named True cannot start native decode thread" in out and "of 64" in out, out
    assert "still decodes True" in out, out


def test_probe_agrees_with_libjpeg_on_mutated_headers():
    # 3,000 crafted headers (bytes flipped, segments repeated or dropped): none that the header
    # reader and the decodable rule accept is refused by libjpeg-turbo (scripts/fuzz_hostile.py
    # runs the same check on its JPEG mutations)
    bad = hd.libjpeg_disagreements(hd.header_mutations(0, 3000))
    assert not bad, [(why, data[:700].hex()) for data, why in bad[:3]]
