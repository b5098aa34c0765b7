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
    (status, call, _, seconds), calls, batched, (host, length, rois, dst, pitch) = _run(5)
    assert (status, call) == (0, 0) and seconds >= 0  # the time spent without the GIL
    # the reference loop: SetROI(params[k], x, y, w, h) per image, then one batched decode
    assert calls == [(1000 + k, *(int(v) for v in rois[k])) for k in range(5)]
    (b,) = batched
    assert (b["handle"], b["state"], b["stream"]) == (11, 22, 33)
    assert b["data"] == host.tolist() and b["lengths"] == length.tolist()
    assert b["dst"] == dst.tolist() and b["pitch"] == pitch.tolist()
    assert b["params"] == [1000 + k for k in range(5)]


def test_submit_reports_the_failing_call_and_stops():
    (status, call, at, _), calls, batched, _ = _run(6, fail_roi_at=3)
    assert (status, call, at) == (2, 1, 3) and len(calls) == 4 and batched == []
    (status, call, _, _), _, batched, _ = _run(4, batched_status=6)
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


def test_submit_passes_three_planes_per_image():
    """Planar YCbCr (chroma="interpolate"): dsts / pitches (n, 3) land in channels 0..2."""
    got = []

    @SET_ROI
    def set_roi(prm, x, y, w, h):
        return 0

    @BATCHED
    def dec(handle, state, data, lengths, imgs, prm, stream):
        got.append([[(imgs[k].channel[c], imgs[k].pitch[c]) for c in range(4)] for k in range(3)])
        return 0

    params, ptrs, lens, imgs = _arrays(4)
    dst = np.arange(9, dtype=np.int64).reshape(3, 3) * 4096 + (1 << 30)
    pitch = np.arange(9, dtype=np.int64).reshape(3, 3) + 100
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    out = nvsubmit.submit(addr(set_roi), addr(dec), 1, 2, ctypes.addressof(params), ctypes.addressof(ptrs),
                          ctypes.addressof(lens), ctypes.addressof(imgs), np.arange(3) + 1, np.arange(3) + 10,
                          np.zeros((3, 4), np.int64), dst, pitch, 0, 4)
    assert tuple(out[:2]) == (0, 0)
    assert got == [[[(int(dst[k, c]), int(pitch[k, c])) for c in range(3)] + [(None, 0)] for k in range(3)]]
    with pytest.raises(ValueError):  # two channels per image: neither layout
        nvsubmit.submit(addr(set_roi), addr(dec), 1, 2, ctypes.addressof(params), ctypes.addressof(ptrs),
                        ctypes.addressof(lens), ctypes.addressof(imgs), np.arange(3), np.arange(3),
                        np.zeros((3, 4), np.int64), np.zeros((3, 2), np.int64), np.zeros((3, 2), np.int64), 0, 4)


INFO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int),
                        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))


def test_infos_returns_what_image_info_returns_per_image():
    """infos (the batch's headers in one GIL-free call) against its reference, one
    nvjpegGetImageInfo per image (_Handle.image_info): same arguments, same fields, the failing
    image's status with zeros."""
    seen = []

    @INFO
    def info(handle, data, length, nc, css, w, h):
        seen.append((handle, data, length))
        if length == 13:
            return 3  # BAD_JPEG
        nc[0], css[0] = 3, data % 7
        for c in range(3):
            w[c], h[c] = length + c, 2 * length + c
        return 0

    host = np.array([1 << 32, 5 << 32, 9 << 32], np.int64)
    lengths = np.array([100, 13, 250], np.int64)
    out = nvsubmit.infos(ctypes.cast(info, ctypes.c_void_p).value, 77, host, lengths)
    assert seen == [(77, int(p), int(n)) for p, n in zip(host, lengths)]
    expect = [[0, 3, int(host[0]) % 7, 100, 200, 101, 201], [3, 0, 0, 0, 0, 0, 0],
              [0, 3, int(host[2]) % 7, 250, 500, 251, 501]]
    assert out.tolist() == expect
    with pytest.raises(ValueError):
        nvsubmit.infos(0, 77, host, lengths)
    with pytest.raises(ValueError):
        nvsubmit.infos(ctypes.cast(info, ctypes.c_void_p).value, 77, host, lengths[:2])


def _hardware_decoder(cap, planar):
    """A HardwareDecoder over stand-ins for nvJPEG (no GPU): what reaches nvJPEG is recorded."""
    from recordtool.decode import nvjpeg

    log = {"init": [], "roi": [], "batched": []}
    channels = 3 if planar else 1

    @SET_ROI
    def set_roi(prm, x, y, w, h):
        log["roi"].append((prm, x, y, w, h))
        return 0

    @BATCHED
    def dec(handle, state, data, lengths, imgs, prm, stream):
        n = log["init"][-1]
        log["batched"].append(([data[k] for k in range(n)], [lengths[k] for k in range(n)],
                               [[(imgs[k].channel[c], imgs[k].pitch[c]) for c in range(channels)] for k in range(n)],
                               stream))
        return 0

    class Lib:
        nvjpegDecodeParamsSetROI, nvjpegDecodeBatchedEx = set_roi, dec

        @staticmethod
        def nvjpegDecodeBatchedInitialize(handle, state, n, threads, fmt):
            log["init"].append(n)
            return 0

    d = object.__new__(nvjpeg.HardwareDecoder)
    d.L, d.handle, d.state, d.max_batch = Lib, ctypes.c_void_p(11), ctypes.c_void_p(22), cap
    d.fmt = nvjpeg.OUTPUT_YUV if planar else nvjpeg.OUTPUT_RGBI
    d.params, d._ptrs, d._lens, d._imgs = _arrays(cap)
    d._batch = d._fns = None
    d._keep = (set_roi, dec)
    return d, log


@pytest.mark.parametrize("planar", [False, True])
@pytest.mark.parametrize("native", [True, False])
def test_hardware_decoder_same_calls_either_way(native, planar):
    """decode / decode_planes submit natively or through the ctypes loop: the same ROIs,
    pointers, lengths and destinations reach nvJPEG, the batched state is initialised once per
    batch size (in one place, `_begin`), and an empty or oversized batch calls nothing."""
    d, log = _hardware_decoder(8, planar)
    rng = np.random.default_rng(1)
    call = d.decode_planes if planar else d.decode
    for n in (5, 5, 3, 0):
        host, length = rng.integers(1 << 20, 1 << 40, n), rng.integers(100, 10 ** 6, n)
        rois = rng.integers(0, 4000, (n, 4))
        dst, pitch = rng.integers(1 << 20, 1 << 40, (n, 3)), rng.integers(3, 9999, (n, 3))
        before = len(log["batched"])
        if planar:
            call(host, length, dst, pitch, 33, rois=rois, native=native)
            want = [[(int(dst[k, c]), int(pitch[k, c])) for c in range(3)] for k in range(n)]
        else:
            call(host, length, rois, dst[:, 0], pitch[:, 0], 33, native=native)
            want = [[(int(dst[k, 0]), int(pitch[k, 0]))] for k in range(n)]
        if n:
            assert log["batched"][before:] == [(host.tolist(), length.tolist(), want, 33)]
            assert log["roi"][-n:] == [(1000 + k, *(int(v) for v in rois[k])) for k in range(n)]
        else:
            assert len(log["batched"]) == before
    assert log["init"] == [5, 3]
    z, z4 = np.zeros(9, np.int64), np.zeros((9, 4), np.int64)
    with pytest.raises(ValueError, match="max_batch"):
        if planar:
            call(z, z, np.zeros((9, 3), np.int64), np.zeros((9, 3), np.int64), 33, rois=z4, native=native)
        else:
            call(z, z, z4, z, z, 33, native=native)
    assert log["init"] == [5, 3]


def _hybrid_standins(log, fail_host_at=None):
    """Stand-ins for the nine functions HybridDecoder's per-image loop calls, each logging its
    call; the host decode of the image with length `fail_host_at` fails."""
    P, I = ctypes.c_void_p, ctypes.c_int
    T = {
        "nvjpegJpegStreamParse": ctypes.CFUNCTYPE(I, P, P, ctypes.c_size_t, I, I, P),
        "nvjpegDecodeParamsSetOutputFormat": ctypes.CFUNCTYPE(I, P, I),
        "nvjpegDecodeParamsSetROI": ctypes.CFUNCTYPE(I, P, I, I, I, I),
        "nvjpegStateAttachPinnedBuffer": ctypes.CFUNCTYPE(I, P, P),
        "nvjpegDecodeJpegHost": ctypes.CFUNCTYPE(I, P, P, P, P, P),
        "nvjpegDecodeJpegTransferToDevice": ctypes.CFUNCTYPE(I, P, P, P, P, P),
        "nvjpegDecodeJpegDevice": ctypes.CFUNCTYPE(I, P, P, P, ctypes.POINTER(Image), P),
        "record": ctypes.CFUNCTYPE(I, P, P),
        "sync": ctypes.CFUNCTYPE(I, P),
    }
    last = {}

    def make(name):
        def fn(*a):
            if name == "nvjpegDecodeJpegDevice":
                img = a[3].contents
                a = a[:3] + (tuple((img.channel[c] or 0, img.pitch[c]) for c in range(3)),) + a[4:]
            if name == "nvjpegJpegStreamParse":
                last["length"] = a[2]
            log.append((name,) + tuple(a))
            return 7 if name == "nvjpegDecodeJpegHost" and last.get("length") == fail_host_at else 0
        return T[name](fn)
    return {name: make(name) for name in T}


class _Lib:
    def __init__(self, fns):
        self.__dict__.update(fns)


class _Event:
    def __init__(self, ptr, sync):
        self.ptr, self._sync = ptr, sync

    def synchronize(self):
        self._sync(self.ptr)


def _hybrid(fns):
    """A HybridDecoder over the stand-ins (no nvJPEG, no GPU)."""
    from recordtool.decode import nvjpeg

    d = object.__new__(nvjpeg.HybridDecoder)
    lib = _Lib(fns)
    d.L = d.Q = lib
    d.handle, d.decoder, d.state, d.params = (ctypes.c_void_p(v) for v in (101, 102, 103, 104))
    d.jstreams, d.pinned = [ctypes.c_void_p(201), ctypes.c_void_p(202)], [ctypes.c_void_p(301), ctypes.c_void_p(302)]
    d.events = [_Event(401, fns["sync"]), _Event(402, fns["sync"])]
    d._record = lambda ev, stream: fns["record"](ev, stream)
    d.stream_ptr, d._fmt, d._roi, d._used, d._k, d._img = 55, nvjpeg.OUTPUT_RGBI, None, [False, False], 0, Image()
    d._fns = np.array([ctypes.cast(fns[k], ctypes.c_void_p).value for k in (
        "nvjpegJpegStreamParse", "nvjpegDecodeParamsSetOutputFormat", "nvjpegDecodeParamsSetROI",
        "nvjpegStateAttachPinnedBuffer", "nvjpegDecodeJpegHost", "nvjpegDecodeJpegTransferToDevice",
        "nvjpegDecodeJpegDevice", "record", "sync")], np.int64)
    return d


@pytest.mark.parametrize("fail", [None, 5003])
def test_hybrid_batch_makes_the_python_loops_calls(monkeypatch, fail):
    """_nvsubmit.hybrid (a batch's hybrid decodes in one GIL-free call) against its reference,
    HybridDecoder's per-image Python loop, on the same stand-ins: the same calls with the same
    arguments in the same order (the two pinned sets alternating, each event waited for before
    its set is reused, format and ROI set only where they change), a failing image reported
    and the next one decoded, and the same decoder state after."""
    from recordtool.decode import nvjpeg

    monkeypatch.setattr(nvjpeg._thread, "context", True, raising=False)
    n = 6
    ptrs, lengths = np.arange(n) * 4096 + (1 << 30), np.arange(n) + 5000
    fmts = np.array([nvjpeg.OUTPUT_RGBI, nvjpeg.OUTPUT_RGBI, nvjpeg.OUTPUT_YUV, nvjpeg.OUTPUT_YUV, nvjpeg.OUTPUT_Y,
                     nvjpeg.OUTPUT_RGBI])
    rois = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, -1, -1], [2, 4, 8, 8], [2, 4, 8, 8], [1, 1, 5, 5]])
    planes = np.arange(3 * n).reshape(n, 3) * 65536 + (1 << 32)
    pitches = np.arange(3 * n).reshape(n, 3) + 640
    runs = {}
    for native in (False, True):
        log = []
        d = _hybrid(_hybrid_standins(log, fail))
        bad = d.decode_batch(ptrs, lengths, fmts, rois, planes, pitches, native=native)
        bad2 = d.decode_batch(ptrs[:2], lengths[:2], fmts[:2], rois[:2], planes[:2], pitches[:2], native=native)
        runs[native] = (log, [i for i, _ in bad], [i for i, _ in bad2], (d._k, d._used, d._fmt, d._roi))
    assert runs[True] == runs[False]
    log, bad, bad2, state = runs[True]
    assert bad == ([] if fail is None else [3]) and bad2 == []
    names = [c[0] for c in log]
    assert names[:9] == ["nvjpegJpegStreamParse", "nvjpegDecodeParamsSetROI", "nvjpegStateAttachPinnedBuffer",
                         "nvjpegDecodeJpegHost", "nvjpegDecodeJpegTransferToDevice", "record",
                         "nvjpegDecodeJpegDevice", "nvjpegJpegStreamParse", "nvjpegStateAttachPinnedBuffer"]
    assert names.count("sync") == n + 2 - 2  # each image's set waited for, but at the first use of each
    assert names.count("record") == n + 2 - (0 if fail is None else 1)  # not for the image that failed
    assert state[1] == [True, True] and state[0] == (n + 2) % 2 and state[3] == (0, 0, 10, 10)


def test_hybrid_batch_refuses_bad_arguments():
    z = np.zeros(2, np.int64)
    with pytest.raises(ValueError):  # eight functions, not nine
        nvsubmit.hybrid(np.ones(8, np.int64), np.ones(5, np.int64), np.ones(6, np.int64), np.zeros(8, np.int64),
                        z, z, z, np.zeros((2, 4), np.int64), np.zeros((2, 3), np.int64), np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError):  # a null handle
        nvsubmit.hybrid(np.ones(9, np.int64), np.zeros(5, np.int64), np.ones(6, np.int64), np.zeros(8, np.int64),
                        z, z, z, np.zeros((2, 4), np.int64), np.zeros((2, 3), np.int64), np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError):  # rois not (n, 4)
        nvsubmit.hybrid(np.ones(9, np.int64), np.ones(5, np.int64), np.ones(6, np.int64), np.zeros(8, np.int64),
                        z, z, z, np.zeros((2, 3), np.int64), np.zeros((2, 3), np.int64), np.zeros((2, 3), np.int64))
