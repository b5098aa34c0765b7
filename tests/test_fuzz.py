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
