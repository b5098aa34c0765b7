"""pack --engine ray on a local Ray instance (ray.init(num_cpus=2)): the same bytes as the local
engine, bad images reported, --strict stops the job, the CLI, and the message without Ray."""
import json
import os
import subprocess
import sys

import pytest

from conftest import tree, write
from recordtool.errors import PackError
from recordtool.pack import pack
from recordtool.pack.transcode import Transcode
from recordtool.sources.tfrecord import PRESETS, TFRecordSource

ray = pytest.importorskip("ray")

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "tfrecord")


@pytest.fixture(scope="module")
def cluster():
    ctx = ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ctx.address_info["gcs_address"]
    ray.shutdown()


def test_same_bytes_as_local_engine(cluster, folder, tmp_path):
    write(str(folder / "dog" / "broken.JPEG"), b"\xff\xd8\xff\xe0" + b"\x00" * 40)  # a bad image: reported, not fatal
    a = pack(str(folder), str(tmp_path / "local"), shards=4, seed=3, progress=False)
    b = pack(str(folder), str(tmp_path / "ray"), shards=4, seed=3, progress=False, engine="ray")
    assert (b.engine, b.records, b.shards, b.retried, b.reused) == ("ray", 21, 4, 0, [])
    assert (a.engine, a.skipped) == ("local", b.skipped)
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    report = json.loads((tmp_path / "ray" / "pack_report.json").read_text())
    assert [x["file"] for x in report["skipped"]] == ["dog/broken.JPEG"] == [f for f, _ in b.skipped]


def test_same_bytes_when_transcoding(cluster, folder, tmp_path):
    t = Transcode(max_side=40, quality=90, hw_friendly=True)  # shrinks most, re-encodes the progressive ones
    a = pack(str(folder), str(tmp_path / "local"), shards=3, transcode=t, progress=False)
    b = pack(str(folder), str(tmp_path / "ray"), shards=3, transcode=t, progress=False, engine="ray")
    assert len(a.converted) > 10 and b.converted == a.converted
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")


@pytest.mark.parametrize("transcode", [None, Transcode(max_side=40, quality=90)])
def test_by_size_same_bytes_as_local_engine(cluster, folder, tmp_path, transcode):
    """Without --shards every engine fills part files in turn up to shard_size (Ray too: the
    same bytes as local, no shard count planned from a sample)."""
    kw = dict(shard_size=6000, seed=4, progress=False, transcode=transcode or Transcode())
    a = pack(str(folder), str(tmp_path / "local"), **kw)
    b = pack(str(folder), str(tmp_path / "ray"), engine="ray", **kw)
    assert a.shards >= 3 and a.engine == ("process" if transcode else "local")
    assert (b.engine, b.records, b.shards, b.retried, b.converted) == ("ray", a.records, a.shards, 0, a.converted)
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    assert json.loads(tree(tmp_path / "ray")["manifest.json"])["pack"]["shard_size"] == 6000


def test_tfrecord_source_ships_to_workers(cluster, tmp_path):
    """TFRecord sources (mappings re-opened in the worker, gzip inflated beside OUT) give the
    same bytes and the same class names from the synset features."""
    outs = {}
    for engine in ("local", "ray"):
        src = TFRecordSource([os.path.join(FIX, "slim.gz"), os.path.join(FIX, "slim-00001-of-00002")],
                             dict(PRESETS["tf-slim"]), tmpdir=str(tmp_path))
        pack(src, str(tmp_path / engine), shards=3, progress=False, engine=engine)
        outs[engine] = tree(tmp_path / engine)
    assert outs["ray"] == outs["local"]
    m = json.loads(outs["ray"]["manifest.json"])
    assert m["classes"] == ["n01440764", "n01443537", "n01484850"]


def test_strict_stops_the_job_with_the_file_named(cluster, folder, tmp_path):
    write(str(folder / "eel" / "empty.JPEG"), b"")
    with pytest.raises(PackError, match="eel/empty.JPEG: empty file"):
        pack(str(folder), str(tmp_path / "out"), shards=3, on_error="raise", progress=False, engine="ray")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_cli_engine_ray(cluster, folder, tmp_path):
    cmd = [sys.executable, "-m", "recordtool.cli", "pack", str(folder), "--shards", "2", "-q"]
    subprocess.run(cmd + [str(tmp_path / "local")], check=True)
    p = subprocess.run(cmd + ["--engine", "ray", "--ray-address", cluster, str(tmp_path / "ray")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "packed 21 records into 2 shards" in p.stdout
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")


def test_cli_engine_ray_without_shards(cluster, folder, tmp_path):
    cmd = [sys.executable, "-m", "recordtool.cli", "pack", str(folder), "--shard-size", "8KB", "--seed", "4", "-q"]
    subprocess.run(cmd + [str(tmp_path / "local")], check=True)
    p = subprocess.run(cmd + ["--engine", "ray", "--ray-address", cluster, str(tmp_path / "ray")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    assert len([n for n in tree(tmp_path / "local") if n.startswith("part-")]) >= 2


def test_without_ray_says_how_to_install(folder, tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"  # as if Ray were not installed
            "from recordtool.cli import main\n"
            f"main(['pack', {str(folder)!r}, {str(tmp_path / 'o')!r}, '--engine', 'ray', '-q'])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 1 and "pip install 'recordtool[ray]'" in p.stderr
    assert not (tmp_path / "o").exists()
