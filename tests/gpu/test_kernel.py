"""The resize kernel on a GPU against its NumPy reference: interleaved RGB and planar samples,
every output dtype and layout."""
import numpy as np
import pytest

from gpu_data import LAYOUT_SUB
from recordtool.decode.gpu.reference import resize_normalize
from recordtool.decode.spec import scale_bias

from .device import cupy, needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]


@pytest.mark.parametrize("dtype,layout", [("float32", "NCHW"), ("float16", "NHWC"), ("uint8", "NCHW")])
def test_kernel_matches_reference(dtype, layout):
    from recordtool.decode.gpu.kernel import SAMPLE_DTYPE, kernel

    rng = np.random.default_rng(1)
    regions = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(300, 400), (50, 70), (224, 224)]]
    boxes = [(0, 0, 400, 300), (2.5, 1.0, 66.0, 49.5), (0, 0, 224, 224)]
    mirror = [0, 1, 0]
    dev = [cupy.asarray(r) for r in regions]
    samples = np.zeros(3, SAMPLE_DTYPE)
    for k, (r, b) in enumerate(zip(dev, boxes)):
        row = dict(src=r.data.ptr, pitch=r.shape[1] * 3, rw=r.shape[1], rh=r.shape[0], x0=b[0], y0=b[1], x1=b[2],
                   y1=b[3], mirror=mirror[k])  # format 0: interleaved RGB
        for name, v in row.items():
            samples[name][k] = v
    H, W = 96, 112
    out = cupy.empty((3, 3, H, W) if layout == "NCHW" else (3, H, W, 3), dtype)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    kernel(dtype, layout)(((W + 31) // 32, (H + 7) // 8, 3), (32, 8, 1),
                          (cupy.asarray(samples.view(np.uint8)), out, np.int32(W), np.int32(H),
                           *np.concatenate(scale_bias(mean, std))))
    got = cupy.asnumpy(out).astype(np.float64)
    if layout == "NCHW":
        got = got.transpose(0, 2, 3, 1)
    for k in range(3):
        norm = dtype != "uint8"
        ref = resize_normalize(regions[k], boxes[k], H, W, bool(mirror[k]), mean if norm else None,
                               std if norm else None)
        tol = {"float32": 1e-3, "float16": 2e-2, "uint8": 1.0}[dtype]
        assert np.abs(got[k] - (ref if norm else np.rint(ref))).max() <= tol


@pytest.mark.parametrize("fmt", ["420", "422", "440", "444", "gray"])
def test_kernel_planar_matches_reference(fmt):
    """The kernel on planar samples (random planes, odd sizes, windows to the edges, mirror)
    against decode.gpu.reference: planes_to_rgb, then the same resample."""
    from recordtool.decode.gpu.kernel import SAMPLE_DTYPE, kernel
    from recordtool.decode.gpu.kernel import FMT_GRAY, FMT_YCC
    from recordtool.decode.gpu.reference import chroma_size, planes_to_rgb

    rng = np.random.default_rng(7)
    shapes = [(301, 403), (9, 5), (64, 3)]
    boxes = [(0, 0, 403, 301), (0.5, 1.0, 5.0, 8.5), (0.0, 10.0, 3.0, 40.0)]
    hs, vs = LAYOUT_SUB.get(fmt, (1, 1))
    samples = np.zeros(len(shapes), SAMPLE_DTYPE)
    keep, refs = [], []
    for k, ((h, w), box) in enumerate(zip(shapes, boxes)):
        y = rng.integers(0, 256, (h, w + 7), dtype=np.uint8)  # a pitch wider than the plane
        dy = cupy.asarray(y)
        row = dict(src=dy.data.ptr, pitch=w + 7, rw=w, rh=h, x0=box[0], y0=box[1], x1=box[2], y1=box[3],
                   mirror=k % 2, format=FMT_GRAY, hs=1, vs=1)
        if fmt == "gray":
            refs.append(planes_to_rgb(y[:, :w]))
            keep.append(dy)
        else:
            cw, ch = chroma_size(w, h, hs, vs)
            cb = rng.integers(0, 256, (ch, cw + 3), dtype=np.uint8)
            cr = rng.integers(0, 256, (ch, cw + 3), dtype=np.uint8)
            dcb, dcr = cupy.asarray(cb), cupy.asarray(cr)
            keep += [dy, dcb, dcr]
            row.update(format=FMT_YCC, cb=dcb.data.ptr, cr=dcr.data.ptr, cpitch=cw + 3, hs=hs, vs=vs, cw=cw, ch=ch)
            refs.append(planes_to_rgb(y[:, :w], cb[:, :cw], cr[:, :cw], hs, vs))
        for name, v in row.items():
            samples[name][k] = v
    H, W = 40, 56
    out = cupy.empty((len(shapes), H, W, 3), np.uint8)
    kernel("uint8", "NHWC")(((W + 31) // 32, (H + 7) // 8, len(shapes)), (32, 8, 1),
                            (cupy.asarray(samples.view(np.uint8)), out, np.int32(W), np.int32(H),
                             *[np.float32(v) for v in (1, 1, 1, 0, 0, 0)]))  # uint8: not normalised
    got = cupy.asnumpy(out).astype(np.float64)
    for k in range(len(shapes)):
        ref = np.rint(resize_normalize(refs[k], boxes[k], H, W, bool(k % 2)))
        assert np.abs(got[k] - ref).max() <= 1.0, (fmt, k)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_kernel_bfloat16_is_the_float32_result_rounded(layout):
    """The bfloat16 variant writes exactly the float32 variant's values rounded to nearest even
    (decode.spec.bfloat16_bits, the reference the native pass is tested against too)."""
    from recordtool.decode.gpu.kernel import SAMPLE_DTYPE, kernel
    from recordtool.decode.spec import bfloat16_bits

    rng = np.random.default_rng(2)
    regions = [cupy.asarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(120, 90), (64, 64)]]
    samples = np.zeros(2, SAMPLE_DTYPE)
    for k, r in enumerate(regions):  # by field: the struct has more fields (planar sources)
        samples["src"][k], samples["pitch"][k], samples["rw"][k], samples["rh"][k] = \
            r.data.ptr, r.shape[1] * 3, r.shape[1], r.shape[0]
        samples["x0"][k], samples["y0"][k], samples["x1"][k], samples["y1"][k] = \
            1.5, 2.0, r.shape[1] - 3.0, r.shape[0] - 1.0
        samples["mirror"][k] = k
    H, W = 40, 56
    shape = (2, 3, H, W) if layout == "NCHW" else (2, H, W, 3)
    args = [np.int32(W), np.int32(H), *np.concatenate(scale_bias((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))]
    dev_samples = cupy.asarray(samples.view(np.uint8))
    f32, bf = cupy.empty(shape, np.float32), cupy.empty(shape, np.uint16)
    for dtype, out in (("float32", f32), ("bfloat16", bf)):
        kernel(dtype, layout)(((W + 31) // 32, (H + 7) // 8, 2), (32, 8, 1), (dev_samples, out, *args))
    assert np.array_equal(cupy.asnumpy(bf), bfloat16_bits(cupy.asnumpy(f32)))
