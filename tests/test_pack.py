"""pack → shards/index/manifest: exact bytes, labels, bad inputs, determinism."""
import io
import json
import os

import numpy as np
import pytest
from PIL import Image

import recordtool
from conftest import jpeg_bytes, png_bytes, write
from recordtool.format import ofrecord_pb2
from recordtool.format.jpeg import CHROMA_GRAY, probe
from recordtool.format.ofrecord import iter_records
from recordtool.errors import PackError
from recordtool.pack import pack
from recordtool.verify import verify


def _files(root):
    out = {}
    for dirpath, _, names in os.walk(root, followlinks=True):
        for n in names:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, root)] = p
    return out


def _by_filename(ds):
    """filename → (jpeg bytes, label), read back through the OFRecord messages themselves."""
    got = {}
    for i in range(len(ds)):
        m = ofrecord_pb2.OFRecord()
        m.ParseFromString(ds.record(i))
        fn = m.feature["filename"].bytes_list.value[0].decode()
        data, label = ds[i]
        assert bytes(data) == m.feature["encoded"].bytes_list.value[0]
        assert label == m.feature["class/label"].int32_list.value[0]
        assert (m.feature["width"].int32_list.value[0], m.feature["height"].int32_list.value[0]) == \
            (int(ds.index.width[i]), int(ds.index.height[i]))
        got[fn] = (bytes(data), label)
    return got


def test_every_file_recovered_exactly_with_its_label(folder, tmp_path):
    s = pack(str(folder), str(tmp_path / "out"), shards=3, progress=False)
    assert (s.records, s.shards, s.skipped, s.converted) == (21, 3, [], [])
    ds = recordtool.open(tmp_path / "out")
    assert ds.classes == ["cat", "dog", "eel"]
    got = _by_filename(ds)
    files = _files(folder)
    assert set(got) == set(files)
    for rel, path in files.items():
        with open(path, "rb") as f:
            assert got[rel][0] == f.read()
        assert got[rel][1] == ds.classes.index(rel.split("/")[0])
    assert verify(str(tmp_path / "out")).ok


def test_index_agrees_with_shards(folder, tmp_path):
    out = tmp_path / "out"
    pack(str(folder), str(out), shards=2, progress=False)
    ds = recordtool.open(out)
    c = ds.index.columns
    k = 0
    for s, sh in enumerate(ds.shards):
        blob = open(out / sh["name"], "rb").read()
        for rec in iter_records(blob):
            assert (int(c["shard"][k]), int(c["offset"][k]), int(c["length"][k])) == (s, rec.offset, rec.length)
            info = probe(blob[int(c["jpeg_offset"][k]):int(c["jpeg_offset"][k]) + int(c["jpeg_length"][k])])
            assert (info.width, info.height, info.chroma, info.progressive) == \
                (int(c["width"][k]), int(c["height"][k]), int(c["chroma"][k]), bool(c["progressive"][k]))
            k += 1
    assert k == len(ds)
    so = c["size_order"]
    assert sorted(so.tolist()) == list(range(len(ds)))
    assert np.all(np.diff(c["jpeg_length"][so].astype(int)) <= 0)
    m = json.load(open(out / "manifest.json"))
    assert m["records"] == 21 and [x["name"] for x in m["shards"]] == ["part-00000", "part-00001"]
    assert sum(x["records"] for x in m["shards"]) == 21
    assert m["shards"][0]["bytes"] == os.path.getsize(out / "part-00000")


def test_records_shuffled_across_shards(folder, tmp_path):
    pack(str(folder), str(tmp_path / "o"), shards=3, progress=False)
    labels = recordtool.open(tmp_path / "o").labels
    assert list(labels) != sorted(labels)  # class-sorted input, not class-sorted output
    for s in range(3):  # each shard holds more than one class
        assert len(set(labels[recordtool.open(tmp_path / "o").index.shard == s])) > 1


def test_deterministic_whatever_the_worker_count(folder, tmp_path):
    pack(str(folder), str(tmp_path / "a"), shards=2, workers=1, seed=7, progress=False)
    pack(str(folder), str(tmp_path / "b"), shards=2, workers=8, seed=7, progress=False)
    pack(str(folder), str(tmp_path / "c"), shards=2, workers=3, seed=8, progress=False)
    names = sorted(os.listdir(tmp_path / "a"))
    assert names == sorted(os.listdir(tmp_path / "b"))
    for n in names:
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes(), n
    assert (tmp_path / "a" / "part-00000").read_bytes() != (tmp_path / "c" / "part-00000").read_bytes()


def test_shard_size_target(folder, tmp_path):
    s = pack(str(folder), str(tmp_path / "o"), shard_size=4000, progress=False)
    assert s.shards > 3
    sizes = [os.path.getsize(tmp_path / "o" / f"part-{k:05d}") for k in range(s.shards)]
    assert all(x >= 4000 for x in sizes[:-1])
    assert verify(str(tmp_path / "o")).ok


def test_bad_inputs_are_skipped_or_fixed_and_reported(tmp_path):
    src = tmp_path / "src"
    good = jpeg_bytes(50, 40, seed=1)
    write(str(src / "a" / "good.jpg"), good)
    write(str(src / "a" / "truncated.JPEG"), jpeg_bytes(64, 64, seed=2)[:600])
    write(str(src / "a" / "zero.jpeg"), b"")
    write(str(src / "a" / "notes.txt"), b"hello")
    write(str(src / "a" / "garbage.JPEG"), b"\xff\xd8" + os.urandom(300))
    write(str(src / "a" / "random.png"), os.urandom(200))
    write(str(src / "b" / "png_named.JPEG"), png_bytes(33, 22, seed=3))
    write(str(src / "b" / "cmyk.jpg"), jpeg_bytes(35, 25, seed=4, mode="CMYK"))
    write(str(src / "b" / "gray.JPEG"), jpeg_bytes(36, 26, seed=5, mode="L"))
    write(str(src / "b" / "rgba.png"), png_bytes(20, 20, mode="RGBA"))
    write(str(src / "b" / "ünïcødé 名前.JPEG"), jpeg_bytes(37, 27, seed=6))
    os.makedirs(src / "c_empty")
    write(str(tmp_path / "elsewhere" / "linked.jpg"), jpeg_bytes(38, 28, seed=7))
    os.symlink(tmp_path / "elsewhere" / "linked.jpg", src / "b" / "linked.jpg")
    os.symlink(tmp_path / "nowhere.jpg", src / "b" / "dangling.jpg")
    bomb = bytearray(jpeg_bytes(64, 48, seed=8))
    sof = bomb.find(b"\xff\xc0")
    bomb[sof + 5:sof + 9] = (60000).to_bytes(2, "big") * 2
    write(str(src / "b" / "bomb.jpg"), bytes(bomb))

    out = tmp_path / "out"
    s = pack(str(src), str(out), progress=False)
    skipped = dict(s.skipped)
    assert set(skipped) == {"a/truncated.JPEG", "a/zero.jpeg", "a/notes.txt", "a/garbage.JPEG",
                            "a/random.png", "b/dangling.jpg", "b/bomb.jpg"}
    assert "truncated" in skipped["a/truncated.JPEG"]
    assert "empty" in skipped["a/zero.jpeg"]
    assert "extension" in skipped["a/notes.txt"]
    assert "60000x60000" in skipped["b/bomb.jpg"]
    assert "symbolic link" in skipped["b/dangling.jpg"]
    assert dict(s.converted).keys() == {"b/png_named.JPEG", "b/cmyk.jpg", "b/rgba.png"}
    assert any("c_empty" in w for w in s.warnings)

    report = json.load(open(out / "pack_report.json"))
    assert {x["file"] for x in report["skipped"]} == set(skipped)
    ds = recordtool.open(out)
    assert ds.classes == ["a", "b", "c_empty"]  # empty class keeps its label, like ImageFolder
    got = _by_filename(ds)
    assert set(got) == {"a/good.jpg", "b/png_named.JPEG", "b/cmyk.jpg", "b/gray.JPEG", "b/rgba.png",
                        "b/ünïcødé 名前.JPEG", "b/linked.jpg"}
    assert got["a/good.jpg"] == (good, 0)
    assert got["b/linked.jpg"][0] == (tmp_path / "elsewhere" / "linked.jpg").read_bytes()
    assert got["b/gray.JPEG"][0] == (src / "b" / "gray.JPEG").read_bytes()  # gray kept as-is
    i_gray = [i for i in range(len(ds)) if bytes(ds[i][0]) == got["b/gray.JPEG"][0]][0]
    assert ds.index.chroma[i_gray] == CHROMA_GRAY
    # converted files are RGB JPEGs whose pixels match the source
    for name, src_bytes in [("b/png_named.JPEG", (src / "b" / "png_named.JPEG").read_bytes()),
                            ("b/cmyk.jpg", (src / "b" / "cmyk.jpg").read_bytes())]:
        conv = Image.open(io.BytesIO(got[name][0]))
        assert conv.format == "JPEG" and conv.mode == "RGB"
        ref = np.asarray(Image.open(io.BytesIO(src_bytes)).convert("RGB"), dtype=float)
        mse = ((np.asarray(conv, dtype=float) - ref) ** 2).mean()
        assert 10 * np.log10(255**2 / mse) > 28  # q95 with 4:2:0 chroma on a noisy 33×22 image
    assert verify(str(out), decode=True).ok


def test_strict_fails_on_first_bad_file_and_leaves_nothing(tmp_path):
    src = tmp_path / "src"
    write(str(src / "a" / "ok.jpg"), jpeg_bytes())
    write(str(src / "a" / "zero.jpg"), b"")
    with pytest.raises(PackError, match="zero.jpg: empty file"):
        pack(str(src), str(tmp_path / "out"), on_error="raise", progress=False)
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not any(n.startswith("part-") for n in os.listdir(tmp_path / "out"))


def test_all_files_bad_is_an_error(tmp_path):
    write(str(tmp_path / "src" / "a" / "zero.jpg"), b"")
    with pytest.raises(PackError, match="all skipped"):
        pack(str(tmp_path / "src"), str(tmp_path / "out"), progress=False)


def test_output_dir_safety(folder, tmp_path):
    out = tmp_path / "out"
    pack(str(folder), str(out), progress=False)
    with pytest.raises(FileExistsError, match="--overwrite"):
        pack(str(folder), str(out), progress=False)
    pack(str(folder), str(out), shards=2, overwrite=True, progress=False)
    assert len(recordtool.open(out).shards) == 2
    assert not (out / "part-00002").exists()
    other = tmp_path / "other"
    write(str(other / "precious.txt"), b"x")
    with pytest.raises(FileExistsError, match="not empty"):
        pack(str(folder), str(other), progress=False)
    assert (other / "precious.txt").read_bytes() == b"x"


def test_reader_views_are_zero_copy(folder, tmp_path):
    pack(str(folder), str(tmp_path / "o"), progress=False)
    ds = recordtool.open(tmp_path / "o")
    data, _ = ds[0]
    assert isinstance(data, memoryview) and data.readonly
    assert ds[-1][0].tobytes() == ds[len(ds) - 1][0].tobytes()
    with pytest.raises(IndexError):
        ds[len(ds)]
    ds.prefetch(range(len(ds)))
    del data
    ds.close()


def test_plan_hash_covers_items_options_and_seed(folder):
    from dataclasses import replace

    from recordtool.errors import OnError
    from recordtool.pack.plan import Options, make_plan, shuffle
    from recordtool.format.jpeg import DEFAULT_MAX_PIXELS
    from recordtool.pack.transcode import NO_TRANSCODE, Transcode
    from recordtool.sources.imagefolder import ImageFolderSource

    src = ImageFolderSource(str(folder))
    opts = Options(DEFAULT_MAX_PIXELS, NO_TRANSCODE, OnError.SKIP)
    items = shuffle(src.items, 0)
    base = make_plan(src, items, 3, 0, opts)
    assert [len(t.items) for t in base.tasks] == [7, 7, 7] and [t.name for t in base.tasks][-1] == "part-00002"
    assert make_plan(src, list(items), 3, 0, opts).hash == base.hash  # pure function of its inputs
    assert make_plan(src, items, 3, 0, replace(opts, on_error=OnError.RAISE)).hash == base.hash  # bytes alike
    for other in (make_plan(src, items, 3, 0, replace(opts, transcode=Transcode(max_side=100))),
                  make_plan(src, items, 3, 1, opts), make_plan(src, items, 4, 0, opts)):
        assert not {t.hash for t in other.tasks} & {t.hash for t in base.tasks}
    moved = items[:-1] + [replace(items[-1], label=9)]  # one item of the last shard changed
    changed = [a.hash != b.hash for a, b in zip(base.tasks, make_plan(src, moved, 3, 0, opts).tasks)]
    assert changed == [False, False, True]


def test_a_file_edited_after_a_killed_pack_changes_its_shards_plan(folder):
    """Resume reuses a finished shard only under the same plan hash; the hash covers each file's
    size and modification time, so an edited image makes its shard be redone."""
    import os

    from recordtool.errors import OnError
    from recordtool.pack.plan import Options, make_plan, shuffle
    from recordtool.format.jpeg import DEFAULT_MAX_PIXELS
    from recordtool.pack.transcode import NO_TRANSCODE
    from recordtool.sources.imagefolder import ImageFolderSource

    opts = Options(DEFAULT_MAX_PIXELS, NO_TRANSCODE, OnError.SKIP)
    before = make_plan(src := ImageFolderSource(str(folder)), shuffle(src.items, 0), 3, 0, opts)
    edited = shuffle(src.items, 0)[20].path  # an item of the last shard
    with open(edited, "ab") as f:
        f.write(b"\0")
    os.utime(edited, ns=(1, 1))
    after = make_plan(src2 := ImageFolderSource(str(folder)), shuffle(src2.items, 0), 3, 0, opts)
    assert [a.hash != b.hash for a, b in zip(before.tasks, after.tasks)] == [False, False, True]


def test_out_as_file_url_is_the_local_directory(folder, tmp_path):
    s = pack(str(folder), f"file://{tmp_path}/out", shards=2, progress=False)
    assert s.records == 21 and (tmp_path / "out" / "manifest.json").exists()
    assert len(recordtool.open(str(tmp_path / "out"))) == 21


def test_more_shards_than_items_is_refused(folder, tmp_path):
    with pytest.raises(ValueError, match="more than the 21 items"):
        pack(str(folder), str(tmp_path / "out"), shards=10**8, progress=False)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_object_store_sources_never_overlap_a_local_out():
    from types import SimpleNamespace

    from recordtool.sources.base import source_paths

    assert source_paths(SimpleNamespace(files=["s3://bucket/train-0", "/data/train-1"])) == ["/data/train-1"]
    assert source_paths(SimpleNamespace(root="gs://bucket/folder")) == []


def test_engine_default_is_packs_own_and_the_package_is_callable(folder, tmp_path):
    """pack() picks the engine itself (processes when transcoding, as the CLI did), so tune and
    library callers get the CLI's default; recordtool.pack is callable."""
    from conftest import tree
    from recordtool.pack import Transcode, configure

    assert configure().engine.name == "local"
    assert configure(transcode=Transcode(max_side=40)).engine.name == "process"
    assert configure(transcode=Transcode(hw_friendly=True), workers=3).engine.processes == 3
    t = Transcode(max_side=40, quality=90)
    a = recordtool.pack(str(folder), str(tmp_path / "a"), transcode=t, shard_size=5000, progress=False)
    b = pack(str(folder), str(tmp_path / "b"), transcode=t, shard_size=5000, progress=False, engine="local")
    assert (a.engine, b.engine) == ("process", "local") and a.shards >= 2
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    with pytest.raises(recordtool.RecordtoolError):  # the top-level base of every error
        pack(str(folder), str(tmp_path / "b"), progress=False)  # a finished dataset: OutputExists
    with pytest.raises(ValueError, match="engine must be one of"):
        pack(str(folder), str(tmp_path / "c"), engine="dask", progress=False)


def test_dataset_writer_publishes_on_a_clean_exit_and_drops_on_an_error(tmp_path):
    from recordtool.format.jpeg import probe as probe_jpeg
    from recordtool.format.writer import DatasetWriter

    jpeg = jpeg_bytes(32, 24, seed=1)
    fields = {"classes": ["a"], "source": {"kind": "test"}, "tool": {"name": "test"}}
    with pytest.raises(KeyError):
        with DatasetWriter(str(tmp_path / "bad")) as w:
            w.add(jpeg, probe_jpeg(jpeg), 0, b"x.jpg")
            raise KeyError("boom")
    assert sorted(os.listdir(tmp_path / "bad")) == [".recordtool.lock"]  # nothing that looks finished
    with DatasetWriter(str(tmp_path / "good")) as w:
        w.add(jpeg, probe_jpeg(jpeg), 0, b"x.jpg")
        w.finish(fields)
    assert w.manifest["records"] == 1 and verify(str(tmp_path / "good")).ok
    assert not (tmp_path / "good" / ".partial").exists()


def test_arithmetic_jpegs_are_converted_and_bad_dac_segments_skipped(tmp_path):
    """nvJPEG decodes Huffman-coded JPEGs only, and the index cannot route an arithmetic-coded
    one away from it: pack converts such a file to a baseline Huffman-coded JPEG (listed as
    converted, pixels kept); a file whose DAC segment libjpeg-turbo refuses is skipped, its
    offset named; `recordtool index` leaves an arithmetic-coded record out."""
    from hostile_data import segments
    from recordtool.format import ofrecord_pb2
    from recordtool.format.scan import index_parts

    fixtures = os.path.join(os.path.dirname(__file__), "fixtures", "jpeg")
    arith = {f"a/{n}": open(os.path.join(fixtures, n), "rb").read()
             for n in ("arith-420.jpg", "arith-progressive.jpg", "arith-gray.jpg")}
    src = tmp_path / "src"
    for rel, data in arith.items():
        write(str(src / rel), data)
    good = jpeg_bytes(50, 40, seed=1)
    write(str(src / "a" / "good.jpg"), good)
    sos = segments(good)[-1][1]
    write(str(src / "a" / "bad-dac.jpg"), good[:sos] + b"\xff\xcc\x00\x04\x00\x05" + good[sos:])  # DC L=5 > U=0
    s = pack(str(src), str(tmp_path / "out"), progress=False)
    assert dict(s.skipped).keys() == {"a/bad-dac.jpg"}
    assert f"(DAC) at offset {sos}" in dict(s.skipped)["a/bad-dac.jpg"]
    assert dict(s.converted).keys() == set(arith)
    assert all("arithmetic-coded JPEG" in why for why in dict(s.converted).values())
    got = _by_filename(recordtool.open(tmp_path / "out"))
    assert got["a/good.jpg"][0] == good
    for rel, data in arith.items():
        info = probe(got[rel][0])
        assert not info.arithmetic and not info.progressive and info.decodable_as_is
        ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=float)
        mse = ((np.asarray(Image.open(io.BytesIO(got[rel][0])), dtype=float) - ref) ** 2).mean()
        assert 10 * np.log10(255**2 / mse) > 28, rel  # q95, 4:2:0 chroma
    assert verify(str(tmp_path / "out"), decode=True).ok
    parts = tmp_path / "parts"
    os.makedirs(parts)
    with open(parts / "part-00000", "wb") as f:
        for payload in (good, arith["a/arith-420.jpg"]):
            m = ofrecord_pb2.OFRecord()
            m.feature["encoded"].bytes_list.value.append(payload)
            m.feature["class/label"].int32_list.value.append(0)
            blob = m.SerializeToString()
            f.write(len(blob).to_bytes(8, "little") + blob)
    m = index_parts(str(parts), progress=False)
    assert m["records"] == 1 and "arithmetic-coded JPEG" in m["skipped"][0]["reason"]


def _labels(out) -> dict:
    """filename → (label, class name) of a packed dataset."""
    ds = recordtool.open(out)
    return {fn: (label, ds.classes[label]) for fn, (_, label) in _by_filename(ds).items()}


def test_hidden_entries_are_no_class_and_are_reported(folder, tmp_path):
    """A hidden folder (`.ipynb_checkpoints`: first in sorted order) is not class 0, and hidden
    files and folders inside classes are not packed: the labels are those of the same folder
    without them; each hidden entry is listed among the skipped, a folder once."""
    clean = pack(str(folder), str(tmp_path / "clean"), progress=False)
    write(str(folder / ".ipynb_checkpoints" / "cat_0-checkpoint.JPEG"), jpeg_bytes(seed=50))
    write(str(folder / "cat" / ".cache" / "deep" / "thumb.JPEG"), jpeg_bytes(seed=51))
    write(str(folder / "dog" / "._dog_0.JPEG"), jpeg_bytes(seed=52))  # macOS AppleDouble beside its file
    write(str(folder / ".DS_Store"), b"\0\0\0\1Bud1")
    s = pack(str(folder), str(tmp_path / "out"), progress=False)
    assert recordtool.open(tmp_path / "out").classes == ["cat", "dog", "eel"]
    assert _labels(tmp_path / "out") == _labels(tmp_path / "clean") and s.records == clean.records == 21
    skipped = dict(s.skipped)
    assert skipped.keys() == {".ipynb_checkpoints", "cat/.cache", "dog/._dog_0.JPEG", ".DS_Store"}
    assert skipped[".ipynb_checkpoints"] == "hidden folder (name starts with '.'): not a class, not packed"
    assert skipped["cat/.cache"].startswith("hidden folder") and skipped["dog/._dog_0.JPEG"].startswith("hidden file")
    report = json.load(open(tmp_path / "out" / "pack_report.json"))
    assert {x["file"] for x in report["skipped"]} == skipped.keys()


def test_classes_from_gives_the_training_labels(folder, tmp_path):
    """A validation folder missing a class ("cat", label 0) takes the training set's labels
    with classes_from (its directory, manifest.json or a Summary's out), not 0..K-2; the missing
    class keeps its label and is reported; a folder the list lacks is refused, named."""
    import shutil

    from recordtool.errors import ConfigError, FormatError
    from recordtool.format.manifest import classes_of

    pack(str(folder), str(tmp_path / "train"), progress=False)
    val = tmp_path / "val"
    shutil.copytree(folder / "dog", val / "dog")
    shutil.copytree(folder / "eel", val / "eel")
    shifted = pack(str(val), str(tmp_path / "shifted"), progress=False)  # without: dog 0, eel 1
    assert set(_labels(tmp_path / "shifted").values()) == {(0, "dog"), (1, "eel")} and not shifted.missing_classes
    for k, ref in enumerate([tmp_path / "train", str(tmp_path / "train" / "manifest.json"),
                             classes_of(str(tmp_path / "train"))]):
        out = tmp_path / f"val{k}"
        s = pack(str(val), str(out), classes_from=ref, progress=False)
        ds = recordtool.open(out)
        assert ds.classes == ["cat", "dog", "eel"]
        train = _labels(tmp_path / "train")
        assert _labels(out) == {fn: train[fn] for fn in train if not fn.startswith("cat/")}
        assert s.missing_classes == [(0, "cat")] and "1 listed class has no folder" in s.line()
        assert json.load(open(out / "pack_report.json"))["missing_classes"] == [{"label": 0, "class": "cat"}]
        assert ds.manifest["source"]["classes_from"] == (ref.origin if k == 2 else str(ref))
    write(str(val / "fox" / "f.JPEG"), jpeg_bytes(seed=60))
    with pytest.raises(PackError, match=r"val/fox: class folder 'fox' is not in the class list of .*train"):
        pack(str(val), str(tmp_path / "refused"), classes_from=str(tmp_path / "train"), progress=False)
    assert not (tmp_path / "refused" / "manifest.json").exists()
    with pytest.raises(FormatError, match="src/manifest.json: no manifest"):
        pack(str(val), str(tmp_path / "x"), classes_from=str(folder), progress=False)
    with pytest.raises(ConfigError, match="not a packed dataset directory"):
        pack(str(val), str(tmp_path / "x"), classes_from=str(folder / "cat" / "cat_0.JPEG"), progress=False)
    from recordtool.sources.imagefolder import ImageFolderSource

    with pytest.raises(ConfigError, match="classes_from applies to a folder SRC"):
        pack(ImageFolderSource(str(folder)), str(tmp_path / "y"), classes_from=str(tmp_path / "train"), progress=False)
