"""The GPU kernel reproduces the CPU path's DCT scaling (a window much larger than the output is
decoded by libjpeg at 1/2 or 1/4, then resampled): checked without a GPU. The numpy reference
(decode.gpu.reference.reduced_planes_to_rgb) against libjpeg-turbo's own scaled decode; the
kernel's own source, built for the host, against the reference on whole and region planes; the
planner (roi.dct_reduction, plan_rois) against the CPU path's scale rule."""
import ctypes
import io

import numpy as np
import pytest
from conftest import cut_to_region, sharp_chroma

from recordtool.decode.gpu.buffers import scaled_boxes
from recordtool.decode.gpu.kernel import FMT_GRAY, FMT_YCC, SAMPLE_DTYPE
from recordtool.decode.gpu.reference import chroma_size, reduced_planes_to_rgb, resize_normalize
from recordtool.decode.gpu.roi import SUBSAMPLING, dct_reduction, plan_rois
from recordtool.decode.windows import random_windows
from recordtool.tools.fidelity import psnr

CODES = {"444": 0, "422": 1, "420": 2, "440": 3, "gray": 6}
TJ_SUB = {"444": 0, "422": 1, "420": 2, "440": 4, "gray": 3}  # TurboJPEG's TJSAMP_*


@pytest.mark.parametrize("layout,red", [("420", 2), ("420", 4), ("444", 2), ("444", 4), ("422", 2), ("440", 2),
                                        ("gray", 2), ("gray", 4)])
def test_reference_is_libjpegs_scaled_decode(layout, red):
    """libjpeg-turbo's reduced IDCTs output the mean of each red × red group of the full IDCT's
    pixels, chroma at the larger IDCT size its sampling allows: the reference, made from the full
    decode's planes, equals libjpeg's decode at 1 / red up to the rounding of the full decode's
    pixels before their mean (a few levels on isolated pixels)."""
    from recordtool.codec import turbojpeg

    tj = turbojpeg()
    from turbojpeg import TJPF_GRAY, TJPF_RGB

    for k, (w, h) in enumerate([(333, 251), (500, 375), (61, 47), (802, 611)]):
        img = np.asarray(sharp_chroma(w, h, seed=k))
        if layout == "gray":
            from PIL import Image

            buf = io.BytesIO()
            Image.fromarray(img).convert("L").save(buf, "JPEG", quality=90)
            data = buf.getvalue()
        else:
            data = tj.encode(img, quality=90, pixel_format=TJPF_RGB, jpeg_subsample=TJ_SUB[layout])
        planes = [tj.decode(data, pixel_format=TJPF_GRAY)[:, :, 0]] if layout == "gray" else tj.decode_to_yuv_planes(data)
        hs, vs = SUBSAMPLING[CODES[layout]]
        ref = reduced_planes_to_rgb(planes[0], red=red) if layout == "gray" else \
            reduced_planes_to_rgb(planes[0], planes[1], planes[2], hs, vs, red)
        lib = tj.decode(data, pixel_format=TJPF_RGB, scaling_factor=(1, red))
        assert lib.shape == ref.shape == (-(-h // red), -(-w // red), 3)
        diff = np.abs(lib.astype(int) - ref.astype(int))[:-1, :-1]  # the last (padded) block row / column apart
        assert psnr(lib, ref) >= 44.0 and (diff > 2).mean() < 0.03, (layout, red, w, h)


def test_red_one_is_the_full_scale_image():
    rng = np.random.default_rng(3)
    y, cb, cr = rng.integers(0, 256, (9, 13), np.uint8), rng.integers(0, 256, (5, 7), np.uint8), \
        rng.integers(0, 256, (5, 7), np.uint8)
    from recordtool.decode.gpu.reference import planes_to_rgb

    assert np.array_equal(reduced_planes_to_rgb(y, cb, cr, 2, 2, 1), planes_to_rgb(y, cb, cr, 2, 2))


def test_reduction_follows_the_cpu_scale_rule():
    """dct_reduction (vectorised, per chroma code) = 8 / the CPU path's choose_scale with its
    min_scale, for every window."""
    from recordtool.decode import reference as R

    rng = np.random.default_rng(0)
    n = 4000
    w, h = rng.integers(1, 3000, n), rng.integers(1, 3000, n)
    win = random_windows(w, h, np.arange(n), 0, 0)
    css = rng.choice([0, 1, 2, 3, 6], n)
    for size in [(224, 224), (160, 288), (64, 64)]:
        red = dct_reduction(win, css, size)
        want = [8 // R.choose_scale(float(b[3]), float(b[2]), size[1], size[0], R.SCALE_MARGIN,
                                    4 if c in (1, 3) else 2) for b, c in zip(win, css)]
        assert red.tolist() == want


@pytest.mark.parametrize("layout", ["420", "422", "440", "444", "gray"])
def test_kernel_reduced_equals_reference_on_whole_and_region_planes(host_kernel, layout):
    """The kernel's own source on samples as GPUDecoder places them (buffers.scaled_boxes, the
    planned region's planes): the reference's reduced image, cut to the window's whole-pixel
    region there and resampled (what the CPU path does at that scale), within one level; the
    region planes give the whole planes' bytes."""
    hs, vs = SUBSAMPLING[CODES[layout]]
    code = CODES[layout]
    H, W = 224, 224
    for k, (w, h) in enumerate([(1201, 799), (997, 1403), (3001, 2000), (733, 561)]):
        rng = np.random.default_rng(k)
        cw, ch = chroma_size(w, h, hs, vs)
        planes = [rng.integers(0, 256, (h, w), dtype=np.uint8)]
        if layout != "gray":
            planes += [rng.integers(0, 256, (ch, cw), dtype=np.uint8) for _ in range(2)]
        win = random_windows(np.full(10, w), np.full(10, h), np.arange(10) + 20 * k, 0, 0, scale=(0.3, 1.0))
        win = np.concatenate([win, [[0, 0, h, w], [h - min(h, 500), w - min(w, 520), min(h, 500), min(w, 520)]]]).astype(np.float64)
        red = dct_reduction(win, np.full(len(win), code), (H, W))
        assert (red > 1).any()
        n = len(win)
        rois = plan_rois(win, np.full(n, w), np.full(n, h), np.full(n, code), (H, W), red=red)
        box = scaled_boxes(win, red, np.full(n, w), np.full(n, h))
        rows = np.zeros((2, n), SAMPLE_DTYPE)
        keep = []
        for j in range(n):
            for m, roi in enumerate([(0, 0, w, h), tuple(rois[j])]):
                cut = [np.ascontiguousarray(p) for p in cut_to_region(planes, roi, hs, vs) if p is not None]
                keep += cut
                r = rows[m, j]
                f = int(red[j])
                r["src"], r["pitch"], r["rw"], r["rh"] = cut[0].ctypes.data, cut[0].shape[1], -(-w // f), -(-h // f)
                r["x0"], r["y0"], r["x1"], r["y1"] = box[j, :4]
                r["mirror"], r["hs"], r["vs"], r["ox"], r["oy"] = j % 2, hs, vs, roi[0], roi[1]
                r["format"] = FMT_GRAY if layout == "gray" else FMT_YCC
                r["cw"], r["ch"] = (0, 0) if layout == "gray" else (cw, ch)
                if layout != "gray":
                    r["cb"], r["cr"], r["cpitch"] = cut[1].ctypes.data, cut[2].ctypes.data, cut[1].shape[1]
                r["red"], r["iw"], r["ih"] = (f if f > 1 else 0), w, h
                r["tx0"], r["ty0"], r["tx1"], r["ty1"] = box[j, 4:]
        outs = np.zeros((2, n, H, W, 3), np.uint8)
        for m in range(2):
            host_kernel.run(ctypes.c_void_p(rows[m].ctypes.data), n, ctypes.c_void_p(outs[m].ctypes.data), W, H)
        bad = [j for j in range(n) if not np.array_equal(outs[0, j], outs[1, j])]
        assert not bad, (layout, w, h, [(j, int(red[j]), win[j].tolist(), rois[j].tolist()) for j in bad])
        reduced = {f: (reduced_planes_to_rgb(planes[0], red=f) if layout == "gray" else
                       reduced_planes_to_rgb(planes[0], planes[1], planes[2], hs, vs, f)) for f in set(red.tolist())}
        for j in range(n):
            f = int(red[j])
            bx0, by0, bx1, by1, rx0, ry0, rx1, ry1 = box[j]
            region = reduced[f][int(ry0):int(ry1), int(rx0):int(rx1)]  # the CPU path's region at its scale
            b = (bx0 - rx0, by0 - ry0, bx1 - rx0, by1 - ry0)
            ref = np.rint(resize_normalize(region, b, H, W, mirror=bool(j % 2)))
            assert np.abs(outs[0, j].astype(np.float64) - ref).max() <= 1.0, (layout, w, h, j, f)
