"""Native fused decode against its Python references and against Pillow's crop → resize."""
import io
import os
import warnings

import numpy as np
import pytest
from PIL import Image

from conftest import jpeg_bytes, photo_like
import recordtool
from recordtool.decode import (DecodeError, decode_crop_resize, eval_transform, mirror, normalize, random_flips,
                               random_windows)
from recordtool.decode import cpu, reference as R

if os.environ.get("RECORDTOOL_REQUIRE_NATIVE"):  # CI and the device script: a failed build is a failure
    from recordtool import _native as native
else:
    native = pytest.importorskip("recordtool._native", reason="native extension not built")


def psnr(a, b):
    mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean()
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def encode(im, **kw):
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=kw.pop("quality", 92), **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def photos():
    """Realistic-enough photos: smooth structure, texture, mild sensor noise (no ../shared)."""
    out = {}
    for k, (w, h) in enumerate([(640, 480), (480, 640), (1600, 1200)]):
        out[(w, h)] = photo_like(w, h, seed=100 + k)
    return out


# ---------------------------------------------------------------- each native routine vs its reference

@pytest.mark.parametrize("shape,box,out", [
    ((50, 60), (0, 0, 60, 50), (224, 224)),          # upscale
    ((480, 640), (0, 0, 640, 480), (224, 224)),      # downscale
    ((300, 301), (3.25, 7.5, 290.75, 250.125), (97, 131)),  # fractional box
    ((40, 40), (0, 0, 40, 40), (40, 40)),            # identity
    ((33, 500), (10, 0, 490, 33), (224, 16)),        # one axis only
])
def test_resample_is_pillow_exact(shape, box, out):
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    got = native.resample(src, list(box), out[0], out[1])
    ref = R.resample(src, box, out[0], out[1])
    assert np.array_equal(got, ref)


def test_choose_scale_matches_reference():
    rng = np.random.default_rng(1)
    for _ in range(2000):
        w, h = rng.uniform(1, 4000, 2)
        ow, oh = rng.integers(16, 512, 2)
        margin = float(rng.choice([1.0, 1.25, 2.0]))
        lo = int(rng.choice([1, 2, 4]))
        assert native.choose_scale(w, h, int(ow), int(oh), margin, lo) == \
            R.choose_scale(w, h, int(ow), int(oh), margin, lo)


def test_gather_matches_numpy_copy():
    rng = np.random.default_rng(3)
    bufs = [rng.bytes(int(k)) for k in rng.integers(0, 5000, 50)] + [memoryview(b"xyz")]
    dst = np.zeros(400_000, np.uint8)
    offs = native.gather(bufs, dst.ctypes.data, dst.size, 64)
    ref = np.cumsum([0] + [(len(b) + 63) // 64 * 64 for b in bufs[:-1]])
    assert offs.tolist() == ref.tolist()
    for o, b in zip(offs, bufs):
        assert dst[o:o + len(b)].tobytes() == bytes(b)
    with pytest.raises(ValueError):
        native.gather(bufs, dst.ctypes.data, 100, 64)


def test_schedule_is_largest_first():
    rng = np.random.default_rng(2)
    sizes = rng.integers(0, 50, 1000).tolist()
    assert native.largest_first(sizes) == np.argsort(-np.array(sizes), kind="stable").tolist()


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8])
def test_scaled_crop_decode_matches_full_decode_reference(photos, m):
    data = encode(photos[(1600, 1200)], subsampling=2)
    windows = np.array([[0, 0, 1200, 1600], [123, 77, 901, 1333], [7, 3, 300, 401], [1199, 1599, 1, 1]])
    out = np.empty((len(windows), 64, 80, 3), np.uint8)
    assert native.decode_crop_resize([data] * len(windows), windows.astype(float), out, 2, 1 << 30, m, 1.25) == []
    for k, win in enumerate(windows):
        ref = R.decode_crop_resize_one(data, win, 80, 64, m=m)
        # crop_scanline decodes from an iMCU edge: fancy upsampling at the window edge may differ
        assert psnr(out[k], ref) > 45, (m, win)


# ---------------------------------------------------------------- fidelity against Pillow crop → resize

CASES = [
    ("4:2:0", dict(subsampling=2), "RGB"),
    ("4:2:2", dict(subsampling=1), "RGB"),
    ("4:4:4", dict(subsampling=0), "RGB"),
    ("gray", dict(), "L"),
    ("progressive", dict(subsampling=2, progressive=True), "RGB"),
]


@pytest.mark.parametrize("name,save,mode", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("size", [(640, 480), (480, 640), (1600, 1200)])
def test_fidelity_psnr_40db(photos, name, save, mode, size):
    im = photos[size] if mode == "RGB" else photos[size].convert(mode)
    data = encode(im, **save)
    W, H = size
    n = 24
    win = random_windows(np.full(n, W), np.full(n, H), np.arange(n), seed=3, epoch=0)
    win[0] = (0, 0, H, W)                 # whole image
    win[1] = (5, 13, 231, 227)            # x not on an iMCU edge, just above the output size
    win[2] = (H - 64, W - 70, 64, 70)     # small window: upscaled, bottom-right corner
    out = decode_crop_resize([data] * n, win, threads=2)
    scaled = 0
    for k in range(n):
        p = psnr(out[k], R.truth(data, win[k], 224, 224))
        assert p >= 40, (name, size, tuple(win[k]), p)
        scaled += R.choose_scale(win[k][3], win[k][2], 224, 224, min_m=R.min_scale(data)) < 8
    if size == (1600, 1200):
        assert scaled > n // 2  # the DCT-scaled path is what was measured here


def test_cmyk_jpeg(photos):
    data = encode(photos[(640, 480)].convert("CMYK"))
    win = np.array([[10, 20, 400, 500]])
    out = decode_crop_resize([data], win)
    assert psnr(out[0], R.truth(data, win[0], 224, 224)) > 40


def test_eval_transform_close_to_resize_then_crop(photos):
    for size in [(640, 480), (480, 640)]:
        data = encode(photos[size])
        got = eval_transform([data], [size[0]], [size[1]])[0]
        im = Image.open(io.BytesIO(data)).convert("RGB")
        W, H = im.size
        rw, rh = (256, int(256 * H / W)) if W <= H else (int(256 * W / H), 256)
        r = im.resize((rw, rh), Image.BILINEAR)
        top, left = int(round((rh - 224) / 2)), int(round((rw - 224) / 2))
        ref = np.asarray(r.crop((left, top, left + 224, top + 224)))
        assert psnr(got[3:-3, 3:-3], ref[3:-3, 3:-3]) > 40  # inside: same filter; edges see other pixels


# ---------------------------------------------------------------- determinism, threads, out=

def test_same_bytes_any_thread_count(photos):
    bufs = [encode(photos[s], subsampling=k % 3) for k, s in enumerate(list(photos) * 4)]
    sizes = [s for s in list(photos) * 4]
    win = random_windows([s[0] for s in sizes], [s[1] for s in sizes], np.arange(len(bufs)), 1, 0)
    a = decode_crop_resize(bufs, win, threads=1)
    for t in (2, 3, 8):
        assert np.array_equal(decode_crop_resize(bufs, win, threads=t), a)
    out = np.full_like(a, 7)
    assert decode_crop_resize(bufs, win, threads=4, out=out) is out and np.array_equal(out, a)
    with pytest.raises(ValueError, match="out must be"):
        decode_crop_resize(bufs, win, out=np.empty((1, 224, 224, 3), np.uint8))


# ---------------------------------------------------------------- bad input

def bad_batch(photos):
    good = encode(photos[(640, 480)])
    bomb = bytearray(good)
    sof = bomb.find(b"\xff\xc0")
    bomb[sof + 5:sof + 9] = (60000).to_bytes(2, "big") * 2
    return [good, good[: len(good) // 3], b"\x00garbage" * 20, b"", bytes(bomb), good], \
        np.array([[0, 0, 480, 640]] * 6)


def test_bad_inputs_reported_not_crashing(photos):
    bufs, win = bad_batch(photos)
    errors = []
    out = decode_crop_resize(bufs, win, on_error="skip", errors=errors)
    failed = dict(errors)
    assert set(failed) == {1, 2, 3, 4}
    assert "truncated" in failed[1] or "premature" in failed[1].lower()
    assert "empty" in failed[3]
    assert "max_pixels" in failed[4] and "60000x60000" in failed[4]
    assert (out[[1, 2, 3, 4]] == 0).all()
    assert np.array_equal(out[0], out[5]) and out[0].any()
    with pytest.raises(DecodeError) as e:
        decode_crop_resize(bufs, win)
    assert [i for i, _ in e.value.failures] == [1, 2, 3, 4]


def test_window_outside_image_is_a_failure(photos):
    data = encode(photos[(640, 480)])
    with pytest.raises(DecodeError, match="outside"):
        decode_crop_resize([data], np.array([[0, 600, 100, 100]]))


def test_fallback_policy_uses_pillow_for_what_it_can(photos, monkeypatch):
    bufs, win = bad_batch(photos)
    errors = []
    calls = []
    real = R.truth
    monkeypatch.setattr(R, "truth", lambda *a: calls.append(a[0]) or real(*a))
    out = decode_crop_resize(bufs, win, on_error="skip", fallback=True, errors=errors)
    assert {i for i, _ in errors} == {1, 2, 3, 4}  # Pillow cannot fix these either
    reasons = dict(errors)
    # the bomb is refused for its cost before any decoder starts: Pillow never sees it
    assert "max_pixels" in reasons[4] and "Pillow" not in reasons[4]
    assert all("Pillow fallback" in reasons[i] for i in (1, 2, 3)) and len(calls) == 3
    assert np.array_equal(out[0], out[5])


# ---------------------------------------------------------------- Python fallback path, same API

def test_missing_native_decoder_is_an_error_with_the_fix(photos, monkeypatch):
    """No silent slow path: without the extension the first decode raises (both entry points),
    naming the fix and the opt-in, and no Python decoder runs."""
    import recordtool
    from recordtool.errors import NativeDecoderMissing, RecordtoolError

    bufs = [encode(photos[(640, 480)])]
    win = random_windows([640], [480], [0], 0, 0)
    monkeypatch.setattr(cpu, "_native", None)
    monkeypatch.setattr(cpu, "_IMPORT_ERROR", "No module named 'recordtool._native'", raising=False)
    monkeypatch.setattr(cpu, "_python_decoder", False)
    monkeypatch.setattr(R, "python_batch", lambda *a: pytest.fail("the Python decoder ran"))
    for call in (lambda: decode_crop_resize(bufs, win), lambda: cpu.decode_crop_resize_normalize(bufs, win)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an error, not a warning
            with pytest.raises(NativeDecoderMissing, match="allow_python_decoder") as e:
                call()
        assert isinstance(e.value, RecordtoolError) and isinstance(e.value, ImportError)
        assert "recordtool._native" in str(e.value) and "wheel" in str(e.value)
    assert recordtool.NativeDecoderMissing is NativeDecoderMissing


def test_python_decoder_when_allowed_same_results(photos, monkeypatch):
    from recordtool.decode import allow_python_decoder

    bufs = [encode(photos[(640, 480)], subsampling=s) for s in (0, 1, 2)]
    win = random_windows([640] * 3, [480] * 3, [0, 1, 2], 0, 0)
    nat = decode_crop_resize(bufs, win)
    monkeypatch.setattr(cpu, "_native", None)
    monkeypatch.setattr(cpu, "_IMPORT_ERROR", "test", raising=False)
    monkeypatch.setattr(cpu, "_python_decoder", False)
    with pytest.warns(RuntimeWarning, match="Python decoder"):  # loud where the opt-in takes effect
        allow_python_decoder()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and only there
        py = decode_crop_resize(bufs, win)
        errors = []
        decode_crop_resize(bufs + [b""], np.vstack([win, win[:1]]), on_error="skip", errors=errors)
    for a, b in zip(nat, py):
        assert psnr(a, b) > 45
    assert [i for i, _ in errors] == [3]
    allow_python_decoder(False)
    with pytest.raises(cpu.NativeDecoderMissing):
        decode_crop_resize(bufs, win)
    with pytest.raises(cpu.ConfigError, match="allow="):
        allow_python_decoder("yes")


# ---------------------------------------------------------------- mirror, normalize

def test_native_normalize_matches_numpy_float16_edges():
    from recordtool.decode.reference import normalize as normalize_reference

    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (3, 7, 9, 3), dtype=np.uint8)
    x[0, 0, :3, 0] = [0, 1, 255]
    flips = np.array([True, False, True])
    # scales/biases that push values into float16's subnormal range, its normal range and past 65504
    for scale, bias in [((1e-7, 3e-6, 1.0), (0.0, 1e-7, -0.5)), ((300.0, 1.0, 1 / 255), (-2.0, 65000.0, 0.1)),
                        ((0.017, 0.0175, 0.0174), (-2.11, -2.03, -1.8))]:
        for dtype in (np.float16, np.float32):
            for nchw in (True, False):
                out = np.empty((3, 3, 7, 9) if nchw else (3, 7, 9, 3), dtype)
                native.normalize(x, flips, out, list(scale), list(bias), nchw, 2)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns on the intended overflow
                    ref = normalize_reference(x, np.float32(scale), np.float32(bias), "NCHW" if nchw else "NHWC",
                                              dtype, flips)
                assert np.array_equal(out, ref), (scale, bias, dtype, nchw)


def test_mirror_and_normalize_against_numpy():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (4, 5, 6, 3), dtype=np.uint8)
    flags = np.array([True, False, True, False])
    m = mirror(x.copy(), flags)
    assert np.array_equal(m[0], x[0, :, ::-1]) and np.array_equal(m[1], x[1])
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    ref = (x / 255.0 - np.array(mean)) / np.array(std)
    nhwc = normalize(x, mean, std, layout="NHWC")
    nchw = normalize(x, mean, std, layout="NCHW", dtype=np.float16)
    assert nhwc.dtype == np.float32 and np.allclose(nhwc, ref, atol=1e-5)
    assert nchw.shape == (4, 3, 5, 6) and nchw.dtype == np.float16
    assert np.allclose(nchw.astype(np.float32), ref.transpose(0, 3, 1, 2), atol=2e-3)


@pytest.mark.skipif(not cpu.native_available(), reason="native decoder not built")
def test_background_pools_run_their_threads_at_lower_priority(photos):
    """A GPU loader's CPU share decodes on background pools: their threads' nice is raised by
    BACKGROUND_NICE before their first job; normal pools' threads keep the process's; a released
    background pool goes back to its own kind, never to a normal caller."""
    from recordtool import _native

    data = [encode(photos[(640, 480)])] * 4
    win = np.array([[0, 0, 480, 640]] * 4, np.float64)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    bg, normal = cpu.new_pool_id(background=True), cpu.new_pool_id()
    try:
        assert bg >= 64 and 1 <= normal < 64
        for pool in (bg, normal):
            decode_crop_resize(data, win, (32, 32), threads=3, pool=pool)
        nice = {pool: {os.getpriority(os.PRIO_PROCESS, t) for t in _native.pool_thread_ids(pool)}
                for pool in (bg, normal)}
        assert nice[bg] == {min(19, base + cpu.BACKGROUND_NICE)} and nice[normal] == {base}
        assert cpu.BACKGROUND_NICE > 0  # the default
    finally:
        cpu.release_pool_id(bg)
        cpu.release_pool_id(normal)
    again = [cpu.new_pool_id() for _ in range(63)]  # every normal pool: none of them background
    try:
        assert all(1 <= p < 64 for p in again) and bg not in again
    finally:
        for p in again:
            cpu.release_pool_id(p)


@pytest.mark.skipif(not cpu.native_available(), reason="native decoder not built")
def test_ends_with_eoi_native_matches_its_reference():
    """The GPU planner's truncation check (FF D9 at the end) in C = its Python reference, on
    bytes, memoryviews and arrays, empty and one-byte buffers included."""
    from recordtool import _native
    from recordtool.decode.gpu.plan import ends_with_eoi, ends_with_eoi_py

    rng = np.random.default_rng(0)
    bufs = [b"", b"\xd9", b"\xff\xd9", b"\xd9\xff", bytes(rng.integers(0, 256, 100, dtype=np.uint8)) + b"\xff\xd9",
            memoryview(b"abc\xff\xd9")[1:], memoryview(b"abc\xff\xd9")[:-1], np.frombuffer(b"\x00\xff\xd9", np.uint8)]
    bufs += [bytes(rng.integers(0, 256, int(rng.integers(0, 8)), dtype=np.uint8)) for _ in range(200)]
    want = ends_with_eoi_py(bufs)
    assert want[:8].tolist() == [False, False, True, False, True, True, False, True]
    assert np.array_equal(_native.ends_with_eoi(bufs), want) and np.array_equal(ends_with_eoi(bufs), want)


@pytest.mark.skipif(not cpu.native_available(), reason="native decoder not built")
def test_buffer_spans_native_matches_its_reference():
    """The GPU decoders' host pointers and lengths in C = its Python reference (a NumPy view per
    buffer), on bytes, memoryview slices, bytearrays, arrays and empty buffers."""
    from recordtool import _native
    from recordtool.decode.gpu.plan import buffer_spans, buffer_spans_py

    rng = np.random.default_rng(1)
    raw = bytes(rng.integers(0, 256, 1000, dtype=np.uint8))
    keep = bytearray(b"\xff\xd8abc")
    bufs = [raw, memoryview(raw)[17:400], memoryview(raw)[999:], b"", keep, np.frombuffer(raw, np.uint8)[5:9]]
    bufs += [bytes(rng.integers(0, 256, int(rng.integers(0, 50)), dtype=np.uint8)) for _ in range(100)]
    want = buffer_spans_py(bufs)
    assert want[1][:6].tolist() == [1000, 383, 1, 0, 5, 4]
    assert want[0][1] - want[0][0] == 17 and want[0][5] - want[0][0] == 5
    for got in (_native.buffer_spans(bufs), buffer_spans(bufs)):
        assert np.array_equal(got[1], want[1]) and got[0].dtype == got[1].dtype == np.int64
        nonempty = want[1] > 0  # an empty buffer's address is whatever its exporter says
        assert np.array_equal(got[0][nonempty], want[0][nonempty])


@pytest.mark.skipif(not cpu.native_available(), reason="native decoder not built")
def test_strided_views_of_bytes_are_refused_naming_the_buffer():
    """The native passes read a buffer as ptr .. ptr + length: a strided or reversed view is not
    its bytes there (a reversed one not even its memory), so each refuses it with a ValueError
    naming its position — as the Python references do; a contiguous slice or array passes."""
    from recordtool import _native
    from recordtool.decode.gpu.plan import buffer_spans_py, ends_with_eoi_py

    good = jpeg_bytes()
    for bad in (memoryview(good)[::2], memoryview(good)[::-1], np.frombuffer(good * 2, np.uint8).reshape(2, -1)[:, ::3]):
        bufs = [good, bad]
        for f in (_native.ends_with_eoi, _native.buffer_spans, ends_with_eoi_py, buffer_spans_py,
                  lambda b: _native.gather(b, np.zeros(4 * len(good), np.uint8).ctypes.data, 4 * len(good), 64),
                  lambda b: cpu.decode_crop_resize(b, np.array([[0, 0, 8, 8]] * 2, np.float64), (16, 16))):
            with pytest.raises(ValueError, match="buffer 1 is not C-contiguous"):
                f(bufs)
    fine = [good, memoryview(good)[:], np.frombuffer(good, np.uint8).reshape(1, -1)]
    assert _native.ends_with_eoi(fine).all() and np.array_equal(_native.buffer_spans(fine)[1], [len(good)] * 3)


# ---------------------------------------------------------------- the Loader's sizes and crops against Pillow

PIXELS = dict(mean=(0, 0, 0), std=(1 / 255,) * 3, layout="NHWC", as_torch=False, with_ids=True, shuffle=False,
              drop_last=False)  # normalised values that are the pixels themselves


@pytest.fixture(scope="module")
def packed_photos(tmp_path_factory):
    from conftest import write
    from recordtool.pack import pack

    root = tmp_path_factory.mktemp("sizes")
    for k, (w, h) in enumerate([(640, 480), (480, 640), (500, 333), (301, 777), (256, 256), (900, 200)]):
        write(str(root / "src" / "c" / f"{k}.jpg"), encode(photo_like(w, h, seed=40 + k), subsampling=k % 3))
    pack(str(root / "src"), str(root / "out"), shards=1, progress=False)
    return str(root / "out")


def _batch(loader):
    x, _, ids = next(iter(loader))
    loader.close()
    return np.clip(np.rint(np.asarray(x, np.float64)), 0, 255).astype(np.uint8), np.asarray(ids)


@pytest.mark.parametrize("size", [(96, 160), (160, 96), 112])
@pytest.mark.parametrize("crop_pct", [0.875, 0.95])
def test_loader_eval_sizes_and_crop_pct_match_pillow_resize_then_centre_crop(packed_photos, size, crop_pct):
    """train=False with size (h, w) and crop_pct: Pillow's Resize keeping the aspect (to cover
    floor(h / crop_pct) × floor(w / crop_pct)) then CenterCrop((h, w)) — timm's evaluation
    transform — inside (edges see other pixels in the one-pass resample), and Pillow's crop →
    resize of that window on the whole image."""
    from recordtool.loader import Loader

    ds = recordtool.open(packed_photos)
    ld = Loader(packed_photos, batch_size=len(ds), size=size, train=False, crop_pct=crop_pct, **PIXELS)
    got, ids = _batch(ld)
    h, w = (size, size) if isinstance(size, int) else size
    assert got.shape == (len(ds), h, w, 3)
    for k, i in enumerate(ids):
        data = ds[int(i)][0]
        im = Image.open(io.BytesIO(bytes(data))).convert("RGB")
        W, H = im.size
        bh, bw = int(h / crop_pct), int(w / crop_pct)
        rw, rh = (bw, int(bw * H / W)) if bw * H >= bh * W else (int(bh * W / H), bh)
        top, left = int(round((rh - h) / 2)), int(round((rw - w) / 2))
        ref = np.asarray(im.resize((rw, rh), Image.BILINEAR).crop((left, top, left + w, top + h)))
        assert psnr(got[k][3:-3, 3:-3], ref[3:-3, 3:-3]) > 36, (W, H, size, crop_pct)
        window = (top * H / rh, left * W / rw, h * H / rh, w * W / rw)
        assert psnr(got[k], R.truth(data, window, w, h)) >= 40, (W, H, size, crop_pct)


@pytest.mark.parametrize("size", [(96, 160), (160, 96)])
@pytest.mark.parametrize("hflip", [0.0, 1.0])
def test_loader_train_sizes_scale_ratio_and_flip_match_pillow_crop_then_resize(packed_photos, size, hflip):
    """train=True with size (h, w), scale, ratio and hflip: each image is Pillow's decode → crop
    of its window → resize(BILINEAR) to (w, h), mirrored when hflip=1 and never when 0; the
    windows keep to scale and ratio (or are torchvision's whole-image fallback)."""
    from recordtool.loader import Loader

    ds = recordtool.open(packed_photos)
    scale, ratio = (0.2, 0.6), (0.5, 0.8)
    ld = Loader(packed_photos, batch_size=len(ds), size=size, scale=scale, ratio=ratio, hflip=hflip, seed=4, **PIXELS)
    got, ids = _batch(ld)
    win, flips = ld.backend.recipe.draws(ids, 0)
    assert flips.all() if hflip else not flips.any()
    h, w = size
    for k, i in enumerate(ids):
        data = ds[int(i)][0]
        W, H = int(ds.index.width[i]), int(ds.index.height[i])
        y, x, wh, ww = win[k]
        if wh < H and ww < W:  # not torchvision's fallback (a centre crop of the whole height or width)
            assert scale[0] * 0.97 <= wh * ww / (W * H) <= scale[1] * 1.03
            assert ratio[0] * 0.95 <= ww / wh <= ratio[1] * 1.05
        ref = R.truth(data, win[k], w, h)
        assert psnr(got[k], ref[:, ::-1] if hflip else ref) >= 40, (W, H, size, tuple(win[k]))


def test_loader_defaults_give_the_batches_of_before(packed_photos):
    """With every crop option at its default the Loader's batch is, bit for bit, the fused
    pass over the windows and flips of before (RandomResizedCrop (0.08, 1) × (3/4, 4/3), flip
    at 0.5; evaluation 256 → 224)."""
    from recordtool.decode.cpu import decode_crop_resize_normalize
    from recordtool.loader import Loader
    from test_windows import old_center_windows

    ds = recordtool.open(packed_photos)
    ix = ds.index
    for train in (True, False):
        kw = dict(batch_size=len(ds), seed=6, as_torch=False, with_ids=True, shuffle=False, drop_last=False)
        ld = Loader(packed_photos, train=train, **kw)
        ld.set_epoch(2)
        x, _, ids = next(iter(ld))
        ld.close()
        W, H = ix.width[ids], ix.height[ids]
        if train:
            win, flips = random_windows(W, H, ids, 6, 2), random_flips(ids, 6, 2)
        else:
            win, flips = old_center_windows(W, H, 256, 224), np.zeros(len(ids), bool)
        ref = decode_crop_resize_normalize([ds[int(i)][0] for i in ids], win, flips, (224, 224), fallback=True)
        assert np.array_equal(np.asarray(x), ref), train

