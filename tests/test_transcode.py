"""Transcoding at pack time: parallel workers, same bytes for any worker count."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import jpeg_bytes, write
from recordtool.decode import cpu, reference
from recordtool.pack import pack
from recordtool.pack.transcode import Transcode


@pytest.fixture
def big_folder(tmp_path):
    """Images larger than the --max-side used below, so every one is shrunk and re-encoded."""
    root = tmp_path / "src"
    for k in range(12):
        write(str(root / f"c{k % 3}" / f"{k}.jpg"),
              jpeg_bytes(160 + 8 * k, 120 + 4 * k, seed=k, subsampling=k % 3, progressive=(k % 4 == 3)))
    return root


def test_transcoded_pack_same_bytes_for_any_worker_count(big_folder, tmp_path):
    t = Transcode(max_side=96, quality=85)
    outs = []
    for w, shards in ((1, None), (4, None), (3, 2), (1, 2)):
        out = tmp_path / f"o{w}_{shards}"
        s = pack(str(big_folder), str(out), workers=w, shards=shards, transcode=t, progress=False)
        assert len(s.converted) == 12
        outs.append(out)
    for a, b in ((outs[0], outs[1]), (outs[2], outs[3])):
        for name in sorted(os.listdir(a)):
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.skipif(not cpu.native_available(), reason="native decoder not built")
def test_calling_thread_decode_matches_the_pool(big_folder):
    bufs = [p.read_bytes() for p in sorted(big_folder.rglob("*.jpg"))]
    win = np.array([[3, 5, 100, 140]] * len(bufs))
    a = cpu.decode_crop_resize(bufs, win, size=(64, 80), pool=-1)
    b = cpu.decode_crop_resize(bufs, win, size=(64, 80), threads=3)
    assert np.array_equal(a, b)
    assert np.array_equal(a[0], reference.decode_crop_resize_one(bufs[0], win[0], 80, 64))
    errors = []
    bad = cpu.decode_crop_resize([b"\xff\xd8junk", bufs[1]], win[:2], size=(8, 8), pool=-1, on_error="skip",
                                 errors=errors)
    assert [i for i, _ in errors] == [0] and not bad[0].any() and bad[1].any()


@pytest.mark.skipif(not cpu.native_available(), reason="native decoder not built")
def test_transcoding_workers_do_not_queue_on_one_native_pool(big_folder, tmp_path):
    """Each pack worker shrinks on its own thread: no call goes to the shared pool, whose one-call-
    at-a-time lock would serialise every worker (--workers 2 no faster than 1)."""
    code = ("import sys; from recordtool import _native; from recordtool.pack import pack; "
            "from recordtool.pack.transcode import Transcode; "
            "s = pack(sys.argv[1], sys.argv[2], workers=2, transcode=Transcode(max_side=96), progress=False); "
            "assert len(s.converted) == 12; print(_native.pool_size())")
    r = subprocess.run([sys.executable, "-c", code, str(big_folder), str(tmp_path / "o")], capture_output=True,
                       text=True, check=True)
    assert r.stdout.strip() == "0", r.stdout + r.stderr


def test_process_engine_same_bytes_as_threads_when_transcoding(tmp_path):
    """engine="process" (the CLI's default when transcoding: processes do not share the GIL) fills
    the same planned shards as the thread engine: the same bytes for any worker count."""
    from conftest import jpeg_bytes, tree, write

    from recordtool.pack import pack
    from recordtool.pack.transcode import Transcode

    src = tmp_path / "src"
    for i in range(18):
        write(str(src / f"c{i % 3}" / f"{i}.jpg"), jpeg_bytes(160 + 8 * i, 120, seed=i))
    t = Transcode(max_side=96, quality=90)
    a = pack(str(src), str(tmp_path / "threads"), shards=3, workers=2, transcode=t, progress=False)
    b = pack(str(src), str(tmp_path / "procs"), shards=3, workers=2, transcode=t, progress=False, engine="process")
    c = pack(str(src), str(tmp_path / "one"), shards=3, workers=1, transcode=t, progress=False, engine="process")
    assert b.engine == "process" and a.records == b.records == c.records == 18 and len(b.converted) == 18
    assert tree(tmp_path / "threads") == tree(tmp_path / "procs") == tree(tmp_path / "one")


def test_process_engine_raise_names_the_file_and_cli_defaults_to_processes(tmp_path):
    import pytest

    from conftest import jpeg_bytes, write

    from recordtool.errors import PackError
    from recordtool.pack import pack
    from recordtool.pack.transcode import Transcode

    src = tmp_path / "src"
    for i in range(8):
        write(str(src / f"c{i % 2}" / f"{i}.jpg"), jpeg_bytes(120, 90, seed=i))
    write(str(src / "c0" / "broken.jpg"), jpeg_bytes(120, 90)[:200])
    with pytest.raises(PackError, match="broken.jpg"):
        pack(str(src), str(tmp_path / "a"), shards=2, workers=2, transcode=Transcode(max_side=64), progress=False,
             engine="process", on_error="raise")
    from click.testing import CliRunner

    from recordtool.cli import main

    r = CliRunner().invoke(main, ["pack", str(src), str(tmp_path / "b"), "--max-side", "64", "-q"])
    assert r.exit_code == 0, r.output
    assert "process engine" in r.output and "skipped 1" in r.output


def test_process_engine_by_size_same_bytes_as_threads(tmp_path):
    """Without --shards the process engine loads and fixes items in worker processes while this
    process writes them in order: the same bytes as the thread engine, for any worker count."""
    from conftest import jpeg_bytes, tree, write

    from recordtool.pack import pack
    from recordtool.pack.transcode import Transcode

    src = tmp_path / "src"
    for i in range(40):
        write(str(src / f"c{i % 4}" / f"{i}.jpg"), jpeg_bytes(150 + 4 * i, 110, seed=i))
    t = Transcode(max_side=80, quality=90)
    a = pack(str(src), str(tmp_path / "threads"), shard_size=20_000, workers=3, transcode=t, progress=False)
    b = pack(str(src), str(tmp_path / "procs"), shard_size=20_000, workers=2, transcode=t, progress=False,
             engine="process")
    assert b.engine == "process" and a.shards == b.shards > 1 and b.records == 40
    assert tree(tmp_path / "threads") == tree(tmp_path / "procs")


def test_missing_native_decoder_stops_a_transcoding_pack(big_folder, tmp_path, monkeypatch):
    """Without the extension (and no opt-in) pack's shrink raises the decoder's error with its
    fix; it is not each file's fault, so no file becomes a rejected record."""
    from recordtool.errors import NativeDecoderMissing

    monkeypatch.setattr(cpu, "_native", None)
    monkeypatch.setattr(cpu, "_IMPORT_ERROR", "test", raising=False)
    monkeypatch.setattr(cpu, "_python_decoder", False)
    with pytest.raises(NativeDecoderMissing, match="allow_python_decoder"):
        pack(str(big_folder), str(tmp_path / "o"), workers=1, transcode=Transcode(max_side=96), progress=False,
             engine="local")
