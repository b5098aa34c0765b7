"""chroma="interpolate" decoding only each window's region (recordtool.decode.gpu.roi), checked
without a GPU: the planned regions are MCU-aligned and hold every pixel the kernel's taps read
and every chroma sample libjpeg's fancy upsampling takes beside them; from a region's planes
(libjpeg's whole planes cut to it, what a region decode gives) the kernel's reference and the
kernel's own source, built for the host, give the whole-image pixels bit for bit."""
import ctypes
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import cut_to_region

from recordtool.decode.gpu.roi import MARGIN, SUBSAMPLING, chroma_dims, plan_rois, tap_span
from recordtool.decode.gpu.reference import chroma_size, planes_to_rgb, region_planes_to_rgb
from recordtool.decode.windows import random_windows

CODES = {"444": 0, "422": 1, "420": 2, "440": 3, "gray": 6}


def kernel_taps(a0, a1, size, out):
    """[lo, hi) of every output's taps along one axis, in float32 like gpu_resize.cu `taps`."""
    f = np.float32
    a0, a1 = f(a0), f(a1)
    scale = f((a1 - a0) / f(out))
    fs = max(scale, f(1.0))
    lo, hi = [], []
    for o in range(out):
        center = f(a0 + f(f(o) + f(0.5)) * scale)
        lo.append(max(int(f(center - fs + f(0.5))), 0))
        hi.append(min(int(f(center + fs + f(0.5))), size))
    return np.array(lo), np.array(hi)


def _cases(seed=0):
    """(width, height, chroma code, windows) of odd and even sizes, RandomResizedCrop windows
    and windows on every edge and corner, 1-pixel and whole-image ones."""
    out = []
    for k, (w, h) in enumerate([(333, 251), (17, 9), (500, 375), (64, 48), (1201, 799), (5, 3), (3, 31)]):
        win = random_windows(np.full(12, w), np.full(12, h), np.arange(12) + 50 * k, seed, 0).astype(np.float64)
        edges = np.array([[0, 0, h, w], [0, 0, 1, 1], [h - 1, w - 1, 1, 1], [0, w - min(w, 7), min(h, 5), min(w, 7)],
                          [h - min(h, 6), 0, min(h, 6), min(w, 9)], [h // 3, w // 3, h - h // 3, w - w // 3]], np.float64)
        win = np.concatenate([win, edges])
        out += [(w, h, code, win) for code in SUBSAMPLING]
    return out


@pytest.mark.parametrize("size", [(224, 224), (64, 96), (500, 500)])
def test_regions_are_aligned_and_hold_every_tap_and_its_chroma_neighbours(size):
    for w, h, code, win in _cases():
        n = len(win)
        rois = plan_rois(win, np.full(n, w), np.full(n, h), np.full(n, code), size)
        hs, vs = SUBSAMPLING[code]
        rx, ry, rw, rh = rois.T
        assert (rx % (8 * hs) == 0).all() and (ry % (8 * vs) == 0).all()
        assert ((rx + rw == w) | ((rx + rw) % (8 * hs) == 0)).all() and ((ry + rh == h) | ((ry + rh) % (8 * vs) == 0)).all()
        assert (rx >= 0).all() and (ry >= 0).all() and (rw > 0).all() and (rh > 0).all()
        assert (rx + rw <= w).all() and (ry + rh <= h).all()
        cw, ch = chroma_size(w, h, hs, vs)
        ccols, crows = chroma_dims(rois, hs, vs)
        assert (rx // hs + ccols <= cw).all() and (ry // vs + crows <= ch).all()  # inside the whole plane
        for k, (y, x, wh, ww) in enumerate(win):
            for a0, a1, axis, out, r0, r1, sub, csize in ((x, x + ww, w, size[1], rx[k], rx[k] + rw[k], hs, cw),
                                                          (y, y + wh, h, size[0], ry[k], ry[k] + rh[k], vs, ch)):
                lo, hi = kernel_taps(a0, a1, axis, out)
                assert r0 <= lo.min() and hi.max() <= r1, (w, h, code, k, r0, r1, lo.min(), hi.max())
                if sub == 2:  # the nearer and the further chroma sample of every pixel read
                    px = np.arange(lo.min(), hi.max())
                    near = np.minimum(px >> 1, csize - 1)
                    far = np.clip(np.where(px & 1, near + 1, near - 1), 0, csize - 1)
                    c0, c1 = r0 // 2, -(-r1 // 2)
                    assert (np.minimum(near, far) >= c0).all() and (np.maximum(near, far) < c1).all()


def test_tap_span_is_the_kernels_plus_margin():
    for a0, a1, size, out in [(0.0, 500.0, 500, 224), (10.0, 60.0, 100, 224), (3.5, 4.5, 10, 224), (0.0, 1.0, 1, 7)]:
        lo, hi = kernel_taps(a0, a1, size, out)
        slo, shi = tap_span(np.array([a0]), np.array([a1]), np.array([size]), out)
        assert max(0, lo.min() - MARGIN - 1) <= slo[0] <= lo.min() and hi.max() <= shi[0] <= min(size, hi.max() + MARGIN + 1)


def test_unknown_chroma_code_is_refused():
    with pytest.raises(ValueError, match="chroma"):
        plan_rois(np.array([[0, 0, 8, 8]]), [64], [64], [4], (224, 224))  # 4:1:1: no planar layout


def _jpeg(w, h, layout, seed):
    import io

    from conftest import sharp_chroma

    buf = io.BytesIO()
    im = sharp_chroma(w, h, seed=seed)
    if layout == "gray":
        im.convert("L").save(buf, "JPEG", quality=90)
    else:
        im.save(buf, "JPEG", quality=90, subsampling={"444": 0, "422": 1, "420": 2}[layout])
    return buf.getvalue()


def _libjpeg_planes(data):
    from turbojpeg import TJPF_GRAY

    from recordtool.codec import turbojpeg
    from recordtool.format.jpeg import CHROMA_GRAY, probe

    info = probe(data)
    if info.chroma == CHROMA_GRAY:
        return [turbojpeg().decode(data, pixel_format=TJPF_GRAY)[:, :, 0]]
    y, cb, cr = turbojpeg().decode_to_yuv_planes(data)
    return [y[: info.height, : info.width], cb, cr]


def _synthetic_440(w, h, seed):
    """Planes of a 4:4:0 image (Pillow cannot write 4:4:0 files): random Y and half-height chroma."""
    rng = np.random.default_rng(seed)
    cw, ch = chroma_size(w, h, 1, 2)
    return [rng.integers(0, 256, (h, w), dtype=np.uint8), rng.integers(0, 256, (ch, cw), dtype=np.uint8),
            rng.integers(0, 256, (ch, cw), dtype=np.uint8)]


@pytest.mark.parametrize("layout", ["420", "422", "444", "440", "gray"])
@pytest.mark.parametrize("wh", [(333, 251), (17, 9), (64, 48), (5, 3), (3, 31)])
def test_region_planes_give_the_whole_image_pixels(layout, wh):
    """The reference level of windowed interpolate: libjpeg's planes cut to each planned region,
    upsampled with the whole image's edge rules (decode.gpu.reference.region_planes_to_rgb, what the kernel
    does with ox / oy), are the whole-image decode's pixels in that region, bit for bit."""
    w, h = wh
    hs, vs = {"444": (1, 1), "422": (2, 1), "420": (2, 2), "440": (1, 2), "gray": (1, 1)}[layout]
    planes = _synthetic_440(w, h, w) if layout == "440" else _libjpeg_planes(_jpeg(w, h, layout, seed=w))
    whole = planes_to_rgb(planes[0]) if layout == "gray" else planes_to_rgb(*planes, hs, vs)
    if layout != "440":  # the whole-image reference is libjpeg's decode itself (tests/test_gpu_reference.py)
        from turbojpeg import TJPF_RGB

        from recordtool.codec import turbojpeg

        assert np.array_equal(whole, turbojpeg().decode(_jpeg(w, h, layout, seed=w), pixel_format=TJPF_RGB))
    cases = [c for c in _cases(1) if c[:3] == (w, h, CODES[layout])]
    win = cases[0][3] if cases else random_windows(np.full(12, w), np.full(12, h), np.arange(12), 1, 0)
    rois = plan_rois(win, np.full(len(win), w), np.full(len(win), h), np.full(len(win), CODES[layout]), (224, 224))
    xlo, xhi = tap_span(win[:, 1], win[:, 1] + win[:, 3], np.full(len(win), w), 224)
    ylo, yhi = tap_span(win[:, 0], win[:, 0] + win[:, 2], np.full(len(win), h), 224)
    for k, roi in enumerate(rois):  # every pixel the kernel reads for the window
        xs, ys = np.arange(xlo[k], xhi[k]), np.arange(ylo[k], yhi[k])
        got = region_planes_to_rgb(*cut_to_region(planes, roi, hs, vs), hs, vs, roi, w, h, xs, ys)
        assert np.array_equal(got, whole[np.ix_(ys, xs)]), (layout, wh, roi)


@pytest.mark.parametrize("layout", ["420", "422", "440", "444", "gray"])
def test_kernel_on_region_planes_equals_kernel_on_whole_planes(host_kernel, layout):
    """The kernel's own source: each window resampled from its region's planes (planes cut to
    plan_rois' region, ox / oy set, pitches of the region) gives the same bytes as from the whole
    image's planes — odd sizes, windows on the edges, mirrored, downscales and upscales."""
    from recordtool.decode.gpu.kernel import SAMPLE_DTYPE
    from recordtool.decode.gpu.kernel import FMT_GRAY, FMT_YCC

    hs, vs = {"444": (1, 1), "422": (2, 1), "420": (2, 2), "440": (1, 2), "gray": (1, 1)}[layout]
    keep = []
    for (w, h, code, win), out_size in zip([c for c in _cases(2) if c[2] == CODES[layout]],
                                           [(224, 224), (37, 29), (224, 224), (64, 96), (224, 224), (7, 5), (33, 9)]):
        rng = np.random.default_rng(w)
        cw, ch = chroma_size(w, h, hs, vs)
        planes = [rng.integers(0, 256, (h, w), dtype=np.uint8)]
        if layout != "gray":
            planes += [rng.integers(0, 256, (ch, cw), dtype=np.uint8) for _ in range(2)]
        n = len(win)
        rois = plan_rois(win, np.full(n, w), np.full(n, h), np.full(n, CODES[layout]), out_size)
        both = np.zeros((2, n), SAMPLE_DTYPE)
        for k in range(n):
            for m, roi in enumerate([(0, 0, w, h), tuple(rois[k])]):
                cut = [np.ascontiguousarray(p) for p in cut_to_region(planes, roi, hs, vs) if p is not None]
                keep += cut
                row = both[m, k]
                y, x, wh, ww = win[k]
                row["src"], row["pitch"], row["rw"], row["rh"] = cut[0].ctypes.data, cut[0].shape[1], w, h
                row["x0"], row["y0"], row["x1"], row["y1"] = x, y, x + ww, y + wh
                row["mirror"], row["hs"], row["vs"], row["ox"], row["oy"] = k % 2, hs, vs, roi[0], roi[1]
                row["format"] = FMT_GRAY if layout == "gray" else FMT_YCC
                if layout != "gray":
                    row["cb"], row["cr"], row["cpitch"] = cut[1].ctypes.data, cut[2].ctypes.data, cut[1].shape[1]
                    row["cw"], row["ch"] = cw, ch
        H, W = out_size
        outs = np.zeros((2, n, H, W, 3), np.uint8)
        for m in range(2):
            host_kernel.run(ctypes.c_void_p(both[m].ctypes.data), n, ctypes.c_void_p(outs[m].ctypes.data), W, H)
        assert np.array_equal(outs[0], outs[1]), (layout, w, h)
        keep.clear()


class _Headers:
    """Stands in for nvJPEG's header reader (image_infos) from recordtool's own parse; its chroma
    codes are nvJPEG's. A file that does not parse gets BAD_JPEG (3), as nvjpegGetImageInfo does."""

    def __init__(self, buffers):
        self.by_ptr = {np.frombuffer(b, np.uint8).ctypes.data: b for b in buffers}

    def image_infos(self, ptrs, lengths):
        from recordtool.format.jpeg import CHROMA_GRAY, probe

        rows = []
        for p in ptrs:
            try:
                i = probe(self.by_ptr[p])
            except Exception:
                rows.append((3, 0, 0, 0, 0, 0, 0))
                continue
            hs, vs = SUBSAMPLING.get(i.chroma, (1, 1))
            cw, ch = chroma_size(i.width, i.height, hs, vs)
            rows.append((0, 1 if i.chroma == CHROMA_GRAY else 3, i.chroma, i.width, i.height, cw, ch))
        return np.array(rows, np.int64)


def _arena(size: int):
    """A stand-in for the device arena: an address and a size in bytes."""
    return type("Arena", (), {"data": type("Ptr", (), {"ptr": 1 << 20})(), "size": int(size)})()


def _decoder_without_gpu(buffers, planar_roi):
    """A GPUDecoder's planar placement with its device parts stood in for: a host arena address,
    the sample table in host memory, the header reader above."""
    from recordtool.decode.gpu.kernel import SAMPLE_DTYPE
    from recordtool.decode.gpu.buffers import DecodeBuffers
    from recordtool.decode.gpu.decoder import GPUDecoder

    buf = DecodeBuffers.__new__(DecodeBuffers)
    buf.planned = False  # no warm-up: room_for grows (the stand-in's reserve) and takes every image
    buf.samples = np.zeros(len(buffers), SAMPLE_DTYPE)
    buf.arena = _arena(1 << 40)
    buf.reserve = lambda staging, arena: None
    dec = GPUDecoder.__new__(GPUDecoder)
    dec.buf, dec.size, dec.planar_roi, dec.hw, dec.hybrid = buf, (224, 224), planar_roi, _Headers(buffers), None
    dec.planar_regions = {"engines": planar_roi, "hybrid": planar_roi}
    return dec


def test_planar_placement_plans_regions_and_refuses_what_the_kernel_does_not_take():
    """GPUDecoder._place_planar (no GPU needed): each engine / hybrid image gets its region
    (plan_rois) or its whole image, sample rows with ox / oy and the whole image's geometry, and
    planes sized by the region; a header that does not parse, a window the header does not hold
    and gray on the engines go to the CPU path."""
    from recordtool.decode.gpu.kernel import FMT_GRAY, FMT_YCC
    from recordtool.decode.gpu.plan import Assignment

    bufs = [_jpeg(333, 251, "420", 1), _jpeg(64, 48, "422", 2), _jpeg(17, 9, "444", 3), _jpeg(40, 30, "gray", 4),
            b"\xff\xd8 not a jpeg \xff\xd9", _jpeg(40, 30, "gray", 5), _jpeg(50, 40, "420", 6)]
    win = np.array([[10, 20, 200, 250], [0, 0, 48, 64], [8, 16, 1, 1], [0, 0, 30, 40], [0, 0, 8, 8], [3, 4, 20, 20],
                    [0, 0, 41, 50]], np.float64)  # the last: a window the header (40 rows) does not hold
    for planar_roi, engines_regions in ((True, True), (False, False), (True, False)):
        dec = _decoder_without_gpu(bufs, planar_roi)
        dec.planar_regions["engines"] = engines_regions  # (True, False): engines whole, hybrid regions
        plan = Assignment(engine=np.array([0, 1, 2, 3, 6]), hybrid=np.array([4, 5]), cpu=np.zeros(0, np.int64), forced=0)
        places, refused, overflow = dec._place_planar(dec.buf, bufs, win, plan)
        assert sorted(refused) == [3, 4, 6] and plan.engine.tolist() == [0, 1, 2] and plan.hybrid.tolist() == [5]
        assert overflow == 0 and plan.cpu.tolist() == []
        s = dec.buf.samples
        for i, (w, h, code) in {0: (333, 251, 2), 1: (64, 48, 1), 2: (17, 9, 0), 5: (40, 30, 6)}.items():
            planes, pitches, gray, roi = places[i]
            hs, vs = SUBSAMPLING[code]
            regions = engines_regions if i in (0, 1, 2) else planar_roi
            want = tuple(plan_rois(win[i:i + 1], [w], [h], [code], (224, 224))[0]) if regions else None
            assert roi == want and gray == (code == 6)
            rx, ry, rw, rh = want or (0, 0, w, h)
            assert (s["ox"][i], s["oy"][i], s["rw"][i], s["rh"][i], s["pitch"][i]) == (rx, ry, w, h, rw)
            assert (s["x0"][i], s["y0"][i], s["x1"][i], s["y1"][i]) == (win[i, 1], win[i, 0], win[i, 1] + win[i, 3],
                                                                        win[i, 0] + win[i, 2])
            assert s["format"][i] == (FMT_GRAY if gray else FMT_YCC) and planes[0] == s["src"][i]
            if not gray:
                (cc,), (cr,) = chroma_dims([(rx, ry, rw, rh)], hs, vs)
                assert (s["cw"][i], s["ch"][i]) == chroma_size(w, h, hs, vs) and pitches[1] == pitches[2] == cc
                assert planes[1] - planes[0] >= rw * rh and planes[2] - planes[1] >= cc * cr
        # what the decoders take: the same rows as arrays, in one indexing (gray: Y only)
        planes, pitches, gray, rois = places.take([5, 0, 2, 1])
        for k, i in enumerate([5, 0, 2, 1]):
            pl, pt, g, roi = places[i]
            c = 1 if g else 3
            assert gray[k] == g and tuple(rois[k]) == (roi or (0, 0, -1, -1))
            assert tuple(planes[k, :c]) == pl[:c] and tuple(pitches[k, :c]) == pt[:c]
            assert not planes[k, c:].any() and not pitches[k, c:].any()
        with pytest.raises(KeyError):
            places.take([3])  # refused: not placed
    # nothing for the GPU decoders in the batch (split="cpu", or the CPU first): nothing placed
    dec = _decoder_without_gpu(bufs, True)
    plan = Assignment(engine=np.zeros(0, np.int64), hybrid=np.zeros(0, np.int64), cpu=np.arange(7), forced=0)
    assert dec._place_planar(dec.buf, bufs, win, plan) == ({}, [], 0)


def test_planar_placement_sends_the_images_past_the_room_to_the_cpu_share():
    """With buffers sized by a warm-up (planned), _place_planar keeps, in order, each GPU-bound
    image whose planes fit the arena and whose JPEG (the engines' only) fits the staging beside
    those of the images kept before it; the rest join the CPU share (counted), placed nowhere —
    nothing grows."""
    from recordtool.decode.gpu.plan import Assignment
    from recordtool.decode.gpu.room import PlaneLayout, staging_each

    bufs = [_jpeg(333, 251, "420", 1), _jpeg(64, 48, "422", 2), _jpeg(200, 150, "420", 3), _jpeg(40, 30, "gray", 4)]
    win = np.array([[0, 0, 251, 333], [0, 0, 48, 64], [0, 0, 150, 200], [0, 0, 30, 40]], np.float64)
    whole = PlaneLayout([[333, 251, 2, 2, 333, 251, 167, 126], [64, 48, 2, 1, 64, 48, 32, 48],
                         [200, 150, 2, 2, 200, 150, 100, 75], [40, 30, 0, 0, 40, 30, 0, 0]]).total
    lens = staging_each([len(b) for b in bufs])
    for arena, staging, kept in ((whole[:2].sum(), lens.sum(), [0, 1]),        # the arena holds two
                                 (whole.sum(), lens[:1].sum(), [0, 3]),        # the staging holds one engine file
                                 (whole.sum(), lens[:3].sum(), [0, 1, 2, 3])):  # room for all (3 is the hybrid's)
        dec = _decoder_without_gpu(bufs, planar_roi=False)
        dec.buf.planned = True
        dec.buf.arena = _arena(arena)
        dec.buf.staging_np = np.zeros(int(staging), np.uint8)
        plan = Assignment(engine=np.array([0, 1, 2]), hybrid=np.array([3]), cpu=np.array([7], np.int64), forced=1)
        places, refused, overflow = dec._place_planar(dec.buf, bufs, win, plan)
        over = [i for i in range(4) if i not in kept]
        assert refused == [] and overflow == len(over)
        assert plan.engine.tolist() == [i for i in kept if i < 3]
        assert plan.hybrid.tolist() == [i for i in kept if i == 3]
        assert plan.cpu.tolist() == [7] + over  # the forced one first, then those past the room
        for i in kept:
            places[i]
        for i in over:
            with pytest.raises(KeyError):
                places[i]


class _HostArray(np.ndarray):
    """A host array standing in for a CuPy one: `.data.ptr` is its address."""

    @property
    def data(self):
        return type("Ptr", (), {"ptr": self.ctypes.data})()


class _HostCupy:
    @staticmethod
    def full(shape, value, dtype):
        return np.full(shape, value, dtype).view(_HostArray)

    @staticmethod
    def asnumpy(a):
        return np.array(a)


def _write(ptr, pitch, plane):
    for r, row in enumerate(np.ascontiguousarray(plane)):
        ctypes.memmove(ptr + r * pitch, row.ctypes.data, len(row))


def _stand_in(how):
    """decode(data, ptrs, pitches, gray, roi) writing libjpeg's planes as a decoder would: "right"
    (a region's planes at the given pointers), "ignores" (the whole image whatever the region),
    "offset" (the region's planes where they lie in the whole image), "raises"."""
    from recordtool.decode.gpu import roi_check

    def decode(data, ptrs, pitches, gray, roi):
        if how == "raises":
            raise RuntimeError("NVJPEG_STATUS_INVALID_PARAMETER")
        planes = _libjpeg_planes(data)
        half = (roi_check.H + 1) // 2, (roi_check.W + 1) // 2
        code = 6 if gray else {half: 2, (roi_check.H, half[1]): 1, (roi_check.H, roi_check.W): 0}[planes[1].shape]
        shapes = roi_check.plane_shapes(code, None if how == "ignores" else roi)
        hs, vs = SUBSAMPLING[code]
        for c, (p, (r, k)) in enumerate(zip(planes, shapes)):
            if roi is None or how == "ignores":
                _write(ptrs[c], pitches[c], p[:r, :k])
                continue
            ox, oy = (roi[0], roi[1]) if c == 0 else (roi[0] // hs, roi[1] // vs)
            cut = p[oy:oy + r, ox:ox + k]
            at = ptrs[c] + (oy * pitches[c] + ox if how == "offset" else 0)
            _write(at, pitches[c], cut)

    return decode


@pytest.mark.parametrize("how", ["right", "ignores", "offset", "raises"])
def test_region_check_trusts_only_a_decoder_that_writes_regions_right(how):
    """roi_check.regions_decode_right (run once per GPUDecoder): a decoder writing each region's planes where asked
    is trusted with regions; one that ignores the region, writes it at the whole image's offset
    or refuses it is not (its images are then decoded whole)."""
    from recordtool.decode.gpu import roi_check

    layouts = ("420", "422", "444", "gray", "prog420")
    assert roi_check.regions_decode_right(_stand_in(how), layouts, _HostCupy) == (how == "right")


def test_room_goes_to_each_image_that_fits_beside_those_before_it():
    """DecodeBuffers.room_for (no GPU needed): in the batch's order, each image whose planes and
    JPEG slot fit beside those of the earlier images that fit takes room — a large image past
    the room leaves it to the later, smaller ones (GPUDecoder puts the batch's Route.LARGE
    images first); a batch that fits is every image; before a warm-up the buffers grow to take
    all. Checked against a plain loop on random batches."""
    from recordtool.decode.gpu.buffers import DecodeBuffers

    def reference(a, s, room_a, room_s):
        out, ua, us = [], 0, 0
        for x, y in zip(a, s):
            ok = ua + x <= room_a and us + y <= room_s
            out.append(ok)
            ua, us = (ua + x, us + y) if ok else (ua, us)
        return out

    buf = DecodeBuffers.__new__(DecodeBuffers)
    buf.planned, buf.arena, buf.staging_np = True, _arena(100), np.zeros(50, np.uint8)
    assert buf.room_for([60, 30, 20, 10], [0, 0, 0, 0]).tolist() == [True, True, False, True]
    assert buf.room_for([120, 30, 20, 10], [1, 1, 1, 1]).tolist() == [False, True, True, True]
    assert buf.room_for([10, 10], [40, 20]).tolist() == [True, False]  # the staging's room too
    assert buf.room_for([50, 50], [25, 25]).tolist() == [True, True]
    assert buf.room_for([], []).tolist() == []
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        a, s = rng.integers(0, 30, n), rng.integers(0, 12, n)
        assert buf.room_for(a, s).tolist() == reference(a.tolist(), s.tolist(), 100, 50)
    grown = []
    buf.planned, buf.reserve = False, lambda staging, arena: grown.append((staging, arena))
    assert buf.room_for([120, 30], [60, 1]).tolist() == [True, True] and grown == [(61, 150)]


def test_a_large_images_decoder_failure_sends_only_those_images_to_the_cpu():
    """GPUDecoder._decode_engines (device parts stood in for): the batch's engines get their
    images in one call, the Route.LARGE ones go to their own decoder in calls of LARGE_BATCH;
    when that decoder fails, only its images are handed back for the CPU path and the batch's
    engines' work stands — a failure of the batch's own call still fails the batch."""
    from recordtool.decode.gpu.decoder import GPUDecoder

    class Engines:
        def __init__(self, fail=False):
            self.calls, self.fail, self.last_native_seconds = [], fail, None

        def decode(self, ptrs, lengths, rois, dst, pitch, stream, native=True):
            if self.fail:
                raise RuntimeError("refused")
            self.calls.append(list(dst))

    class Places:
        def take(self, idx):
            return np.zeros((len(idx), 4), np.int64), np.asarray(idx), np.ones(len(idx), np.int64)

    recorded = []

    def decoder(hw, large):
        dec = GPUDecoder.__new__(GPUDecoder)
        buf = type("Buf", (), {"staging_np": np.zeros(1 << 16, np.uint8)})()
        dec.chunk, dec.planar, dec.native_submit, dec.large_error = 0, False, False, None
        stream = type("S", (), {"ptr": 0})()
        # one phase, one call: no lanes
        dec.ph = SimpleNamespace(hw=hw, lanes=[], stream=stream, buf=buf, wait=lambda: None)
        dec.hw, dec.hw_large, dec._large_phase = hw, large, None
        dec._large_done = SimpleNamespace(event=SimpleNamespace(record=recorded.append))
        return dec

    bufs = [bytes([255, 216]) + bytes(100 + k) + bytes([255, 217]) for k in range(6)]
    idx, large = np.array([0, 2, 3, 4, 5]), np.array([False, True, False, True, True])
    hw, big = Engines(), Engines()
    dec = decoder(hw, big)
    assert dec._decode_engines(dec.ph, dec._stage(dec.ph, bufs, idx), idx, Places(), large) == (None, [])
    assert hw.calls == [[0, 3]] and big.calls == [[2, 4], [5]]
    # the large images' decoder is shared by the phases: its last call's end is recorded for the other
    assert recorded == [dec.ph.stream] and dec._large_phase is dec.ph
    hw, dec = Engines(), decoder(Engines(), Engines(fail=True))
    dec.ph.hw = hw
    assert dec._decode_engines(dec.ph, dec._stage(dec.ph, bufs, idx), idx, Places(), large) == (None, [2, 4, 5])
    assert hw.calls == [[0, 3]] and "large" in dec.last_gpu_error
    with pytest.raises(RuntimeError, match="refused"):
        refusing = decoder(Engines(fail=True), Engines())
        refusing._decode_engines(refusing.ph, refusing._stage(refusing.ph, bufs, idx), idx, Places(), large)
    # a batch whose large images the CPU path decoded instead: warned once per decoder, not per batch
    dec._large_warned = False
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            dec._note_large_failed(3)
    assert len(seen) == 1 and issubclass(seen[0].category, RuntimeWarning)
    assert "refused 3" in str(seen[0].message) and "refused" in dec.last_gpu_error


def test_a_windows_arena_need_is_its_placed_regions_planes():
    """roi.window_need is what _place_planar lays out for a window: PlaneLayout of plan_rois'
    region at the CPU path's DCT reduction where the decoder decodes regions, else the whole
    image (room.planar_need); a whole-image window's region is the whole image."""
    from recordtool.decode.gpu.roi import dct_reduction
    from recordtool.decode.gpu.roi import window_need
    from recordtool.decode.gpu.room import PlaneLayout, planar_need, planar_subsampling

    for w, h, code, win in _cases():
        n = len(win)
        ws, hs_, css = np.full(n, w), np.full(n, h), np.full(n, code)
        sub = planar_subsampling(css)
        dims = np.stack([ws, hs_, sub[:, 0], sub[:, 1], ws, hs_, 0 * ws, 0 * ws], 1)
        red = dct_reduction(win, css, (224, 224))
        want = PlaneLayout(dims, plan_rois(win, ws, hs_, css, (224, 224), red=red), np.ones(n, bool)).total
        np.testing.assert_array_equal(window_need(win, ws, hs_, css, (224, 224), True), want)
        whole = planar_need(ws, hs_, css)
        np.testing.assert_array_equal(window_need(win, ws, hs_, css, (224, 224), False), whole)
        assert (want <= whole).all()
        full = (win[:, 0] == 0) & (win[:, 1] == 0) & (win[:, 2] == h) & (win[:, 3] == w)
        np.testing.assert_array_equal(want[full], whole[full])


def test_the_arena_holds_a_batch_of_crops_regions_and_the_largest_whole_image():
    """Sized by sample windows (GPUDecoder._region_room, room.crop_room): batch × the regions'
    mean + 4 σ √batch + the largest whole image — less than a batch of whole images when the
    decoders decode regions, and that batch of whole images when they do not."""
    from recordtool.decode.gpu.decoder import GPUDecoder
    from recordtool.decode.gpu.plan import ENGINE, HYBRID
    from recordtool.decode.gpu.roi import window_need
    from recordtool.decode.gpu.room import batch_room, planar_need

    rng = np.random.default_rng(3)
    n = 400
    w, h = rng.integers(100, 900, n), rng.integers(100, 900, n)
    chroma = rng.choice([0, 1, 2, 6], n)
    routes = np.where(chroma == 6, HYBRID, ENGINE)
    ids = np.concatenate([np.arange(n), np.arange(n)])
    win = np.concatenate([random_windows(w, h, np.arange(n), 5, e) for e in (0, 1)]).astype(np.float64)
    whole = planar_need(w, h, chroma)
    dec = GPUDecoder.__new__(GPUDecoder)
    dec.size, dec.max_batch = (224, 224), 32
    for engines, hybrid in ((True, True), (True, False), (False, False)):
        dec.planar_regions = {"engines": engines, "hybrid": hybrid}
        room = dec._region_room((ids, win), w, h, chroma, routes, np.ones(n, bool), int(whole.max()))
        need = window_need(win, w[ids], h[ids], chroma[ids], (224, 224),
                           np.where(routes[ids] == HYBRID, hybrid, engines))
        want = int(np.ceil(32 * need.mean() + 4 * need.std() * np.sqrt(32))) + int(whole.max())
        assert room == want
        if engines:
            assert room < 0.75 * batch_room(whole, 32), (room, batch_room(whole, 32))
        else:  # no regions: a batch of whole images (the sample's), as batch_room's formula gives it
            assert abs(room - batch_room(np.concatenate([whole, whole]), 32)) <= 1
