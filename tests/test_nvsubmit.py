"""recordtool._nvsubmit (the engines' GIL-free batch submission) against its reference, the ctypes
loop of HardwareDecoder.decode: stand-ins for nvJPEG's two functions record what they are given,
so what the native loop passes is checked without a GPU."""
import ctypes
import os

import numpy as np
import pytest

from recordtool.decode.nvjpeg import Image

nvsubmit = pytest.importorskip("recordtool._nvsubmit") if not os.environ.get("RECORDTOOL_REQUIRE_NATIVE") \
    else __import__("recordtool._nvsubmit", fromlist=["submit"])

SET_ROI = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int)
BATCHED = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                           ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(Image), ctypes.POINTER(ctypes.c_void_p),
                           ctypes.c_void_p)


def _arrays(cap):
    params = (ctypes.c_void_p * cap)(*[1000 + k for k in range(cap)])
    return params, (ctypes.c_void_p * cap)(), (ctypes.c_size_t * cap)(), (Image * cap)()


def _run(n, cap=8, fail_roi_at=None, batched_status=0):
    calls, batched = [], []

    @SET_ROI
    def set_roi(prm, x, y, w, h):
        calls.append((prm, x, y, w, h))
        return 2 if fail_roi_at is not None and len(calls) - 1 == fail_roi_at else 0

    @BATCHED
    def dec(handle, state, data, lengths, imgs, prm, stream):
        batched.append(dict(handle=handle, state=state, stream=stream, data=[data[k] for k in range(n)],
                            lengths=[lengths[k] for k in range(n)],
                            dst=[imgs[k].channel[0] for k in range(n)], pitch=[imgs[k].pitch[0] for k in range(n)],
                            params=[prm[k] for k in range(n)]))
        return batched_status

    params, ptrs, lens, imgs = _arrays(cap)
    rng = np.random.default_rng(n)
    host = rng.integers(1 << 20, 1 << 40, n)
    length = rng.integers(100, 10 ** 6, n)
    rois = rng.integers(0, 4000, (n, 4))
    dst = rng.integers(1 << 20, 1 << 40, n)
    pitch = rng.integers(3, 12000, n)
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    out = nvsubmit.submit(addr(set_roi), addr(dec), 11, 22, ctypes.addressof(params), ctypes.addressof(ptrs),
                          ctypes.addressof(lens), ctypes.addressof(imgs), host, length, rois, dst, pitch, 33, cap)
    return out, calls, batched, (host, length, rois, dst, pitch)


def test_submit_passes_what_the_ctypes_loop_passes():
    (status, call, _), calls, batched, (host, length, rois, dst, pitch) = _run(5)
    assert (status, call) == (0, 0)
    # the reference loop: SetROI(params[k], x, y, w, h) per image, then one batched decode
    assert calls == [(1000 + k, *(int(v) for v in rois[k])) for k in range(5)]
    (b,) = batched
    assert (b["handle"], b["state"], b["stream"]) == (11, 22, 33)
    assert b["data"] == host.tolist() and b["lengths"] == length.tolist()
    assert b["dst"] == dst.tolist() and b["pitch"] == pitch.tolist()
    assert b["params"] == [1000 + k for k in range(5)]


def test_submit_reports_the_failing_call_and_stops():
    (status, call, at), calls, batched, _ = _run(6, fail_roi_at=3)
    assert (status, call, at) == (2, 1, 3) and len(calls) == 4 and batched == []
    (status, call, _), _, batched, _ = _run(4, batched_status=6)
    assert (status, call) == (6, 2) and len(batched) == 1


def test_submit_refuses_bad_arguments_without_calling_anything():
    with pytest.raises(ValueError):  # more images than the decoder's arrays hold
        _run(9, cap=8)
    params, ptrs, lens, imgs = _arrays(4)
    z = np.zeros(3, np.int64)
    with pytest.raises(ValueError):  # rois not (n, 4)
        nvsubmit.submit(1, 1, 1, 1, ctypes.addressof(params), ctypes.addressof(ptrs), ctypes.addressof(lens),
                        ctypes.addressof(imgs), z, z, np.zeros(5, np.int64), z, z, 0, 4)
    with pytest.raises(ValueError):  # a null function
        nvsubmit.submit(0, 1, 1, 1, ctypes.addressof(params), ctypes.addressof(ptrs), ctypes.addressof(lens),
                        ctypes.addressof(imgs), z, z, np.zeros((3, 4), np.int64), z, z, 0, 4)
