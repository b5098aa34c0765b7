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

    from recordtool.decode import decode_crop_resize
    from recordtool.decode.reference import _turbojpeg

    data = hd.corrupt_entropy(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(Warning):  # the reference decoder (verify --decode) warns
            _turbojpeg().decode(data)
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
    monkeypatch.setattr(cpu, "_warned", True)
    errors = []
    cpu.decode_crop_resize([hd.bomb_progressive(), hd.many_scans(2000), hd.corrupt_entropy(1), jpeg_bytes()],
                           np.array([[0, 0, 8, 8]] * 4), size=(8, 8), on_error="skip", errors=errors)
    reasons = dict(errors)
    assert set(reasons) == {0, 1, 2}
    assert "coefficient" in reasons[0] and "scans" in reasons[1] and "Corrupt JPEG" in reasons[2]
