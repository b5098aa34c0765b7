"""recordtool._nvsubmit (the engines' GIL-free batch submission) against its reference, the ctypes
loop of HardwareDecoder.decode: stand-ins for nvJPEG's two functions record what they are given,
so what the native loop passes is checked without a GPU."""
import ctypes
import os

import numpy as np
import pytest

from recordtool.decode.gpu.nvjpeg import Image

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
    from recordtool.decode.gpu import nvjpeg

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


def test_hardware_flags():
    """nvjpegCreateEx's flags for the engines: unpipelined unless asked, interpolation on request
    (nvjpeg.h: NO_PIPELINE 1, UPSAMPLING_WITH_INTERPOLATION 32)."""
    from recordtool.decode.gpu.nvjpeg import hardware_flags

    assert hardware_flags(False, False) == 1
    assert hardware_flags(True, False) == 33
    assert hardware_flags(False, True) == 0
    assert hardware_flags(True, True) == 32


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
    from recordtool.decode.gpu import nvjpeg

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
    from recordtool.decode.gpu import nvjpeg

    monkeypatch.setattr(nvjpeg, "context_current", lambda: None)
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


# ------------------------------------------------------------------ queue: a stream's work in one call
SYNC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
WAIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)
COPY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
RECORD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class _Ptr:  # what StreamWork reads of CuPy's events, streams, functions and arrays
    def __init__(self, ptr, nbytes=0):
        self.ptr, self.nbytes = ptr, nbytes
        self.data = self


def _driver_standins(log, fail=None, kinds=None, write=False):
    """Stand-ins for the five driver functions; the launch reads each kernel argument through
    the pointer it is given, as the `kinds` ("p" 8 bytes, "i" int32, "f" float32, "d" float64);
    write: the copy writes its bytes to dst (host memory standing for the device's)."""
    def status(name):  # 700 for the fail-th call (0-based) of that name, just logged
        return 700 if fail == (name, sum(1 for c in log if c[0] == name) - 1) else 0

    @SYNC
    def sync(ev):
        log.append(("sync", ev))
        return status("sync")

    @WAIT
    def wait(stream, ev, flags):
        log.append(("wait", stream, ev, flags))
        return status("wait")

    @COPY
    def copy(dst, src, nbytes, stream):
        log.append(("copy", dst, bytes(ctypes.string_at(src, nbytes)), stream))
        if write and not status("copy"):
            ctypes.memmove(dst, src, nbytes)
        return status("copy")

    @LAUNCH
    def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        kind = kinds[f]
        vals = []
        for i, k in enumerate(kind):
            c = {"p": ctypes.c_int64, "i": ctypes.c_int32, "f": ctypes.c_float, "d": ctypes.c_double}[k]
            vals.append(ctypes.cast(params[i], ctypes.POINTER(c))[0])
        log.append(("launch", f, (gx, gy, gz), (bx, by, bz), shared, stream, tuple(vals), extra))
        return status("launch")

    @RECORD
    def record(ev, stream):
        log.append(("record", ev, stream))
        return status("record")

    fns = (sync, wait, copy, launch, record)
    return fns, np.array([ctypes.cast(f, ctypes.c_void_p).value for f in fns], np.int64)


def _work(monkeypatch, log, fail=None):
    from recordtool.decode.gpu import work as W

    kinds = {901: "pidid", 902: "ppiiffffff"}
    keep, addrs = _driver_standins(log, fail, kinds)
    monkeypatch.setattr(W, "_functions", lambda: addrs)
    monkeypatch.setattr(W.nvjpeg, "context_current", lambda: None)
    w = W.StreamWork()
    params = np.arange(6, dtype=np.float64) / 7
    table = np.frombuffer(bytes(range(40)), np.uint8).copy()
    w.wait(_Ptr(71))
    w.copy(_Ptr(5000, 64), params)
    w.copy(_Ptr(6000, 40), table)
    w.launch(_Ptr(901), (3, 2, 1), (256, 1, 1), (_Ptr(1 << 33), np.int32(-3), np.float64(2.5), np.int32(48),
                                                  np.float64(-1e300)))
    w.launch(_Ptr(902), (2, 6, 4), (32, 8, 1), (_Ptr(6000), _Ptr(1 << 34), np.int32(48), np.int32(40),
                                                np.float32(0.25), np.float32(-1.5), np.float32(3e-8),
                                                np.float32(1), np.float32(2), np.float32(-0.0)))
    return w, keep, params, table


def test_queue_makes_the_calls_of_the_reference_in_order_with_the_arguments_it_is_given(monkeypatch):
    """StreamWork.queue through _nvsubmit.queue (one GIL-free call) on stand-ins of the driver:
    the previous pass waited for, then the stream's waits, copies (the host bytes as they are),
    launches (each argument read back through its pointer at its own type) and the event
    recorded — the order of the CuPy calls of the reference (native=False)."""
    log = []
    w, keep, params, table = _work(monkeypatch, log)
    w.queue(_Ptr(55), prev=_Ptr(81), done=_Ptr(82))
    assert [c[0] for c in log] == ["sync", "wait", "copy", "copy", "launch", "launch", "record"]
    assert log[0] == ("sync", 81) and log[1] == ("wait", 55, 71, 0)
    assert log[2] == ("copy", 5000, params.tobytes(), 55) and log[3] == ("copy", 6000, table.tobytes(), 55)
    assert log[4] == ("launch", 901, (3, 2, 1), (256, 1, 1), 0, 55, (1 << 33, -3, 2.5, 48, -1e300), None)
    f32 = [float(np.float32(v)) for v in (0.25, -1.5, 3e-8, 1, 2, -0.0)]
    assert log[5] == ("launch", 902, (2, 6, 4), (32, 8, 1), 0, 55, (6000, 1 << 34, 48, 40, *f32), None)
    assert log[6] == ("record", 82, 55)
    log.clear()
    w.queue(_Ptr(55))  # no previous pass, no event after
    assert [c[0] for c in log] == ["wait", "copy", "copy", "launch", "launch"]


@pytest.mark.parametrize("fail, last", [(("sync", 0), "sync"), (("wait", 0), "wait"), (("copy", 1), "copy"),
                                        (("launch", 0), "launch"), (("record", 0), "record")])
def test_queue_stops_at_the_failing_call_and_names_it(monkeypatch, fail, last):
    from recordtool.decode.gpu.work import CudaError

    log = []
    w, *_ = _work(monkeypatch, log, fail)
    with pytest.raises(CudaError, match=r"cu\w+ .*failed with CUDA error 700") as e:
        w.queue(_Ptr(55), prev=_Ptr(81), done=_Ptr(82))
    assert log[-1][0] == last and e.value.status == 700  # nothing after the failed call
    if last == "launch":
        assert "(launch 1 of 2)" in str(e.value)


def test_queue_refuses_bad_arguments_without_calling_anything():
    log = []
    keep, fns = _driver_standins(log)
    z2, z3 = np.zeros((0, 3), np.int64), np.zeros((0, 9), np.int64)
    one = np.array([[901, 1, 1, 1, 32, 1, 1, 0, 2]], np.int64)
    bad = [
        dict(fns=fns[:4]),                                       # four functions, not five
        dict(stream=0),                                          # the legacy default stream
        dict(copies=np.array([[0, 8, 16]], np.int64)),           # a copy to a null pointer
        dict(copies=np.array([[8, 8, -1]], np.int64)),           # a negative size
        dict(launches=one, slots=np.zeros(1, np.int64)),         # nargs 2, one slot
        dict(launches=np.where(np.arange(9) == 1, 0, one), slots=np.zeros(2, np.int64)),  # a grid of 0
        dict(launches=np.where(np.arange(9) == 7, 1 << 40, one), slots=np.zeros(2, np.int64)),  # shared > uint32
        dict(waits=np.array([0], np.int64)),                     # a null event
        dict(launches=np.zeros((1, 8), np.int64)),               # not (k, 9)
        dict(launches=np.repeat(np.where(np.arange(9) == 8, 1 << 62, one), 4, axis=0)),  # nargs that wrap to 0
    ]
    for b in bad:
        kw = dict(fns=fns, stream=55, prev=0, waits=np.zeros(0, np.int64), copies=z2, launches=z3,
                  slots=np.zeros(0, np.int64), done=0)
        kw.update(b)
        with pytest.raises(ValueError):
            nvsubmit.queue(**kw)
    assert log == []


def test_pack_args_puts_each_value_in_the_low_bytes_of_its_slot():
    from recordtool.decode.gpu.work import pack_args

    s = pack_args([_Ptr(0xDEADBEEF12), np.int32(-2), np.float32(1.5), np.float64(-0.1), np.uint64(1 << 63),
                   np.uint32(7)])
    assert s[0] == 0xDEADBEEF12 and s[1:2].view(np.int32)[0] == -2 and s[2:3].view(np.float32)[0] == 1.5
    assert s[3:4].view(np.float64)[0] == -0.1 and s[4:5].view(np.uint64)[0] == 1 << 63
    assert s[5] == 7  # the high bytes of a 32-bit value's slot are zero
    with pytest.raises(TypeError):
        __import__("recordtool.decode.gpu.work", fromlist=["StreamWork"]).StreamWork().launch(_Ptr(1), (1,), (1,), (3,))


def test_queue_launch_without_arguments_and_launch_dimensions(monkeypatch):
    """A kernel without arguments gets no parameter pointer; grid and block of fewer than three
    dimensions are padded with 1 (as CuPy's launch pads them); what is not a CuPy array or a
    NumPy scalar of a kernel parameter type is refused when added."""
    from recordtool.decode.gpu import work as W

    log = []
    got = []
    LAUNCH0 = LAUNCH

    @LAUNCH0
    def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        got.append(((gx, gy, gz), (bx, by, bz), bool(params)))
        return 0

    keep, addrs = _driver_standins(log)
    addrs = addrs.copy()
    addrs[3] = ctypes.cast(launch, ctypes.c_void_p).value
    monkeypatch.setattr(W, "_functions", lambda: addrs)
    monkeypatch.setattr(W.nvjpeg, "context_current", lambda: None)
    w = W.StreamWork()
    w.launch(_Ptr(7), (4,), 32, ())
    w.launch(_Ptr(8), [2, 3], (8, 8), (np.int32(1),))
    w.queue(_Ptr(55))
    assert got == [((4, 1, 1), (32, 1, 1), False), ((2, 3, 1), (8, 8, 1), True)]
    for bad in (3, 2.0, np.int16(1), np.float16(1), np.bool_(True), np.zeros(2)):
        with pytest.raises(TypeError):
            w.launch(_Ptr(7), 1, 1, (bad,))
    for dims in ((0,), (1, 1, 1, 1), ()):
        with pytest.raises(ValueError):
            w.launch(_Ptr(7), dims, 1, ())


class _FakeCupy:  # what NormalizePass allocates with
    class cuda:
        alloc_pinned_memory = staticmethod(lambda n: bytearray(n))

    empty = staticmethod(lambda n, dtype: np.empty(n, dtype))


@pytest.mark.parametrize("nparams", [0, 3])
def test_a_pass_fills_its_two_host_sets_in_turn_and_only_after_a_queued_pass(nparams):
    """GPUBackend's pass per producer slot: two host sets (sample table, params) in turn; the
    set stays the next one until a pass has been queued from it (a pass that failed before
    queueing must not make the next one fill the set whose copies may still be pending)."""
    from recordtool.decode.gpu.kernel import SAMPLE_DTYPE
    from recordtool.decode.gpu.normalize import NormalizePass

    p = NormalizePass(_FakeCupy, 8, nparams)
    a = p.host()
    assert a[0].dtype == SAMPLE_DTYPE and len(a[0]) == 8 and a[1].shape == (8 * nparams,)
    assert p.host()[0] is a[0]  # no pass queued: the same set
    p.used()
    b = p.host()
    assert b[0] is not a[0] and not np.shares_memory(a[0], b[0]) and not np.shares_memory(a[1], b[1])
    p.used()
    assert p.host()[0] is a[0]
    assert p.params_dev.size >= 1 and p.samples_dev.nbytes == 8 * SAMPLE_DTYPE.itemsize


# ------------------------------------------------------------------ a user op's pass, on stand-ins
class _Arr:  # a CuPy array as the pass sees it, over host memory standing for the device's
    def __init__(self, a):
        self.a = a
        self.data, self.nbytes, self.shape, self.dtype, self.ndim, self.flags = \
            _Ptr(a.ctypes.data), a.nbytes, a.shape, a.dtype, a.ndim, a.flags
        self.size = a.size


class _PassCupy:
    class cuda:
        alloc_pinned_memory = staticmethod(lambda n: bytearray(n))

        class Event:
            made = 0

            def __init__(self, disable_timing=False):
                type(self).made += 1
                self.ptr = 7000 + type(self).made

    empty = staticmethod(lambda n, dtype: _Arr(np.zeros(n, dtype)))
    ascontiguousarray = staticmethod(lambda a: a)


class _Stream:
    ptr = 55

    def __init__(self):
        self.synced = 0

    def synchronize(self):
        self.synced += 1


def _batcher(monkeypatch, op, fail=None, size=16):
    """A GPUBackend with only what its pass reads, on the driver's stand-ins (the copies write)."""
    import threading
    from types import SimpleNamespace

    from recordtool.decode.gpu import work as W
    from recordtool.decode.gpu.backend import GPUBackend
    from recordtool.decode.spec import Output
    from recordtool.ops import cuda as C

    log = []
    keep, addrs = _driver_standins(log, fail, {901: "piiipi", 902: "ppiiffffff"}, write=True)
    monkeypatch.setattr(W, "_functions", lambda: addrs)
    monkeypatch.setattr(W.nvjpeg, "context_current", lambda: None)
    monkeypatch.setattr(C, "kernel", lambda op: _Ptr(901))
    g = object.__new__(GPUBackend)
    g.recipe, g.output = SimpleNamespace(), Output(size)
    out = np.zeros((8, 3, *g.output.size), np.float32)
    g._passes, g._lock, g.image_op, g.max_batch = {}, threading.Lock(), op, 8
    g.ring = SimpleNamespace(take=lambda n: (_Arr(out[:n]), _Ptr(71)))
    g._normalize = _Ptr(902)
    dec = SimpleNamespace(cupy=_PassCupy, stream=_Stream())
    return g, dec, log, keep


@pytest.mark.parametrize("nparams", [3, 0])
def test_user_op_pass_queues_its_copies_and_launches_in_one_call(monkeypatch, nparams):
    """GPUBackend._normalise with a compiled op on the driver's stand-ins: the ring's wait, the
    params (none for a parameter-free op) and the 1:1 sample table up — each image's source
    packed back to back in the uint8 batch, mirrored where flipped — the op's kernel on the batch
    with its params, the normalising kernel into the ring's slot with the CPU path's constants,
    the event; the next pass waits for this one first and fills the other host set; a pass whose
    copy fails raises CudaError, waits for its stream and leaves the host set to the next pass."""
    from recordtool.decode.gpu.kernel import SAMPLE_DTYPE
    from recordtool.decode.gpu.work import CudaError
    from recordtool.decode.spec import scale_bias
    from recordtool.ops import ColorJitter, ImageOp

    class Flat(ImageOp):
        cuda_name, cuda_source = "flat", "x"

        def params(self, n, keys, h, w):
            return np.zeros((n, 0))

    op = ColorJitter() if nparams else Flat()
    g, dec, log, keep = _batcher(monkeypatch, op)
    n = 5
    raw = _Arr(np.zeros((n, 16, 16, 3), np.uint8))
    params = np.arange(n * nparams, dtype=np.float64).reshape(n, nparams) + 0.5
    flips = np.array([1, 0, 0, 1, 1], bool)
    out, done = g._normalise(raw, dec, 0, (), flips=flips, op=(op, params))
    names = [c[0] for c in log]
    assert names == ["wait"] + ["copy"] * (2 if nparams else 1) + ["launch", "launch", "record"]
    p = g._passes[0]
    if nparams:
        assert log[1][1] == p.params_dev.data.ptr and log[1][2] == params.tobytes()
        assert np.array_equal(p.params_dev.a[: n * nparams], params.ravel())
    table = np.frombuffer(bytes(p.samples_dev.a[: n * SAMPLE_DTYPE.itemsize]), SAMPLE_DTYPE)
    assert table["src"].tolist() == [raw.data.ptr + i * 16 * 16 * 3 for i in range(n)]
    assert table["mirror"].tolist() == flips.astype(int).tolist() and (table["rw"] == 16).all()
    op_launch, norm_launch = [c for c in log if c[0] == "launch"]
    grid = (n, 1, 1) if op.cuda_block_per_image else ((16 * 16 + 255) // 256, n, 1)
    assert op_launch[1:4] == (901, grid, (256, 1, 1))
    assert op_launch[6] == (raw.data.ptr, n, 16, 16, p.params_dev.data.ptr, nparams)
    sc, bi = scale_bias(g.output.mean, g.output.std)
    assert norm_launch[1] == 902 and norm_launch[2] == (1, 2, n)
    assert norm_launch[6] == (p.samples_dev.data.ptr, out.data.ptr, 16, 16, *(float(v) for v in (*sc, *bi)))
    assert log[-1] == ("record", done.ptr, 55) and p.done is done and p.held[0] is raw
    assert p.host()[0] is p._sets[1][0]  # the next pass fills the other host set
    log.clear()
    g._normalise(raw, dec, 0, (), flips=~flips, op=(op, params))  # the next pass waits for this one first
    assert log[0] == ("sync", done.ptr)
    table = np.frombuffer(bytes(p.samples_dev.a[: n * SAMPLE_DTYPE.itemsize]), SAMPLE_DTYPE)
    assert table["mirror"].tolist() == (~flips).astype(int).tolist()
    assert p.host()[0] is p._sets[0][0]  # two passes queued: the first set again
    g2, dec2, log2, keep2 = _batcher(monkeypatch, op, fail=("copy", 0))
    with pytest.raises(CudaError, match=r"cuMemcpyHtoDAsync \(copy 1 of"):
        g2._normalise(raw, dec2, 0, (), flips=flips, op=(op, params))
    p2 = g2._passes[0]
    assert dec2.stream.synced == 1 and p2.done is None and p2.held == ()
    assert p2.host()[0] is p2._sets[0][0]  # the failed pass's set is the next pass's again


def test_user_op_pass_of_a_non_square_size_resamples_h_by_w_in_the_kernels_own_source(monkeypatch, tmp_path):
    """size=(h, w) through GPUBackend._normalise on the driver's stand-ins: each image's source
    is h × w (packed back to back), the normalising kernel's grid and (W, H) arguments are the
    output's; the sample table it uploads, run through native/gpu_resize.cu built for the host,
    gives the uint8 batch back (a 1:1 resample is a copy), mirrored where flipped."""
    import ctypes as C

    from host_kernel import build

    from recordtool.decode.gpu.kernel import SAMPLE_DTYPE
    from recordtool.ops import ImageOp

    class Flat(ImageOp):
        cuda_name, cuda_source = "flat", "x"

        def params(self, n, keys, h, w):
            return np.zeros((n, 0))

    h, w, n = 12, 20, 5
    g, dec, log, keep = _batcher(monkeypatch, Flat(), size=(h, w))
    raw = _Arr(np.random.default_rng(0).integers(0, 256, (n, h, w, 3), dtype=np.uint8))
    flips = np.array([1, 0, 0, 1, 1], bool)
    g._normalise(raw, dec, 0, (), flips=flips, op=(Flat(), np.zeros((n, 0))))
    p = g._passes[0]
    table = np.frombuffer(bytes(p.samples_dev.a[: n * SAMPLE_DTYPE.itemsize]), SAMPLE_DTYPE).copy()
    assert table["src"].tolist() == [raw.data.ptr + i * h * w * 3 for i in range(n)]
    assert (table["rw"] == w).all() and (table["rh"] == h).all() and (table["pitch"] == w * 3).all()
    assert (table["x1"] == w).all() and (table["y1"] == h).all()
    norm_launch = [c for c in log if c[0] == "launch"][-1]
    assert norm_launch[2] == ((w + 31) // 32, (h + 7) // 8, n) and norm_launch[6][2:4] == (w, h)
    lib = build(tmp_path)
    if lib is None:
        pytest.skip("no C++ compiler")
    out = np.zeros((n, h, w, 3), np.uint8)
    lib.run(C.c_void_p(table.ctypes.data), n, C.c_void_p(out.ctypes.data), w, h)
    want = raw.a.copy()
    want[flips] = want[flips, :, ::-1]
    assert np.array_equal(out, want)
