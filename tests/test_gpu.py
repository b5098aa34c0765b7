"""GPU path: kernel vs its numpy reference, GPU vs CPU pixels, split, steady-state memory.

The GPU tests skip cleanly without CuPy or a GPU (CI); the reference and routing tests run
everywhere. scripts/device_run.sh runs this file on the H200 machine.
"""
import io
import time

import numpy as np
import pytest
from PIL import Image

from conftest import photo_like
from recordtool.decode import decode_crop_resize, random_flips, random_windows
from recordtool.decode.gpu import route
from recordtool.decode.gpu.plan import CPU, ENGINE, HYBRID, hardware_decodable
from recordtool.decode.gpu.reference import resize_normalize
from recordtool.decode.options import GPUOptions
from recordtool.decode.spec import Output, scale_bias
from recordtool.format.jpeg import CHROMA_411, CHROMA_420, CHROMA_422, CHROMA_GRAY, CS_CMYK, CS_GRAY, CS_YCBCR


def psnr(a, b):
    mse = ((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2).mean()
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def test_routing_from_index_columns():
    chroma = np.array([CHROMA_420, CHROMA_422, CHROMA_420, CHROMA_411, CHROMA_GRAY, -1])
    prog = np.array([0, 0, 1, 0, 0, 0])
    cs = np.array([CS_YCBCR, CS_YCBCR, CS_YCBCR, CS_YCBCR, CS_GRAY, CS_CMYK])
    assert hardware_decodable(chroma, prog, cs).tolist() == [True, True, False, False, False, False]
    # progressive and gray to nvJPEG's hybrid decoder; 4:1:1 and CMYK to the CPU
    assert route(chroma, prog, cs).tolist() == [ENGINE, ENGINE, HYBRID, CPU, HYBRID, CPU]


def test_same_pixels_routes_4_4_4_and_gray_to_the_cpu():
    from recordtool.format.jpeg import CHROMA_444

    chroma = np.array([CHROMA_444, CHROMA_444, CHROMA_GRAY, CHROMA_GRAY, CHROMA_420, CHROMA_422, CHROMA_420, -1])
    prog = np.array([0, 1, 0, 1, 0, 0, 1, 0])
    cs = np.array([CS_YCBCR] * 2 + [CS_GRAY] * 2 + [CS_YCBCR] * 3 + [CS_CMYK])
    assert route(chroma, prog, cs).tolist() == [ENGINE, HYBRID, HYBRID, HYBRID, ENGINE, ENGINE, HYBRID, CPU]
    # nothing to upsample in them: the CPU path decodes them itself; the rest routes as before
    assert route(chroma, prog, cs, same_pixels=True).tolist() == [CPU, CPU, CPU, CPU, ENGINE, ENGINE, HYBRID, CPU]


def test_images_past_the_gpu_size_go_to_their_own_engines_decoder_and_the_buffers_take_the_largest_layout():
    """route(pixels=): above GPU_MAX_PIXELS an engines' image is LARGE (the engines, on a decoder
    of their own) and a hybrid one goes to the CPU path (the batch's decoders' buffers are sized
    by the largest image they see; 4:1:1 stays on the CPU, with same_pixels 4:4:4 too); above
    LARGE_MAX_PIXELS every image goes to the CPU path;
    largest_layout: the engines' buffers are pre-allocated for the widest layout they will see."""
    from recordtool.decode.gpu.decoder import largest_layout
    from recordtool.decode.gpu.plan import GPU_MAX_PIXELS, LARGE, LARGE_MAX_PIXELS
    from recordtool.format.jpeg import CHROMA_411, CHROMA_440, CHROMA_444

    chroma = np.array([CHROMA_420, CHROMA_420, CHROMA_422, CHROMA_422, CHROMA_411, CHROMA_444])
    prog, cs = np.array([0, 0, 1, 1, 0, 0]), np.array([CS_YCBCR] * 6)
    big = 4500 * 3000
    pixels = np.array([GPU_MAX_PIXELS, GPU_MAX_PIXELS + 1, GPU_MAX_PIXELS, big, big, big])
    assert route(chroma, prog, cs, pixels=pixels).tolist() == [ENGINE, LARGE, HYBRID, CPU, CPU, LARGE]
    assert route(chroma, prog, cs, pixels=pixels, same_pixels=True).tolist() == [ENGINE, LARGE, HYBRID, CPU, CPU, CPU]
    assert route(chroma, prog, cs).tolist() == [ENGINE, ENGINE, HYBRID, HYBRID, CPU, ENGINE]
    # past LARGE_MAX_PIXELS nothing goes to a GPU decoder (an index row claiming a huge image
    # would size every producer's large-images decoder, arena and staging at warm-up)
    huge = np.array([LARGE_MAX_PIXELS, LARGE_MAX_PIXELS + 1, 65_500 * 65_500, LARGE_MAX_PIXELS + 1, 10**12, 10**12])
    assert route(chroma, prog, cs, pixels=huge).tolist() == [LARGE, CPU, CPU, CPU, CPU, CPU]
    assert largest_layout([CHROMA_420, CHROMA_420]) == CHROMA_420
    assert largest_layout([CHROMA_420, CHROMA_440]) == CHROMA_440
    assert largest_layout([CHROMA_420, CHROMA_422, CHROMA_444]) == CHROMA_444
    assert largest_layout(None) == largest_layout([]) == CHROMA_444


def test_planar_need_is_what_place_planar_gives_a_whole_image():
    """room.planar_need (the warm-up's estimate from index columns) equals the arena bytes
    place_planar's layout gives each whole image at its chroma layout (PlaneLayout.total, with
    nvJPEG's plane sizes equal to libjpeg's), and 4:4:4 where the layout is unknown."""
    from recordtool.decode.gpu.room import PlaneLayout, planar_need
    from recordtool.format.jpeg import CHROMA_440, CHROMA_444

    layouts = {CHROMA_444: (1, 1), CHROMA_422: (2, 1), CHROMA_420: (2, 2), CHROMA_440: (1, 2), CHROMA_GRAY: (0, 0)}
    rng = np.random.default_rng(0)
    for code, (hs, vs) in layouts.items():
        w, h = rng.integers(1, 3000, 50), rng.integers(1, 3000, 50)
        cw = np.where(hs == 0, 0, -(-w // max(hs, 1)))
        ch = np.where(hs == 0, 0, -(-h // max(vs, 1)))
        dims = np.stack([w, h, np.full(50, hs), np.full(50, vs), w, h, cw, ch], 1)
        assert np.array_equal(planar_need(w, h, np.full(50, code)), PlaneLayout(dims).total), code
    w, h = np.array([640, 33]), np.array([480, 17])
    assert np.array_equal(planar_need(w, h, [-1, 99]), planar_need(w, h))  # unknown: as 4:4:4
    assert np.array_equal(planar_need(w, h), planar_need(w, h, [CHROMA_444] * 2))


def test_batch_room_holds_random_batches_of_a_heavy_tailed_set():
    """room.batch_room: all of a set smaller than a batch; between the largest record and the
    batch's largest records at once; and a random batch of an ImageNet-like mix (a 0.3 % tail
    of images 40× the typical one) fits it — checked over many drawn batches."""
    from recordtool.decode.gpu.room import batch_room

    assert batch_room([5, 7, 9], 8) == 21 and batch_room([], 8) == 0
    rng = np.random.default_rng(1)
    need = np.where(rng.random(8192) < 0.003, rng.integers(8_000_000, 18_000_000, 8192),
                    rng.integers(50_000, 400_000, 8192))
    room = batch_room(need, 256)
    top = np.sort(need)[::-1][:256].sum()
    assert need.max() <= room < top / 2  # far less than the 256 largest at once
    sums = np.array([need[rng.choice(len(need), 256, replace=False)].sum() for _ in range(4000)])
    assert (sums > room).mean() < 0.002


@pytest.mark.parametrize("shape,box,out", [((300, 400), (0, 0, 400, 300), (224, 224)),
                                           ((80, 60), (3.5, 1.25, 57.5, 70.75), (224, 224)),
                                           ((500, 375), (10, 20, 300, 460), (96, 128))])
def test_kernel_reference_matches_pillow(shape, box, out):
    region = np.asarray(photo_like(shape[1], shape[0], seed=4))
    ref = np.asarray(Image.fromarray(region).resize((out[1], out[0]), Image.BILINEAR, box=box))
    got = np.clip(np.rint(resize_normalize(region, box, out[0], out[1])), 0, 255)
    assert psnr(got, ref) > 45
    m = resize_normalize(region, box, out[0], out[1], mirror=True)
    assert np.allclose(m, resize_normalize(region, box, out[0], out[1])[:, ::-1])


try:
    import cupy

    _ngpu = cupy.cuda.runtime.getDeviceCount()
except Exception:  # no CuPy, or no driver
    cupy, _ngpu = None, 0
gpu = pytest.mark.skipif(_ngpu == 0, reason="no CuPy or no CUDA device")


def _jpegs(n=24):
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


def _hw(bufs):
    """Route codes, as the index columns give them."""
    from recordtool.format.jpeg import probe

    infos = [probe(b) for b in bufs]
    return route([i.chroma for i in infos], [i.progressive for i in infos], [i.colorspace for i in infos])


@gpu
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


@gpu
@pytest.mark.parametrize("split", ["gpu", "cpu", "auto", 0.5])
def test_gpu_matches_cpu_40db(split):
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs()
    ids = np.arange(len(bufs))
    win = random_windows(sizes[:, 0], sizes[:, 1], ids, 3, 0)
    flips = random_flips(ids, 3, 0)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split=split), max_batch=32)
    out = cupy.asnumpy(dec(bufs, win, flips, _hw(bufs)))
    ref = decode_crop_resize(bufs, win)
    ref[flips] = ref[flips, :, ::-1]
    for k in range(len(bufs)):
        assert psnr(out[k], ref[k]) >= 40, (k, split, dec.last)
    routes = _hw(bufs)
    assert (routes == HYBRID).sum() >= 6  # progressive and gray files are in the batch
    if split == "cpu":
        assert dec.last.gpu == 0 and dec.last.hybrid == 0
    else:
        if dec.hw is not None and split == "gpu":
            assert dec.last.gpu == int((routes == ENGINE).sum())
        if dec.hybrid is not None:  # every progressive / gray window went through the hybrid decoder
            assert dec.last.hybrid == int((routes == HYBRID).sum()), dec.last
    dec.close()


@gpu
def test_native_submit_matches_the_ctypes_loop():
    """The engines' GIL-free batch submission and the hybrid decoder's batch in one call
    (recordtool._nvsubmit) decode exactly what the ctypes loops they replace decode (their
    reference), and are the default."""
    import inspect

    from recordtool.decode.gpu import nvjpeg
    from recordtool.decode.gpu import GPUDecoder

    assert inspect.signature(GPUDecoder).parameters["native_submit"].default is True
    bufs, sizes = _jpegs()
    ids = np.arange(len(bufs))
    win = random_windows(sizes[:, 0], sizes[:, 1], ids, 5, 0)
    flips = random_flips(ids, 5, 0)
    outs = []
    for native in (False, True):
        dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu"),
                         max_batch=32, native_submit=native)
        if dec.hw is None:
            pytest.skip(f"no NVJPG engines: {dec.hw_error}")
        assert dec.native_submit == native
        outs.append(cupy.asnumpy(dec(bufs, win, flips, _hw(bufs))))
        assert dec.last.gpu == int((_hw(bufs) == ENGINE).sum())
        if dec.hybrid is not None:  # the progressive and gray images, by the hybrid decoder either way
            assert dec.last.hybrid == int((_hw(bufs) == HYBRID).sum()) > 0, dec.last
        dec.close()
    assert nvjpeg._nvsubmit is not None  # built on the GPU machine (setup.py)
    assert np.array_equal(outs[0], outs[1])


@gpu
def test_unpipelined_engines_decode_what_pipelined_ones_decode():
    """The engines' batched calls run without nvJPEG's pipelining by default
    (NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE: a pipelined call waits behind other streams' queued
    work); batches of changing sizes, each read back once its stream is done, give the pixels
    of the pipelined decoder bit for bit."""
    import inspect

    from recordtool.decode.gpu.nvjpeg import FLAGS_HW_DECODE_NO_PIPELINE, HardwareDecoder

    assert inspect.signature(HardwareDecoder).parameters["pipeline"].default is False
    bufs, sizes = _jpegs(40)
    eng = [i for i, r in enumerate(_hw(bufs)) if r == ENGINE]
    pins = [cupy.cuda.alloc_pinned_memory(len(bufs[i])) for i in eng]
    for p, i in zip(pins, eng):
        np.frombuffer(p, np.uint8, len(bufs[i]))[:] = np.frombuffer(bufs[i], np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    got = {}
    for pipeline in (False, True):
        try:
            d = HardwareDecoder(len(eng), pipeline=pipeline)
        except Exception as e:
            pytest.skip(f"no NVJPG engines: {e}")
        assert d.pipeline == pipeline
        outs = []
        for lo, hi in ((0, len(eng)), (3, 9), (0, len(eng) - 2), (5, 6)):  # sizes change: re-initialised
            w, h = sizes[eng[lo:hi]].T
            dst = [cupy.full((int(hh), int(ww) * 3), 7, np.uint8) for ww, hh in zip(w, h)]
            d.decode([p.ptr for p in pins[lo:hi]], [len(bufs[i]) for i in eng[lo:hi]],
                     [(0, 0, int(ww), int(hh)) for ww, hh in zip(w, h)], [x.data.ptr for x in dst],
                     [x.shape[1] for x in dst], stream.ptr)
            stream.synchronize()
            outs += [cupy.asnumpy(x) for x in dst]
        got[pipeline] = outs
        d.close()
    assert all(np.array_equal(a, b) for a, b in zip(got[False], got[True]))
    assert any((x != 7).any() for x in got[False])  # decoded, not the fill
    assert FLAGS_HW_DECODE_NO_PIPELINE == 1  # nvjpeg.h


@gpu
@pytest.mark.parametrize("chroma", ["replicate", "interpolate"])
def test_engine_lanes_decode_what_one_call_decodes(monkeypatch, chroma):
    """engine_lanes=N: a batch's engine images in N calls at once (parts of about equal bytes, each
    on its own state, stream and thread) give the pixels of one call, bit for bit, batch after
    batch; a lane whose call fails sends the whole engine share to the CPU path (no lane left
    writing into the arena), and a bad value is refused."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.errors import ConfigError

    monkeypatch.setattr(GPUDecoder, "LANE_MIN", 4)
    bufs, sizes = _jpegs(29)
    ids = np.arange(len(bufs))
    flips = random_flips(ids, 2, 0)
    outs = {}
    for lanes in (1, 3):
        dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"),
                         GPUOptions(split="gpu", chroma=chroma, engine_lanes=lanes), max_batch=32)
        if dec.hw is None:
            pytest.skip(f"no NVJPG engines: {dec.hw_error}")
        assert dec.engine_lanes == lanes and len(dec._lanes) == lanes - 1
        calls = []  # images per nvJPEG call, over the lanes
        name = "decode_planes" if dec.planar else "decode"
        for d in [dec.hw] + [lane[0] for lane in dec._lanes]:
            real = getattr(d, name)
            monkeypatch.setattr(d, name, lambda ptrs, *a, _real=real, **k: (calls.append(len(ptrs)), _real(ptrs, *a, **k))[1])
        got = []
        for epoch in range(3):
            n = [29, 17, 22][epoch]
            win = random_windows(sizes[:n, 0], sizes[:n, 1], ids[:n], 2, epoch)
            calls.clear()
            got.append(cupy.asnumpy(dec(bufs[:n], win, flips[:n], _hw(bufs[:n]))).copy())
            m = int((_hw(bufs[:n]) == ENGINE).sum())
            assert dec.last.gpu == m > 8, dec.last
            assert sum(calls) == m and len(calls) == min(lanes, m // 4), calls
        outs[lanes] = got
        if lanes > 1:  # a lane refuses: the batch's engine images go to the CPU path, all of them
            def refuse(*a, **k):
                raise RuntimeError("refused")

            monkeypatch.setattr(dec._lanes[-1][0], name, refuse)
            n = 29
            win = random_windows(sizes[:n, 0], sizes[:n, 1], ids[:n], 2, 0)
            out = cupy.asnumpy(dec(bufs[:n], win, flips[:n], _hw(bufs[:n])))
            assert dec.last.gpu == 0 and dec.last.cpu + dec.last.hybrid == n and not dec.last.errors, dec.last
            assert np.abs(out.astype(int) - outs[lanes][0].astype(int)).mean() < 3  # the CPU path's pixels of the same crops
        dec.close()
    for a, b in zip(outs[1], outs[3]):
        assert np.array_equal(a, b)
    for bad in (0, 9, 2.5, True, "2"):
        with pytest.raises(ConfigError, match="engine_lanes"):
            GPUOptions(split="gpu", engine_lanes=bad)

@gpu
@pytest.mark.parametrize("chroma", ["replicate", "interpolate"])
def test_chunked_engine_calls_decode_what_one_call_decodes(monkeypatch, chroma):
    """chunk=N: the engines' images in nvJPEG calls of at most N (sizes that differ, so the state
    is re-initialised between calls, each after the last call's work is done) give the pixels of
    one call, bit for bit, batch after batch (a hang here is the re-initialisation racing the
    previous call); a bad value is refused."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.errors import ConfigError

    bufs, sizes = _jpegs(29)
    ids = np.arange(len(bufs))
    flips = random_flips(ids, 2, 0)
    outs = {}
    for chunk in (0, 4):
        dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu", chroma=chroma),
                         max_batch=32, chunk=chunk)
        if dec.hw is None:
            pytest.skip(f"no NVJPG engines: {dec.hw_error}")
        assert dec.chunk == chunk
        calls = []  # images per nvJPEG call
        name = "decode_planes" if dec.planar else "decode"
        real = getattr(dec.hw, name)
        monkeypatch.setattr(dec.hw, name, lambda ptrs, *a, **k: (calls.append(len(ptrs)), real(ptrs, *a, **k))[1])
        got = []
        for epoch in range(3):  # engine counts of 21, 12 and 15: calls of 3 and 4 images with chunks of 4
            n = [29, 17, 22][epoch]
            win = random_windows(sizes[:n, 0], sizes[:n, 1], ids[:n], 2, epoch)
            calls.clear()
            got.append(cupy.asnumpy(dec(bufs[:n], win, flips[:n], _hw(bufs[:n]))).copy())
            m = int((_hw(bufs[:n]) == ENGINE).sum())
            assert dec.last.gpu == m > 8, dec.last
            if chunk == 0:
                assert calls == [m]
            else:  # as equal as they can be, none over 4
                assert sum(calls) == m and len(calls) == -(-m // 4) and max(calls) - min(calls) <= 1
                assert max(calls) <= 4
        outs[chunk] = got
        dec.close()
    for a, b in zip(outs[0], outs[4]):
        assert np.array_equal(a, b)
    assert GPUDecoder(Output(224), GPUOptions(split="gpu"), max_batch=8).chunk == 0  # the default: one call
    for bad in (-1, 2.5, True, "4"):
        with pytest.raises(ConfigError, match="chunk"):
            GPUDecoder(Output(224), GPUOptions(split="gpu"), max_batch=8, chunk=bad)


@gpu
@pytest.mark.parametrize("chroma", ["replicate", "interpolate"])
def test_large_images_go_to_the_engines_on_a_decoder_of_their_own(monkeypatch, chroma):
    """Route.LARGE images (baseline, above GPU_MAX_PIXELS) are decoded by the engines on a
    decoder of their own (made and sized at warm-up for them alone), in calls of at most
    LARGE_BATCH after the batch's engines call: none reaches the CPU share, and they are the
    pixels the batch's engines give the same images routed to them, bit for bit, within 40 dB
    of the CPU path."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.decode.gpu.plan import GPU_MAX_PIXELS, LARGE
    from recordtool.format.jpeg import probe

    small, small_sizes = _jpegs(12)
    big = []
    for k, (w, h, sub) in enumerate([(2400, 1800, 2), (1800, 2400, 1), (2560, 1600, 0)]):
        b = io.BytesIO()
        photo_like(w, h, seed=50 + k).save(b, "JPEG", quality=90, subsampling=sub)
        big.append(b.getvalue())
    bufs = big[:2] + small + big[2:]
    sizes = np.concatenate([[[2400, 1800], [1800, 2400]], small_sizes, [[2560, 1600]]])
    infos = [probe(b) for b in bufs]
    cols = ([i.chroma for i in infos], [i.progressive for i in infos], [i.colorspace for i in infos])
    pixels = sizes[:, 0] * sizes[:, 1]
    routes = route(*cols, pixels=pixels)
    large = [0, 1, len(bufs) - 1]
    assert pixels[large].min() > GPU_MAX_PIXELS and np.nonzero(routes == LARGE)[0].tolist() == large
    n_engine = int((routes == ENGINE).sum())
    ids = np.arange(len(bufs))
    lengths = np.array([len(b) for b in bufs])
    outs = []
    for rts in (routes, route(*cols)):  # LARGE, then the same images as the batch's engines' own
        dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu", chroma=chroma),
                         max_batch=32)
        if dec.hw is None:
            pytest.skip(f"no NVJPG engines: {dec.hw_error}")
        dec.LARGE_ROOM = 3  # room for this batch's three whole (a batch of 15 has no margin for them)
        dec.warmup(lengths, sizes[:, 0], sizes[:, 1], routes=rts, chroma=cols[0])
        assert dec.prealloc_error is None
        calls = []
        if (rts == LARGE).any():
            assert dec.hw_large is not None and dec.hw_large.max_batch == dec.LARGE_BATCH == 2
            if dec.planar:  # primed at warm-up by a call of that many, not pre-allocated
                assert dec.hw_large._batch == 2
            name = "decode_planes" if dec.planar else "decode"
            real = getattr(dec.hw_large, name)
            monkeypatch.setattr(dec.hw_large, name, lambda ptrs, *a, **k: (calls.append(len(ptrs)), real(ptrs, *a, **k))[1])
        else:
            assert dec.hw_large is None  # made only for a dataset that has such images
        got = []
        for epoch in range(2):
            win = random_windows(sizes[:, 0], sizes[:, 1], ids, 7, epoch)
            flips = random_flips(ids, 7, epoch)
            got.append(cupy.asnumpy(dec(bufs, win, flips, rts)).copy())
            assert dec.last.gpu == n_engine + 3 and dec.last.cpu == 0 and dec.last.overflow == 0, dec.last
            ref = decode_crop_resize(bufs, win)
            ref[flips] = ref[flips, :, ::-1]
            for k in large:
                assert psnr(got[-1][k], ref[k]) >= 40, (k, epoch, chroma)
        assert calls == ([2, 1] * 2 if (rts == LARGE).any() else [])
        outs.append(got)
        dec.close()
    for a, b in zip(*outs):
        assert np.array_equal(a, b)


@gpu
def test_hybrid_off_sends_progressive_and_gray_to_cpu():
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs(12)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(12), 1, 0)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu", hybrid=False), max_batch=16)
    out = cupy.asnumpy(dec(bufs, win, np.zeros(12, bool), _hw(bufs)))
    assert dec.last.hybrid == 0 and dec.last.cpu_forced == int((_hw(bufs) != ENGINE).sum())
    ref = decode_crop_resize(bufs, win)
    assert min(psnr(out[k], ref[k]) for k in range(12)) >= 40
    dec.close()


@gpu
def test_producer_owned_ring_gives_slots_back_without_an_event():
    """A user op's uint8 ring is given back by the producer once its pass is done: no event on
    the releasing thread's default stream (which the next decode would wait for)."""
    from recordtool.decode.gpu.buffers import OutputRing

    ring = OutputRing((4, 8, 8, 3), "uint8", 2, producer_owned=True)
    stream = cupy.cuda.Stream(non_blocking=True)
    a = ring.acquire(3, stream)
    assert ring.free == 1 and a.shape == (3, 8, 8, 3)
    del a
    assert ring.free == 2 and ring._ready == [None, None]
    plain = OutputRing((4, 8, 8, 3), "uint8", 1)
    b = plain.acquire(2, stream)
    del b
    assert plain._ready[0] is not None  # a consumer's ring: the next producer waits for the event


@gpu
def test_output_ring_recycles_after_release_and_spills_when_held():
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.decode.gpu.buffers import OutputRing

    bufs, sizes = _jpegs(8)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(8), 2, 0)
    dec = GPUDecoder(Output(224, dtype="float32", layout="NCHW"), GPUOptions(split="gpu"), max_batch=8)
    ring = dec.ring = OutputRing(dec.output_shape(), "float32", 2)
    first = dec(bufs, win, np.zeros(8, bool), _hw(bufs))
    keep = cupy.asnumpy(first)
    ptr = first.data.ptr
    assert ring.free == 1
    second = dec(bufs, win, np.ones(8, bool), _hw(bufs))  # the other slot: `first` is still held
    assert second.data.ptr != ptr and ring.free == 0
    third = dec(bufs, win, np.zeros(8, bool), _hw(bufs))  # both held: from CuPy's pool, counted
    assert ring.spills == 1
    assert np.array_equal(cupy.asnumpy(first), keep)  # a held batch is never overwritten
    view = first[2:5]  # a view keeps the slot too
    del first, third
    assert ring.free == 0
    del view
    assert ring.free == 1
    again = dec(bufs, win, np.zeros(8, bool), _hw(bufs))
    assert again.data.ptr == ptr and np.array_equal(cupy.asnumpy(again), keep)
    del second, again
    assert ring.free == 2
    dec.close()


@gpu
def test_auto_split_adapts_and_memory_is_steady():
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs(64)
    ids = np.arange(len(bufs))
    dec = GPUDecoder(Output(224, dtype="float16"), GPUOptions(split="auto"), max_batch=64)
    dec.warmup([len(b) for b in bufs], sizes[:, 0], sizes[:, 1])
    pool = cupy.get_default_memory_pool()
    fractions = []
    for epoch in range(6):
        win = random_windows(sizes[:, 0], sizes[:, 1], ids, 0, epoch)
        out = dec(bufs, win, random_flips(ids, 0, epoch), _hw(bufs))
        del out
        fractions.append(dec.cpu_fraction)
        if epoch == 1:
            before, allocs = pool.total_bytes(), dec.allocations
    assert pool.total_bytes() == before and dec.allocations == allocs  # nothing new after warm-up
    assert dec.ring.spills == 0 and dec.prealloc_error is None
    if dec.hw is not None:
        assert len(set(fractions)) > 1 and 0 < fractions[-1] < 0.9  # the share moved with measured rates


@gpu
def test_the_kernel_reads_the_cpu_share_in_pinned_memory():
    """The CPU share's pixels reach the kernel where the CPU wrote them (pinned memory mapped
    into the device's address space): no device buffer of a batch's pixels, and the output is
    the CPU path's, bit for bit, batch after batch in the same buffer."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.decode.gpu.buffers import DecodeBuffers

    pool = cupy.get_default_memory_pool()
    before = pool.total_bytes()
    buf = DecodeBuffers(cupy, 64, (224, 224))
    assert pool.total_bytes() - before < 64 * 224 * 224 * 3 // 8  # the sample table's bytes only
    buf.cpu_out[...] = np.random.default_rng(0).integers(0, 256, buf.cpu_out.shape, np.uint8)
    mapped = cupy.ndarray(buf.cpu_out.shape, np.uint8, cupy.cuda.MemoryPointer(
        cupy.cuda.UnownedMemory(buf.cpu_src, buf.cpu_out.nbytes, buf), 0))
    assert int(mapped.astype(cupy.int64).sum()) == int(buf.cpu_out.astype(np.int64).sum())  # a kernel's reads

    bufs, sizes = _jpegs(8)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="cpu"), max_batch=8)
    for seed in range(3):
        ids = np.arange(8)
        win, flips = random_windows(sizes[:, 0], sizes[:, 1], ids, seed, 0), random_flips(ids, seed, 0)
        got = cupy.asnumpy(dec(bufs, win, flips, _hw(bufs)))
        assert dec.last.cpu == 8
        want = decode_crop_resize(bufs, win)
        want[flips] = want[flips][:, :, ::-1]
        np.testing.assert_array_equal(got, want)


@gpu
def test_bad_jpeg_in_batch_is_reported():
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs(8)
    hw = _hw(bufs)  # as the index says: the damage happened after packing
    bufs[2] = bufs[2][: len(bufs[2]) // 3]
    ids = np.arange(8)
    win = random_windows(sizes[:, 0], sizes[:, 1], ids, 0, 0)
    on_cpu = GPUDecoder(Output(224, dtype="uint8"), GPUOptions(split="cpu"), max_batch=8)
    on_cpu(bufs, win, np.zeros(8, bool), hw)
    assert [i for i, _ in on_cpu.last.errors] == [2]  # the CPU path names it
    # Neither the engines nor the hybrid decoder report a truncated stream (seen on the H200):
    # a file not ending in EOI is sent to libjpeg, which names it
    bufs[4] = bufs[4][: len(bufs[4]) // 3]
    assert hw[4] == HYBRID
    on_gpu = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu"), max_batch=8)
    out = cupy.asnumpy(on_gpu(bufs, win, np.zeros(8, bool), hw))
    assert sorted(i for i, _ in on_gpu.last.errors) == [2, 4], on_gpu.last
    assert on_gpu.last.cpu == 2 + int((hw == CPU).sum())
    ref = decode_crop_resize(bufs, win, on_error="skip")
    for k in set(range(8)) - {2, 4}:  # the rest of the batch is intact
        assert psnr(out[k], ref[k]) >= 40


@gpu
def test_dlpack_to_torch():
    torch = pytest.importorskip("torch")
    from recordtool.decode.gpu import GPUDecoder, to_torch

    bufs, sizes = _jpegs(8)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(8), 0, 0)
    dec = GPUDecoder(Output(224, dtype="float16"), max_batch=8)
    t = to_torch(dec(bufs, win, np.zeros(8, bool), _hw(bufs)), dec.stream)
    assert t.is_cuda and t.dtype == torch.float16 and tuple(t.shape) == (8, 3, 224, 224)
    assert torch.isfinite(t).all()


@pytest.fixture(scope="module")
def packed_mix(tmp_path_factory):
    """A small packed set with engine, hybrid (progressive, gray) and CPU (CMYK) files."""
    from conftest import write
    from recordtool.pack import pack

    root = tmp_path_factory.mktemp("gpu_loader")
    bufs, _ = _jpegs(40)
    for i, b in enumerate(bufs):
        write(str(root / "src" / f"c{i % 4}" / f"{i}.jpg"), b)
    cmyk = io.BytesIO()
    photo_like(200, 150, seed=99).convert("CMYK").save(cmyk, "JPEG", quality=90)
    write(str(root / "src" / "c0" / "cmyk.jpg"), cmyk.getvalue())
    pack(str(root / "src"), str(root / "out"), shards=2, progress=False)
    return str(root / "out")


@gpu
def test_cuda_loader_matches_cpu_loader_and_resumes(packed_mix):
    from recordtool.loader import Loader

    kw = dict(batch_size=8, size=64, seed=4, drop_last=False, as_torch=False, dtype="float32", layout="NHWC")
    cpu_batches = [(np.asarray(x), np.asarray(y)) for x, y in Loader(packed_mix, device="cpu", **kw)]
    gpu_loader = Loader(packed_mix, device="cuda", producers=3, **kw)
    gpu_batches = [(cupy.asnumpy(x), cupy.asnumpy(y)) for x, y in gpu_loader]
    assert len(gpu_batches) == len(cpu_batches) == 6
    std = np.array([0.229, 0.224, 0.225], np.float32)
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    for (xg, yg), (xc, yc) in zip(gpu_batches, cpu_batches):
        assert np.array_equal(yg, yc)
        for a, b in zip(xg, xc):  # back to 0..255 pixels to compare
            assert psnr((a * std + mean) * 255, (b * std + mean) * 255) >= 40
    split = gpu_loader.last_split
    assert split.gpu + split.hybrid + split.cpu == split.n
    assert sum(gpu_loader.decoded.values()) == 41 and set(gpu_loader.decoded) == {"gpu", "hybrid", "cpu"}
    # resume mid-epoch on the GPU: the same batches as the uninterrupted run (bit for bit with a
    # fixed split; the auto split moves images between engines and CPU by measured speed)
    kw["split"] = "gpu"
    gpu_batches = [(cupy.asnumpy(x), None) for x, _ in Loader(packed_mix, device="cuda", producers=3, **kw)]
    part = Loader(packed_mix, device="cuda", producers=2, **kw)
    it = iter(part)
    next(it), next(it)
    state = part.state_dict()
    del it
    part.close()
    resumed = Loader(packed_mix, device="cuda", producers=4, **kw)
    resumed.load_state_dict(state)
    rest = [cupy.asnumpy(x) for x, _ in resumed]
    assert len(rest) == 4
    for a, (b, _) in zip(rest, gpu_batches[2:]):
        assert np.array_equal(a, b)


@pytest.fixture(scope="module")
def packed_layouts(tmp_path_factory):
    """A packed set of every layout the index names: 4:4:4 and gray (baseline and progressive)
    beside 4:2:0 / 4:2:2 files."""
    from conftest import write
    from recordtool.pack import pack

    root = tmp_path_factory.mktemp("gpu_layouts")
    kinds = [(0, False, False), (0, True, False), (None, False, True), (None, True, True), (2, False, False),
             (1, False, False), (2, True, False)]
    for i in range(28):
        sub, prog, gray = kinds[i % len(kinds)]
        im = photo_like(*[(500, 375), (375, 500), (640, 480), (333, 500)][i % 4], seed=200 + i)
        buf = io.BytesIO()
        if gray:
            im.convert("L").save(buf, "JPEG", quality=92, progressive=prog)
        else:
            im.save(buf, "JPEG", quality=92, subsampling=sub, progressive=prog)
        write(str(root / "src" / f"c{i % 3}" / f"{i}.jpg"), buf.getvalue())
    pack(str(root / "src"), str(root / "out"), shards=2, progress=False)
    return str(root / "out")


@gpu
@pytest.mark.parametrize("dtype,split", [("float32", "auto"), ("float32", "gpu"), ("float16", "gpu")])
def test_cuda_loader_gives_4_4_4_and_gray_bit_for_bit(packed_layouts, dtype, split):
    """same_pixels=True: a cuda Loader's 4:4:4 and gray images are device="cpu"'s,
    bit for bit, normalised values included; the others within the fidelity bound. Without
    it the GPU decodes them and they are not."""
    import recordtool
    from recordtool.decode.gpu.plan import SAME_PIXELS_CHROMA
    from recordtool.loader import Loader

    ds = recordtool.open(packed_layouts)
    same = np.isin(ds.index.chroma, SAME_PIXELS_CHROMA)
    assert same.sum() == 16 and (~same).sum() == 12
    kw = dict(batch_size=8, size=64, seed=3, drop_last=False, as_torch=False, dtype=dtype, layout="NCHW",
              with_ids=True)
    cpu = {i: x for xs, _, ids in Loader(ds, device="cpu", **kw) for i, x in zip(np.asarray(ids).tolist(), xs)}
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    for same_pixels in (True, False):
        ld = Loader(ds, device="cuda", split=split, same_pixels=same_pixels, **kw)
        equal = {}
        for xs, _, ids in ld:
            for i, x in zip(np.asarray(ids).tolist(), cupy.asnumpy(xs)):
                equal[i] = np.array_equal(x, cpu[i])
                if not same[i]:
                    a, b = (x.astype(np.float32) * std + mean) * 255, (cpu[i].astype(np.float32) * std + mean) * 255
                    assert psnr(a, b) >= 40, i
        assert len(equal) == len(ds)
        if same_pixels:
            assert all(equal[i] for i in np.nonzero(same)[0].tolist())
            if split == "gpu":  # nothing else goes to the CPU
                assert ld.decoded["cpu"] == same.sum(), ld.decoded
        elif split == "gpu":  # ("auto", with no training loop waiting, lets the CPU decode everything)
            assert not any(equal[i] for i in np.nonzero(same)[0].tolist())
            assert ld.decoded["cpu"] == 0, ld.decoded
        ld.close()


@gpu
def test_images_decoded_ahead_are_the_batchs_own(packed_layouts):
    """A producer's look-ahead lane (decode.gpu.ahead): the CPU-routed images of its next batch,
    decoded before the batch is made, are taken by it (BatchReport.ahead counts them) and the
    batch is, bit for bit, the one its decoder makes without them — and the CPU Loader's pixels
    for those images (same_pixels routes 4:4:4 and gray to the CPU)."""
    import recordtool
    from recordtool.decode.gpu.ahead import AheadLane
    from recordtool.loader import Loader

    ds = recordtool.open(packed_layouts)
    kw = dict(batch_size=7, size=64, seed=3, drop_last=False, as_torch=False, dtype="float32", with_ids=True)
    cpu = {i: x for xs, _, ids in Loader(ds, device="cpu", **kw) for i, x in zip(np.asarray(ids).tolist(), xs)}
    ld = Loader(ds, device="cuda", split="gpu", same_pixels=True, **kw)
    b, taken = ld.backend, 0
    for start in range(0, len(ds), 7):
        ids = np.arange(start, min(start + 7, len(ds)))
        drawn = b.recipe.draws(ids, 2)
        b.announce(ids, 2, 0, drawn)  # slot 0's next batch announced
        for _, jobs in b._lanes[0]._pending:  # let its lane finish (a batch cancels what it has not started)
            for f in jobs.values():
                f.exception(timeout=60)
        with_lane = b.make(ids, 2, 0, drawn)
        got = cupy.asnumpy(with_lane.images[: len(ids)])
        assert with_lane.report.ahead == b._cpu_routed[ids].sum() == with_lane.report.cpu, with_lane.report
        taken += with_lane.report.ahead
        alone = b.make(ids, 2, 1, drawn)  # slot 1 has no lane: nothing announced for it
        assert alone.report.ahead == 0 and 1 not in b._lanes
        assert np.array_equal(got, cupy.asnumpy(alone.images[: len(ids)]))
    assert taken == 16 and isinstance(b._lanes[0], AheadLane)
    ld.close()
    # the Loader itself takes its lanes' images in its epochs: the CPU path's pixels
    from recordtool.decode.gpu.plan import SAME_PIXELS_CHROMA

    ld = Loader(ds, device="cuda", split="gpu", same_pixels=True, **kw)
    same = np.isin(ds.index.chroma, SAME_PIXELS_CHROMA)
    for xs, _, ids in ld:
        for i, x in zip(np.asarray(ids).tolist(), cupy.asnumpy(xs)):
            if same[i]:
                assert np.array_equal(x, cpu[i]), i
    assert ld.decoded["cpu"] == same.sum() and 0 <= ld.ahead <= same.sum()
    ld.close()


@gpu
@pytest.mark.parametrize("train,crop,user_op", [
    (True, dict(size=(48, 80), scale=(0.2, 0.7), ratio=(0.5, 1.5), hflip=0.3), False),
    (False, dict(size=(80, 48), crop_pct=0.95), False),
    (True, dict(size=(40, 72), hflip=1.0), True),  # the uint8 ring and the normalising pass at h × w
    (False, dict(size=64, crop_pct=0.5), True)])
def test_cuda_loader_sizes_and_crops_match_the_cpu_loader(packed_layouts, train, crop, user_op):
    """size=(h, w), scale, ratio, hflip and crop_pct on cuda: the same windows, flips and labels
    as device="cpu"; 4:4:4 and gray images bit for bit (same_pixels), the others within the
    fidelity bound — with and without a user op (its uint8 batch and pass are h × w)."""
    import recordtool
    from recordtool.decode.gpu.plan import SAME_PIXELS_CHROMA
    from recordtool.loader import Loader

    ds = recordtool.open(packed_layouts)
    same = np.isin(ds.index.chroma, SAME_PIXELS_CHROMA)
    kw = dict(batch_size=8, seed=5, train=train, drop_last=False, as_torch=False, layout="NHWC", with_ids=True, **crop)
    cpu = {i: (x, y) for xs, ys, ids in Loader(ds, device="cpu", **kw)
           for i, x, y in zip(np.asarray(ids).tolist(), xs, ys)}
    op = (lambda b: b) if user_op else None
    ld = Loader(ds, device="cuda", split="gpu", user_op=op, same_pixels=True, **kw)
    h, w = ld.output.size
    std = np.array([0.229, 0.224, 0.225], np.float32)
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    seen = 0
    for xs, ys, ids in ld:
        assert xs.shape[1:] == (h, w, 3)
        for i, x, y in zip(np.asarray(ids).tolist(), cupy.asnumpy(xs), cupy.asnumpy(ys)):
            xc, yc = cpu[i]
            assert y == yc
            if same[i]:
                assert np.array_equal(x, xc), i
            else:
                assert psnr((x * std + mean) * 255, (xc * std + mean) * 255) >= 40, i
            seen += 1
    assert seen == len(ds)
    ld.close()


@gpu
def test_the_arena_holds_a_batch_of_crops_regions(packed_mix):
    """With REGION_ROOM_MIN batches of GPU-bound records or more, the arena is sized by the
    regions random crops decode (two epochs' windows), not by whole images: smaller where the
    engines decode regions, and later epochs' batches fit it (the rare one past it sends its
    last images to the CPU share, counted in Loader.overflow)."""
    from recordtool.decode.gpu.plan import CPU
    from recordtool.decode.gpu.room import batch_room, planar_need
    from recordtool.loader import Loader

    ld = Loader(packed_mix, batch_size=4, size=64, device="cuda", dtype="float16", as_torch=False)
    n = 0
    for epoch in range(4):
        ld.set_epoch(epoch)
        for x, y in ld:
            n += len(y)
    dec = next(iter(ld.backend._decoders.values()))
    ix, gpu = ld.ds.index, ld.backend.routes != CPU
    assert gpu.sum() >= dec.REGION_ROOM_MIN * 4
    whole = batch_room(planar_need(ix.width[gpu], ix.height[gpu], ix.chroma[gpu]), 4)
    if dec.planar and dec.planar_regions["engines"] and dec.planar_regions["hybrid"]:
        assert dec.buf.arena.size < whole, (dec.buf.arena.size, whole)  # (engines alone: about the same here)
    assert ld.overflow <= 0.05 * n, (ld.overflow, n)
    ld.close()


@gpu
def test_cuda_loader_memory_fixed_after_warmup(packed_mix):
    torch = pytest.importorskip("torch")
    from recordtool.loader import Loader

    ld = Loader(packed_mix, batch_size=8, size=64, device="cuda", dtype="float16")
    pool = cupy.get_default_memory_pool()
    for epoch in range(4):
        ld.set_epoch(epoch)
        for x, y in ld:
            assert x.is_cuda and x.dtype == torch.float16
            x = x.float().sum()  # the consumer works on the batch on torch's stream
        torch.cuda.synchronize()
        if epoch == 0:
            before = pool.total_bytes()
    assert pool.total_bytes() == before and ld.ring.spills == 0 and ld.overflow == 0
    ld.close()  # the producers had gone on into epoch 4 (continuous): what they made is dropped
    assert ld.ring.free == ld.ring.slots  # every batch given back


@gpu
def test_cuda_loader_bounds_how_far_the_training_loop_runs_ahead(packed_mix):
    """run_ahead=1 (the default): when batch k is handed out, the GPU work the loop queued
    before it took batch k - 1 has finished — the Loader slept for it — while the loop still
    had a step queued; the batches are those of an unbounded Loader. CuPy batches (as_torch=False)
    and the loop's work on the default stream, which torch's current stream is: no label copy to
    torch synchronises the hand-out, so the Loader's own wait is what is measured.
    Why one long step after a pause: the producers' nvJPEG calls themselves wait for work queued
    on the default stream, so batches made while a step is queued are ready only after it; the
    pause lets them make the next batches first, and batch 3's wait is then the Loader's alone —
    step 1, about a second — whatever else shares the GPU."""
    torch = pytest.importorskip("torch")
    from recordtool.loader import Loader

    torch.cuda.init()  # the consumer's stream is torch's current one (the default stream here)
    kw = dict(batch_size=8, size=64, device="cuda", dtype="float16", split="gpu", seed=3, as_torch=False)
    assert Loader(packed_mix, **kw).gpu.run_ahead == 1
    sums = {}
    for ahead in (1, None):
        ld = Loader(packed_mix, run_ahead=ahead, **kw)
        assert (ld.backend._pace is None) == (ahead is None)
        done, sums[ahead] = [], []
        for k, (x, _) in enumerate(ld):
            if ahead is not None and k >= 2:
                assert done[k - 2].query(), (k, ld.stage_seconds)  # the step before last is finished
            if k == 3 and ahead is not None:
                assert ld.stage_seconds["run_ahead"] > 0.5, ld.stage_seconds  # it slept on step 1
            sums[ahead].append(x.astype(cupy.float32).sum())
            if k == 1:
                time.sleep(1.0)  # the producers make batches 2 and 3 (and more) meanwhile
            torch.cuda._sleep(3_000_000_000 if k == 1 else 20_000_000)  # step 1: ~1.5 s of GPU time
            ev = torch.cuda.Event()
            ev.record()
            done.append(ev)
        torch.cuda.synchronize()
        ld.close()
    assert [float(v) for v in sums[1]] == [float(v) for v in sums[None]], sums


@gpu
def test_a_batch_past_the_room_sends_its_last_images_to_the_cpu_share():
    """A batch heavier than the room planned at warm-up (room.batch_room) keeps the buffers
    as they are: the images past the room are decoded by the CPU share, counted in
    BatchReport.overflow, with the CPU path's pixels bit for bit; nothing is allocated."""
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs(16)
    routes, ids = _hw(bufs), np.arange(16)
    spec = Output(64, dtype="float32")
    win, flips = random_windows(sizes[:, 0], sizes[:, 1], ids, 0, 0), random_flips(ids, 0, 0)
    lengths = [len(b) for b in bufs]
    ref = GPUDecoder(spec, GPUOptions(split="cpu"), max_batch=16)
    ref.warmup(lengths, sizes[:, 0], sizes[:, 1], routes=routes)
    want = cupy.asnumpy(ref(bufs, win, flips, routes))
    ref.close()
    dec = GPUDecoder(spec, GPUOptions(split="gpu"), max_batch=16)
    dec.warmup(lengths, sizes[:, 0], sizes[:, 1], routes=routes)
    if dec.hw is None:
        pytest.skip("no NVJPG engines here")
    layouts, place = [], dec.buf.place_planar

    def spy(*args, layout=None, **kw):  # the arena each placed image takes, in the batch's order
        layouts.append(layout.total.copy())
        return place(*args, layout=layout, **kw)

    dec.buf.place_planar = spy
    full = cupy.asnumpy(dec(bufs, win, flips, routes))
    dec.buf.place_planar = place
    assert dec.last.overflow == 0  # a set smaller than a batch: room for all of it
    # the regions decoded (crop windows) take far less than the whole images warm-up sized the
    # room for: an arena that holds the batch's first half of them, and no more
    taken = np.cumsum(layouts[-1])
    half = len(taken) // 2
    dec.buf.arena = cupy.empty(int(taken[half - 1]), np.uint8)
    pool = cupy.get_default_memory_pool()
    before, allocs = pool.total_bytes(), dec.allocations
    got = cupy.asnumpy(dec(bufs, win, flips, routes))
    r = dec.last
    assert r.overflow == len(taken) - half and r.gpu + r.hybrid == half, (r, taken)
    assert r.cpu >= r.cpu_forced + r.overflow, r
    assert pool.total_bytes() == before and dec.allocations == allocs, (pool.total_bytes() - before, dec.allocations)
    exact = [i for i in range(16) if np.array_equal(got[i], want[i])]
    assert len(exact) >= r.cpu, (exact, r)  # what the CPU share decoded is the CPU path's image
    for i in range(16):
        assert np.array_equal(got[i], want[i]) or np.array_equal(got[i], full[i]), i
    dec.close()


@gpu
def test_cuda_loader_leads_with_the_engines_whatever_the_threads(packed_mix):
    """The Loader's split="auto" gives the engines the lead at any number of CPU threads;
    first="cpu" gives it to the CPU. Before the consumer has waited, the lead side decodes every
    image it can take."""
    from recordtool.loader import Loader

    kw = dict(batch_size=8, size=64, device="cuda", as_torch=False, same_pixels=False, with_ids=True)
    few = Loader(packed_mix, threads=4, **kw)
    many = Loader(packed_mix, threads=16, **kw)
    named = Loader(packed_mix, threads=16, first="cpu", **kw)
    assert (few.backend.demand.first, many.backend.demand.first, named.backend.demand.first) == \
        ("engines", "engines", "cpu")
    ix = __import__("recordtool").open(packed_mix).index
    routes = route(ix.chroma, ix.progressive, ix.colorspace)
    for ld, lead in ((few, "gpu"), (many, "gpu"), (named, "cpu")):
        _, _, ids = next(iter(ld))  # nobody has waited yet: the lead side takes what it can
        engines = int((routes[np.asarray(ids)] == ENGINE).sum())
        if ld.backend.decoder(0).hw is not None and engines:
            assert ld.last_split.gpu == (engines if lead == "gpu" else 0), ld.last_split
    for ld in (few, many, named):
        ld.close()


@gpu
def test_cuda_loader_names_a_damaged_record(packed_mix, tmp_path):
    from test_loader import _damaged_copy

    from recordtool.loader import Loader, RecordError

    ix = __import__("recordtool").open(packed_mix).index
    engine = int(np.nonzero(route(ix.chroma, ix.progressive, ix.colorspace, same_pixels=True) == ENGINE)[0][3])
    path, shard, off = _damaged_copy(packed_mix, tmp_path, engine)
    ld = Loader(path, batch_size=8, size=64, device="cuda", as_torch=False)
    with pytest.raises(RecordError, match=f"record {engine} .*{shard}.*offset {off}"):
        for _ in ld:
            pass


# ------------------------------------------------------------------ the split planner (no GPU needed)

def test_planner_routes_eoi_and_fixed_splits():
    from recordtool.decode.gpu.plan import SplitPlanner, ends_with_eoi

    routes = np.array([ENGINE] * 6 + [HYBRID] * 2 + [CPU] * 2, np.int8)
    bufs = [b"\xff\xd8..\xff\xd9"] * 10
    bufs[1] = b"\xff\xd8..truncated"  # no EOI: libjpeg must see it (GPU decoders do not report truncation)
    eoi = ends_with_eoi(bufs)
    assert eoi.tolist() == [True, False] + [True] * 8
    p = SplitPlanner("gpu").plan(routes, eoi)
    assert p.engine.tolist() == [0, 2, 3, 4, 5] and p.hybrid.tolist() == [6, 7]
    assert sorted(p.cpu.tolist()) == [1, 8, 9] and p.forced == 3 and p.n == 10
    p = SplitPlanner("cpu").plan(routes, eoi)
    assert len(p.engine) == len(p.hybrid) == 0 and sorted(p.cpu.tolist()) == list(range(10))
    p = SplitPlanner(0.5).plan(routes, eoi)  # half the batch on the CPU: forced ones + engine images
    assert len(p.cpu) == 5 and p.cpu[:3].tolist() == [1, 8, 9] and len(p.engine) == 3
    p = SplitPlanner("gpu", engines=True, hybrid=False).plan(routes, eoi)
    assert len(p.hybrid) == 0 and {6, 7} <= set(p.cpu.tolist())
    p = SplitPlanner("auto", engines=False).plan(routes, eoi)  # no engines here
    assert len(p.engine) == 0 and {0, 2, 3, 4, 5} <= set(p.cpu.tolist())


def test_demand_engines_first_keeps_the_cpu_share_to_what_the_consumer_waits_for():
    """Engines first: with a consumer that never waits the CPU takes no engine image whatever
    the measured rates say; while it waits, the CPU share grows up to the balanced one."""
    from recordtool.decode.gpu.plan import Demand, SplitPlanner

    routes = np.array([ENGINE] * 90 + [CPU] * 10, np.int8)
    eoi = np.ones(100, bool)
    demand = Demand(first="engines")
    p = SplitPlanner("auto", demand=demand)
    p.observe(100, 50, 0.01, 50, 0.01)  # equal rates: balanced share 0.5
    assert p.cpu_fraction == pytest.approx(0.5)
    for _ in range(20):  # a consumer that finds every batch ready
        demand.observe(wait=0.0, interval=0.05)
    assert demand.allowed == 0.0
    plan = p.plan(routes, eoi)
    assert len(plan.cpu) == plan.forced == 10 and len(plan.engine) == 90  # only what no GPU decoder takes
    for k in range(3):  # a consumer waiting 6 ms of each 50 ms step: 12 %, 10 points past the threshold
        demand.observe(wait=0.006, interval=0.05)
    assert demand.allowed == pytest.approx(0.3)
    assert len(p.plan(routes, eoi).cpu) == 30
    for _ in range(20):
        demand.observe(wait=0.02, interval=0.05)
    assert demand.allowed == demand.ceiling and len(p.plan(routes, eoi).cpu) == 50  # the balanced share caps it
    demand.observe(wait=0.0005, interval=0.05)  # 1 %, under the threshold: the share shrinks by the difference
    assert demand.allowed == pytest.approx(demand.ceiling - demand.gain * (demand.threshold - 0.01))
    fixed = SplitPlanner(0.25, demand=Demand(first="engines"))  # a fixed split is what the user asked for
    assert len(fixed.plan(routes, eoi).cpu) == 25


def test_engines_first_moves_engine_images_to_the_cpu_only_where_it_pays():
    """Engines first, a consumer that always waits: the balanced share goes to the CPU only
    where it shortens the predicted batch by MIN_GAIN — not a CPU at ~2 % of the engines' rate
    (a node's share of cores), but one at ~15 %; the CPU first is not filtered; unmeasured
    rates keep the share (paying_share is its own reference: the predicted times by hand)."""
    from recordtool.decode.gpu.plan import Demand, SplitPlanner
    from recordtool.decode.gpu.plan import MIN_GAIN, Rates, paying_share

    routes = np.array([ENGINE] * 500 + [CPU] * 2, np.int8)
    eoi = np.ones(502, bool)

    def planner(first, rg, rc):
        demand = Demand(first=first)
        for _ in range(20):
            demand.observe(wait=0.02, interval=0.05)
        p = SplitPlanner("auto", demand=demand)
        p.observe(502, 500, 500 / rg, 10, 10 / rc)
        assert p.rates.gpu == pytest.approx(rg) and p.cpu_fraction == pytest.approx(rc / (rc + rg))
        return p

    slow = planner("engines", 7000, 150)  # balanced: 11 images, 73 ms on the CPU against 71 ms
    plan = slow.plan(routes, eoi)
    assert len(plan.cpu) == plan.forced == 2 and len(plan.engine) == 500
    fast = planner("engines", 6500, 1000)  # balanced: 67 images, 77 → 67 ms
    plan = fast.plan(routes, eoi)
    assert len(plan.cpu) == 67 and plan.forced == 2 and len(plan.engine) == 435
    cpu_first = planner("cpu", 7000, 150)  # the CPU first: its share is the balanced one at least
    assert len(cpu_first.plan(routes, eoi).cpu) >= 11
    r = Rates(gpu=6500.0, cpu=1000.0)
    before, after = 500 / 6500, max(435 / 6500, 67 / 1000)
    assert (before - after >= MIN_GAIN * before) and paying_share(500, 2, 65, r) == 65
    before, after = 500 / 7000, max(491 / 7000, 11 / 150)
    assert after > before and paying_share(500, 2, 9, Rates(gpu=7000.0, cpu=150.0)) == 0
    assert paying_share(500, 2, 9, Rates(gpu=7000.0)) == 9  # the CPU not measured yet
    assert paying_share(500, 2, 0, Rates(gpu=7000.0, cpu=150.0)) == 0


def test_demand_cpu_first_gives_the_engines_only_what_the_consumer_waits_for():
    """The CPU first (GPUOptions(first="cpu")): with a consumer that never waits the engines take
    nothing whatever the rates say (hybrid images but the two that keep its rate measured go to
    the CPU too); while it waits, the engines' share grows up to the balanced split; when the
    waiting stops it shrinks back."""
    from recordtool.decode.gpu.plan import Demand, SplitPlanner
    from recordtool.loader.config import GPUOptions

    assert Demand().first == GPUOptions().first == "engines"  # a Demand made outside a Loader: the same order
    routes = np.array([ENGINE] * 80 + [HYBRID] * 10 + [CPU] * 10, np.int8)
    eoi = np.ones(100, bool)
    demand = Demand(first="cpu")
    p = SplitPlanner("auto", demand=demand)
    plan = p.plan(routes, eoi)  # nothing measured, nobody waited: the CPU takes the engines' images
    assert len(plan.engine) == 0 and len(plan.cpu) == 90 and len(plan.hybrid) == 10
    p.observe(100, 40, 0.01, 40, 0.01, 10, 0.01)  # equal rates: balanced share 0.5
    assert p.cpu_fraction == pytest.approx(0.5)
    for _ in range(20):
        demand.observe(wait=0.0, interval=0.05)
    plan = p.plan(routes, eoi)
    assert len(plan.engine) == 0 and len(plan.hybrid) == 2 and len(plan.cpu) == 98
    for _ in range(2):  # a consumer waiting 6 ms of each 50 ms step
        demand.observe(wait=0.006, interval=0.05)
    assert demand.allowed == pytest.approx(0.2)
    plan = p.plan(routes, eoi)
    assert len(plan.cpu) == 80 and len(plan.engine) == 20 - len(plan.hybrid)
    for _ in range(20):
        demand.observe(wait=0.02, interval=0.05)
    assert demand.allowed == demand.ceiling
    plan = p.plan(routes, eoi)  # the balanced share caps the engines' share
    assert len(plan.cpu) == 50 and len(plan.engine) == 40
    for _ in range(60):
        demand.observe(wait=0.0005, interval=0.05)  # 1 % of the time, under the threshold
    assert demand.allowed == pytest.approx(demand.ceiling - 60 * demand.gain * (demand.threshold - 0.01))
    assert len(p.plan(routes, eoi).cpu) == 60  # the engines' share shrinks below the balanced one


def test_demand_follows_the_time_the_consumer_waits_not_the_batches_it_waited_for():
    """Demand settles where the consumer waits `threshold` of its time: bursty waits (30 ms once
    in six 58 ms steps, ~9 % of the time) grow the other side's share though five batches in
    six are ready — a count of batches waited for would give none —, steady short waits under
    the threshold give it back, and a wait past the interval counts as the whole interval.
    A consumer whose waits shrink as the share grows (a model of the loop) ends near the
    threshold, neither at 0 nor at the ceiling."""
    from recordtool.decode.gpu.plan import Demand

    demand = Demand(first="engines")
    for _ in range(10):  # ten bursts of six steps
        demand.observe(wait=0.030, interval=0.058)
        for _ in range(5):
            demand.observe(wait=0.0, interval=0.058)
    # per burst +(30/58 - 0.02), then 5 × -0.02: up to the ceiling, less the last five ready batches
    assert demand.allowed == pytest.approx(demand.ceiling - 5 * demand.threshold)
    first = Demand(first="engines")
    first.observe(wait=0.030, interval=0.058)
    assert first.allowed == pytest.approx(0.030 / 0.058 - first.threshold)
    for _ in range(400):  # 1 ms of 58 (1.7 %): ready enough, the share shrinks by 0.3 points a batch
        demand.observe(wait=0.001, interval=0.058)
    assert demand.allowed == 0.0
    demand.observe(wait=5.0, interval=0.058)  # the first batch after a pause: at most the interval
    assert demand.allowed == pytest.approx(1.0 - demand.threshold)
    demand.observe(wait=0.01, interval=0.0)  # no interval measured yet: not a wait
    assert demand.allowed == pytest.approx(1.0 - 2 * demand.threshold)
    loop = Demand(first="engines")
    waits = []
    for _ in range(400):  # the loop waits 10 % of 50 ms with no share, nothing with half of the batch
        w = max(0.0, 0.005 * (1 - 2 * loop.allowed))
        waits.append(w / 0.05)
        loop.observe(wait=w, interval=0.05)
    assert 0.3 < loop.allowed < 0.5 and np.mean(waits[-100:]) == pytest.approx(loop.threshold, abs=0.005)


@gpu
def test_warmup_keeps_every_failed_sizing_step(monkeypatch):
    """A warm-up whose sizing steps fail one after another (the hybrid decoder's priming, the
    engines' pre-allocation, the large images' priming) reports them all in prealloc_error, in
    that order: a later failure does not hide an earlier one. The next warm-up starts afresh:
    one that succeeds leaves prealloc_error None."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.decode.gpu.plan import LARGE

    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu"), max_batch=8)
    if dec.hw is None or dec.hybrid is None:
        pytest.skip(f"no NVJPG engines or hybrid decoder: {dec.hw_error or dec.hybrid_error}")
    routes = np.array([ENGINE] * 4 + [HYBRID, LARGE], np.int8)
    widths, heights = np.array([640] * 5 + [2400]), np.array([480] * 5 + [1800])
    lengths, chroma = np.array([60_000] * 5 + [900_000]), np.full(6, CHROMA_420)

    def fails(what):
        def raise_(*a, **k):
            raise RuntimeError(what)
        return raise_

    monkeypatch.setattr(dec, "_prime_hybrid", fails("hybrid primed"))
    monkeypatch.setattr(dec.hw, "preallocate", fails("engines sized"))
    monkeypatch.setattr(dec, "_prime_large", fails("large primed"))
    dec.warmup(lengths, widths, heights, routes=routes, chroma=chroma)
    assert dec.prealloc_error == "hybrid: hybrid primed; engines: engines sized; large: large primed"
    monkeypatch.undo()
    dec.warmup(lengths, widths, heights, routes=routes, chroma=chroma)
    assert dec.prealloc_error is None
    dec.close()


def test_demand_cpu_first_measures_the_engines_on_small_batches():
    """The CPU first with the CPU's rate known and the engines' not: the engines' share follows
    the demand alone (not the half-and-half placeholder balance), so a consumer that waits gets
    them on batches too small for half of one to measure a rate; then the balance takes over.
    Bad Demand values are ConfigErrors (ValueErrors too); its `first` is GPUOptions', checked there."""
    from recordtool.decode.gpu.plan import Demand, SplitPlanner
    from recordtool.errors import ConfigError

    routes = np.array([ENGINE] * 12, np.int8)
    eoi = np.ones(12, bool)
    demand = Demand(first="cpu")
    p = SplitPlanner("auto", demand=demand)
    for _ in range(12):  # a consumer that always waits; the engines 3× the CPU's rate
        plan = p.plan(routes, eoi)
        ne, nc = len(plan.engine), len(plan.cpu)
        p.observe(12, ne, ne / 3000 if ne else None, nc, nc / 1000 if nc else None)
        demand.observe(wait=0.02, interval=0.05)
    assert p.rates.gpu == pytest.approx(3000) and p.cpu_fraction == pytest.approx(0.25)
    assert len(p.plan(routes, eoi).cpu) == 3  # the balanced share, now that both rates are known
    for bad in (dict(gain=1.5), dict(ceiling=-0.1), dict(threshold="x"), dict(gain=True)):
        with pytest.raises(ConfigError):
            Demand(**bad)


def test_planner_gives_large_images_to_the_engines_first_and_never_to_the_cpu_share():
    """Route.LARGE images go to the engines whatever the split asks of the engines' images
    (on the CPU one costs 20-40 ms of a core), first in the engines' list (the batch's room is
    given in order); to the CPU only where the engines are not used (split="cpu", no engines,
    paused) or the file has no EOI."""
    from recordtool.decode.gpu.plan import SplitPlanner, ends_with_eoi
    from recordtool.decode.gpu.plan import LARGE

    routes = np.array([ENGINE] * 6 + [LARGE, HYBRID, CPU, LARGE], np.int8)
    eoi = np.ones(10, bool)
    for split in ("gpu", "auto", 0.5, 1.0):
        p = SplitPlanner(split).plan(routes, eoi)
        assert p.engine[:2].tolist() == [6, 9] and not {6, 9} & set(p.cpu.tolist()), split
        assert p.n == 10 and p.forced == 1
    assert len(SplitPlanner(1.0).plan(routes, eoi).engine) == 2  # a CPU share of everything it may take
    for p in (SplitPlanner("cpu"), SplitPlanner("auto", engines=False)):
        assert {6, 9} <= set(p.plan(routes, eoi).cpu.tolist())
    paused = SplitPlanner("auto")
    paused.paused = 3
    assert {6, 9} <= set(paused.plan(routes, eoi).cpu.tolist())
    bufs = [b"\xff\xd8..\xff\xd9"] * 10
    bufs[9] = b"\xff\xd8..truncated"
    p = SplitPlanner("gpu").plan(routes, ends_with_eoi(bufs))
    assert p.engine[:1].tolist() == [6] and 9 in p.cpu.tolist()


@pytest.mark.parametrize("split", ["auto", "gpu"])
def test_planner_pauses_engines_that_refuse_every_batch_and_retries_them(split):
    """Engines that refuse every batch (the CPU redoes each one) and so never get a rate: after
    ENGINES_OFF_AFTER refusals in a row they get no images for ENGINES_RETRY_AFTER batches
    (observe says so once, for the decoder's warning), then one batch again; a refused retry
    doubles the pause, a decoded one ends the pauses; refusals with a success between them do
    not add up."""
    from recordtool.decode.gpu.plan import Demand, SplitPlanner

    routes = np.array([ENGINE] * 16, np.int8)
    eoi = np.ones(16, bool)
    demand = Demand(first="cpu")
    p = SplitPlanner(split, demand=demand)
    p.ENGINES_RETRY_AFTER = 5

    def run(batches, works=False):
        sent, stops = [], []
        for _ in range(batches):  # a consumer that always waits: the CPU-first share keeps moving to the engines
            plan = p.plan(routes, eoi)
            ne = len(plan.engine)
            sent.append(ne > 0)
            ok = works and ne > 0
            stops.append(p.observe(16, ne if ok else 0, ne / 4000 if ok else None, 16 - ne if ok else 16, 0.016,
                                   engines_failed=ne > 0 and not works))
            demand.observe(wait=0.02, interval=0.05)
        return sent, stops

    sent, stops = run(12)
    first = sent.index(True)
    off = first + SplitPlanner.ENGINES_OFF_AFTER - 1  # the batch of the third refusal
    # paused for 5 batches, one retry (refused: paused for 10), the batches after it paused
    assert sent[first:] == [True] * SplitPlanner.ENGINES_OFF_AFTER + [False] * 5 + [True] + [False] * (3 - first)
    assert stops == [k == off for k in range(12)] and p.paused == 10 - (3 - first) and p.pause == 10
    sent, stops = run(p.paused + 1, works=True)  # the pause ends; the engines decode again
    assert sent == [False] * (len(sent) - 1) + [True] and not any(stops) and p.pause == p.refused == 0
    q = SplitPlanner(split)
    for failed in (True, True, False, True, True, False, True):
        q.observe(16, 0 if failed else 12, None if failed else 0.01, 16, 0.016, engines_failed=failed)
    assert q.paused == 0 and q.refused == 1 and len(q.plan(routes, eoi).engine) > 0


def test_planner_auto_split_follows_measured_rates():
    from recordtool.decode.gpu.plan import SplitPlanner

    pl = SplitPlanner("auto")
    routes = np.full(100, ENGINE, np.int8)
    eoi = np.ones(100, bool)
    assert len(pl.plan(routes, eoi).cpu) == 0
    pl.observe(100, 100, 0.01, 0, None)  # engines measured, CPU not yet: send it a few to measure
    assert 0 < len(pl.plan(routes, eoi).cpu) <= 10
    for _ in range(30):  # engines 4× as fast as the CPU: the CPU should get ~1/5
        p = pl.plan(routes, eoi)
        pl.observe(100, len(p.engine), len(p.engine) / 8000, len(p.cpu), len(p.cpu) / 2000)
    assert abs(pl.cpu_fraction - 0.2) < 0.02 and abs(len(pl.plan(routes, eoi).cpu) - 20) <= 2
    # the hybrid decoder gets what it finishes while the engines do their part, the rest the CPU
    routes[:50] = HYBRID
    pl.rates.hybrid = 500.0
    p = pl.plan(routes, eoi)
    t_engines = 50 * (1 - pl.cpu_fraction) / pl.rates.gpu
    assert len(p.hybrid) == max(2, int(500.0 * t_engines)) and p.n == 100


@gpu
@pytest.mark.parametrize("how", ["abandoned", "break", "collected"])
def test_cuda_script_leaving_a_loader_exits_cleanly(packed_mix, tmp_path, how):
    import subprocess
    import sys

    from test_loader import _EXIT_SCRIPT

    script = tmp_path / "leave.py"
    script.write_text(_EXIT_SCRIPT)
    p = subprocess.run([sys.executable, str(script), how, packed_mix, "cuda"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "end of script" in p.stdout, (p.returncode, p.stderr[-2000:])


@gpu
def test_cuda_keyed_user_op_same_for_any_producers_and_normalised_by_the_kernel(packed_mix):
    """Keyed ops get their keys with the call (no race between producers); the uint8 batch the
    op returns is normalised by the resize kernel at 1:1 into the output ring — the same values
    as normalising it on the host."""
    from recordtool.loader import Loader
    from recordtool.ops import Cutout, ReferenceOp

    kw = dict(batch_size=8, size=48, seed=2, split="gpu", as_torch=False, dtype="float32", layout="NCHW",
              user_op=ReferenceOp(Cutout(16)))  # array code on the CuPy batch
    ref = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", producers=1, **kw)]
    got = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", producers=4, **kw)]
    assert all(np.array_equal(a, b) for a, b in zip(ref, got))
    raw = Loader(packed_mix, device="cuda", producers=1, **dict(kw, mean=(0, 0, 0), std=(1 / 255,) * 3))
    x = cupy.asnumpy(next(iter(raw))[0])
    assert np.abs(x - np.rint(x)).max() < 1e-3 and x.min() > -1e-3 and x.max() < 255.001  # pixels back
    assert (x == 0).all(axis=1).any()  # the cutout squares are there


@gpu
@pytest.mark.parametrize("returns", ["none", "numpy", "float"])
def test_cuda_user_op_returning_something_else_than_its_batch_is_named(packed_mix, returns):
    """On the GPU too each batch checks what the op returned: the CuPy uint8 batch (or one of its
    kind, dtype and shape); a host array, None or a float array is an OpResultError naming the op."""
    from recordtool.errors import OpResultError
    from recordtool.loader import Loader

    def make(batch):
        return {"none": None, "numpy": cupy.asnumpy(batch), "float": batch.astype(cupy.float32)}[returns]

    ld = Loader(packed_mix, device="cuda", batch_size=8, size=48, as_torch=False, user_op=make)
    with pytest.raises(OpResultError, match="make"):
        next(iter(ld))
    ld.close()
    ok = Loader(packed_mix, device="cuda", batch_size=8, size=48, as_torch=False, layout="NHWC", mean=(0, 0, 0),
                std=(1, 1, 1), user_op=lambda b: cupy.full_like(b, 255))  # a new CuPy batch: normalised
    assert np.all(cupy.asnumpy(next(iter(ok))[0]) == 1.0)
    ok.close()


def _image_ops():
    # the GPU form needs no Numba (only the CPU form is compiled by it)
    from recordtool.ops import ColorJitter, Cutout, RandomGrayscale

    return [RandomGrayscale(0.5), Cutout(9), ColorJitter(0.4, 0.4, 0.4), ColorJitter(0.9, 0.0, 2.0, seed=3)]


@gpu
@pytest.mark.parametrize("shape", [(5, 29, 23), (1, 16, 16), (3, 7, 300), (64, 224, 224)])
def test_image_op_cuda_kernels_equal_their_numpy_reference(shape):
    """Each compiled op's CUDA kernel (one launch over the batch) gives the NumPy reference's
    pixels exactly (integer arithmetic), with the params computed on the host as on the CPU."""
    from recordtool.loader import BatchKeys
    from recordtool.ops.cuda import launch

    n, h, w = shape
    rng = np.random.default_rng(h)
    for op in _image_ops():
        b = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
        b[0] = 255
        p = op.batch_params(n, BatchKeys(np.arange(n) + 3, 1, 2), h, w)
        d = cupy.asarray(b)
        launch(op, d, p)
        assert np.array_equal(cupy.asnumpy(d), op.reference(b.copy(), p)), op.name
        d = cupy.asarray(b)  # as a batch op on a CuPy batch: the same kernel
        assert np.array_equal(cupy.asnumpy(op(d, BatchKeys(np.arange(n) + 3, 1, 2))), op.reference(b.copy(), p))


@gpu
def test_cuda_loader_with_a_compiled_op_same_for_any_producers_and_equal_to_the_host_reference(packed_mix):
    """Loader(device="cuda", user_op=ImageOp): the kernel runs on the unmirrored uint8 batch, the
    normalising pass mirrors. Pointwise ops commute with the mirror, so the batches equal those
    of the op's NumPy reference run as a batch op on the host (ReferenceOp); Cutout is checked
    without flips (train=False)."""
    from recordtool.loader import Loader
    from recordtool.ops import ReferenceOp

    for op in _image_ops()[:3]:
        kw = dict(batch_size=8, size=48, seed=2, split="gpu", as_torch=False, dtype="float32", layout="NCHW",
                  train=op.name != "Cutout")
        one = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", producers=1, user_op=op, **kw)]
        four = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", producers=4, user_op=op, **kw)]
        ref = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", producers=2, user_op=ReferenceOp(op),
                                                  **kw)]
        assert len(one) == len(ref) > 0
        assert all(np.array_equal(a, b) for a, b in zip(one, four)), op.name
        assert all(np.array_equal(a, b) for a, b in zip(one, ref)), op.name


class _Invert:
    """A parameter-free compiled op (nparams = 0): its pass uploads no params."""

    @staticmethod
    def make():
        from recordtool.ops import ImageOp

        class Invert(ImageOp):
            nparams = 0
            cuda_name = "rt_invert"
            cuda_source = r"""extern "C" __global__ void rt_invert(unsigned char* b, int n, int h, int w,
                const double* p, int k) {
                long long i = (long long)blockIdx.y * h * w * 3 + ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 3;
                if ((blockIdx.x * blockDim.x + threadIdx.x) >= h * w) return;
                b[i] = 255 - b[i]; b[i + 1] = 255 - b[i + 1]; b[i + 2] = 255 - b[i + 2];
            }"""

            def params(self, n, keys, h, w):
                return np.zeros((n, 0))

            @staticmethod
            def image(img, p):
                img[...] = 255 - img

            def reference(self, batch, params):
                batch[...] = 255 - batch
                return batch

        return Invert()


@gpu
@pytest.mark.parametrize("dtype, layout", [("float32", "NCHW"), ("float16", "NHWC")])
def test_cuda_user_op_pass_queued_in_one_call_equals_its_cupy_calls(packed_mix, monkeypatch, dtype, layout):
    """A user op's pass (params and samples up, the op's kernel, the normalising kernel, the
    event) queued in one GIL-free call (StreamWork, _nvsubmit.queue) gives the batches of the
    same CuPy calls made one by one (GPUBackend.native_queue = False): compiled ops with and
    without params, a batch op; the parameter-free op equals its host reference too."""
    from recordtool.decode.gpu.backend import GPUBackend
    from recordtool.decode.gpu.work import native_available
    from recordtool.loader import Loader
    from recordtool.ops import ColorJitter, Cutout, ReferenceOp

    assert native_available()
    kw = dict(batch_size=8, size=48, seed=4, split="gpu", as_torch=False, dtype=dtype, layout=layout, producers=2)
    for op in (ColorJitter(0.5, 0.5, 0.5), _Invert.make(), ReferenceOp(Cutout(12))):
        native = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", user_op=op, **kw)]
        with monkeypatch.context() as m:
            m.setattr(GPUBackend, "native_queue", False)
            calls = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", user_op=op, **kw)]
        assert len(native) == len(calls) > 1
        assert all(np.array_equal(a, b) for a, b in zip(native, calls)), type(op).__name__
    inv = _Invert.make()
    ref = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", user_op=ReferenceOp(inv), **kw)]
    got = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", user_op=inv, **kw)]
    assert all(np.array_equal(a, b) for a, b in zip(ref, got))


@gpu
def test_cuda_kernel_that_nvrtc_refuses_is_a_clear_error():
    from recordtool.errors import OpCompileError
    from recordtool.ops import Cutout
    from recordtool.ops.cuda import kernel

    class Broken(Cutout):
        cuda_source = Cutout.cuda_source.replace("q[0] = 0;", "q[0] = undefined_name;")

    with pytest.raises(OpCompileError, match="rt_cutout of Broken"):
        kernel(Broken(4))


# ------------------------------------------------------------------ the GPU/CPU fidelity bound
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


def _interp_bound(data, window, out=224) -> float:
    """The GPU-vs-CPU bound of chroma="interpolate" for one window: INTERPOLATED_DB where the
    CPU decodes at full scale, SCALED_DB where it decodes DCT-scaled (choose_scale)."""
    from recordtool import _native
    from recordtool.decode import reference as R

    y, x, h, w = window
    m = _native.choose_scale(float(w), float(h), out, out, R.SCALE_MARGIN, R.min_scale(data))
    return INTERPOLATED_DB if m == 8 else SCALED_DB


def _sharp_jpegs(side, subsampling, n=3, gray=False):
    from conftest import sharp_chroma

    out = []
    for k in range(n):
        im = sharp_chroma(side, side * 3 // 4, seed=k)
        buf = io.BytesIO()
        (im.convert("L") if gray else im).save(buf, "JPEG", quality=90, subsampling=subsampling)
        out.append(buf.getvalue())
    return out


@pytest.mark.parametrize("side", [500, 1600])
@pytest.mark.parametrize("subsampling", [2, 1, 0, "gray"])
def test_fidelity_bound_with_nvjpeg_upsampling_emulated(side, subsampling):
    """CPU-only proof of the bound's cause and size: the GPU path emulated as libjpeg-turbo with
    replicated chroma (what nvJPEG outputs) + the kernel's reference resample, against our CPU path."""
    from turbojpeg import TJFLAG_FASTUPSAMPLE, TJPF_RGB

    from recordtool.codec import turbojpeg

    gray = subsampling == "gray"
    bufs = _sharp_jpegs(side, 0 if gray else subsampling, n=2, gray=gray)
    worst = 99.0
    for k, data in enumerate(bufs):
        full = turbojpeg().decode(data, pixel_format=TJPF_RGB, flags=TJFLAG_FASTUPSAMPLE)
        h0, w0 = full.shape[:2]
        ids = np.arange(10) + 100 * k
        win = random_windows(np.full(10, w0), np.full(10, h0), ids, 0, 0)
        cpu = decode_crop_resize([data] * 10, win)
        for i, (y, x, h, w) in enumerate(win):
            gpu = np.clip(np.rint(resize_normalize(full[y:y + h, x:x + w], (0, 0, w, h), 224, 224)), 0, 255)
            worst = min(worst, psnr(gpu, cpu[i]))
    assert worst >= BOUND_DB, worst
    if subsampling in (0, "gray"):  # no chroma upsampling: only resampling differences
        assert worst >= 42, worst


@gpu
@pytest.mark.parametrize("subsampling", [2, 1, 0, "gray"])
def test_gpu_vs_cpu_bound_on_sharp_chroma_edges(subsampling):
    from recordtool.decode.gpu import GPUDecoder

    gray = subsampling == "gray"
    bufs = _sharp_jpegs(1200, 0 if gray else subsampling, n=4, gray=gray)
    sizes = np.array([[1200, 900]] * len(bufs))
    ids = np.arange(len(bufs))
    win = random_windows(sizes[:, 0], sizes[:, 1], ids, 5, 0)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu"), max_batch=8)
    out = cupy.asnumpy(dec(bufs, win, np.zeros(len(bufs), bool), _hw(bufs)))
    ref = decode_crop_resize(bufs, win)
    assert dec.last.cpu == 0  # every image went through a GPU decoder
    worst = min(psnr(out[k], ref[k]) for k in range(len(bufs)))
    assert worst >= BOUND_DB, (worst, dec.last)
    if subsampling == 0:
        assert worst >= 45, worst
    dec.close()


def test_hostile_multiscan_files_never_reach_the_hybrid_decoder():
    """A progressive file with thousands of scans, or one declaring 8192² in 156 bytes, is
    refused by the decoders' rule before nvJPEG's hybrid decoder sees it (no GPU needed to check
    the routing; on a GPU the CPU path then names it)."""
    from hostile_data import bomb_progressive, many_scans

    from recordtool.decode.gpu.decoder import _refused

    assert _refused(many_scans()) and _refused(bomb_progressive())
    assert not _refused(_jpegs(5)[0][4])  # an ordinary progressive file goes to the hybrid decoder


def test_refusal_routing_remembers_the_records_that_passed(monkeypatch):
    """refuse_hybrid routes a refused HYBRID image to the CPU; with ids and a decoder's set, a
    record that passed is not parsed again (the batch's planning holds the GIL), while a record
    whose bytes now have another length is parsed again — and its reference, the loop without
    the set, routes every batch the same way."""
    from hostile_data import many_scans

    from recordtool.decode.gpu import decoder as D
    from recordtool.decode.gpu.plan import CPU, ENGINE, HYBRID

    good, bad = _jpegs(5)[0][4], many_scans()
    parsed = []
    real = D._refused
    monkeypatch.setattr(D, "_refused", lambda data: parsed.append(len(data)) or real(data))
    routes0 = np.array([HYBRID, ENGINE, HYBRID, HYBRID])
    cleared: set = set()
    for batch in range(3):
        bufs, ids = [good, good, bad, good], np.array([7, 8, 9, 10])
        routes = routes0.copy()
        D.refuse_hybrid(routes, bufs, ids, cleared)
        ref = routes0.copy()
        D.refuse_hybrid(ref, bufs)  # the reference: every hybrid image parsed
        assert routes.tolist() == ref.tolist() == [HYBRID, ENGINE, CPU, HYBRID]
    assert cleared == {(7, len(good)), (10, len(good))}  # the refused record is parsed every time
    # ours: both good records in the first batch only, the refused one each time; + the reference's 3 a batch
    assert parsed.count(len(bad)) == 3 + 3 and parsed.count(len(good)) == 2 + 3 * 2
    parsed.clear()
    routes = routes0.copy()
    D.refuse_hybrid(routes, [good, good, bad, bad], np.array([7, 8, 9, 10]), cleared)  # record 10 changed length
    assert routes.tolist() == [HYBRID, ENGINE, CPU, CPU] and parsed == [len(bad), len(bad)]


@gpu
def test_hostile_multiscan_files_in_a_gpu_batch_are_named():
    from hostile_data import bomb_progressive, many_scans

    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs(6)
    bufs[1], bufs[3] = many_scans(), bomb_progressive()
    sizes[1], sizes[3] = (512, 512), (8192, 8192)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(6), 0, 0)
    routes = _hw(bufs)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu"), max_batch=8)
    dec(bufs, win, np.zeros(6, bool), routes)
    assert sorted(i for i, _ in dec.last.errors) == [1, 3], dec.last.errors
    dec.close()


# ------------------------------------------------------------------ chroma="interpolate": libjpeg's pixels from planes
# nvJPEG decodes whole images to planar YCbCr; the kernel upsamples chroma with libjpeg-turbo's
# fancy (triangle) filter and converts with libjpeg's fixed-point tables (decode.gpu.reference.planes_to_rgb).

def _planes(data):
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


def _to_440(data: bytes) -> bytes:
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


def _layout_jpeg(w, h, layout, seed=0, progressive=False):
    from conftest import sharp_chroma

    buf = io.BytesIO()
    im = sharp_chroma(w, h, seed=seed)
    if layout == "gray":
        im.convert("L").save(buf, "JPEG", quality=90, progressive=progressive)
    else:
        sub = {"444": 0, "422": 1, "420": 2, "440": 1}[layout]
        im.save(buf, "JPEG", quality=90, subsampling=sub, progressive=progressive)
    return _to_440(buf.getvalue()) if layout == "440" else buf.getvalue()


_LAYOUT_SUB = {"444": (1, 1), "422": (2, 1), "420": (2, 2), "440": (1, 2)}


@pytest.mark.parametrize("layout", ["420", "422", "444", "440", "gray"])
@pytest.mark.parametrize("size", [(333, 251), (64, 48), (5, 7), (3, 9), (17, 2)])
def test_planar_reference_is_libjpeg_bit_exact(layout, size):
    """decode.gpu.reference.planes_to_rgb (what the kernel computes per pixel) gives libjpeg-turbo's RGB decode
    bit for bit, from libjpeg's own planes: interior, edges, odd sizes, planes of ≤ 2 columns."""
    from turbojpeg import TJPF_RGB

    from recordtool.decode.gpu.reference import planes_to_rgb
    from recordtool.codec import turbojpeg

    w, h = size
    if layout == "440":
        w, h = (w + 15) // 16 * 16, (h + 7) // 8 * 8
    data = _layout_jpeg(w, h, layout, seed=w)
    p = _planes(data)
    got = planes_to_rgb(p[0]) if layout == "gray" else planes_to_rgb(*p, *_LAYOUT_SUB[layout])
    assert np.array_equal(got, turbojpeg().decode(data, pixel_format=TJPF_RGB))
    assert np.array_equal(got, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))  # Pillow's libjpeg too


def test_sample_dtype_is_the_kernels_struct():
    """SAMPLE_DTYPE's fields, order and offsets are struct Sample's in gpu_resize.cu (C layout
    rules: 8-byte pointers / long long, 4-byte int / float), and the kernel's colour constants
    are libjpeg's FIX() values the reference uses."""
    import re

    from recordtool.decode.gpu.kernel import SAMPLE_DTYPE
    from recordtool.decode.gpu.reference import CB_B, CB_G, CR_G, CR_R
    from recordtool.decode.gpu.kernel import _source

    src = _source()
    body = re.search(r"struct Sample \{(.*?)\};", src, re.S).group(1)
    fields = []
    for line in body.splitlines():
        decl = line.split("//")[0].strip().rstrip(";")
        if decl:
            ctype, names = re.match(r"(const unsigned char\*|long long|int|float)\s+(.*)", decl).groups()
            fields += [(n.strip(), 8 if ctype in ("const unsigned char*", "long long") else 4) for n in names.split(",")]
    off, expect = 0, {}
    for name, size in fields:
        off = (off + size - 1) // size * size
        expect[name] = off
        off += size
    assert list(SAMPLE_DTYPE.names) == [n for n, _ in fields]
    assert {n: SAMPLE_DTYPE.fields[n][1] for n in SAMPLE_DTYPE.names} == expect
    assert SAMPLE_DTYPE.itemsize == (off + 7) // 8 * 8
    for const in (CR_R, CB_B, CR_G, CB_G):
        assert str(const) in src
    assert (CR_R, CB_B, CR_G, CB_G) == (91881, 116130, 46802, 22554)


@pytest.mark.parametrize("side", [500, 1600])
@pytest.mark.parametrize("subsampling", [2, 1])
def test_fidelity_with_interpolated_chroma_emulated(side, subsampling):
    """CPU-only emulation of chroma="interpolate": libjpeg's planes → the kernel's reference
    (planes_to_rgb + resample) against our CPU path on sharp chroma edges — what replaced the
    35 dB bound of replicated chroma (test_fidelity_bound_with_nvjpeg_upsampling_emulated)."""
    from recordtool.decode.gpu.reference import planes_to_rgb

    bufs = _sharp_jpegs(side, subsampling, n=2)
    worst = 99.0
    for k, data in enumerate(bufs):
        full = planes_to_rgb(*_planes(data), *{2: (2, 2), 1: (2, 1)}[subsampling])
        h0, w0 = full.shape[:2]
        ids = np.arange(10) + 100 * k
        win = random_windows(np.full(10, w0), np.full(10, h0), ids, 0, 0)
        cpu = decode_crop_resize([data] * 10, win)
        for i, (y, x, h, w) in enumerate(win):
            gpu = np.clip(np.rint(resize_normalize(full, (x, y, x + w, y + h), 224, 224)), 0, 255)
            worst = min(worst, psnr(gpu, cpu[i]))
    # 1600 px: most windows are DCT-scaled on the CPU, whose resampling differs (the 4:4:4 floor
    # of the replicated-chroma test above, 42 dB); 500 px: mostly full-scale decodes
    assert worst >= (INTERPOLATED_DB if side == 500 else 42.0), worst  # 42: the 4:4:4 floor above


def test_kernel_source_built_for_the_host_matches_reference(tmp_path):
    """native/gpu_resize.cu itself (CUDA qualifiers defined away, the grid run as loops on the
    CPU) on planar samples of every layout against decode.gpu.reference: the kernel's upsampling and colour
    arithmetic and SAMPLE_DTYPE's layout, checked without a GPU."""
    import ctypes

    from host_kernel import build

    from recordtool.decode.gpu.kernel import SAMPLE_DTYPE
    from recordtool.decode.gpu.kernel import FMT_GRAY, FMT_RGB, FMT_YCC
    from recordtool.decode.gpu.reference import chroma_size, planes_to_rgb

    lib = build(tmp_path)
    if lib is None:
        pytest.skip("no C++ compiler")
    rng = np.random.default_rng(11)
    cases = [("420", (61, 83)), ("422", (40, 33)), ("440", (32, 17)), ("444", (20, 31)), ("gray", (25, 19)),
             ("420", (9, 3)), ("422", (7, 4)), ("rgb", (30, 20))]
    samples = np.zeros(len(cases), SAMPLE_DTYPE)
    keep, refs, boxes = [], [], []
    for k, (fmt, (h, w)) in enumerate(cases):
        box = (0.0, 0.0, float(w), float(h)) if k % 2 else (0.5, 1.25, w - 0.75, h - 0.5)
        boxes.append(box)
        row = dict(pitch=w + 5, rw=w, rh=h, x0=box[0], y0=box[1], x1=box[2], y1=box[3], mirror=k % 3 == 0)
        if fmt == "rgb":
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            keep.append(img)
            row.update(src=img.ctypes.data, pitch=w * 3, format=FMT_RGB)
            refs.append(img)
        else:
            y = rng.integers(0, 256, (h, w + 5), dtype=np.uint8)
            keep.append(y)
            row.update(src=y.ctypes.data, format=FMT_GRAY, hs=1, vs=1)
            if fmt == "gray":
                refs.append(planes_to_rgb(y[:, :w]))
            else:
                hs, vs = _LAYOUT_SUB[fmt]
                cw, ch = chroma_size(w, h, hs, vs)
                cb, cr = (rng.integers(0, 256, (ch, cw + 2), dtype=np.uint8) for _ in range(2))
                keep += [cb, cr]
                row.update(format=FMT_YCC, cb=cb.ctypes.data, cr=cr.ctypes.data, cpitch=cw + 2, hs=hs, vs=vs, cw=cw,
                           ch=ch)
                refs.append(planes_to_rgb(y[:, :w], cb[:, :cw], cr[:, :cw], hs, vs))
        for name, v in row.items():
            samples[name][k] = v
    W, H = 37, 29
    out = np.zeros((len(cases), H, W, 3), np.uint8)
    lib.run(ctypes.c_void_p(samples.ctypes.data), len(cases), ctypes.c_void_p(out.ctypes.data), W, H)
    for k, (fmt, _) in enumerate(cases):
        ref = np.rint(resize_normalize(refs[k], boxes[k], H, W, bool(samples["mirror"][k])))
        assert np.abs(out[k].astype(np.float64) - ref).max() <= 1.0, (fmt, k)
    # 1:1 windows are the pixels themselves: the kernel's upsampling and colour conversion are
    # planes_to_rgb's (libjpeg's), bit for bit
    for k, (fmt, (h, w)) in enumerate(cases):
        one = samples[k:k + 1].copy()
        one["x0"], one["y0"], one["x1"], one["y1"], one["mirror"] = 0, 0, w, h, 0
        out = np.zeros((1, h, w, 3), np.uint8)
        lib.run(ctypes.c_void_p(one.ctypes.data), 1, ctypes.c_void_p(out.ctypes.data), w, h)
        assert np.array_equal(out[0], refs[k]), fmt


def test_chroma_mode_is_validated():
    from recordtool.decode.options import CHROMA_MODES, DEFAULT_CHROMA

    assert DEFAULT_CHROMA in CHROMA_MODES and all(GPUOptions(chroma=c).chroma == c for c in CHROMA_MODES)
    with pytest.raises(ValueError, match="chroma"):
        GPUOptions(chroma="bilinear")
    from recordtool.loader import Loader

    with pytest.raises(ValueError, match="chroma"):  # at the edge, before the dataset is opened
        Loader("/nonexistent", batch_size=8, chroma="bilinear")


@gpu
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
    hs, vs = _LAYOUT_SUB.get(fmt, (1, 1))
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


@gpu
@pytest.mark.parametrize("layout", ["420", "422", "444", "440", "gray", "prog420"])
def test_nvjpeg_planes_are_libjpeg_planes(layout):
    """What the kernel's exactness rests on: nvJPEG's planar output (engines for baseline,
    hybrid decoder for progressive / gray) equals libjpeg-turbo's planes (its IDCT)."""
    from recordtool.decode.gpu.nvjpeg import HardwareDecoder, HybridDecoder

    prog = layout.startswith("prog")
    lay = layout[4:] if prog else layout
    w, h = (320, 240) if lay == "440" else (333, 251)
    data = _layout_jpeg(w, h, lay, seed=3, progressive=prog)
    want = _planes(data)
    view = np.frombuffer(data, np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    gray = lay == "gray"
    planes = [cupy.zeros((p.shape[0] + 2, p.shape[1] + 16), np.uint8) for p in want]
    ptrs = [p.data.ptr for p in planes] + [planes[0].data.ptr] * (3 - len(planes))
    pitches = [p.shape[1] for p in planes] + [planes[0].shape[1]] * (3 - len(planes))
    if prog or gray:
        d = HybridDecoder(stream.ptr)
        d.decode_planes(view.ctypes.data, len(view), ptrs, pitches, gray)
    else:
        try:
            d = HardwareDecoder(1, planar=True)
        except Exception as e:
            pytest.skip(f"no NVJPG engines: {e}")
        pin = cupy.cuda.alloc_pinned_memory(len(view))
        np.frombuffer(pin, np.uint8, len(view))[:] = view
        d.decode_planes([pin.ptr], [len(view)], [ptrs], [pitches], stream.ptr)
    stream.synchronize()
    nc, css, ws, hs = d.image_info(view.ctypes.data, len(view))
    assert (ws[0], hs[0]) == (want[0].shape[1], want[0].shape[0])
    for c, p in enumerate(want):
        got = cupy.asnumpy(planes[c])[: p.shape[0], : p.shape[1]]
        assert psnr(got, p) >= 50, (layout, c, psnr(got, p), np.abs(got.astype(int) - p).max())
    d.close()


def _edge_windows(w, h, n, seed):
    """RandomResizedCrop windows plus windows on every edge and corner, 1-pixel and whole ones."""
    win = random_windows(np.full(n, w), np.full(n, h), np.arange(n) + seed, seed, 0)
    edges = [[0, 0, h, w], [0, 0, 1, 1], [h - 1, w - 1, 1, 1], [0, w - min(w, 7), min(h, 5), min(w, 7)],
             [h - min(h, 6), 0, min(h, 6), min(w, 9)], [h // 3, w // 3, h - h // 3, w - w // 3]]
    return np.concatenate([win, np.array(edges, np.int64)])


@gpu
@pytest.mark.parametrize("layout", ["420", "422", "440", "444", "gray", "prog420", "prog422", "prog444"])
def test_nvjpeg_region_planes_are_the_whole_images_planes(layout):
    """What windowed interpolate rests on: nvJPEG's planar output of a region (plan_rois: MCU-
    aligned, engines for baseline, hybrid decoder for progressive / gray) equals the whole
    image's planes there, bit for bit — odd sizes, regions on every edge."""
    from recordtool.decode.gpu.roi import chroma_dims, plan_rois
    from recordtool.decode.gpu.nvjpeg import HardwareDecoder, HybridDecoder

    prog = layout.startswith("prog")
    lay = layout[4:] if prog else layout
    hs, vs = {"444": (1, 1), "422": (2, 1), "420": (2, 2), "440": (1, 2), "gray": (1, 1)}[lay]
    stream = cupy.cuda.Stream(non_blocking=True)
    hybrid = prog or lay == "gray"
    try:
        d = HybridDecoder(stream.ptr) if hybrid else HardwareDecoder(1, planar=True)
    except Exception as e:
        pytest.skip(f"no NVJPG engines: {e}")
    for w, h in ([(320, 240), (48, 24)] if lay == "440" else [(333, 251), (61, 33), (1001, 777)]):
        data = _layout_jpeg(w, h, lay, seed=w, progressive=prog)
        view = np.frombuffer(data, np.uint8)
        pin = cupy.cuda.alloc_pinned_memory(len(view))
        np.frombuffer(pin, np.uint8, len(view))[:] = view
        nc, css, ws, hsz = d.image_info(view.ctypes.data, len(view))
        w, h = ws[0], hsz[0]  # (4:4:0 files are 4:2:2 ones relabelled: half the width, twice the height)
        gray = lay == "gray"

        def decode(roi, pw, ph, native=True):
            cc, cr = (chroma_dims([roi], hs, vs) if roi is not None else ((ws[1],), (hsz[1],)))
            shapes = [(ph, pw)] + ([] if gray else [(cr[0], cc[0])] * 2)
            # region pitches, in buffers big enough for the whole planes (a decoder ignoring the
            # region writes inside them)
            room = (hsz[0] + 2) * (ws[0] + 16)
            planes = [cupy.full(room, 7, np.uint8)[: (r + 2) * (c + 16)].reshape(r + 2, c + 16) for r, c in shapes]
            ptrs = [p.data.ptr for p in planes] + [planes[0].data.ptr] * (3 - len(planes))
            pitches = [p.shape[1] for p in planes] + [planes[0].shape[1]] * (3 - len(planes))
            if hybrid:
                d.decode_planes(pin.ptr, len(view), ptrs, pitches, gray, roi)
            else:
                d.decode_planes([pin.ptr], [len(view)], [ptrs], [pitches], stream.ptr,
                                None if roi is None else [roi], native=native)
            stream.synchronize()
            return [cupy.asnumpy(p)[:r, :c] for p, (r, c) in zip(planes, shapes)]

        whole = decode(None, ws[0], hsz[0])
        win = _edge_windows(w, h, 6, w)
        rois = plan_rois(win, np.full(len(win), w), np.full(len(win), h), np.full(len(win), css), (224, 224))
        for roi in rois:
            rx, ry, rw, rh = (int(v) for v in roi)
            got = decode((rx, ry, rw, rh), rw, rh)
            if not hybrid and rx == 0:  # the ctypes loop, the native submission's reference
                assert all(np.array_equal(a, b) for a, b in zip(got, decode((rx, ry, rw, rh), rw, rh, False)))
            assert np.array_equal(got[0], whole[0][ry:ry + rh, rx:rx + rw]), (layout, w, h, roi, "Y")
            for c in (1, 2)[: 0 if gray else 2]:
                want = whole[c][ry // vs:ry // vs + got[c].shape[0], rx // hs:rx // hs + got[c].shape[1]]
                assert np.array_equal(got[c], want), (layout, w, h, roi, c)
    d.close()


@gpu
@pytest.mark.parametrize("split", ["gpu", "auto"])
def test_windowed_interpolate_is_whole_image_interpolate(split):
    """chroma="interpolate" decoding each window's region gives the same pixels as decoding
    whole images (planar_roi=False), bit for bit: 4:2:0 / 4:2:2 / 4:4:0 / 4:4:4,
    gray and progressive, odd sizes, windows on the edges, mirrored; and the CPU path's pixels
    (_interp_bound, ≥ 40 dB) on the RandomResizedCrop windows (on tiny edge windows both modes'
    filter taps reach past the window into the image, where the CPU path's crop stops)."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.format.jpeg import probe

    bufs, win, rrc = [], [], []
    for k, (lay, (w, h), prog) in enumerate([("420", (333, 251), False), ("422", (61, 33), False),
                                             ("440", (320, 240), False), ("444", (1001, 777), False),
                                             ("gray", (97, 55), True), ("420", (500, 375), True),
                                             ("420", (35, 33), False), ("422", (1200, 900), False)]):
        data = _layout_jpeg(w, h, lay, seed=k, progressive=prog)
        info = probe(data)  # (4:4:0 files are 4:2:2 ones relabelled: half the width, twice the height)
        ws = _edge_windows(info.width, info.height, 2, k)
        bufs += [data] * len(ws)
        win.append(ws)
        rrc += [True, True] + [False] * (len(ws) - 2)
    win = np.concatenate(win)
    flips = np.arange(len(bufs)) % 2 == 1
    outs = []
    for mode in ("whole", "roi"):
        dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split=split, chroma="interpolate"),
                         max_batch=len(bufs), planar_roi=mode == "roi")
        assert dec.planar_roi == (mode == "roi")
        if mode == "roi":  # both decoders passed the region check (roi_check.py) on this machine
            assert dec.planar_regions == {"engines": True, "hybrid": True}, dec.planar_regions
        outs.append(cupy.asnumpy(dec(bufs, win, flips, _hw(bufs))))
        if split == "gpu":
            assert dec.last.cpu == 0 and not dec.last.errors, dec.last
        dec.close()
    if split == "gpu":
        assert np.array_equal(outs[0], outs[1])
    ref = decode_crop_resize(bufs, win)
    ref[flips] = ref[flips, :, ::-1]
    for k in np.nonzero(rrc)[0]:
        # a window upscaled more than 4× (a RandomResizedCrop of the 61×33 image) magnifies the
        # edge taps the kernel takes from the image beyond the window, where the CPU path (and
        # Pillow's crop → resize) stops: ~35 dB there on the H200, a known deviation (README)
        if min(win[k][2], win[k][3]) * 4 < 224:
            continue
        assert psnr(outs[1][k], ref[k]) >= _interp_bound(bufs[k], win[k]), (k, psnr(outs[1][k], ref[k]))


@gpu
@pytest.mark.parametrize("layout", ["420", "422", "444", "gray", "prog420"])
def test_gpu_interpolate_matches_cpu_on_sharp_chroma(layout):
    """GPUDecoder(chroma="interpolate") against the CPU path on sharp colour edges, engines and
    hybrid decoder: ≥ 45 dB per window (40 where the CPU decodes DCT-scaled) where replication
    gave ≥ 35 dB."""
    from recordtool.decode.gpu import GPUDecoder

    prog = layout.startswith("prog")
    lay = layout[4:] if prog else layout
    bufs = [_layout_jpeg(1200, 900, lay, seed=k, progressive=prog) for k in range(4)]
    sizes = np.array([[1200, 900]] * len(bufs))
    ids = np.arange(len(bufs))
    win = random_windows(sizes[:, 0], sizes[:, 1], ids, 5, 0)
    flips = random_flips(ids, 5, 0)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu", chroma="interpolate"),
                     max_batch=8)
    out = cupy.asnumpy(dec(bufs, win, flips, _hw(bufs)))
    ref = decode_crop_resize(bufs, win)
    ref[flips] = ref[flips, :, ::-1]
    assert dec.last.cpu == 0 and not dec.last.errors, dec.last  # every image went through a GPU decoder
    for k in range(len(bufs)):
        assert psnr(out[k], ref[k]) >= _interp_bound(bufs[k], win[k]), (layout, k, psnr(out[k], ref[k]), dec.last)
    dec.close()


@gpu
@pytest.mark.parametrize("chroma", ["interpolate", "nvjpeg"])
def test_chroma_modes_on_the_mixed_batch(chroma):
    """Each chroma mode decodes the usual mixed batch (4:2:0 / 4:2:2 / 4:4:4, progressive, gray)
    on the GPU decoders; "interpolate" to the CPU path's pixels (_interp_bound), "nvjpeg" (the
    library's own interpolation, measured by benchmarks/gpu_fidelity.py) to the old bound."""
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs()
    ids = np.arange(len(bufs))
    win = random_windows(sizes[:, 0], sizes[:, 1], ids, 3, 0)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu", chroma=chroma), max_batch=32)
    out = cupy.asnumpy(dec(bufs, win, np.zeros(len(bufs), bool), _hw(bufs)))
    ref = decode_crop_resize(bufs, win)
    assert not dec.last.errors and dec.last.cpu == dec.last.cpu_forced, dec.last
    for k in range(len(bufs)):
        bound = _interp_bound(bufs[k], win[k]) if chroma == "interpolate" else BOUND_DB
        assert psnr(out[k], ref[k]) >= bound, (chroma, k, psnr(out[k], ref[k]))
    dec.close()


@gpu
def test_interpolate_memory_is_steady_and_loader_matches_cpu(packed_mix):
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.loader import Loader

    bufs, sizes = _jpegs(48)
    ids = np.arange(len(bufs))
    dec = GPUDecoder(Output(224), GPUOptions(split="auto", chroma="interpolate"), max_batch=48)
    dec.warmup([len(b) for b in bufs], sizes[:, 0], sizes[:, 1], routes=_hw(bufs))
    pool = cupy.get_default_memory_pool()
    for epoch in range(4):
        win = random_windows(sizes[:, 0], sizes[:, 1], ids, 0, epoch)
        out = dec(bufs, win, random_flips(ids, 0, epoch), _hw(bufs))
        del out
        if epoch == 1:
            before, allocs = pool.total_bytes(), dec.allocations
    assert pool.total_bytes() == before and dec.allocations == allocs == 0 and dec.prealloc_error is None
    dec.close()
    kw = dict(batch_size=8, size=64, seed=4, drop_last=False, as_torch=False, dtype="float32", layout="NHWC")
    cpu_b = [np.asarray(x) for x, _ in Loader(packed_mix, device="cpu", **kw)]
    gpu_b = [cupy.asnumpy(x) for x, _ in Loader(packed_mix, device="cuda", split="gpu", chroma="interpolate", **kw)]
    std, mean = np.array([0.229, 0.224, 0.225], np.float32), np.array([0.485, 0.456, 0.406], np.float32)
    for xg, xc in zip(gpu_b, cpu_b):
        for a, b in zip(xg, xc):
            assert psnr((a * std + mean) * 255, (b * std + mean) * 255) >= SCALED_DB  # 64 px: mostly scaled


@gpu
def test_interpolate_sends_headers_that_disagree_with_the_index_to_the_cpu():
    """Planes are sized from each file's header: a file damaged after packing whose header
    declares a bomb (9000² > DEFAULT_MAX_PIXELS) or a size that does not hold the index's window
    is not decoded on the GPU; the CPU path decodes it or names it, the rest of the batch is intact."""
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs(8)
    routes = _hw(bufs)
    eng = [int(i) for i in np.nonzero(routes == ENGINE)[0][:2]]

    def with_size(data, w, h):
        b = bytearray(data)
        i = 2
        while b[i + 1] not in (0xC0, 0xC2):
            i += 2 + ((b[i + 2] << 8) | b[i + 3])
        b[i + 5:i + 7], b[i + 7:i + 9] = h.to_bytes(2, "big"), w.to_bytes(2, "big")
        return bytes(b)

    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(8), 0, 0)
    bufs[eng[0]] = with_size(bufs[eng[0]], 9000, 9000)
    bufs[eng[1]] = with_size(bufs[eng[1]], 16, 16)
    win[eng[1]] = (0, 0, 200, 200)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu", chroma="interpolate"),
                     max_batch=8)
    dec.warmup([len(b) for b in bufs], sizes[:, 0], sizes[:, 1], outputs=0, routes=routes)  # the index's sizes
    out = cupy.asnumpy(dec(bufs, win, np.zeros(8, bool), routes))
    assert dec.last.gpu == int((routes == ENGINE).sum()) - 2 and dec.last.cpu == 2 + int((routes == CPU).sum())
    assert eng[0] in [i for i, _ in dec.last.errors], dec.last.errors  # the bomb is named by the CPU path
    ref = decode_crop_resize(bufs, win, on_error="skip")
    for k in set(range(8)) - set(eng):
        assert psnr(out[k], ref[k]) >= SCALED_DB
    assert dec.allocations == 0  # nothing was sized by the lying headers
    dec.close()


# ---------------------------------------------------------------- Output on the GPU: bfloat16, channels_last

@gpu
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


@gpu
def test_gpu_decoder_channels_last_writes_nhwc_and_hands_out_nchw():
    from recordtool.decode.gpu import GPUDecoder

    bufs, sizes = _jpegs(6)
    win = random_windows(sizes[:, 0], sizes[:, 1], np.arange(6), 0, 0)
    nchw = GPUDecoder(Output(64, dtype="float32"), GPUOptions(split="gpu"), max_batch=8)
    cl_spec = Output(64, dtype="float32", memory_format="channels_last")
    cl = GPUDecoder(cl_spec, GPUOptions(split="gpu"), max_batch=8)
    a = cupy.asnumpy(nchw(bufs, win, np.zeros(6, bool), _hw(bufs)))
    b = cl(bufs, win, np.zeros(6, bool), _hw(bufs))
    assert b.shape == (6, 64, 64, 3) and cl_spec.arrange(b).shape == (6, 3, 64, 64)
    assert np.array_equal(cupy.asnumpy(cl_spec.arrange(b)), a)
    nchw.close()
    cl.close()


@gpu
def test_cuda_loader_bfloat16_channels_last_and_device_spellings(packed_mix):
    torch = pytest.importorskip("torch")
    from recordtool.errors import DeviceUnavailable
    from recordtool.loader import Loader

    kw = dict(batch_size=8, size=48, seed=1, split="gpu", train=False)
    ref = [x.clone() for x, _ in Loader(packed_mix, device="cuda:0", **kw)]  # float32 NCHW
    ld = Loader(packed_mix, device=torch.device("cuda", 0), dtype="bfloat16", memory_format="channels_last", **kw)
    assert ld.gpu_id == 0
    got = [x for x, _ in ld]
    assert len(got) == len(ref) == 6  # 41 records, eval: nothing dropped
    for x, r in zip(got, ref):
        assert x.is_cuda and x.dtype == torch.bfloat16 and x.shape == r.shape
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(x, r.to(torch.bfloat16))
    big = Loader(packed_mix, device=0, batch_size=4000, size=32, train=False, as_torch=False)
    assert big.ring.shape[0] == 41 and len([x for x, _ in big]) == 1  # the ring holds the rank's share
    with pytest.raises(DeviceUnavailable, match="sees"):
        Loader(packed_mix, device=f"cuda:{_ngpu}", batch_size=8)


@gpu
def test_set_host_wait_policy_sets_the_context_flags():
    """set_host_wait_policy (process-wide: only a measurement calls it): the context's
    scheduling flags follow it."""
    from recordtool.decode.gpu import set_host_wait_policy

    try:
        assert set_host_wait_policy(0, "block") & 0x7 == 4
        assert set_host_wait_policy(0, "spin") & 0x7 == 1
    finally:
        assert set_host_wait_policy(0, "auto") & 0x7 == 0


def test_an_unknown_host_wait_policy_is_refused_before_cuda():
    """A mode that is not auto / spin / yield / block is a ConfigError, before CuPy or the driver
    is touched (no GPU needed)."""
    from recordtool.decode.gpu import set_host_wait_policy
    from recordtool.errors import ConfigError

    for bad in ("fast", "", None, 4):
        with pytest.raises(ConfigError, match="host wait policy"):
            set_host_wait_policy(0, bad)


@gpu
def test_training_bench_at_a_node_share_reports_cores_and_memory(packed_mix):
    """bench --train on the GPU at 2 cores: every run pinned there, cores busy and host RSS
    measured, the device memory the process holds read (nvidia-smi for this pid, else
    memGetInfo), the Loader's share beside the model above the synthetic pipeline's. (DALI is
    left out: this set's CMYK file is not for it; scripts/device_run.sh's trainbench runs it.)"""
    import os

    pytest.importorskip("torch")
    from recordtool.tools import train_bench

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    res = train_bench.run(packed_mix, None, "tiny", 32, 8, 3, 2, 1, ["synthetic", "recordtool"], None, "cuda",
                          log=lambda m: None, cores=2)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    assert res.threads == 2 and res.cpus == cpus
    for r in res.runs:
        assert r.error is None, r
        assert r.affinity == cpus and r.cores_busy > 0 and r.rss_mib > 0 and r.gpu_mib > 0, r
    s = res.summary()
    # the pipeline's memory is its reading less the synthetic one's; with this tiny model and batch
    # the two differ by less than what the caching allocators hold, so only its form is checked here
    # (the training benchmark's rows, ResNet at batch 256/512, are where the difference means something)
    assert s["synthetic"]["gpu_mib"] == 0 and isinstance(s["recordtool"]["gpu_mib"], (int, float)), s


@gpu
@pytest.mark.parametrize("layout,progressive", [("420", False), ("422", False), ("440", False), ("444", False),
                                                ("gray", False), ("420", True)])
def test_gpu_reproduces_the_cpu_dct_scaling(layout, progressive):
    """Windows the CPU path decodes DCT-scaled (at 1/2 or 1/4: far larger than the output) give
    the CPU's pixels on the GPU too (chroma="interpolate": the kernel reduces nvJPEG's planes as
    libjpeg's reduced IDCTs do, gpu_resize.cu reduced_rgb) — within nvJPEG's own IDCT rounding:
    ≥ 45 dB per image, on sharp colour edges, every layout, the engines and the hybrid decoder."""
    from recordtool.decode.gpu import GPUDecoder
    from recordtool.decode.gpu.roi import dct_reduction
    from recordtool.format.jpeg import probe

    bufs, win = [], []
    for k, (w, h) in enumerate([(1408, 1048), (2016, 1336), (896, 1200)]):  # (4:4:0: _to_440's multiples)
        data = _layout_jpeg(w, h, layout, seed=40 + k, progressive=progressive)
        info = probe(data)
        ws = random_windows(np.full(16, info.width), np.full(16, info.height), np.arange(16) + 16 * k, 0, 0,
                            scale=(0.25, 1.0))
        bufs += [data] * len(ws)
        win.append(ws)
    win = np.concatenate(win)
    red = dct_reduction(win, [probe(b).chroma for b in bufs], (224, 224))
    assert (red == 2).any() and (layout in ("422", "440") or (red == 4).any())
    flips = np.zeros(len(bufs), bool)
    dec = GPUDecoder(Output(224, dtype="uint8", layout="NHWC"), GPUOptions(split="gpu", chroma="interpolate"),
                     max_batch=len(bufs))
    got = cupy.asnumpy(dec(bufs, win, flips, _hw(bufs)))
    assert dec.last.cpu == 0 and not dec.last.errors, dec.last
    dec.close()
    ref = decode_crop_resize(bufs, win)
    worst = min(psnr(got[k], ref[k]) for k in np.nonzero(red > 1)[0])
    assert worst >= 45.0, (layout, progressive, worst)
