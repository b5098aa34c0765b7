"""Mutated inputs never crash anything: each is decoded, or refused with a reason."""
import numpy as np
import pytest

from conftest import jpeg_bytes
from recordtool.decode import decode_crop_resize
from recordtool.format.jpeg import BadJPEG, NotJPEG, probe
from recordtool.format.ofrecord import FormatError, decode_ofrecord, encode_ofrecord, iter_records


def mutations(data: bytes, n: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        b = bytearray(data)
        kind = rng.integers(0, 4)
        if kind == 0:  # flip bytes, header included
            for p in rng.integers(0, len(b), rng.integers(1, 8)):
                b[p] ^= int(rng.integers(1, 256))
        elif kind == 1:  # truncate
            b = b[: int(rng.integers(0, len(b)))]
        elif kind == 2:  # insert garbage
            p = int(rng.integers(0, len(b)))
            b[p:p] = rng.bytes(int(rng.integers(1, 64)))
        else:  # corrupt a marker length in the header
            p = int(rng.integers(2, min(len(b), 600)))
            b[p] = 0xFF
        yield bytes(b)


@pytest.fixture(scope="module")
def seeds():
    return [jpeg_bytes(96, 72, seed=1, subsampling=2), jpeg_bytes(64, 80, seed=2, subsampling=0, progressive=True),
            jpeg_bytes(50, 40, seed=3, mode="L")]


def test_probe_refuses_or_accepts(seeds):
    for k, data in enumerate(seeds):
        for m in mutations(data, 300, k):
            try:
                info = probe(m)
            except (NotJPEG, BadJPEG):
                continue
            assert info.width > 0 and info.height > 0 and info.channels in (1, 3, 4)


@pytest.mark.skipif(not __import__("recordtool.decode", fromlist=["native_available"]).native_available(),
                    reason="native decoder not built")
def test_native_decoder_survives_mutations(seeds):
    for k, data in enumerate(seeds):
        muts = list(mutations(data, 200, 10 + k))
        errors = []
        out = decode_crop_resize(muts, np.array([[0, 0, 16, 16]] * len(muts)), size=(32, 32), on_error="skip",
                                 errors=errors, threads=2)
        assert out.shape == (len(muts), 32, 32, 3)
        assert all(isinstance(r, str) and r for _, r in errors)
        bad = {i for i, _ in errors}
        assert all(not out[i].any() for i in bad)  # failed slots are zeroed, never half-written


def test_ofrecord_walker_refuses_or_parses():
    blob = b"".join(encode_ofrecord({"encoded": b"\xff\xd8" + bytes(200), "class/label": 7,
                                     "filename": b"a/b.jpg"}).parts)
    rec = len(blob).to_bytes(8, "little") + blob
    for m in mutations(rec * 3, 500, 99):
        try:
            for r in iter_records(m, "fuzz"):
                decode_ofrecord(m, r.data_offset, r.data_offset + r.length)
        except (FormatError, ValueError):
            pass


# ------------------------------------------------------------------ hostile dataset, cache and state

def _fuzz_script():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "fuzz_hostile.py")
    spec = importlib.util.spec_from_file_location("fuzz_hostile", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_hostile_fuzz_small():
    """A CI-sized run of scripts/fuzz_hostile.py --kinds hostile: mutated index, manifest, part
    files, cache folders and Loader state dicts, each chunk in a child process; every input is
    served right or refused with a RecordtoolError — no other exception, crash, hang, or label
    or image bytes that are not the record's."""
    fz = _fuzz_script()
    lines = []
    s = fz.run(fz.HOSTILE, total=300, chunk=300, seed=7, timeout=300, log=lambda *a, **k: lines.append(a))
    assert s["total"] == 300, s
    bad = {k: s["outcomes"][k] for k in ("other", "wrong_label", "wrong_bytes", "crash", "hang")}
    assert not any(bad.values()), (bad, s["findings"][:3])
    assert not s["findings"], s["findings"][:3]
    assert set(s["kinds"]) == set(fz.HOSTILE)
    # both sides reached: not a run of refusals only (or of inputs the mutations left valid)
    assert s["outcomes"]["accepted"] > 30 and s["outcomes"]["refused"] > 30, s["outcomes"]


def test_local_index_changed_after_the_manifest_is_refused(tmp_path):
    """A label rewritten inside the class list passes every bounds check; the index's CRC32C in
    the manifest is what tells it from the packed one."""
    import os

    from conftest import write
    from recordtool.errors import FormatError
    from recordtool.format import index as ix
    from recordtool.pack import pack
    from recordtool.reader import Dataset

    for i in range(4):
        write(str(tmp_path / "src" / f"c{i % 2}" / f"{i}.jpg"), jpeg_bytes(40, 32, seed=i))
    out = str(tmp_path / "ds")
    pack(str(tmp_path / "src"), out, shards=1, progress=False)
    path = os.path.join(out, "index.rtx")
    blob = bytearray(open(path, "rb").read())
    idx = ix.read_index(path)
    at = next(int(c["offset"]) for c in __import__("json").loads(blob[12:12 + int.from_bytes(blob[8:12], "little")])
              ["columns"] if c["name"] == "label")
    blob[at] = 1 - int(idx.label[0])  # still a class of the dataset
    del idx
    os.unlink(path)
    open(path, "wb").write(bytes(blob))
    with pytest.raises(FormatError, match="index.rtx: CRC32C .* differs from the manifest"):
        Dataset(out)


def test_a_refused_record_leaves_a_with_block_as_its_own_error(tmp_path):
    """`ds.info(i)` of a record that does not parse raises FormatError, and `with Dataset(...)`
    leaving on it raises that error — not a BufferError from close() about views the
    error's traceback holds."""
    import os

    from conftest import write
    from recordtool.errors import FormatError
    from recordtool.pack import pack
    from recordtool.reader import Dataset

    for i in range(2):
        write(str(tmp_path / "src" / f"c{i}" / f"{i}.jpg"), jpeg_bytes(40, 32, seed=i))
    out = str(tmp_path / "ds")
    pack(str(tmp_path / "src"), out, shards=1, progress=False)
    part = os.path.join(out, "part-00000")
    b = bytearray(open(part, "rb").read())
    b[8] = 0x0F  # the record's first field key: wire type 7, which no message has
    os.unlink(part)
    open(part, "wb").write(bytes(b))
    with pytest.raises(FormatError, match="wire type"):
        with Dataset(out) as ds:
            ds[0]  # a view of the shard mapped
            ds.info(0)
