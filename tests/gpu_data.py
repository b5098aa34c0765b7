"""Test data and measures shared by the GPU path's tests (tests/gpu/) and their checks without a
GPU (test_gpu_plan.py, test_gpu_reference.py): a mixed batch of JPEGs and its route codes, files of
every chroma layout, libjpeg's planes, PSNR and the GPU-vs-CPU fidelity bounds."""
import io

import numpy as np

from conftest import photo_like
from recordtool.decode import random_windows
from recordtool.decode.gpu import route


def psnr(a, b):
    mse = ((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2).mean()
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def mixed_jpegs(n=24):
    out, sizes = [], []
    for k in range(n):
        w, h = [(500, 375), (375, 500), (640, 480), (333, 500)][k % 4]
        im = photo_like(w, h, seed=k)
        if k % 7 == 3:
            im = im.convert("L")
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=92, subsampling=[2, 1, 0][k % 3], progressive=(k % 5 == 4))
        out.append(buf.getvalue())
        sizes.append((w, h))
    return out, np.array(sizes)


def index_routes(bufs):
    """Route codes, as the index columns give them."""
    from recordtool.format.jpeg import probe

    infos = [probe(b) for b in bufs]
    return route([i.chroma for i in infos], [i.progressive for i in infos], [i.colorspace for i in infos])


# nvJPEG's decoders (engines and hybrid) upsample 4:2:0 / 4:2:2 chroma by replication; libjpeg-turbo
# (our CPU path, and Pillow) by its "fancy" triangle filter. On the H200 the raw decoded regions
# equalled libjpeg-turbo's TJFLAG_FASTUPSAMPLE decode to 0.1 dB (34.6 dB vs fancy on the worst
# photo window, both ways), 4:4:4 bit-exact, gray ≥ 65 dB (benchmarks/gpu_fidelity.py). README states
# the resulting bound: GPU vs CPU ≥ 35 dB per image on real photos (1st percentile ≥ 40 dB).
BOUND_DB = 35.0
# chroma="interpolate" (libjpeg's upsampling in our kernel): what is left is resampling (the CPU
# path's DCT-scaled decodes and crop edges, the kernel's float sums)
INTERPOLATED_DB = 45.0
# windows the CPU decodes DCT-scaled: its scaled IDCT and resampling differ from a full decode +
# antialiased resize whatever the chroma (README: the CPU path against Pillow ≥ 39.8 dB there)
SCALED_DB = 40.0


def interp_bound(data, window, out=224) -> float:
    """The GPU-vs-CPU bound of chroma="interpolate" for one window: INTERPOLATED_DB where the
    CPU decodes at full scale, SCALED_DB where it decodes DCT-scaled (choose_scale)."""
    from recordtool import _native
    from recordtool.decode import reference as R

    y, x, h, w = window
    m = _native.choose_scale(float(w), float(h), out, out, R.SCALE_MARGIN, R.min_scale(data))
    return INTERPOLATED_DB if m == 8 else SCALED_DB


def sharp_jpegs(side, subsampling, n=3, gray=False):
    from conftest import sharp_chroma

    out = []
    for k in range(n):
        im = sharp_chroma(side, side * 3 // 4, seed=k)
        buf = io.BytesIO()
        (im.convert("L") if gray else im).save(buf, "JPEG", quality=90, subsampling=subsampling)
        out.append(buf.getvalue())
    return out


# nvJPEG decodes whole images to planar YCbCr; the kernel upsamples chroma with libjpeg-turbo's
# fancy (triangle) filter and converts with libjpeg's fixed-point tables (decode.gpu.reference.planes_to_rgb).
def libjpeg_planes(data):
    """libjpeg-turbo's decoded planes before upsampling (TurboJPEG's YUV decode), cropped to
    the image: [Y] for grayscale, else [Y, Cb, Cr] at their subsampled sizes."""
    from turbojpeg import TJPF_GRAY

    from recordtool.codec import turbojpeg
    from recordtool.format.jpeg import CHROMA_GRAY, probe

    info = probe(data)
    if info.chroma == CHROMA_GRAY:
        return [turbojpeg().decode(data, pixel_format=TJPF_GRAY)[:, :, 0]]
    y, cb, cr = turbojpeg().decode_to_yuv_planes(data)
    return [y[: info.height, : info.width], cb, cr]


def to_440(data: bytes) -> bytes:
    """A baseline 4:2:2 JPEG (width % 16 == 0, height % 8 == 0) relabelled as 4:4:0 of half the
    width and twice the height: the same MCUs in the same order, so a valid 4:4:0 file (Pillow
    cannot write 4:4:0; the content is scrambled, the chroma layout is what matters)."""
    b = bytearray(data)
    i = 2
    while b[i + 1] != 0xC0:
        i += 2 + ((b[i + 2] << 8) | b[i + 3])
    h, w = (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8]
    assert w % 16 == 0 and h % 8 == 0 and b[i + 11] == 0x21
    b[i + 5:i + 7], b[i + 7:i + 9], b[i + 11] = (2 * h).to_bytes(2, "big"), (w // 2).to_bytes(2, "big"), 0x12
    return bytes(b)


def layout_jpeg(w, h, layout, seed=0, progressive=False):
    from conftest import sharp_chroma

    buf = io.BytesIO()
    im = sharp_chroma(w, h, seed=seed)
    if layout == "gray":
        im.convert("L").save(buf, "JPEG", quality=90, progressive=progressive)
    else:
        sub = {"444": 0, "422": 1, "420": 2, "440": 1}[layout]
        im.save(buf, "JPEG", quality=90, subsampling=sub, progressive=progressive)
    return to_440(buf.getvalue()) if layout == "440" else buf.getvalue()


LAYOUT_SUB = {"444": (1, 1), "422": (2, 1), "420": (2, 2), "440": (1, 2)}


def edge_windows(w, h, n, seed):
    """RandomResizedCrop windows plus windows on every edge and corner, 1-pixel and whole ones."""
    win = random_windows(np.full(n, w), np.full(n, h), np.arange(n) + seed, seed, 0)
    edges = [[0, 0, h, w], [0, 0, 1, 1], [h - 1, w - 1, 1, 1], [0, w - min(w, 7), min(h, 5), min(w, 7)],
             [h - min(h, 6), 0, min(h, 6), min(w, 9)], [h // 3, w // 3, h - h // 3, w - w // 3]]
    return np.concatenate([win, np.array(edges, np.int64)])
